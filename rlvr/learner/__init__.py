"""The PyTorch side, in its seams: a step's rollouts as tensors (`batch.py`), the policy as it trains
and its weights on the way out (`policy.py`, with LoRA adapters from `lora.py`), logprobs from its
forwards (`scoring.py`, each group's prompt forwarded once by `shared_prefix.py`), the precision it
computes in (`precision.py`), and the update of every stage with its optimizer state (`update.py`:
`Learner`, which holds the other parts). What the transformers rollout engine shares with it (token
logprobs, attention kernels) is in `rlvr.modeling`."""

from rlvr.learner.batch import make_batch
from rlvr.learner.update import Learner

__all__ = ["Learner", "make_batch"]

"""The PyTorch side, in its seams: a step's rollouts as tensors (`batch.py`), the policy as it trains
and its weights on the way out (`policy.py`), logprobs from its forwards (`scoring.py`), and the RL
update with its optimizer state (`update.py`: `Learner`, which holds the other parts)."""

from rlvr.learner.batch import make_batch
from rlvr.learner.update import Learner

__all__ = ["Learner", "make_batch"]

"""What the learner and the transformers rollout engine both run on a transformers model: token
logprobs from a forward (`logprobs.py`) and the attention kernel picked per forward (`kernels.py`).
Neither side's modules are imported here."""

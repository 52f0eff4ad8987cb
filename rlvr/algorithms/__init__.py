"""Pure tensor functions of the GRPO family: advantages, the clipped surrogate, KL, aggregation."""

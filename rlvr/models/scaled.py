"""Random-weight Llama models of real sizes, built locally (no download), for measuring speed and
memory where no real model of that size can be fetched (`scripts/gpu_check.sh`). They learn nothing.

Shapes follow Qwen2.5-0.5B and -1.5B (hidden size, layers, heads, MLP width) with the tiny model's
512-token tokenizer, so the parameters are almost all in the decoder layers: 0.36 B and 1.31 B.
Weights are written in bfloat16 (half the disk); the learner loads them as float32 masters.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from rlvr.models.tiny import build_tokenizer

SHAPES = {
    "0.5b": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
             "num_key_value_heads": 2, "head_dim": 64},
    "1.5b": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
             "num_key_value_heads": 2, "head_dim": 128},
}


def build(path: Path, size: str) -> None:
    tokenizer = build_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), max_position_embeddings=4096, tie_word_embeddings=True,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, **SHAPES[size])
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)


def build_0_5b(path: Path) -> None:
    build(path, "0.5b")


def build_1_5b(path: Path) -> None:
    build(path, "1.5b")

"""A tiny random-weight Llama and a byte-level BPE tokenizer, built locally and deterministically;
and the same in other model families (`FAMILIES`), for the tests that every feature works on each.

2 layers, hidden 64, 2 heads of 32 (vLLM's CPU attention needs head_dim in {32, 64, ...}),
a 512-token vocabulary trained on arithmetic-flavoured text, and a ChatML chat template.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

SEED = 0
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Other families of the tiny model: (transformers config class, what sets the family apart), on top of
# the Llama's sizes with grouped-query attention (2 query heads share 1 key/value head). Windows of 16
# tokens, shorter than the tests' sequences, so that a sliding window changes what a token sees.
FAMILIES = {
    "qwen2": ("Qwen2Config", {}),  # biases on q, k and v
    "qwen3": ("Qwen3Config", {}),  # RMS norms on each head's q and k
    "gemma2": ("Gemma2Config", {"sliding_window": 16, "query_pre_attn_scalar": 32, "attn_logit_softcapping": 50.0,
                                "final_logit_softcapping": 30.0}),  # windows on every other layer, soft-capping
    "gemma3": ("Gemma3TextConfig", {"sliding_window": 16, "query_pre_attn_scalar": 32,
                                    "layer_types": ["sliding_attention", "full_attention"]}),  # q/k norms, 2 ropes
    "mistral": ("MistralConfig", {"sliding_window": 16}),  # a window on every layer
    "phi3": ("Phi3Config", {"tie_word_embeddings": False}),  # fused qkv_proj and gate_up_proj
    "olmo2": ("Olmo2Config", {"tie_word_embeddings": False}),  # norms after attention and MLP, q/k norms
    "granite": ("GraniteConfig", {"embedding_multiplier": 12.0, "residual_multiplier": 0.22,
                                  "attention_multiplier": 0.03, "logits_scaling": 8.0}),  # scaled paths
}


def _corpus(rng: random.Random) -> list[str]:
    words = ("what is the answer give final in tags you are a careful calculator system user assistant "
             "yes no function call name arguments because so then first next").split()
    lines = []
    for _ in range(2000):
        a, b = rng.randint(0, 9999), rng.randint(0, 99)
        lines.append(f"What is {a} * {b}? <answer>{a * b}</answer> " + " ".join(rng.choices(words, k=6)))
    return lines


def build_tokenizer(vocab_size: int = 512) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(random.Random(SEED)), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", chat_template=CHATML)


def build(path: Path) -> None:
    """Write the tiny model and its tokenizer to `path` (same bytes for the same SEED)."""
    tokenizer = build_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, head_dim=32, max_position_embeddings=2048,
        tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)


def build_family(path: Path, family: str) -> None:
    """Write a tiny model of `family` (a key of `FAMILIES`) with the tiny tokenizer to `path`."""
    tokenizer = build_tokenizer()
    name, settings = FAMILIES[family]
    config = getattr(transformers, name)(**{
        "vocab_size": len(tokenizer), "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "max_position_embeddings": 2048,
        "tie_word_embeddings": True, "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id, **settings})
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)

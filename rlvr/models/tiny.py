"""A tiny random-weight Llama and a byte-level BPE tokenizer, built locally and deterministically.

2 layers, hidden 64, 2 heads of 32 (vLLM's CPU attention needs head_dim in {32, 64, ...}),
a 512-token vocabulary trained on arithmetic-flavoured text, and a ChatML chat template.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SEED = 0
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


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

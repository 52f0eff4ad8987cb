"""LoRA (peft) for the learner: adapters on a model, and the merged weights that the engine gets."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

from rlvr.config import LoraConfig
from rlvr.models import ModelError

# `model.lora.target_modules: [all-linear]`: adapters on every linear layer of the decoder layers.
ALL_LINEAR = "all-linear"


def with_adapters(model: torch.nn.Module, lora: LoraConfig, adapter_path: Path | None) -> torch.nn.Module:
    """`model` with LoRA adapters (peft): trainable adapters on `lora.target_modules`, base frozen;
    loaded from `adapter_path` when given, else freshly initialised (B = 0: the policy starts as the base)."""
    from peft import LoraConfig, PeftModel, get_peft_model

    if adapter_path is not None:
        return PeftModel.from_pretrained(model, adapter_path, is_trainable=True)
    targets: list[str] | str = list(lora.target_modules)
    if targets == [ALL_LINEAR]:
        targets = ALL_LINEAR  # peft's: every linear layer but the output head, whatever the family names them
    else:
        present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
        missing = [m for m in targets if m not in present]
        if missing:
            raise ModelError(f"model.lora.target_modules: this model has no layer named {', '.join(missing)} "
                             f"(its {model.config.model_type} layers include {', '.join(sorted(present)[:12])}, ...)")
    return get_peft_model(model, LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                            target_modules=targets, bias="none", task_type="CAUSAL_LM"))


@torch.no_grad()
def merged_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The weights of a peft LoRA model merged (W + scale * B @ A), by the base model's Hugging Face
    names, computed without touching the model (merging in place and back would drift by rounding)."""
    from peft.tuners.lora import LoraLayer

    # each layer's delta is computed as its weight is yielded: one layer's extra memory at a time
    lora_layers = {f"{name}.base_layer.weight": module for name, module in model.named_modules()
                   if isinstance(module, LoraLayer)}
    for name, tensor in model.state_dict().items():
        if ".lora_" in name:
            continue
        layer = lora_layers.get(name)
        merged = tensor + layer.get_delta_weight(layer.active_adapters[0]) if layer is not None else tensor
        yield name.removeprefix("base_model.model.").replace(".base_layer.", "."), merged

"""The policy as it trains: a transformers causal LM with float32 master weights, wrapped (LoRA
adapters, FSDP2 shards across processes, compiled decoder layers), its frozen KL reference, and its
weights on the way out (to the engine, to a checkpoint, to the final model folder)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlvr import distributed
from rlvr.config import LoraConfig
from rlvr.learner.lora import merged_weights, with_adapters
from rlvr.modeling.kernels import compile_choice, compile_layers, decoder_layers
from rlvr.models import ModelError


def load_policy(model_path: Path):
    """The causal LM in `model_path` with float32 weights, and its tokenizer (which must have a chat template)."""
    try:
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    except (OSError, ValueError) as e:
        raise ModelError(f"model.path={str(model_path)!r} cannot be loaded as a causal LM: {e}") from e
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    return model, tokenizer


def tied_names(model: torch.nn.Module) -> set[str]:
    """Names of weights tied to another (an LM head that is the embedding): a checkpoint holds them once."""
    return ({n for n, _ in model.named_parameters(remove_duplicate=False)} - {n for n, _ in model.named_parameters()})


class Policy:
    """The model being trained and its tokenizer, as loaded and wrapped for `device`."""

    def __init__(self, model_path: Path, device: str, compile_setting: str | bool, bf16: bool,
                 reference_path: Path | None = None, with_reference: bool = False,
                 lora: LoraConfig | None = None, adapter_path: Path | None = None):
        """`model_path`: the weights to train (a resumed run's checkpoint); `reference_path`: the initial
        model a KL term is measured against (default: `model_path`), loaded when `with_reference`.
        With `lora` (`model.lora`, r > 0), `model_path` is the frozen base and adapters train on it,
        starting from those saved in `adapter_path` when given (a resumed run)."""
        # Built in stages: load -> wrap (LoRA adapters, or FSDP2 shards across processes) -> compile.
        self.model, self.tokenizer = load_policy(model_path)
        self.lora = lora is not None and lora.r > 0
        self.tied = tied_names(self.model)
        self.device = device
        self.model = self._wrap(self.model, lora, adapter_path)
        # The KL reference: with LoRA the base model with its adapters switched off, else a frozen copy.
        self.ref = None
        if with_reference and not self.lora:
            self.ref = AutoModelForCausalLM.from_pretrained(reference_path or model_path, dtype=torch.float32)
            self.ref.to(device).eval().requires_grad_(False)
        self.compiled, self.compile_why = compile_choice(compile_setting, bf16, device)
        if self.compiled:
            compile_layers(self.model)

    def _wrap(self, model: torch.nn.Module, lora: LoraConfig | None, adapter_path: Path | None) -> torch.nn.Module:
        """The loaded model as it trains: with LoRA adapters (frozen base), on the device, and across
        processes sharded by FSDP2 (each rank holding a shard of every weight)."""
        if self.lora:
            model = with_adapters(model, lora, adapter_path)
        model.to(self.device).train()
        if distributed.world_size() > 1:  # a process group: each rank holds a shard (rlvr.distributed)
            if self.lora:
                raise ModelError("LoRA is not supported across processes yet: use one process, or model.lora.r=0")
            distributed.shard(model, decoder_layers(model))
        return model

    def reference(self) -> contextlib.AbstractContextManager[torch.nn.Module]:
        """The frozen KL reference to forward, for the duration of the block (with LoRA: the policy with
        its adapters switched off)."""
        if self.lora:
            @contextlib.contextmanager
            def base() -> Iterator[torch.nn.Module]:
                with self.model.disable_adapter():
                    yield self.model
            return base()
        return contextlib.nullcontext(self.ref)

    @property
    def pad_id(self) -> int:
        tok = self.tokenizer
        return tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

    def named_weights(self, dtype: torch.dtype = torch.float32) -> Iterator[tuple[str, torch.Tensor]]:
        """The policy's weights, by the names of its Hugging Face checkpoint (what vLLM loads), as copies
        in `dtype` (the engine's) or the float32 masters themselves; with LoRA, merged (base + adapter)."""
        if self.lora:
            return ((name, p.to(dtype)) for name, p in merged_weights(self.model))
        return ((name, distributed.full(p).detach().to(dtype)) for name, p in self.model.state_dict().items())

    def export_weights(self) -> dict[str, torch.Tensor] | None:
        """The whole policy's float32 weights by their Hugging Face names (with LoRA, merged), on the
        CPU; across processes a collective that every rank calls, returning them on rank 0 alone."""
        if self.lora:
            return dict(merged_weights(self.model))
        if distributed.world_size() == 1:
            return self.model.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        weights = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return {k: v for k, v in weights.items() if k not in self.tied} if distributed.rank() == 0 else None

    def save(self, path: Path, weights: dict[str, torch.Tensor] | None = None) -> None:
        """The policy as a Hugging Face folder (safetensors + tokenizer), loadable by transformers and vLLM;
        with LoRA the merged weights (the adapter alone: `save_adapter`). `weights`: what `export_weights`
        returned (across processes rank 0 writes them; in one process they are taken here if not given)."""
        weights = self.export_weights() if weights is None else weights
        model = self.model.get_base_model() if self.lora else self.model
        model.save_pretrained(path, state_dict=weights)
        self.tokenizer.save_pretrained(path)

    def save_adapter(self, path: Path) -> None:
        """The LoRA adapter (peft's folder: adapter_config.json, adapter_model.safetensors)."""
        self.model.save_pretrained(path)

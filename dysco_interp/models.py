"""Load a real model offline into a TransformerLens `TransformerBridge`.

`load_model` accepts a registry alias (see `packaged_models.REGISTRY`), a local folder
(safetensors or a folder with one .gguf file), or any Hugging Face name for users with
a hub. The result holds the bridge (eager attention, hooks), an SDPA twin of the same
HF model that shares every weight tensor (for prefill without an n x n score matrix),
the tokenizer and a `ModelSpec`.
"""

from __future__ import annotations

import copy
import difflib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from dysco_interp import packaged_models
from dysco_interp.errors import ConfigError, ContextLengthError, ModelNotFoundError

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}


def resolve_device(device: str | torch.device | None) -> torch.device:
    """CUDA when present, else CPU; an unknown or unavailable device is a ConfigError."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ConfigError(f"invalid device {device!r}: use 'cpu', 'cuda' or 'cuda:N'") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r} requested but CUDA is not available on this machine")
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"unsupported device type {dev.type!r}: use 'cpu' or 'cuda'")
    return dev


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """fp32 on CPU and bf16 on GPU by default; names such as 'bf16' are accepted."""
    if dtype is None:
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    if isinstance(dtype, torch.dtype):
        if dtype not in set(_DTYPES.values()):
            raise ConfigError(f"unsupported dtype {dtype}: use one of float32, bfloat16, float16")
        return dtype
    key = str(dtype).lower().removeprefix("torch.")
    if key not in _DTYPES:
        raise ConfigError(f"invalid dtype {dtype!r}: use one of {', '.join(sorted(_DTYPES))}")
    return _DTYPES[key]


@dataclass(frozen=True)
class ModelSpec:
    """What analyses need to know about a model's geometry and prompt format."""

    name: str
    architecture: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_model: int
    context_length: int
    layer_types: tuple[str, ...]
    sliding_window: int | None
    chat_template: str | None

    @property
    def group_size(self) -> int:
        """Query heads per KV head (GQA): head h reads KV head h // group_size."""
        return self.n_heads // self.n_kv_heads

    @classmethod
    def from_hf_config(cls, name: str, config, chat_template: str | None) -> "ModelSpec":
        n_heads = config.num_attention_heads
        d_model = config.hidden_size
        n_layers = config.num_hidden_layers
        layer_types = tuple(getattr(config, "layer_types", None) or ["full_attention"] * n_layers)
        return cls(
            name=name,
            architecture=(config.architectures or [type(config).__name__])[0],
            n_layers=n_layers,
            n_heads=n_heads,
            n_kv_heads=getattr(config, "num_key_value_heads", None) or n_heads,
            d_head=getattr(config, "head_dim", None) or d_model // n_heads,
            d_model=d_model,
            context_length=int(config.max_position_embeddings),
            layer_types=layer_types,
            sliding_window=getattr(config, "sliding_window", None)
            if "sliding_attention" in layer_types
            else None,
            chat_template=chat_template,
        )


@dataclass(eq=False)
class LoadedModel:
    """A model ready for interpretability work and for DySCO decoding."""

    bridge: "object"  # transformer_lens TransformerBridge (eager attention, hook points)
    tokenizer: "object"
    spec: ModelSpec
    prefill_model: torch.nn.Module  # SDPA twin sharing the bridge's weight tensors
    source: str
    _reference_factory: Callable[[str], torch.nn.Module] = field(repr=False)

    @property
    def device(self) -> torch.device:
        return next(self.prefill_model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.prefill_model.parameters()).dtype

    @property
    def hf_config(self):
        return self.prefill_model.config

    @property
    def eos_token_ids(self) -> frozenset[int]:
        ids = set()
        gen_eos = getattr(getattr(self.prefill_model, "generation_config", None), "eos_token_id", None)
        for value in (gen_eos, self.tokenizer.eos_token_id):
            if isinstance(value, int):
                ids.add(value)
            elif value is not None:
                ids.update(int(v) for v in value)
        return frozenset(ids)

    def load_reference_hf(self, attn_implementation: str = "eager") -> torch.nn.Module:
        """A separately loaded HF model with the same weights (the bridge mutates its own)."""
        return self._reference_factory(attn_implementation)

    def check_fits(self, n_prompt: int, n_new: int = 0) -> None:
        """ContextLengthError unless n_prompt + n_new tokens fit the model's context."""
        if n_prompt + n_new > self.spec.context_length:
            raise ContextLengthError(
                f"prompt of {n_prompt} tokens plus {n_new} new tokens exceeds the context of "
                f"{self.spec.name} ({self.spec.context_length} tokens)"
            )


def _model_from_config(config, attn_implementation: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    # A config object of its own: from_config and the bridge set the attention backend on it.
    return AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation=attn_implementation)


def share_weights_twin(hf_model: torch.nn.Module, attn_implementation: str) -> torch.nn.Module:
    """A second HF model object whose parameters and buffers are the same tensors."""
    with torch.device("meta"):
        twin = _model_from_config(hf_model.config, attn_implementation)
    twin.load_state_dict(hf_model.state_dict(), assign=True, strict=True)
    # Non-persistent buffers (rotary frequencies) are not in the state dict.
    for name, buf in hf_model.named_buffers():
        module_name, _, attr = name.rpartition(".")
        twin.get_submodule(module_name)._buffers[attr] = buf
    if hasattr(hf_model, "generation_config"):
        twin.generation_config = hf_model.generation_config
    return twin.eval()


def from_hf(
    hf_model: torch.nn.Module,
    tokenizer,
    name: str,
    source: str = "<in memory>",
    reference_factory: Callable[[str], torch.nn.Module] | None = None,
) -> LoadedModel:
    """Wrap an HF causal LM (already on its device and dtype) as a `LoadedModel`."""
    from transformer_lens.model_bridge import TransformerBridge

    if not hf_model.config.architectures:
        hf_model.config.architectures = [type(hf_model).__name__]
    hf_model.eval()
    prefill_model = hf_model
    eager = share_weights_twin(hf_model, "eager")
    param = next(hf_model.parameters())
    bridge = TransformerBridge.boot_transformers(
        name, hf_model=eager, tokenizer=tokenizer, device=param.device, dtype=param.dtype
    )
    bridge.eval()
    if reference_factory is None:

        def reference_factory(attn_implementation: str) -> torch.nn.Module:
            ref = _model_from_config(hf_model.config, attn_implementation)
            ref.load_state_dict({k: v.clone() for k, v in prefill_model.state_dict().items()})
            return ref.to(device=param.device, dtype=param.dtype).eval()

    spec = ModelSpec.from_hf_config(name, hf_model.config, getattr(tokenizer, "chat_template", None))
    return LoadedModel(bridge, tokenizer, spec, prefill_model, source, reference_factory)


def _find_local(name_or_path: str) -> Path | None:
    path = Path(name_or_path).expanduser()
    return path if path.is_dir() else None


def _gguf_in(folder: Path) -> Path | None:
    ggufs = sorted(folder.glob("*.gguf"))
    if len(ggufs) > 1:
        raise ModelNotFoundError(f"{folder} holds several .gguf files; pass a folder with exactly one")
    return ggufs[0] if ggufs else None


TINY_PREFIX = "tiny-"


def with_yarn(config, factor: float | None):
    """The config with YaRN rope scaling by `factor` (context x factor), or unchanged for None."""
    if factor is None:
        return config
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 1:
        raise ConfigError(f"YaRN factor must be a number > 1, got {factor!r}")
    rope = dict(getattr(config, "rope_parameters", None) or {})
    if "rope_theta" not in rope:
        raise ConfigError(
            f"YaRN needs one rope setting for every layer; {type(config).__name__} has {sorted(rope)}"
        )
    original = int(config.max_position_embeddings)
    config.rope_parameters = {
        "rope_type": "yarn",
        "rope_theta": rope["rope_theta"],
        "factor": float(factor),
        "original_max_position_embeddings": original,
    }
    config.max_position_embeddings = int(original * factor)
    return config


def _refuse_likely_typo(name: str) -> None:
    # A near-miss of an alias is a typo, not a hub id: say so instead of trying a hub.
    close = difflib.get_close_matches(name, list(packaged_models.REGISTRY), n=3, cutoff=0.6)
    if close and "/" not in name:
        raise ModelNotFoundError(
            f"unknown model {name!r}; did you mean {' or '.join(map(repr, close))}? "
            f"Known aliases: {', '.join(sorted(packaged_models.REGISTRY))}"
        )


def _source(name_or_path: str, progress: bool = True) -> tuple[str, dict]:
    """Where to load a name from (folder or hub id) and the from_pretrained kwargs it needs."""
    if name_or_path in packaged_models.REGISTRY:
        return str(packaged_models.ensure_converted(packaged_models.REGISTRY[name_or_path], progress)), {}
    local = _find_local(name_or_path)
    if local is None:
        _refuse_likely_typo(name_or_path)
        return name_or_path, {}
    if (local / "config.json").exists():
        return str(local), {}
    gguf = _gguf_in(local)
    if gguf is None:
        raise ModelNotFoundError(f"{local} has neither config.json nor a .gguf file")
    return str(local), {"gguf_file": gguf.name}


def _not_found(name_or_path: str, error: Exception) -> ModelNotFoundError:
    known = ", ".join(sorted(packaged_models.REGISTRY))
    return ModelNotFoundError(
        f"cannot load model {name_or_path!r}: it is not a registry alias ({known}), not a local "
        f"folder, and could not be fetched from a model hub ({error.__class__.__name__})"
    )


def load_tokenizer(name_or_path: str = packaged_models.DEFAULT_MODEL, progress: bool = True):
    """Only a model's tokenizer; no weights are loaded or converted when avoidable."""
    from transformers import AutoTokenizer

    if name_or_path.startswith(TINY_PREFIX):
        from dysco_interp.tiny_models import tiny_tokenizer

        return tiny_tokenizer(name_or_path.removeprefix(TINY_PREFIX))
    packaged = packaged_models.REGISTRY.get(name_or_path)
    if packaged is not None and not packaged_models.is_converted(packaged) and len(packaged.chunks) == 1:
        # a single-file GGUF carries its tokenizer: read it without converting the weights
        gguf = packaged_models.locate_chunks(packaged)[0]
        folder, kwargs = str(gguf.parent), {"gguf_file": gguf.name}
    else:
        folder, kwargs = _source(name_or_path, progress)
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
    except OSError as e:
        raise _not_found(name_or_path, e) from e
    if packaged is not None:
        tokenizer.name_or_path = name_or_path
    return tokenizer


def load_model(
    name_or_path: str = packaged_models.DEFAULT_MODEL,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    progress: bool = True,
    yarn_factor: float | None = None,
) -> LoadedModel:
    """Load a model by registry alias, local folder or Hugging Face name.

    `yarn_factor` switches the rope to YaRN scaling (the paper's baseline for contexts past
    the native window; 4 for the Qwen models), and combines with every decoding method.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    start = time.perf_counter()
    if name_or_path.startswith(TINY_PREFIX):
        from dysco_interp.tiny_models import tiny_model

        return tiny_model(name_or_path.removeprefix(TINY_PREFIX), dtype=dt, device=dev, yarn_factor=yarn_factor)
    folder, kwargs = _source(name_or_path, progress)
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
        kwargs["config"] = with_yarn(AutoConfig.from_pretrained(folder, **kwargs), yarn_factor)
        hf_model = AutoModelForCausalLM.from_pretrained(
            folder, dtype=dt, attn_implementation="sdpa", **kwargs
        )
    except OSError as e:
        raise _not_found(name_or_path, e) from e
    hf_model.hf_quantizer = None
    hf_model.to(dev)

    def reference_factory(attn_implementation: str) -> torch.nn.Module:
        config = copy.deepcopy(kwargs["config"])
        ref = AutoModelForCausalLM.from_pretrained(
            folder, dtype=dt, attn_implementation=attn_implementation, **{**kwargs, "config": config}
        )
        return ref.to(dev).eval()

    loaded = from_hf(hf_model, tokenizer, name_or_path, folder, reference_factory)
    if progress:
        print(f"[dysco-interp] loaded {name_or_path} on {dev} ({dt}) in {time.perf_counter() - start:.1f}s")
    return loaded

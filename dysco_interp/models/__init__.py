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
import hashlib
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from dysco_interp.models import packaged as packaged_models
from dysco_interp.atomic import atomic_open
from dysco_interp.errors import (
    ConfigError,
    ContextLengthError,
    DyscoError,
    ModelIntegrityError,
    ModelNotFoundError,
)

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


def dtype_name(dtype: torch.dtype) -> str:
    """'bfloat16' for torch.bfloat16: how stores and reports name a dtype."""
    return str(dtype).removeprefix("torch.")


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
    # the identity, or how to compute it on first use; None: from the weights in memory
    _weights_id: str | Callable[[], str] | None = field(default=None, repr=False)

    @property
    def weights_id(self) -> str:
        """What the model computes, as a string to store beside every result.

        Two models with the same `weights_id` give the same outputs at the same dtype and
        device (record those separately). It covers the weights, the tokenizer and the
        settings that change outputs at fixed weights (YaRN):
        - packaged alias: ``gguf-sha256:<hex>``, the recorded hash of its GGUF (no rehash);
        - local folder: ``files-sha256:<hex>`` over the names, sizes and SHA-256 of its files
          (weights, config, tokenizer; README/licence files and hidden files excepted), each
          file's hash cached by (path, size, mtime) in the cache folder, so a 6.7 GB folder
          is hashed once (about 20 s), on first use of this property; a folder loaded
          from its .gguf file: ``gguf-sha256:<hex>`` of that file, as for a packaged alias;
        - hub model: ``hf:<repo>@<commit>`` of the snapshot it was loaded from;
        - tiny and in-memory models: ``state-sha256:<hex>`` over the state dict (names, dtypes,
          shapes, bytes), the config (rope scaling included) and the tokenizer's vocabulary.
        `load_model(..., yarn_factor=f)` appends ``;yarn=f`` to the first three.
        """
        if not isinstance(self._weights_id, str):
            compute = self._weights_id or (lambda: in_memory_weights_id(self.prefill_model, self.tokenizer))
            self._weights_id = compute()
        return self._weights_id

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


# Config keys that do not change what the model computes (or are bookkeeping).
_VOLATILE_CONFIG_KEYS = frozenset(
    {"dtype", "torch_dtype", "transformers_version", "use_cache", "output_attentions", "output_hidden_states",
     "return_dict", "name_or_path"}
)


def in_memory_weights_id(hf_model: torch.nn.Module, tokenizer=None) -> str:
    """``state-sha256:<hex>`` over the state dict, the config and the tokenizer's vocabulary."""
    digest = hashlib.sha256()
    config = {k: v for k, v in hf_model.config.to_dict().items()
              if k not in _VOLATILE_CONFIG_KEYS and not k.startswith("_")}
    digest.update(json.dumps(config, sort_keys=True, default=str).encode())
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        digest.update(backend.to_str().encode())
    if tokenizer is not None:
        digest.update(str(getattr(tokenizer, "chat_template", None)).encode())
    for name, tensor in hf_model.state_dict().items():
        t = tensor.detach().to("cpu").contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return f"state-sha256:{digest.hexdigest()}"


_HASH_CACHE_FILE = "file-hashes.json"


def file_hashes(paths: list[Path]) -> list[str]:
    """SHA-256 of each file, kept in the cache folder by (path, size, mtime), best effort: a
    read-only or misconfigured cache only means hashing again next time."""
    try:
        store_path = packaged_models.cache_root() / _HASH_CACHE_FILE
        store = json.loads(store_path.read_text()) if store_path.is_file() else {}
    except (DyscoError, OSError, ValueError):
        store_path, store = None, {}
    if not isinstance(store, dict):
        store = {}
    hexes, changed = [], False
    for path in paths:
        stat = path.stat()
        key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
        if key not in store:
            store[key], changed = packaged_models.sha256_file(path), True
        hexes.append(store[key])
    if store_path is not None and changed:
        try:
            with atomic_open(store_path) as f:
                f.write(json.dumps(store))
        except OSError:
            pass
    return hexes


def _identity_files(folder: Path) -> list[Path]:
    # Documentation does not change outputs; hidden files are tools' bookkeeping.
    def counts(p: Path) -> bool:
        upper = p.name.upper()
        return not (p.name.startswith(".") or upper.startswith(("README", "LICENSE")) or upper.endswith(".MD"))

    return sorted(p for p in folder.iterdir() if p.is_file() and counts(p))


def folder_weights_id(folder: Path) -> str:
    """``files-sha256:<hex>`` over the names, sizes and SHA-256 of a model folder's files."""
    files = _identity_files(folder)
    digest = hashlib.sha256()
    for path, hexdigest in zip(files, file_hashes(files)):
        digest.update(f"{path.name}|{path.stat().st_size}|{hexdigest}\n".encode())
    return f"files-sha256:{digest.hexdigest()}"


def gguf_weights_id(path: Path) -> str:
    """``gguf-sha256:<hex>``: a GGUF carries weights, config and tokenizer (as a packaged alias)."""
    return f"gguf-sha256:{file_hashes([path])[0]}"


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
    weights_id: str | Callable[[], str] | None = None,
) -> LoadedModel:
    """Wrap an HF causal LM (already on its device and dtype) as a `LoadedModel`.

    `weights_id` (a string, or a function computing it on first use) defaults to a hash of
    the model in memory; see `LoadedModel.weights_id`.
    """
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
    return LoadedModel(bridge, tokenizer, spec, prefill_model, source, reference_factory, weights_id)


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


def _known() -> str:
    return ", ".join(sorted(packaged_models.REGISTRY))


def _model_name(name_or_path) -> str:
    """The name as a string, or the package's error for None, "" and other non-names."""
    if isinstance(name_or_path, os.PathLike):
        name_or_path = os.fspath(name_or_path)
    if not isinstance(name_or_path, str):
        raise ConfigError(
            f"a model is named by a string (a registry alias: {_known()}; a local folder; or a hub id), "
            f"got {name_or_path!r}"
        )
    if not name_or_path.strip():
        raise ModelNotFoundError(f"empty model name: use a registry alias ({_known()}), a local folder or a hub id")
    return name_or_path


def _refuse_likely_typo(name: str) -> None:
    # A near-miss of an alias is a typo, not a hub id: say so instead of trying a hub.
    close = difflib.get_close_matches(name, list(packaged_models.REGISTRY), n=3, cutoff=0.6)
    if close and "/" not in name:
        raise ModelNotFoundError(
            f"unknown model {name!r}; did you mean {' or '.join(map(repr, close))}? Known aliases: {_known()}"
        )


def _gguf_in(folder: Path) -> Path | None:
    ggufs = sorted(folder.glob("*.gguf"))
    if len(ggufs) > 1:
        raise ModelNotFoundError(f"{folder} holds several .gguf files; pass a folder with exactly one")
    return ggufs[0] if ggufs else None


def hub_probe(endpoint: str, repo_id: str, timeout: float = 3.0) -> str:
    """"present", "absent" or "unreachable": one HEAD request, without retries, for the
    repo's config.json (what from_pretrained fetches first), within `timeout` seconds.

    transformers retries an unreachable hub for a minute before failing; this answers first.
    HTTP 401/404 is "absent" (a private or gated repo without a token looks the same); any
    other HTTP answer, a redirect included, lets the real download decide.
    """
    from urllib.error import HTTPError
    from urllib.request import HTTPRedirectHandler, Request, build_opener

    from huggingface_hub.utils import build_hf_headers

    class NoRedirect(HTTPRedirectHandler):
        # A redirect (to a CDN, or a renamed repo) already says the file exists.
        def redirect_request(self, *args, **kwargs):
            return None

    url = f"{endpoint.rstrip('/')}/{repo_id}/resolve/main/config.json"
    answer = []

    def attempt() -> None:
        try:
            request = Request(url, method="HEAD", headers=build_hf_headers())
            build_opener(NoRedirect).open(request, timeout=timeout).close()
            answer.append("present")
        except HTTPError as e:
            answer.append("absent" if e.code in (401, 404) else "present")
        except (OSError, ValueError):  # no route, refused, no such host, timed out, bad URL
            answer.append("unreachable")

    # In a thread: name resolution has no timeout of its own.
    probe = threading.Thread(target=attempt, daemon=True)
    probe.start()
    probe.join(timeout)
    return answer[0] if answer else "unreachable"


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~", "\\")) or name.count("/") > 1 or name.endswith(("/", ".gguf"))


def _hub_kwargs(name: str) -> dict:
    """from_pretrained kwargs for a hub id, or a ModelNotFoundError within seconds when the
    id cannot be fetched: offline, or no hub reachable, and not in the local Hugging Face cache."""
    from huggingface_hub import constants, try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if _looks_like_path(name):
        raise ModelNotFoundError(
            f"no model folder at {Path(name).expanduser()} (and {name!r} is no registry alias: {_known()})"
        )
    try:
        validate_repo_id(name)
    except HFValidationError:
        raise ModelNotFoundError(
            f"unknown model {name!r}: not a registry alias ({_known()}), not a local folder, and not a Hugging Face id"
        ) from None
    offline = constants.is_offline_mode()
    answer = "unreachable" if offline else hub_probe(constants.ENDPOINT, name)
    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        # Cached: read it from there rather than ask a hub that does not answer.
        return {} if answer == "present" else {"local_files_only": True}
    if answer != "present":
        why = {
            "absent": f"the model hub {constants.ENDPOINT} has no such model (a private or gated one needs a token)",
            "unreachable": f"the model hub {constants.ENDPOINT} is not reachable",
        }[answer]
        raise ModelNotFoundError(
            f"unknown model {name!r}: not a registry alias ({_known()}), not a local folder, "
            f"not in the Hugging Face cache, and {'HF_HUB_OFFLINE is set' if offline else why}"
        )
    return {}


def _hub_snapshot(name: str) -> str | None:
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(name, "config.json")
    return Path(cached).parent.name if isinstance(cached, str) else None


@dataclass(frozen=True)
class _Where:
    """Where a name loads from: a folder (or hub id), the from_pretrained kwargs it needs,
    and the packaged model behind it, if any."""

    location: str
    kwargs: dict
    packaged: packaged_models.PackagedModel | None = None
    hub: bool = False


def _resolve(name: str, progress: bool) -> _Where:
    packaged = packaged_models.REGISTRY.get(name)
    if packaged is not None:
        return _Where(str(packaged_models.ensure_converted(packaged, progress)), {}, packaged)
    path = Path(name).expanduser()
    if path.is_dir():
        if (path / "config.json").exists():
            return _Where(str(path), {})
        gguf = _gguf_in(path)
        if gguf is None:
            raise ModelNotFoundError(f"{path} has neither config.json nor a .gguf file")
        return _Where(str(path), {"gguf_file": gguf.name})
    if path.is_file() and path.suffix == ".gguf":
        return _Where(str(path.parent), {"gguf_file": path.name})
    _refuse_likely_typo(name)
    return _Where(name, _hub_kwargs(name), hub=True)


def _not_found(name_or_path: str, error: Exception) -> ModelNotFoundError:
    return ModelNotFoundError(
        f"cannot load model {name_or_path!r}: it is not a registry alias ({_known()}), not a local "
        f"folder, and could not be fetched from a model hub ({error.__class__.__name__})"
    )


def _describe(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:300]}" if lines else type(error).__name__


def _load_guarded(name: str, where: _Where, progress: bool, load: Callable[[_Where], object]):
    """`load(where)`, its failures turned into the package's errors. A packaged folder that
    fails is hashed fully and, when corrupt, converted again and loaded once more."""
    try:
        return load(where)
    except (DyscoError, MemoryError):
        raise
    except Exception as e:
        if where.packaged is None:
            if where.hub:
                raise _not_found(name, e) from e
            raise ModelNotFoundError(f"cannot load the model in {where.location} ({_describe(e)})") from e
        failure = e
    if not packaged_models.repair(where.packaged, progress):
        raise ModelIntegrityError(
            f"the converted model {name!r} in {where.location} fails to load ({_describe(failure)}) although its "
            f"files match their recorded hashes: delete {where.location} to convert it again"
        ) from failure
    try:
        return load(where)
    except (DyscoError, MemoryError):
        raise
    except Exception as e:
        raise ModelIntegrityError(
            f"the converted model {name!r} in {where.location} still fails to load after converting it again "
            f"({_describe(e)})"
        ) from e


def load_tokenizer(name_or_path: str = packaged_models.DEFAULT_MODEL, progress: bool = True):
    """Only a model's tokenizer; no weights are loaded or converted when avoidable."""
    from transformers import AutoTokenizer

    name = _model_name(name_or_path)
    if name.startswith(TINY_PREFIX):
        from dysco_interp.models.tiny import tiny_tokenizer

        return tiny_tokenizer(name.removeprefix(TINY_PREFIX))
    packaged = packaged_models.REGISTRY.get(name)
    gguf = None
    if packaged is not None and len(packaged.chunks) == 1 and not packaged_models.is_converted(packaged):
        # a single-file GGUF carries its tokenizer: read it without converting the weights
        try:
            gguf = packaged_models.locate_chunks(packaged)[0]
        except DyscoError:
            gguf = None  # ensure_converted below says what is missing or broken
    where = _Where(str(gguf.parent), {"gguf_file": gguf.name}) if gguf else _resolve(name, progress)
    tokenizer = _load_guarded(name, where, progress, lambda w: AutoTokenizer.from_pretrained(w.location, **w.kwargs))
    if packaged is not None:
        tokenizer.name_or_path = name
    return tokenizer


def load_model(
    name_or_path: str = packaged_models.DEFAULT_MODEL,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    progress: bool = True,
    yarn_factor: float | None = None,
) -> LoadedModel:
    """Load a model by registry alias, local folder (or .gguf file) or Hugging Face name.

    `yarn_factor` switches the rope to YaRN scaling (the paper's baseline for contexts past
    the native window; 4 for the Qwen models), and combines with every decoding method.
    A name that is none of these fails within seconds when no hub is reachable.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    name = _model_name(name_or_path)
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    start = time.perf_counter()
    if name.startswith(TINY_PREFIX):
        from dysco_interp.models.tiny import tiny_model

        return tiny_model(name.removeprefix(TINY_PREFIX), dtype=dt, device=dev, yarn_factor=yarn_factor)
    where = _resolve(name, progress)

    def read(where: _Where):
        kwargs = dict(where.kwargs)
        tokenizer = AutoTokenizer.from_pretrained(where.location, **kwargs)
        kwargs["config"] = with_yarn(AutoConfig.from_pretrained(where.location, **kwargs), yarn_factor)
        hf_model = AutoModelForCausalLM.from_pretrained(
            where.location, dtype=dt, attn_implementation="sdpa", **kwargs
        )
        return tokenizer, kwargs, hf_model

    tokenizer, kwargs, hf_model = _load_guarded(name, where, progress, read)
    if where.packaged is not None:
        packaged_models.record_manifest(where.packaged, progress)
    hf_model.hf_quantizer = None
    hf_model.to(dev)
    folder = where.location

    def reference_factory(attn_implementation: str) -> torch.nn.Module:
        config = copy.deepcopy(kwargs["config"])
        ref = AutoModelForCausalLM.from_pretrained(
            folder, dtype=dt, attn_implementation=attn_implementation, **{**kwargs, "config": config}
        )
        return ref.to(dev).eval()

    loaded = from_hf(hf_model, tokenizer, name, folder, reference_factory, _weights_id(name, where, yarn_factor))
    if progress:
        print(f"[dysco-interp] loaded {name} on {dev} ({dt}) in {time.perf_counter() - start:.1f}s")
    return loaded


def _weights_id(name: str, where: _Where, yarn_factor: float | None) -> str | Callable[[], str] | None:
    # None: hashed from the model in memory, whose config already carries the YaRN setting.
    suffix = "" if yarn_factor is None else f";yarn={float(yarn_factor):g}"
    if where.packaged is not None:
        return where.packaged.weights_id + suffix
    if where.hub:
        snapshot = _hub_snapshot(name)
        return f"hf:{name}@{snapshot}{suffix}" if snapshot else None
    folder, gguf = Path(where.location), where.kwargs.get("gguf_file")
    if gguf:
        return lambda: gguf_weights_id(folder / gguf) + suffix
    return lambda: folder_weights_id(folder) + suffix

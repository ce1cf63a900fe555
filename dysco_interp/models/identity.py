"""Weights identities: strings that say what a model computes, stored beside every result
(see `LoadedModel.weights_id` for which kind each source gets), and weights fingerprints,
which two loads of the same weights share whatever their source, dtype or YaRN setting.

Files are hashed once: each file's SHA-256 is kept in the cache folder by (path, size,
mtime), so a 6.7 GB folder costs about 20 s on first use only. A fingerprint reads only the
first and last `FINGERPRINT_SAMPLE` values of each weight tensor, so it is cheap even for a
folder that is not loaded (safetensors are read slice by slice).
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Union

import torch

from dysco_interp.atomic import atomic_open
from dysco_interp.errors import DyscoError
from dysco_interp.models.packaged.cache import cache_root
from dysco_interp.models.packaged.manifest import sha256_file

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# What a source knows of a model's identity when it loads it: the identity, a function that
# computes it on first use (hashing a folder is slow), or None for a hash of the model in memory.
WeightsId = Union[str, Callable[[], str], None]

# Config keys that do not change what the model computes (or are bookkeeping).
_VOLATILE_CONFIG_KEYS = frozenset(
    {"dtype", "torch_dtype", "transformers_version", "use_cache", "output_attentions", "output_hidden_states",
     "return_dict", "name_or_path"}
)


def in_memory_weights_id(hf_model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase | None = None) -> str:
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
        store_path = cache_root() / _HASH_CACHE_FILE
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
            store[key], changed = sha256_file(path), True
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


FINGERPRINT_SAMPLE = 4096  # values read from each end of each weight tensor


def _canonical(values: torch.Tensor) -> bytes:
    # bf16 bits: a model loaded at bf16 from fp32 files rounds to exactly these values
    return values.detach().to("cpu", torch.float32).to(torch.bfloat16).view(torch.int16).numpy().tobytes()


def tensors_fingerprint(ends: Iterable[tuple[str, tuple[int, ...], torch.Tensor, torch.Tensor]]) -> str:
    """``weights-fp:<hex>`` over (name, shape, first values, last values) of each weight tensor,
    in name order; what two sources of the same weights agree on."""
    digest = hashlib.sha256()
    for name, shape, head, tail in sorted(ends, key=lambda e: e[0]):
        digest.update(f"{name}|{tuple(shape)}\n".encode())
        digest.update(_canonical(head))
        digest.update(_canonical(tail))
    return f"weights-fp:{digest.hexdigest()}"


def model_fingerprint(hf_model: torch.nn.Module) -> str:
    """The weights fingerprint of an HF model in memory (tied weights counted once, as files hold them)."""
    k = FINGERPRINT_SAMPLE

    def ends(t: torch.Tensor):
        flat = t.detach().reshape(-1)
        return flat[:k], flat[-k:]

    return tensors_fingerprint((name, tuple(p.shape), *ends(p)) for name, p in hf_model.named_parameters())


def folder_fingerprint(folder: Path) -> str | None:
    """The weights fingerprint of a folder's safetensors files, read slice by slice; None when it
    holds none (a .bin or GGUF folder) or they cannot be read."""
    from safetensors import safe_open

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        return None
    k, out = FINGERPRINT_SAMPLE, []
    try:
        for path in files:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():
                    part = f.get_slice(name)
                    shape = tuple(part.get_shape())
                    if not shape:
                        value = f.get_tensor(name).reshape(-1)
                        out.append((name, shape, value, value))
                        continue
                    row = max(1, math.prod(shape[1:]))
                    rows = min(shape[0], -(-k // row))  # enough leading rows for k values
                    head = part[:rows].reshape(-1)[:k]
                    tail = part[shape[0] - rows:].reshape(-1)[-k:]
                    out.append((name, shape, head, tail))
    except (OSError, ValueError, RuntimeError):
        return None
    return tensors_fingerprint(out)

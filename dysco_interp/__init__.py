"""dysco-interp: retrieval heads and dynamic attention-scaling decoding on TransformerLens.

The public API, imported lazily (torch, transformers and TransformerLens load on first use):

    from dysco_interp import load_model, load_heads, preset, generate
    model = load_model("qwen2.5-coder-0.5b")
    result = generate(model, prompt, preset("paper"), heads=load_heads("shipped", model))
"""

import importlib as _importlib
import os as _os
import warnings as _warnings

# TransformerLens pulls wandb in; nothing here logs to it.
_os.environ.setdefault("WANDB_MODE", "disabled")
# Libraries we load import tqdm.auto, which warns in a notebook without ipywidgets and then draws
# the same text bars that `dysco_interp.progress` chooses: the warning says nothing to act on.
_warnings.filterwarnings("ignore", message="IProgress not found", module="tqdm")

__version__ = "0.1.0"

from dysco_interp.errors import (  # noqa: E402
    ConfigError,
    ContextLengthError,
    DataError,
    DyscoError,
    ModelIntegrityError,
    ModelNotFoundError,
    ModelPackageMissingError,
)

# name -> the module that defines it
_LAZY = {
    "load_model": "dysco_interp.models",
    "LoadedModel": "dysco_interp.models",
    "ModelSpec": "dysco_interp.models",
    "HeadSet": "dysco_interp.heads",
    "load_heads": "dysco_interp.heads",
    "shipped_heads": "dysco_interp.heads",
    "DecodingConfig": "dysco_interp.decoding.config",
    "preset": "dysco_interp.decoding.config",
    "SamplingConfig": "dysco_interp.decoding.sampling",
    "generate": "dysco_interp.decoding.loop",
    "generate_batch": "dysco_interp.decoding.loop",
    "compare_methods": "dysco_interp.decoding.loop",
    "dysco_generate": "dysco_interp.decoding.loop",
    "current_pass": "dysco_interp.decoding.passes",
    "observe": "dysco_interp.decoding.observe",
    "register_method": "dysco_interp.decoding.methods",
    "Method": "dysco_interp.decoding.methods",
    "MethodParams": "dysco_interp.decoding.params",
    "SteeringMethod": "dysco_interp.decoding.steering",
    "PassPlan": "dysco_interp.decoding.plan",
    "Read": "dysco_interp.decoding.plan",
    "Bias": "dysco_interp.decoding.plan",
    "Mask": "dysco_interp.decoding.plan",
    "Scale": "dysco_interp.decoding.plan",
    "GenerationResult": "dysco_interp.decoding.results",
    "Trace": "dysco_interp.decoding.results",
    "detect_qr_heads": "dysco_interp.detection",
    "make_dataset": "dysco_interp.tasks",
    "evaluate": "dysco_interp.experiments.evaluate",
}


def __getattr__(name):
    if name in _LAZY:
        return getattr(_importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dysco_interp' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "__version__",
    *_LAZY,
    "DyscoError",
    "ConfigError",
    "ContextLengthError",
    "DataError",
    "ModelIntegrityError",
    "ModelNotFoundError",
    "ModelPackageMissingError",
]

"""dysco-interp: retrieval heads and dynamic attention-scaling decoding on TransformerLens."""

import os as _os

# TransformerLens pulls wandb in; nothing here logs to it.
_os.environ.setdefault("WANDB_MODE", "disabled")

__version__ = "0.1.0"

from dysco_interp.errors import (  # noqa: E402
    ConfigError,
    ContextLengthError,
    DyscoError,
    ModelIntegrityError,
    ModelNotFoundError,
    ModelPackageMissingError,
)


def __getattr__(name):
    # Heavy imports (torch, transformers, TransformerLens) wait until first use.
    if name in ("load_model", "LoadedModel", "ModelSpec"):
        from dysco_interp import models

        return getattr(models, name)
    raise AttributeError(f"module 'dysco_interp' has no attribute {name!r}")


__all__ = [
    "__version__",
    "load_model",
    "LoadedModel",
    "ModelSpec",
    "DyscoError",
    "ConfigError",
    "ContextLengthError",
    "ModelIntegrityError",
    "ModelNotFoundError",
    "ModelPackageMissingError",
]

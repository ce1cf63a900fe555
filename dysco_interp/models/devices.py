"""Devices and dtypes: the defaults (CUDA when present; fp32 on CPU, bf16 on GPU), the
names accepted for them, and the one name under which stores and reports record a dtype."""

from __future__ import annotations

import torch

from dysco_interp.errors import ConfigError

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

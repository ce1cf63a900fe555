"""Where DySCO's passes run: one interface (`base.Backend`), one file per implementation.

- "bridge": the TransformerBridge with TransformerLens hooks (eager attention, one prompt);
  the reference, and what analyses hook into;
- "sdpa": the SDPA twin of the same weights, DySCO inside its attention function; prompts of
  any lengths decode together, left-padded;
- "static": SDPA prefill into fixed KV buffers, decoding passes replayed as CUDA graphs.
The relevance and selection math is shared (`decoding/relevance.py`); backends differ only in
how a pass reads attention and applies the bias.
"""

from __future__ import annotations

from collections.abc import Sequence

from dysco_interp.decoding.backends.base import (
    Backend,
    DecodeState,
    StepOutput,
    StopForward,
    no_hooks_message,
    stop_after,
)
from dysco_interp.decoding.backends.bridge import BridgeBackend
from dysco_interp.decoding.backends.decode_attention import check_decode_attention
from dysco_interp.decoding.backends.sdpa import SdpaBackend
from dysco_interp.decoding.backends.static import StaticBackend
from dysco_interp.decoding.choices import BACKENDS, DECODE_ATTENTION, DEFAULT_DECODE_ATTENTION, BackendName
from dysco_interp.errors import ConfigError
from dysco_interp.hooks import Hook
from dysco_interp.models import LoadedModel

REGISTRY: dict[str, type[Backend]] = {cls.name: cls for cls in (BridgeBackend, SdpaBackend, StaticBackend)}
assert BACKENDS == tuple(REGISTRY)


def check_backend(name: str, decode_attention: str | None = None) -> str:
    """`name` if it is a backend, and `decode_attention` (if given) one the static backend has."""
    if name not in REGISTRY:
        raise ConfigError(f"unknown backend {name!r}; choose one of {', '.join(REGISTRY)}")
    if decode_attention is not None:
        if name != "static":
            raise ConfigError(f"decode_attention sets the static backend's decoding; the {name} backend has none")
        check_decode_attention(decode_attention)
    return name


def make_backend(model: LoadedModel, name: BackendName | str, *, tau: float = 1.0,
                 graphs: bool | None = None, hooks: Sequence[Hook] = (),
                 decode_attention: str | None = None, compile_kernels: bool | None = None) -> Backend:
    """The backend `name` for `model`: it prefills prompts and runs pass plans (`decoding.plan`).

    Args:
        model: the loaded model.
        name: "bridge", "sdpa" or "static".
        tau: UniAttnS's attention temperature (1.0: none).
        graphs: CUDA graphs for the static backend (None: on CUDA devices); True elsewhere is a ConfigError.
        hooks: your TransformerLens forward hooks for every pass (the bridge only; elsewhere a ConfigError).
        decode_attention: the static backend's decoding attention, "sdpa" (fused, its default) or
            "float32" (the reference); None for the other backends.
        compile_kernels: whether the static backend compiles its fused decoder's small operations
            (None: on CUDA devices); None for the other backends.

    Returns:
        A `Backend`.
    """
    name = check_backend(name, decode_attention)
    if decode_attention is None and compile_kernels is None:
        return REGISTRY[name](model, tau=tau, graphs=graphs, hooks=hooks)
    if name != "static":
        raise ConfigError(f"compile_kernels sets the static backend's decoding; the {name} backend has none")
    return StaticBackend(model, tau=tau, graphs=graphs, hooks=hooks,
                         decode_attention=decode_attention or DEFAULT_DECODE_ATTENTION, compile_kernels=compile_kernels)


__all__ = [
    "BACKENDS", "DECODE_ATTENTION", "DEFAULT_DECODE_ATTENTION", "REGISTRY", "Backend", "BackendName", "BridgeBackend",
    "DecodeState", "SdpaBackend", "StaticBackend", "StepOutput", "StopForward", "check_backend", "make_backend",
    "no_hooks_message", "stop_after",
]

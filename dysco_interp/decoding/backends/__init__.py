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
from dataclasses import dataclass

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


def register_backend(cls: type[Backend]) -> type[Backend]:
    """Register a `Backend` subclass under `cls.name` (usable as a class decorator): it then runs
    every method, by name or in a `BackendSpec`. A new backend is its `prefill`, its `run` and
    this line; the command line offers the built-in ones (`choices.BACKENDS`)."""
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise ConfigError(f"register_backend takes a Backend subclass, got {cls!r}")
    name = cls.__dict__.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"a backend needs a name of its own (got {name!r})")
    taken = REGISTRY.get(name)
    if taken is not None and taken is not cls and (taken.__module__, taken.__qualname__) != (
            cls.__module__, cls.__qualname__):
        raise ConfigError(f"backend {name!r} is already registered ({taken.__module__}.{taken.__qualname__})")
    REGISTRY[name] = cls
    return cls


def check_backend(name: str, decode_attention: str | None = None) -> str:
    """`name` if it is a backend, and `decode_attention` (if given) one the static backend has."""
    if name not in REGISTRY:
        raise ConfigError(f"unknown backend {name!r}; choose one of {', '.join(REGISTRY)}")
    if decode_attention is not None:
        if name != "static":
            raise ConfigError(f"decode_attention sets the static backend's decoding; the {name} backend has none")
        check_decode_attention(decode_attention)
    return name


@dataclass(frozen=True)
class BackendSpec:
    """A backend and its options, as one value: what the decode loop, `evaluate` and a result
    store carry instead of loose keyword arguments.

    Args:
        name: "bridge", "sdpa" or "static".
        graphs: CUDA graphs for the static backend (None: on CUDA devices).
        decode_attention: the static backend's decoding attention, "sdpa" (fused, its default) or
            "float32" (the reference); None for the other backends.
        compile_kernels: whether the static backend compiles its fused decoder's small operations
            (None: on CUDA devices); None for the other backends.
    """

    name: str = "bridge"
    graphs: bool | None = None
    decode_attention: str | None = None
    compile_kernels: bool | None = None

    def __post_init__(self) -> None:
        check_backend(self.name, self.decode_attention)
        if self.compile_kernels is not None and self.name != "static":
            raise ConfigError(f"compile_kernels sets the static backend's decoding; the {self.name} backend has none")
        if self.graphs and not REGISTRY[self.name].supports_graphs:
            raise ConfigError(f"the {self.name} backend does not capture CUDA graphs; use backend='static'")

    @classmethod
    def of(cls, backend: "BackendSpec | str", graphs: bool | None = None,
           decode_attention: str | None = None) -> "BackendSpec":
        """`backend` as a spec; a name takes the options given beside it (the public functions'
        `graphs=` and `decode_attention=`), which a spec must not be given again."""
        if isinstance(backend, BackendSpec):
            if graphs is not None or decode_attention is not None:
                raise ConfigError("give graphs and decode_attention inside the BackendSpec, not beside it")
            return backend
        if not isinstance(backend, str):
            raise ConfigError(f"backend is a name ({', '.join(REGISTRY)}) or a BackendSpec, "
                              f"got {type(backend).__name__}")
        return cls(backend, graphs, decode_attention)

    @property
    def runs_hooks(self) -> bool:
        return REGISTRY[self.name].runs_hooks

    @property
    def max_batch(self) -> int | None:
        return REGISTRY[self.name].max_batch

    def make(self, model: LoadedModel, *, hooks: Sequence[Hook] = (), tau: float | None = None) -> Backend:
        """The backend for `model` (the user's `hooks` for the bridge; `tau` is deprecated, see `Backend`)."""
        return make_backend(model, self.name, graphs=self.graphs, hooks=hooks, decode_attention=self.decode_attention,
                            compile_kernels=self.compile_kernels, tau=tau)

    def store_settings(self) -> dict:
        """What a result store records of it: the name, and the decoding attention when it is not
        the default (stores made before the option existed stay resumable). CUDA graphs and
        compiled kernels give the eager tokens, so they are not settings."""
        out: dict = {"backend": self.name}
        if self.decode_attention not in (None, DEFAULT_DECODE_ATTENTION):
            out["decode_attention"] = self.decode_attention
        return out


def make_backend(model: LoadedModel, name: BackendName | str, *, graphs: bool | None = None,
                 hooks: Sequence[Hook] = (), decode_attention: str | None = None,
                 compile_kernels: bool | None = None, tau: float | None = None) -> Backend:
    """The backend `name` for `model`: it prefills prompts and runs pass plans (`decoding.plan`).

    Args:
        model: the loaded model.
        name: "bridge", "sdpa" or "static".
        graphs: CUDA graphs for the static backend (None: on CUDA devices); True elsewhere is a ConfigError.
        hooks: your TransformerLens forward hooks for every pass (the bridge only; elsewhere a ConfigError).
        decode_attention: the static backend's decoding attention, "sdpa" (fused, its default) or
            "float32" (the reference); None for the other backends.
        compile_kernels: whether the static backend compiles its fused decoder's small operations
            (None: on CUDA devices); None for the other backends.
        tau: deprecated: a temperature is a plan's `Scale` now (`Backend` says what it still does).

    Returns:
        A `Backend`.
    """
    name = check_backend(name, decode_attention)
    legacy = {} if tau is None else {"tau": tau}  # only when given: its notice is for those who give it
    if decode_attention is None and compile_kernels is None:
        return REGISTRY[name](model, graphs=graphs, hooks=hooks, **legacy)
    if name != "static":
        raise ConfigError(f"compile_kernels sets the static backend's decoding; the {name} backend has none")
    return StaticBackend(model, graphs=graphs, hooks=hooks,
                         decode_attention=decode_attention or DEFAULT_DECODE_ATTENTION, compile_kernels=compile_kernels,
                         **legacy)


__all__ = [
    "BACKENDS", "DECODE_ATTENTION", "DEFAULT_DECODE_ATTENTION", "REGISTRY", "Backend", "BackendName", "BackendSpec",
    "BridgeBackend",
    "DecodeState", "SdpaBackend", "StaticBackend", "StepOutput", "StopForward", "check_backend", "make_backend",
    "register_backend",
    "no_hooks_message", "stop_after",
]

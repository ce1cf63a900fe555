"""Where DySCO's passes run: one interface (`base.Backend`), one file per implementation.

- "bridge": the TransformerBridge with TransformerLens hooks (eager attention, one prompt);
  the reference, and what analyses hook into;
- "sdpa": the SDPA twin of the same weights, DySCO inside its attention function; prompts of
  any lengths decode together, left-padded;
- "static": SDPA prefill into fixed KV buffers, decoding passes replayed as CUDA graphs;
- "flex": the SDPA backend's prefill and cache, decoding steps through FlexAttention (the
  plan's bias, mask and scale as a `score_mod`), compiled where `torch.compile` works.
The relevance and selection math is shared (`decoding/relevance.py`); backends differ only in
how a pass reads attention and applies the bias.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from dysco_interp.decoding.backends.base import (
    Backend,
    BackendOptions,
    DecodeState,
    StepOutput,
    StopForward,
    no_hooks_message,
    raise_fault,
    stop_after,
)
from dysco_interp.decoding.backends.bridge import BridgeBackend
from dysco_interp.decoding.backends.flex import FlexBackend, FlexOptions
from dysco_interp.decoding.backends.sdpa import SdpaBackend
from dysco_interp.decoding.backends.static import StaticBackend, StaticOptions
from dysco_interp.decoding.choices import BACKENDS, DECODE_ATTENTION, DEFAULT_DECODE_ATTENTION, BackendName
from dysco_interp.errors import ConfigError
from dysco_interp.hooks import Hook
from dysco_interp.models import LoadedModel

REGISTRY: dict[str, type[Backend]] = {cls.name: cls for cls in (BridgeBackend, SdpaBackend, StaticBackend,
                                                                  FlexBackend)}
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


def check_backend(name: str) -> str:
    """`name` if it is a backend."""
    if name not in REGISTRY:
        raise ConfigError(f"unknown backend {name!r}; choose one of {', '.join(REGISTRY)}")
    return name


@dataclass(frozen=True, init=False)
class BackendSpec:
    """A backend and its options, as one value: what the decode loop, `evaluate` and a result
    store carry instead of loose keyword arguments.

    Args:
        name: "bridge", "sdpa", "static", "flex" or a registered backend's.
        graphs: CUDA graphs (None: where the backend captures them, on CUDA devices).
        options: the backend's own options (`REGISTRY[name].Options`, e.g. `StaticOptions`), or
            their fields as keywords (`decode_attention=`, `compile_kernels=`, `matvec=` for the
            static backend).
    """

    name: str
    graphs: bool | None
    options: BackendOptions

    def __init__(self, name: str = "bridge", graphs: bool | None = None, options: BackendOptions | None = None,
                 **option_fields):
        check_backend(name)
        cls = REGISTRY[name]
        if graphs and not cls.supports_graphs:
            raise ConfigError(f"the {name} backend does not capture CUDA graphs; use backend='static'")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "graphs", graphs)
        object.__setattr__(self, "options", cls.Options.of(name, options, option_fields))

    @classmethod
    def of(cls, backend: "BackendSpec | str", graphs: bool | None = None,
           decode_attention: str | None = None) -> "BackendSpec":
        """`backend` as a spec; a name takes the options given beside it (the public functions'
        deprecated `graphs=` and `decode_attention=`), which a spec must not be given again."""
        if isinstance(backend, BackendSpec):
            if graphs is not None or decode_attention is not None:
                raise ConfigError("give graphs and decode_attention inside the BackendSpec, not beside it")
            return backend
        if not isinstance(backend, str):
            raise ConfigError(f"backend is a name ({', '.join(REGISTRY)}) or a BackendSpec, "
                              f"got {type(backend).__name__}")
        return cls(backend, graphs, decode_attention=decode_attention)

    def __getattr__(self, name: str):
        # an option's value read off the spec, as when the static backend's options were its fields
        options = self.__dict__.get("options")
        if options is not None and name in {f.name for f in dataclasses.fields(options)}:
            return getattr(options, name)
        raise AttributeError(f"BackendSpec has no attribute {name!r}")

    @property
    def runs_hooks(self) -> bool:
        return REGISTRY[self.name].runs_hooks

    @property
    def max_batch(self) -> int | None:
        return REGISTRY[self.name].max_batch

    def make(self, model: LoadedModel, *, hooks: Sequence[Hook] = (), tau: float | None = None) -> Backend:
        """The backend for `model` (the user's `hooks` for the bridge; `tau` is deprecated, see `Backend`)."""
        legacy = {} if tau is None else {"tau": tau}  # only when given: its notice is for those who give it
        cls = REGISTRY[self.name]
        if cls.Options is BackendOptions:
            return cls(model, graphs=self.graphs, hooks=hooks, **legacy)
        return cls(model, graphs=self.graphs, hooks=hooks, options=self.options, **legacy)  # type: ignore[call-arg]

    def store_settings(self) -> dict:
        """What a result store records of it: the name and the options that change the tokens (CUDA
        graphs and compiled kernels give the eager tokens, so they are not settings)."""
        return {"backend": self.name, **self.options.store_settings()}

    def described(self, model: LoadedModel) -> dict:
        """How this backend decodes on `model`, for a benchmark's record (its options' own account)."""
        return self.options.described(self.make(model))


def make_backend(model: LoadedModel, name: BackendName | str, *, graphs: bool | None = None,
                 hooks: Sequence[Hook] = (), options: BackendOptions | None = None,
                 tau: float | None = None, **option_fields) -> Backend:
    """The backend `name` for `model`: it prefills prompts and runs pass plans (`decoding.plan`).

    Args:
        model: the loaded model.
        name: "bridge", "sdpa", "static" or a registered backend's.
        graphs: CUDA graphs (None: on CUDA devices, where the backend captures them); True
            elsewhere is a ConfigError.
        hooks: your TransformerLens forward hooks for every pass (the bridge only; elsewhere a ConfigError).
        options: the backend's own options (`REGISTRY[name].Options`), or their fields as
            keywords: the static backend's `decode_attention` ("sdpa", fused, its default, or
            "float32", the reference), `compile_kernels` (None: on CUDA devices) and `matvec`
            (None: the Triton kernel for a step's products of one row, with the compiled kernels).
        tau: deprecated: a temperature is a plan's `Scale` now (`Backend` says what it still does).

    Returns:
        A `Backend`.
    """
    return BackendSpec(name, graphs, options, **option_fields).make(model, hooks=hooks, tau=tau)


__all__ = [
    "BACKENDS", "DECODE_ATTENTION", "DEFAULT_DECODE_ATTENTION", "REGISTRY", "Backend", "BackendName", "BackendOptions",
    "BackendSpec", "StaticOptions", "FlexOptions",
    "BridgeBackend", "FlexBackend",
    "DecodeState", "SdpaBackend", "StaticBackend", "StepOutput", "StopForward", "check_backend", "make_backend",
    "register_backend",
    "no_hooks_message", "raise_fault", "stop_after",
]

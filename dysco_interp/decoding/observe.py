"""Hooks and read-outs scoped by a context instead of riding through every decoding call.

    with observe(model, hooks=[(name, fn)], read=Read(heads, "rows"), on_read=keep):
        generate(model, prompt, config)           # every call inside decodes under them

`hooks` are TransformerLens forward hooks for every pass (the bridge backend only), `read` a
`plan.Read` made in every pass that keeps a token (any backend), `on_read(step, read_out)` is
called after each such pass. Contexts nest: an inner one adds its hooks after the outer one's, and
may set a read or a callback only where no outer one has. The decoding functions' own `hooks=`,
`read_out=` and `on_read=` keywords still work and add to the context's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dysco_interp.decoding.plan import PassPlan, Read
from dysco_interp.errors import ConfigError
from dysco_interp.hooks import Hook

if TYPE_CHECKING:
    from dysco_interp.models import LoadedModel


@dataclass(frozen=True)
class Observation:
    """What the decoding calls inside an `observe` context add to every run."""

    hooks: tuple[Hook, ...] = ()
    read: Read | None = None
    on_read: Callable[[int, Any], None] | None = None

    def merged(self, hooks: Sequence[Hook] | None, read: Read | None, on_read) -> "Observation":
        """This observation with a call's own keywords added (a read or a callback given twice is an error)."""
        for what, mine, given in (("read_out", self.read, read), ("on_read", self.on_read, on_read)):
            if mine is not None and given is not None:
                raise ConfigError(f"{what} is set by an observe() context and again by the call: give it once")
        return Observation((*self.hooks, *(hooks or ())), self.read if read is None else read,
                           self.on_read if on_read is None else on_read)


_NONE = Observation()
_CURRENT: ContextVar[Observation | None] = ContextVar("dysco_observation", default=None)


def current_observation() -> Observation:
    """The observation of the innermost `observe` context (an empty one outside any)."""
    return _CURRENT.get() or _NONE


@contextlib.contextmanager
def observe(model: LoadedModel | None = None, *, hooks: Sequence[Hook] = (), read: Read | None = None,
            on_read: Callable[[int, Any], None] | None = None) -> Iterator[Observation]:
    """Decode every call inside under `hooks`, `read` and `on_read` (see the module docstring).
    With `model`, the read is checked against it here, before anything runs."""
    if read is not None and not isinstance(read, Read):
        raise ConfigError(f"read is a plan.Read, got {type(read).__name__}")
    if on_read is not None and not callable(on_read):
        raise ConfigError(f"on_read is called with (step, read_out), got {type(on_read).__name__}")
    if model is not None and read is not None:
        PassPlan(reads=(read,)).check(model.spec.n_layers, model.spec.n_heads)
    inner = current_observation().merged(list(hooks), read, on_read)
    token = _CURRENT.set(inner)
    try:
        yield inner
    finally:
        _CURRENT.reset(token)

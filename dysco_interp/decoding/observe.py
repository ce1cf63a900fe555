"""Hooks and read-outs scoped by a context instead of riding through every decoding call.

    with observe(model, hooks=[(name, fn)], read=Read(heads, "rows"), on_read=keep):
        generate(model, prompt, config)           # every call inside decodes under them

The words, the same everywhere: a `Read` (`plan.Read`) is the request, which heads' attention to
read; `read=` is the keyword that makes it, here and on `generate_batch` (and `generate`,
`compare_methods`); a `ReadOut` (`plan.ReadOut`) is what a pass gives back; `on_read(step,
read_out)` is called with each.

`hooks` are TransformerLens forward hooks for every pass (the bridge backend only), `read` is made
in every pass that keeps a token (any backend), `on_read` is called after each such pass.
Contexts nest: an inner one adds its hooks after the outer one's, and may set a read or a
callback only where no outer one has, as may a call's own `read=`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dysco_interp.decoding.arguments import check_hooks, hook_pairs
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
        """This observation with a call's own added (a read or a callback given twice is an error)."""
        for what, mine, given in (("read", self.read, read), ("on_read", self.on_read, on_read)):
            if mine is not None and given is not None:
                raise ConfigError(f"{what} is set by an observe() context and again by the call: give it once")
        return Observation((*self.hooks, *hook_pairs(hooks)), self.read if read is None else read,
                           self.on_read if on_read is None else on_read)

    def check(self, model: LoadedModel | None = None) -> None:
        """ConfigError unless the read is a `plan.Read` (of heads `model` has, given one) and
        `on_read` a callable."""
        if self.read is not None and not isinstance(self.read, Read):
            raise ConfigError(f"read is a plan.Read, got {type(self.read).__name__}")
        if self.on_read is not None and not callable(self.on_read):
            raise ConfigError(f"on_read is called with (step, read_out), got {type(self.on_read).__name__}")
        if model is not None and self.read is not None:
            PassPlan(reads=(self.read,)).check(model.spec.n_layers, model.spec.n_heads)


_NONE = Observation()
_CURRENT: ContextVar[Observation | None] = ContextVar("dysco_observation", default=None)


def current_observation() -> Observation:
    """The observation of the innermost `observe` context (an empty one outside any)."""
    return _CURRENT.get() or _NONE


@contextlib.contextmanager
def observe(model: LoadedModel | None = None, *, hooks: Sequence[Hook] = (), read: Read | None = None,
            on_read: Callable[[int, Any], None] | None = None) -> Iterator[Observation]:
    """Decode every call inside under `hooks`, `read` and `on_read` (see the module docstring).
    With `model`, the hook names and the read are checked against it here, before anything runs."""
    given = Observation(tuple(hook_pairs(hooks) if model is None else check_hooks(model, hooks)), read, on_read)
    given.check(model)
    inner = current_observation().merged(given.hooks, read, on_read)
    token = _CURRENT.set(inner)
    try:
        yield inner
    finally:
        _CURRENT.reset(token)

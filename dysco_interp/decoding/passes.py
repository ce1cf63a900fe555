"""Which forward pass of the decode loop is running, for hooks that must tell them apart.

DySCO runs up to two bridge passes per token (the partial pass that reads the QRHeads, then
the biased pass), so a hook on `blocks.L.attn.hook_pattern` fires twice per token. Inside any
hook, `current_pass()` says which pass called it: a frozen `Pass` (its kind, the schedule's
phase, the trace step it belongs to, the layers it runs, the method it decodes), or None
outside the decode loop. The bridge backend announces each pass (`running`); the loop says
where in the schedule it is (`scheduled`).
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Iterator, Literal

PassKind = Literal["prefill", "plain", "partial", "biased", "reuse"]
PassPhase = Literal["prefill", "context-warmup", "intervention-warmup", "decode"]


@dataclass(frozen=True)
class Pass:
    """One forward pass of the decode loop.

    Attributes:
        kind: "prefill" (the prompt up to the warm-up tokens, in chunks of `runtime.DEFAULT_CHUNK`
            tokens), "plain" (the whole model, no bias: context warm-up, vanilla and UniAttnS
            steps), "partial" (layers 0..L*, no bias, the cache left as it was: DySCO's read),
            "biased" (the whole model with log(beta) on the selected keys) or "reuse"
            (dysco-reuse's one pass: unbiased up to L*, biased after).
        phase: "prefill", or the phase of the trace step it belongs to ("context-warmup",
            "intervention-warmup", "decode").
        step: that step's index in `result.trace.steps` (None for the prefill).
        position: absolute position of the first token fed.
        n_tokens: tokens fed (the prefix's length for the prefill, else 1).
        layers: the layers it runs (hooks of later layers do not fire).
        method: the name of the method being decoded (the configs' key in `compare_methods`);
            None for a prefill that several methods share.
    """

    kind: PassKind
    phase: PassPhase
    step: int | None
    position: int
    n_tokens: int
    layers: range
    method: str | None


@dataclass(frozen=True)
class _Where:
    method: str | None = None
    phase: PassPhase = "prefill"
    step: int | None = None


_NOWHERE = _Where()
_WHERE: ContextVar[_Where | None] = ContextVar("dysco_schedule", default=None)
_CURRENT: ContextVar[Pass | None] = ContextVar("dysco_pass", default=None)


def current_pass() -> Pass | None:
    """The pass running now (call it from a hook), or None outside the decode loop."""
    return _CURRENT.get()


@contextlib.contextmanager
def scheduled(*, method: str | None = None, phase: PassPhase | None = None, step: int | None = None,
              keep_method: bool = False) -> Iterator[None]:
    """While open, passes belong to this method (or the enclosing one, with `keep_method`),
    phase and trace step."""
    outer = _WHERE.get() or _NOWHERE
    where = _Where(outer.method if keep_method else method, phase or "prefill", step)
    token = _WHERE.set(where)
    try:
        yield
    finally:
        _WHERE.reset(token)


@contextlib.contextmanager
def running(kind: PassKind, position: int, n_tokens: int, layers: range) -> Iterator[Pass]:
    """While open, `current_pass()` is this pass (a backend wraps each forward in it)."""
    where = _WHERE.get() or _NOWHERE
    phase: PassPhase = "prefill" if kind == "prefill" else where.phase
    step = None if kind == "prefill" else where.step
    this = Pass(kind, phase, step, position, n_tokens, layers, where.method)
    token = _CURRENT.set(this)
    try:
        yield this
    finally:
        _CURRENT.reset(token)

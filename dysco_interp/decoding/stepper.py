"""The `Stepper`: one method fed one token per row on a backend, each step recorded.

The decode loop (`loop.py`) drives it through the schedule; a benchmark or a custom schedule
drives it directly, one step at a time, from a state the backend prefilled.
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from dysco_interp.decoding.backends import Backend, DecodeState, StepOutput, raise_fault
from dysco_interp.decoding.config import DecodingConfig
from dysco_interp.decoding.methods import Method, Selector, method_for
from dysco_interp.decoding.passes import scheduled
from dysco_interp.decoding.plan import PassPlan, Read, ReadOut
from dysco_interp.decoding.prompts import PromptBatch
from dysco_interp.decoding.relevance import Selection
from dysco_interp.decoding.results import CONTEXT_WARMUP, DECODE, Phase, StepRecord
from dysco_interp.decoding.span_mass import SpanMass
from dysco_interp.decoding.template import extend_mask
from dysco_interp.errors import ConfigError, MethodExitError
from dysco_interp.heads import HeadSet

OnRead = Callable[[int, ReadOut], None]  # (trace step, what the read-out gave)


@contextlib.contextmanager
def method_code(name: str) -> Iterator[None]:
    """Around a method's own code (a researcher's, run mid-decode): `sys.exit` there becomes a
    MethodExitError, so a run never ends as if it had finished."""
    try:
        yield
    except SystemExit as e:
        raise MethodExitError(f"method {name!r} called sys.exit({e.code!r}) while decoding; a method cannot end "
                              "the run: raise an exception to stop it") from None


class Stepper:
    """Feeds one token per row under one method and records what each step selected.

    Drive it one step at a time from a prefilled state (`Backend.prefill`):
    `context_warmup(state, tokens)` for the warm-up tokens (relevance only), then
    `step(state, tokens, phase)` for the rest. Both return the float32 logits `[B, vocab]`
    and one `StepRecord` per row. Each call is one trace step: `passes.current_pass()` gives
    its index (`n_steps` before the call) and phase to the hooks that its passes run.

    Args:
        backend: where the passes run.
        config: the method and its parameters.
        batch: the prompts' rows (pads and template tokens are never selected).
        span_mass: per row, named spans whose relevance mass each record reports (or None).
        heads: the QRHeads (H*) for the methods that read heads.
        read: a read (`plan.Read`: any heads, their rows or span mass) added to every pass
            that writes the cache, whatever the method; `last_read` holds the latest one's result,
            a span-mass read lands in each record's `read_mass`.
        on_read: called with (trace step, `ReadOut`) after each such pass.
    """

    def __init__(self, backend: Backend, config: DecodingConfig, batch: PromptBatch,
                 span_mass: Sequence[SpanMass | None] | None = None, heads: HeadSet | None = None,
                 read: Read | None = None, on_read: OnRead | None = None):
        self.backend, self.config, self.batch = backend, config, batch
        self.read, self.on_read = read, on_read
        self.last_read: ReadOut | None = None
        model = backend.model
        # on the device once, with room for every generated key (never excluded): each step slices it
        excluded = extend_mask(batch.never_selected(config.parameter("template_masking")),
                               batch.width + config.max_new_tokens + 1).to(backend.model.device)
        with method_code(config.method):
            self.heads = config.strategy.heads_for(config, model, heads)
            self.method: Method = method_for(config, self.heads, model.spec)
            self.method.begin(model, batch, excluded)
        # a method written before step lost its selector argument still runs, for one release
        self.old_step = len(inspect.signature(self.method.step).parameters) >= 3
        if self.old_step:
            warnings.warn(f"method {config.method!r}: step(run, n_keys, selector) is deprecated and goes in the next "
                          "release; write step(run, n_keys) and use self.selector", DeprecationWarning, stacklevel=2)
        self.span_mass = span_mass
        self.n_steps = 0  # steps fed so far: the trace index of the next one

    @property
    def selector(self) -> Selector | None:
        """The method's running relevance and selection (None for a method that reads no heads)."""
        return self.method.selector

    @property
    def relevance(self) -> torch.Tensor | None:
        """Each row's running relevance, float32 `[B, n_keys]` (None before the first read)."""
        return None if self.selector is None else self.selector.relevance

    @relevance.setter
    def relevance(self, value: torch.Tensor) -> None:
        if self.selector is None:
            raise ConfigError(f"method {self.config.method!r} keeps no relevance")
        self.selector.relevance = value

    def select(self, n_keys: int) -> Selection:
        """The selection the current relevance gives over the first `n_keys` keys."""
        if self.selector is None:
            raise ConfigError(f"method {self.config.method!r} selects nothing")
        return self.selector.select(n_keys)

    @property
    def runs_ahead(self) -> bool:
        """Whether a decode loop may queue the next step before it reads this one's token: the
        backend runs ahead (`Backend.runs_ahead`) and no `on_read` would see a step that is
        thrown away."""
        return self.backend.runs_ahead and self.on_read is None

    def context_warmup(self, state: DecodeState, tokens: torch.Tensor) -> tuple[torch.Tensor, list[StepRecord]]:
        """One warm-up token per row: no bias; the QRHeads' read updates relevance."""
        n_cached = state.n_keys
        with scheduled(phase=CONTEXT_WARMUP, step=self.n_steps, keep_method=True), method_code(self.config.method):
            out = self._runner(state, tokens)(self.method.warmup_plan)
        self.n_steps += 1
        with method_code(self.config.method):
            self.method.warmed(out.attention)
        assert out.logits is not None
        return out.logits, self._pending(CONTEXT_WARMUP, n_cached, tokens, None).records()

    def step(self, state: DecodeState, tokens: torch.Tensor,
             phase: Phase = DECODE) -> tuple[torch.Tensor, list[StepRecord]]:
        """One token per row with the method's full step."""
        logits, pending = self.launch(state, tokens, phase)
        return logits, pending.records()

    def launch(self, state: DecodeState, tokens: torch.Tensor,
               phase: Phase = DECODE) -> tuple[torch.Tensor, PendingRecords]:
        """`step` without waiting for the device: the step is queued, and its records are read
        when asked for (`PendingRecords.records`). A loop that queues the next step first keeps
        the device busy while the host reads them and prepares that step."""
        n_cached = state.n_keys
        with scheduled(phase=phase, step=self.n_steps, keep_method=True), method_code(self.config.method):
            run = self._runner(state, tokens)
            if self.old_step:
                logits, selection = self.method.step(run, n_cached + 1, self.selector)  # type: ignore[call-arg]
            else:
                logits, selection = self.method.step(run, n_cached + 1)
            own = self.method.step_values()
        self.n_steps += 1
        return logits, self._pending(phase, n_cached, tokens, selection, own)

    def _runner(self, state: DecodeState, tokens: torch.Tensor) -> Callable[[PassPlan], StepOutput]:
        """One pass of this step's tokens; the pass that keeps the token also makes `read`."""
        def run(plan: PassPlan) -> StepOutput:
            if self.read is None or not plan.write_cache:
                return self.backend.run(state, tokens, plan)
            out = self.backend.run(state, tokens, plan.with_read(self.read))
            self.last_read = out.reads[-1]
            if self.on_read is not None:
                self.on_read(self.n_steps, self.last_read)
            return out

        return run

    def _pending(self, phase: Phase, n_cached: int, tokens: torch.Tensor, selection: Selection | None,
                 own: list[dict] | None = None) -> PendingRecords:
        """The step's records, their device values copied now: the buffers they come from are
        the next step's by the time a loop that runs ahead reads them."""
        n_rows = len(self.batch.pads)
        if own is not None and (len(own) != n_rows or not all(isinstance(v, dict) for v in own)):
            raise ConfigError(f"method {self.config.method!r}: step_values() must return one dict per row "
                              f"({n_rows}), got {type(own).__name__}")
        span_mass = None if self.last_read is None else self.last_read.span_mass
        values = HostRead(self.backend.take_fault(), tokens, None if selection is None else selection.count,
                          None if selection is None else selection.mass, span_mass)
        positions = selection.mask.clone() if selection is not None and self.config.record_positions else None
        relevance = None
        if self.span_mass is not None and self.relevance is not None:
            relevance = self.relevance.clone()
        return PendingRecords(phase, n_cached, list(self.batch.pads), values,
                              None if span_mass is None else tuple(span_mass.shape), selection is not None,
                              positions, relevance, self.span_mass, own)


@dataclass
class PendingRecords:
    """A queued step's records (`Stepper.launch`): `records()` reads them from the device, waiting
    for that step only, and raises the fault its biases or keeps had (`Backend.take_fault`)."""

    phase: Phase
    n_cached: int
    pads: list[int]
    values: HostRead  # fault bits, tokens, selection counts and masses, span mass
    span_shape: tuple[int, ...] | None  # the span-mass read's [B, heads, spans]
    selected: bool
    positions: torch.Tensor | None  # the selection's mask, when positions are recorded
    relevance: torch.Tensor | None  # the relevance, when named spans are reported
    span_masses: Sequence[SpanMass | None] | None
    own: list[dict] | None  # the method's own values per row
    _records: list[StepRecord] | None = field(default=None, init=False, repr=False)

    def records(self) -> list[StepRecord]:
        """One `StepRecord` per row (read once; later calls give the same list)."""
        if self._records is None:
            self._records = self._read()
        return self._records

    def _read(self) -> list[StepRecord]:
        fault, tokens, counts, masses, span_mass = self.values.values()
        raise_fault(0 if fault is None else int(fault[0]))
        assert tokens is not None
        pads = self.pads
        records = [StepRecord(self.phase, self.n_cached - pad, int(tok)) for pad, tok in zip(pads, tokens)]
        if self.own is not None:
            for rec, values in zip(records, self.own):
                rec.own = values
        if span_mass is not None:
            assert self.span_shape is not None
            n_heads, n_spans = self.span_shape[1], self.span_shape[2]
            per_row = n_heads * n_spans
            for i, rec in enumerate(records):
                row = span_mass[i * per_row:(i + 1) * per_row]
                rec.read_mass = [[round(m, 6) for m in row[h * n_spans:(h + 1) * n_spans]] for h in range(n_heads)]
        if self.selected:
            assert counts is not None and masses is not None
            for i, rec in enumerate(records):
                rec.n_selected, rec.nucleus_mass = int(counts[i]), round(float(masses[i]), 6)
                if self.positions is not None:
                    rec.selected = (self.positions[i].nonzero().flatten() - pads[i]).tolist()
        if self.relevance is not None and self.span_masses is not None:
            r = self.relevance.cpu()
            for i, rec in enumerate(records):
                spans = self.span_masses[i]
                if spans is not None:
                    rec.top_spans = spans.top_spans(r[i, pads[i]:])
        return records


class HostRead:
    """Device tensors' values on their way to the host, queued behind the work so far: `values()`
    waits for this copy only, not for work queued after it, so a step queued meanwhile keeps the
    device busy. The values are copied when the read is made; later writes to the tensors do not
    reach it.

    `values()` gives each tensor's values as a flat list (None stays None), the device's from
    one transfer: a step's record needs its fault bits, tokens and selection sizes, and each
    transfer of its own would be another wait (tens of microseconds at batch 1). Every value a
    float64 holds exactly: token ids and counts are integers far below 2**53, masses float32.
    """

    def __init__(self, *tensors: torch.Tensor | None):
        flat = [None if t is None else t.reshape(-1) for t in tensors]
        self.sizes = [None if t is None else t.numel() for t in flat]
        self.on_host = [t.tolist() if t is not None and t.device.type == "cpu" else None for t in flat]
        on_device = [t for t in flat if t is not None and t.device.type != "cpu"]
        self.event: torch.cuda.Event | None = None
        self.joined: torch.Tensor | None = None
        if not on_device:
            return
        device = on_device[0].device
        joined = torch.cat([t.to(device, torch.float64) for t in on_device])  # a copy, as of now
        if device.type != "cuda":
            self.joined = joined.cpu()
            return
        self.joined = torch.empty(joined.shape, dtype=joined.dtype, pin_memory=True)
        self.joined.copy_(joined, non_blocking=True)
        self.event = torch.cuda.Event()
        self.event.record(torch.cuda.current_stream(device))

    def values(self) -> list[list[float] | None]:
        if self.event is not None:
            self.event.synchronize()
        joined = [] if self.joined is None else self.joined.tolist()
        out: list[list[float] | None] = []
        at = 0
        for size, host in zip(self.sizes, self.on_host):
            if size is None:
                out.append(None)
            elif host is not None:
                out.append(host)
            else:
                out.append(joined[at:at + size])
                at += size
        return out

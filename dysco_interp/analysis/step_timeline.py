"""Where one profiled decoding step's wall time goes: before the device starts, device work by
kind, the device idle between its kernels, and the wait after the last one.

`torch.profiler`'s operator table sums each kernel's time; it cannot say how long the device
sat idle, which at batch 1 is a tenth of a step (the gaps between a CUDA graph's nodes, and the
host's work before the graph is launched). This reads the same profile as intervals on one
clock instead. The profiler slows the host's own work, so `host_before_ms` is an upper bound.

The idle time is split by gap length: a short gap (under `LONG_GAP_US`) is the device moving
from one queued kernel to the next (a CUDA graph's nodes, or kernels the host launched well
ahead); a long one is the device waiting for the host to launch the next kernel. The longest
gaps are listed with the kernels on either side, which names the host work they wait for.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

STEP_LABEL = "dysco_interp.step"  # the record_function range around the profiled step

# kernel name fragment -> kind (the first that matches; everything else is "other")
KINDS = (
    (("nvjet", "gemv", "gemm", "splitkreduce", "cublas", "cutlass"), "matmul"),
    (("sdpa", "flash", "fmha", "attention", "lean_reduction"), "attention"),
    (("memcpy", "memset"), "copy"),
)


LONG_GAP_US = 5.0  # a graph's node-to-node gap is 1-3 us on an H100/H200; a late launch is longer
N_LONGEST = 8


@dataclass(frozen=True)
class Span:
    name: str
    start_us: float
    end_us: float


def kernel_kind(name: str) -> str:
    low = name.lower()
    return next((kind for fragments, kind in KINDS if any(f in low for f in fragments)), "other")


def union_us(spans: Sequence[Span]) -> float:
    """The time covered by at least one span (overlapping kernels counted once)."""
    total, end = 0.0, float("-inf")
    for s in sorted(spans, key=lambda s: s.start_us):
        if s.end_us > end:
            total += s.end_us - max(s.start_us, end)
            end = s.end_us
    return total


def gaps(spans: Sequence[Span]) -> list[tuple[float, Span, Span]]:
    """The idle intervals between the spans' union: (length in us, the span that ended last
    before it, the span that starts it), in time order."""
    ordered = sorted(spans, key=lambda s: s.start_us)
    if not ordered:
        return []
    out, last = [], ordered[0]
    for s in ordered[1:]:
        if s.start_us > last.end_us:
            out.append((s.start_us - last.end_us, last, s))
        if s.end_us > last.end_us:
            last = s
    return out


def short_name(name: str, width: int = 60) -> str:
    return name if len(name) <= width else name[:width - 3] + "..."


def step_timeline(step: Span, device: Iterable[Span]) -> dict:
    """The step's wall time split into: the host's work before the first device activity, the
    device's busy time (by kind, overlaps counted once in the total), the idle time between its
    first and last activity, and the time from the last activity to the step's end."""
    spans = [s for s in device if s.end_us > step.start_us and s.start_us < step.end_us]
    wall = step.end_us - step.start_us
    if not spans:
        return {"wall_ms": round(wall / 1e3, 4), "device_spans": 0}
    first, last = min(s.start_us for s in spans), max(s.end_us for s in spans)
    busy = union_us(spans)
    idle = gaps(spans)
    kinds: dict[str, list[Span]] = {}
    for s in spans:
        kinds.setdefault(kernel_kind(s.name), []).append(s)
    return {
        "wall_ms": round(wall / 1e3, 4),
        "host_before_ms": round((first - step.start_us) / 1e3, 4),
        "device_busy_ms": round(busy / 1e3, 4),
        "device_idle_between_ms": round((last - first - busy) / 1e3, 4),
        "idle_in_short_gaps_ms": round(sum(g for g, _, _ in idle if g < LONG_GAP_US) / 1e3, 4),
        "idle_in_long_gaps_ms": round(sum(g for g, _, _ in idle if g >= LONG_GAP_US) / 1e3, 4),
        "long_gaps": sum(g >= LONG_GAP_US for g, _, _ in idle),
        "longest_gaps": [{"us": round(g, 2), "after": short_name(a.name), "before": short_name(b.name)}
                         for g, a, b in sorted(idle, key=lambda t: -t[0])[:N_LONGEST]],
        "after_last_ms": round((step.end_us - last) / 1e3, 4),
        "device_spans": len(spans),
        "busy_by_kind_ms": {k: round(union_us(v) / 1e3, 4) for k, v in sorted(kinds.items())},
        "spans_by_kind": {k: len(v) for k, v in sorted(kinds.items())},
    }


def profiled_timeline(events) -> dict | None:
    """`step_timeline` of a `torch.profiler` run's events (`prof.events()`) around one
    `STEP_LABEL` range; None when the range or the device's events are missing (a CPU run)."""
    from torch.autograd import DeviceType

    step, device = None, []
    for e in events:
        span = Span(e.name, e.time_range.start, e.time_range.end)
        on_device = e.device_type == DeviceType.CUDA
        if e.name == STEP_LABEL:  # the range on the host; its annotation on the device is no work
            step = step if on_device else span
        elif on_device:
            device.append(span)
    if step is None or not device:
        return None
    return step_timeline(step, device)

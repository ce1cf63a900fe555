"""Data-parallel evaluation throughput: one `evaluate` command under torchrun with 1, 2, 4, ...
processes, each run into a fresh store, with its records compared to the one-process run's.

Two speeds per run:
- end to end: instances over the run's wall time, process start, model load and compilation
  included, as a user waits for them;
- decoding: instances over the busiest rank's decoding time (the sum of its records' prefill
  and decode times; each rank's instances are known from the round-robin share), what more
  GPUs buy once every rank is running. At batch size 1 a record's times are its own.
An untimed one-instance run first fills the compilation caches, so no timed run pays for them
and later runs do not profit from an earlier one's.

A run's records must equal the one-process records field for field, apart from wall-clock times:
a speed-up that changed a result would not count.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from dysco_interp.atomic import atomic_open
from dysco_interp.distributed import World
from dysco_interp.errors import ConfigError
from dysco_interp.stores.store import read_store


def torchrun_command(n_processes: int, evaluate_args: Sequence[str]) -> list[str]:
    """`python -m torch.distributed.run --standalone --nproc-per-node N -m dysco_interp.cli -- evaluate ...`."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n_processes),
            "-m", "dysco_interp.cli", "--", "evaluate", *evaluate_args]


def comparable(records: Sequence[dict]) -> list[dict]:
    """Records without their wall-clock times and their provenance (when, where, by what command:
    `stores.provenance`), the only fields two runs may differ in."""
    return [{**{k: v for k, v in r.items() if k != "run"},
             "timings": {k: v for k, v in (r.get("timings") or {}).items() if not k.endswith("_s")}}
            for r in records]


def seconds_path(out: Path) -> Path:
    return out.with_suffix(".seconds")


def timed_run(n_processes: int, evaluate_args: Sequence[str], out: Path,
              reuse: bool = False) -> tuple[float, list[dict]]:
    """Seconds and records of one run into the fresh store `out` (a failed run is a ConfigError
    carrying its last lines). With `reuse`, a finished earlier run (its store and the seconds
    recorded beside it) is read instead, so a sweep too long for one sitting can go in pieces."""
    if reuse and out.exists() and seconds_path(out).exists():
        contents = read_store(out)
        if contents is not None:
            return float(seconds_path(out).read_text()), contents.records
    if out.exists():
        raise ConfigError(f"{out} exists: each run writes a fresh store")
    t0 = time.perf_counter()
    done = subprocess.run(torchrun_command(n_processes, [*evaluate_args, "--out", str(out)]), capture_output=True,
                          text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise ConfigError(f"the run with {n_processes} process(es) failed ({done.returncode}): {tail}")
    contents = read_store(out)
    if contents is None:
        raise ConfigError(f"the run with {n_processes} process(es) wrote no store at {out}")
    recorded = f"{seconds:.3f}"
    with atomic_open(seconds_path(out)) as f:
        f.write(recorded + "\n")
    # the value as recorded: a run read back later must report the very same seconds (rounding
    # the unrounded time again can land on the other side of a half)
    return float(recorded), contents.records


BUSY_TIMINGS = ("prefill_s", "warmup_s", "decode_s")


def busiest_rank_seconds(records: Sequence[dict], n_processes: int) -> float:
    """The decoding time of the busiest rank of a run from a fresh store: rank r decoded every
    n-th instance from the r-th, in data order (`World.share`), all methods of each."""
    order = list(dict.fromkeys(r["instance"] for r in records))
    rank = {instance: r for r in range(n_processes) for instance in World(r, n_processes).share(order)}
    busy = [0.0] * n_processes
    for r in records:
        timings = r.get("timings") or {}
        busy[rank[r["instance"]]] += sum(float(timings.get(k, 0.0)) for k in BUSY_TIMINGS)
    return max(busy)


def scaling(n_processes: Sequence[int], evaluate_args: Sequence[str], work_dir: Path, reuse: bool = False) -> dict:
    """Each process count's run: its instances per second end to end and decoding, its speed-ups
    over the first count (which should be 1), and whether its records equal the first run's.
    `reuse`: runs already finished in `work_dir` are read, not repeated (`timed_run`)."""
    if not n_processes or any(n < 1 for n in n_processes):
        raise ConfigError(f"process counts must be integers >= 1, got {list(n_processes)}")
    work_dir.mkdir(parents=True, exist_ok=True)
    timed_run(1, [*evaluate_args, "--limit", "1"], work_dir / "warmup.jsonl", reuse)
    rows: list[dict] = []
    reference: list[dict] | None = None
    for n in n_processes:
        seconds, records = timed_run(n, evaluate_args, work_dir / f"results_{n}.jsonl", reuse)
        instances = len({r["instance"] for r in records})
        busy = busiest_rank_seconds(records, n)
        if reference is None:
            reference = comparable(records)
        row = {"processes": n, "seconds": round(seconds, 2), "instances": instances,
               "records": len(records), "instances_per_s": round(instances / seconds, 4),
               "busiest_rank_decoding_s": round(busy, 2), "decoding_instances_per_s": round(instances / busy, 4),
               "records_equal_to_first": comparable(records) == reference}
        first = rows[0] if rows else row
        row["speedup"] = round(row["instances_per_s"] / first["instances_per_s"], 3)
        row["decoding_speedup"] = round(row["decoding_instances_per_s"] / first["decoding_instances_per_s"], 3)
        rows.append(row)
        print(f"{n} process(es): {seconds:.1f} s, {row['instances_per_s']:.3f} instances/s "
              f"(speed-up {row['speedup']:.2f}x); decoding {row['decoding_instances_per_s']:.3f} instances/s "
              f"(speed-up {row['decoding_speedup']:.2f}x); records equal: {row['records_equal_to_first']}",
              flush=True)
    return {"rows": rows, "all_records_equal": all(r["records_equal_to_first"] for r in rows)}

"""Data-parallel evaluation throughput: one `evaluate` command under torchrun with 1, 2, 4, ...
processes, each run into a fresh store, timed end to end (process start and model load included,
as a user waits for them), with its records compared to the one-process run's.

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

from dysco_interp.errors import ConfigError
from dysco_interp.experiments.store import read_store


def torchrun_command(n_processes: int, evaluate_args: Sequence[str]) -> list[str]:
    """`python -m torch.distributed.run --standalone --nproc-per-node N -m dysco_interp.cli -- evaluate ...`."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n_processes),
            "-m", "dysco_interp.cli", "--", "evaluate", *evaluate_args]


def comparable(records: Sequence[dict]) -> list[dict]:
    """Records without their wall-clock times, the only fields two runs may differ in."""
    return [{**r, "timings": {k: v for k, v in (r.get("timings") or {}).items() if not k.endswith("_s")}}
            for r in records]


def timed_run(n_processes: int, evaluate_args: Sequence[str], out: Path) -> tuple[float, list[dict]]:
    """Seconds and records of one run into the fresh store `out` (a failed run is a ConfigError
    carrying its last lines)."""
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
    return seconds, contents.records


def scaling(n_processes: Sequence[int], evaluate_args: Sequence[str], work_dir: Path) -> dict:
    """Each process count's run, its instances per second and its speed-up over the first count
    (which should be 1), and whether its records equal the first run's."""
    if not n_processes or any(n < 1 for n in n_processes):
        raise ConfigError(f"process counts must be integers >= 1, got {list(n_processes)}")
    work_dir.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    reference: list[dict] | None = None
    for n in n_processes:
        seconds, records = timed_run(n, evaluate_args, work_dir / f"results_{n}.jsonl")
        instances = len({r["instance"] for r in records})
        if reference is None:
            reference = comparable(records)
        row = {"processes": n, "seconds": round(seconds, 2), "instances": instances,
               "records": len(records), "instances_per_s": round(instances / seconds, 4),
               "records_equal_to_first": comparable(records) == reference}
        row["speedup"] = round(row["instances_per_s"] / rows[0]["instances_per_s"], 3) if rows else 1.0
        rows.append(row)
        print(f"{n} process(es): {seconds:.1f} s, {row['instances_per_s']:.3f} instances/s, "
              f"speed-up {row['speedup']:.2f}x, records equal: {row['records_equal_to_first']}", flush=True)
    return {"rows": rows, "all_records_equal": all(r["records_equal_to_first"] for r in rows)}

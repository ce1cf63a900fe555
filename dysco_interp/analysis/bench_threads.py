"""CPU time under a competing load: one `generate` run, idle and beside busy processes, with
torch's own thread count (the old behaviour) and with the free-cores default (`threads`).

Each run is a fresh process, timed whole (imports, model load, prefill, decoding) as a user
pays for it: its user + system CPU seconds come from the kernel when it is reaped (`os.wait4`),
so the competing processes, reaped apart, never count. The competing load is `n` busy loops,
each bounded in time, started before the loaded runs and stopped after them. The two settings
alternate within each phase, so a drift in the machine's other load touches both alike.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from dysco_interp.errors import ConfigError
from dysco_interp.threads import ENV

# bounded, so a driver killed before its cleanup leaves nothing spinning for long
BUSY_LOOP = "import sys, time\nend = time.time() + float(sys.argv[1])\nwhile time.time() < end:\n    pass\n"


def prompt_text(n_lines: int) -> str:
    """A fixed key-value list and a question about it: the same prompt for every run."""
    lines = [f"Key {i:03d} holds the value {i * 37 % 1009}." for i in range(n_lines)]
    return "\n".join([*lines, f"Which value does key {n_lines // 3:03d} hold? Then list the next five keys."])


def clean_env() -> dict[str, str]:
    """This environment without OMP_NUM_THREADS, so each run's default is its own."""
    return {k: v for k, v in os.environ.items() if k != ENV}


def torch_default_threads() -> int:
    """torch's thread count in a fresh process without OMP_NUM_THREADS: what the commands used
    before they chose their own."""
    done = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                          capture_output=True, text=True, env=clean_env(), check=True)
    return int(done.stdout.strip())


def generate_command(model: str, prompt_file: Path, max_new_tokens: int, threads: int | None) -> list[str]:
    """`dysco-interp generate --json` on the CPU, vanilla decoding; --threads only when given."""
    return [sys.executable, "-m", "dysco_interp.cli", "generate", "--model", model, "--prompt-file", str(prompt_file),
            "--max-new-tokens", str(max_new_tokens), "--method", "vanilla", "--device", "cpu", "--json",
            *(["--threads", str(threads)] if threads is not None else [])]


def timed_child(command: Sequence[str], json_out: bool = True) -> dict:
    """Wall seconds, user and system CPU seconds of one process, and its JSON output (a `generate
    --json` run's threads, speed and token counts) unless `json_out` is False."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(command, stdout=out, stderr=err, env=clean_env())
        # reaped here, not by Popen, for the rusage of this child alone
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode != 0:
        tail = " | ".join(stderr.decode(errors="replace").strip().splitlines()[-3:])
        raise ConfigError(f"the {'generate' if json_out else 'timed'} run failed ({proc.returncode}): {tail}")
    times = {"wall_s": round(wall, 3), "user_s": round(usage.ru_utime, 3), "sys_s": round(usage.ru_stime, 3),
             "cpu_s": round(usage.ru_utime + usage.ru_stime, 3)}
    if not json_out:
        return times
    result = json.loads(stdout.decode().strip().splitlines()[-1])
    return {**times, "threads": result.get("threads"),
            "decode_tok_per_s": result.get("decode_tok_per_s"), "n_prompt": result.get("n_prompt"),
            "n_new": result.get("n_new")}


@contextmanager
def busy_load(n: int, seconds: float) -> Iterator[list[subprocess.Popen]]:
    """`n` busy-loop processes for at most `seconds`, stopped when the block ends."""
    procs = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP, str(seconds)]) for _ in range(n)]
    try:
        yield procs
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()


def median(values: Sequence[float]) -> float:
    return round(statistics.median(values), 3)


def summarise(rows: Sequence[dict], settings: Sequence[str]) -> dict:
    """Per setting: median CPU and wall seconds idle and loaded, and their loaded/idle ratios."""
    out = {}
    for setting in settings:
        by_phase = {phase: [r for r in rows if r["setting"] == setting and r["phase"] == phase]
                    for phase in ("idle", "loaded")}
        cpu = {phase: median([r["cpu_s"] for r in rs]) for phase, rs in by_phase.items()}
        wall = {phase: median([r["wall_s"] for r in rs]) for phase, rs in by_phase.items()}
        out[setting] = {"idle_cpu_s": cpu["idle"], "loaded_cpu_s": cpu["loaded"],
                        "loaded_over_idle_cpu": round(cpu["loaded"] / cpu["idle"], 3),
                        "idle_wall_s": wall["idle"], "loaded_wall_s": wall["loaded"],
                        "loaded_over_idle_wall": round(wall["loaded"] / wall["idle"], 3),
                        "threads": sorted({r["threads"] for r in by_phase["loaded"] + by_phase["idle"]})}
    return out


def block_command(block: str, threads: int | None) -> list[str]:
    """A Python block run as a fresh process, as a user pastes it; with `threads`, after
    `torch.set_num_threads(threads)`, which `load_model` keeps as the user's own count."""
    setup = f"import torch\ntorch.set_num_threads({threads})\n" if threads is not None else ""
    return [sys.executable, "-c", setup + block]


def idle_then_loaded(settings: dict[str, int | None], run: Callable[[int | None], dict], repeats: int,
                     n_busy: int, warmup_s: float, log=print) -> dict:
    """`run(threads)` for each setting, `repeats` times alternating, idle and then beside `n_busy`
    busy loops (after `warmup_s` for the load average to see them); an untimed run first warms the
    file cache, so the first timed run does not pay for reading the weights from disk."""
    run(None)
    rows = []

    def phase(name: str) -> None:
        for rep in range(repeats):
            for setting, threads in settings.items():
                load = os.getloadavg()[0]
                row = {"phase": name, "setting": setting, "repeat": rep, "loadavg_before": round(load, 2),
                       "threads": threads, **run(threads)}
                log(f"{name:6} {setting:17} {row['threads']} threads: cpu {row['cpu_s']:.1f}s, "
                    f"wall {row['wall_s']:.1f}s (load {load:.2f})")
                rows.append(row)

    phase("idle")
    # bounded well past the loaded phase's expected length; stopped as soon as it ends
    with busy_load(n_busy, warmup_s + 900):
        time.sleep(warmup_s)
        phase("loaded")
    return {"torch_default_threads": settings["torch default"], "cores": os.cpu_count(), "n_busy": n_busy,
            "warmup_s": warmup_s, "repeats": repeats, "summary": summarise(rows, list(settings)), "rows": rows}


def measure_block(block: str, repeats: int, n_busy: int, warmup_s: float, log=print) -> dict:
    """The README's Python block as written (load_model's thread rule) and with torch's own count
    set by hand (as before load_model applied the rule), idle and loaded (`idle_then_loaded`)."""
    settings = {"torch default": torch_default_threads(), "load_model's rule": None}
    return idle_then_loaded(settings, lambda threads: timed_child(block_command(block, threads), json_out=False),
                            repeats, n_busy, warmup_s, log)


def measure(model: str, prompt_file: Path, max_new_tokens: int, repeats: int, n_busy: int,
            warmup_s: float, log=print) -> dict:
    """`generate` with torch's own thread count and with the free-cores default, idle and loaded
    (`idle_then_loaded`)."""
    settings = {"torch default": torch_default_threads(), "free cores": None}

    def run(threads: int | None) -> dict:
        return timed_child(generate_command(model, prompt_file, max_new_tokens, threads))

    out = idle_then_loaded(settings, run, repeats, n_busy, warmup_s, log)
    return {**out, "max_new_tokens": max_new_tokens}

"""How many torch CPU threads a command uses: the cores free to this process, unless told.

torch starts one thread per physical core whatever else runs; on a shared machine those
threads wait on each other and on the other processes, and a run spent about 6 times the CPU
time it needs idle. The rule, in `choose_threads`:
- `--threads N` wins;
- else `OMP_NUM_THREADS` (torch's own setting, which torchrun sets to 1 per rank);
- else the cores this process may run on (`os.sched_getaffinity`), less what other processes
  use now, never more than the machine has, never below 1.

`load_model` applies the same rule from Python (`threads_for_load`) unless the user chose a
count: an argument, OMP_NUM_THREADS, or torch's own `torch.set_num_threads`, seen as a count that
is neither torch's default (`torch_default_threads`) nor the one this rule set last.

Light: torch is imported only by `apply_threads` and `threads_for_load`, so the argument parser
does not pay for it.
"""

from __future__ import annotations

import glob
import math
import os
import time
from dataclasses import dataclass

from dysco_interp.errors import ConfigError

ENV = "OMP_NUM_THREADS"
TOPOLOGY_GLOB = "/sys/devices/system/cpu/cpu[0-9]*/topology"
# what `threads_for_load` calls a count the user set with torch.set_num_threads
TORCH_SETTING = "torch.set_num_threads"
LOADAVG_FILE = "/proc/loadavg"
# the 1-minute load average is an exponential average over this many seconds
LOADAVG_SECONDS = 60.0


@dataclass(frozen=True)
class ThreadChoice:
    """A thread count and what set it: "--threads", "OMP_NUM_THREADS" or "free cores"."""

    n: int
    source: str

    def describe(self) -> str:
        return f"{self.n} threads ({self.source})"


def allowed_cores() -> int:
    """The cores this process may run on (its CPU affinity; the machine's count where unknown)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def other_load() -> float:
    """Runnable processes other than this one: the larger of the 1-minute load average and the
    runnable tasks now (Linux), each without this process's share.

    The average alone lags a load that started seconds ago; the count now alone misses a load
    that happens to sleep this instant. Our own share of the average is what being runnable
    for our CPU time so far adds to it, 1 - exp(-t / 60)."""
    try:
        average = os.getloadavg()[0]
    except (AttributeError, OSError):
        average = 0.0
    own = 1.0 - math.exp(-time.process_time() / LOADAVG_SECONDS)
    now = 0.0
    try:
        with open(LOADAVG_FILE, encoding="ascii") as f:
            running = f.read().split()[3].split("/")[0]
        now = float(int(running) - 1)  # the reading process is runnable while it reads
    except (OSError, IndexError, ValueError):
        pass
    return max(0.0, average - own, now)


def free_cores(allowed: int, machine: int, load: float) -> int:
    """`allowed` cores, less those that `load` runnable processes take of the machine's
    `machine` cores (rounded to the nearest core), at least 1."""
    free = math.floor(machine - load + 0.5)
    return max(1, min(allowed, machine, free))


def env_threads(environ=None) -> int | None:
    """OMP_NUM_THREADS as a count (its first entry, as OpenMP reads a nested list), None when
    unset or empty; a ConfigError when it is not a positive integer."""
    text = (os.environ if environ is None else environ).get(ENV, "").strip()
    if not text:
        return None
    first = text.split(",")[0].strip()
    if not first.isdigit() or int(first) < 1:
        raise ConfigError(f"{ENV}={text!r} is not a positive integer; set a thread count or unset it")
    return int(first)


def choose_threads(flag: int | None = None, environ=None) -> ThreadChoice:
    """The torch CPU thread count of a command: `flag` (--threads), else OMP_NUM_THREADS, else
    the free cores (see the module's docstring)."""
    if flag is not None:
        return ThreadChoice(flag, "--threads")
    env = env_threads(environ)
    if env is not None:
        return ThreadChoice(env, ENV)
    return ThreadChoice(free_cores(allowed_cores(), os.cpu_count() or 1, other_load()), "free cores")


# the count this process's rule set last: a count equal to it is the rule's, not the user's
_applied: list[ThreadChoice] = []


def apply_threads(flag: int | None = None) -> ThreadChoice:
    """Set torch's intra-op thread count by `choose_threads` and return the choice."""
    import torch

    choice = choose_threads(flag)
    if torch.get_num_threads() != choice.n:
        torch.set_num_threads(choice.n)
    _applied[:] = [choice]
    return choice


def physical_cores(pattern: str = TOPOLOGY_GLOB) -> int:
    """The machine's physical cores as Linux's CPU topology lists them (one per package and core
    id); the logical count where the topology cannot be read."""
    logical = os.cpu_count() or 1
    cores = set()
    for folder in glob.glob(pattern):
        try:
            with open(os.path.join(folder, "physical_package_id"), encoding="ascii") as f:
                package = f.read().strip()
            with open(os.path.join(folder, "core_id"), encoding="ascii") as f:
                cores.add((package, f.read().strip()))
        except OSError:
            return logical
    return len(cores) if 0 < len(cores) <= logical else logical


def torch_default_threads(environ=None) -> int:
    """The count torch starts with by itself: OMP_NUM_THREADS or MKL_NUM_THREADS where set (as
    torch reads them), else one thread per physical core."""
    env = os.environ if environ is None else environ
    for name in (ENV, "MKL_NUM_THREADS"):
        first = env.get(name, "").split(",")[0].strip()
        if first.isdigit() and int(first) > 0:
            return int(first)
    return physical_cores()


def user_set(current: int, default: int, applied: int | None) -> bool:
    """Whether torch's count `current` is the user's own (torch.set_num_threads): neither torch's
    `default` nor the count this rule set last (`applied`)."""
    return current != default and current != applied


def threads_for_load(flag: int | None = None) -> ThreadChoice:
    """The thread rule as `load_model` applies it: `flag` wins, then OMP_NUM_THREADS; a count the
    user set with torch.set_num_threads is kept, and so is one this rule already set (the
    command line sets it before loading); else the free cores."""
    import torch

    current = torch.get_num_threads()
    applied = _applied[0] if _applied else None
    if flag is None and env_threads() is None:
        if user_set(current, torch_default_threads(), applied.n if applied else None):
            return ThreadChoice(current, TORCH_SETTING)
        if applied is not None and current == applied.n:
            return applied
    return apply_threads(flag)

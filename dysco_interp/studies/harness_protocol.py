"""The steering harness's protocol: every attention-steering method on one set of tasks, lengths,
splits and rules, fixed here before any dev run (git order is the evidence).

- Tasks: Path Traversal and MRCR-style made with `DEV_SEED` for the dev split and `TEST_SEED`
  for the test split; Needle QA's test split uses `NEEDLE_TEST_SEED`, whose needles no head
  detection has seen (the shipped QRHeads were detected on Needle QA seed 0).
- Lengths: `LENGTHS` for both Qwen2.5-Coder models; the `N_LONG` best methods of the 1.5B also at
  `LONG_LENGTH` with YaRN factor `LONG_YARN`, "best" by `LONG_RULE` on the dev choices
  (`long_methods`), so the test split never picks what runs at 127K.
- Parameters: each method has a grid of at most `MAX_GRID` points (`GRIDS`, gentlest first), each
  point a set of its `Params` values over the method's defaults. `choose` picks one point per
  model and method on the dev split by `RULE`; vanilla is the baseline of every pair.
- Test: `TEST_N` instances per length, teacher forced and free, each method at its dev choice,
  paired with vanilla (counts, exact p, BH q over the whole table).

A method of one's own joins with a grid of its own (`grid_of`, `check_grid`) under the same rule.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dysco_interp.analysis.method_key import MethodKey, method_key
from dysco_interp.decoding.config import DecodingConfig
from dysco_interp.decoding.methods import PAPER_TAUS
from dysco_interp.errors import ConfigError
from dysco_interp.studies.budget_choice import mean_ranks_over_cells, paired_gains, primary_metrics
from dysco_interp.tasks.registry import get_task

TASKS = ("path_traversal", "mrcr", "needle_qa")
LENGTHS = ("2k", "8k", "31k")
LONG_LENGTH, LONG_MODEL, LONG_YARN, N_LONG = "127k", "qwen2.5-coder-1.5b", 4, 3
DEV_SEED, TEST_SEED, NEEDLE_TEST_SEED = 1, 0, 2
DEV_N = {"2k": 30, "8k": 30, "31k": 16}
TEST_N = {"2k": 100, "8k": 100, "31k": 50, LONG_LENGTH: 20}
MAX_GRID = 6
RULE = ("per model and method: the grid point with the lowest mean rank of its teacher-forced paired gain over "
        "vanilla on each task's primary metric across the dev cells (task x length), among the points run on "
        "every dev cell; a tie goes to the point listed first (the gentlest)")

Point = Mapping[str, Any]
# method -> its grid (its Params values over the method's defaults), gentlest first
GRIDS: dict[str, tuple[Point, ...]] = {
    # the paper's own grid, as every table that compares against UniAttnS chooses on it
    "uniattns": tuple({"tau": tau} for tau in PAPER_TAUS),
    # the small budget our dev splits chose (its defaults), two neighbours, the paper's budget
    "dysco": ({}, {"select_k": 32}, {"beta": 2.0}, {"select_k": 32, "beta": 2.0},
              {"select_k": 4096, "beta": 2.0}),
    # one pass per token at the small budget, and one step stronger
    "dysco-lagged": ({}, {"beta": 2.0}),
    # a mask keeps fewer keys the smaller K is: most kept first
    "dysco-hard": ({"select_k": 4096}, {"select_k": 256}, {"select_k": 32}),
    # the middle half (its defaults), at two strengths; the lower and the upper half
    "dysco-middle": ({}, {"beta": 2.0}, {"depth_from": 0.0, "depth_to": 0.5}, {"depth_from": 0.5, "depth_to": 1.0}),
    # Qwen2.5's training length (no change below 32K tokens), then ever shorter ones: stronger growth
    "logn": ({"train_length": 32768}, {"train_length": 8192}, {"train_length": 2048}, {"train_length": 512}),
    # the original's own grid (1, 3, ..., 19, chosen on validation data), five points spanning it
    "instaboost": ({"M": 3.0}, {"M": 5.0}, {"M": 9.0}, {"M": 13.0}, {"M": 19.0}),
    # half the correction; the neutral profile flattened (its defaults: 16 buckets, the last half of the
    # layers); finer buckets for the long prompts; a quarter more of the layers; over-correction
    "pos-calibration": ({"strength": 0.5}, {}, {"buckets": 64}, {"depth_from": 0.25}, {"strength": 2.0}),
    # the paper's alpha on ever more of the profile's best heads, after one milder alpha
    "pasta": ({"alpha": 0.1, "profiled_heads": 8}, {"alpha": 0.01, "profiled_heads": 4},
              {"alpha": 0.01, "profiled_heads": 8}, {"alpha": 0.01, "profiled_heads": 16},
              {"alpha": 0.01, "profiled_heads": 32}),
    # PASTA on the units the QRHeads pick, the profile's 8 best heads at the paper's alpha: from many
    # units (lines: Path Traversal's edges, Needle QA's documents) to few; sentences; more heads
    "qr-pasta": ({"unit": "line", "n_spans": 8, "profiled_heads": 8},
                 {"unit": "line", "n_spans": 4, "profiled_heads": 8},
                 {"unit": "line", "n_spans": 2, "profiled_heads": 8},
                 {"unit": "sentence", "n_spans": 4, "profiled_heads": 8},
                 {"unit": "line", "n_spans": 4, "profiled_heads": 16}),
}

LONG_RULE = ("per model: the N_LONG methods whose dev choices rank best against each other: on each dev cell the "
             "methods' chosen points ranked by their teacher-forced paired gain over vanilla (1 the largest), "
             "then the lowest mean rank over the cells every method ran on; a tie goes to the method listed "
             "first in the choice file")

# DySCO's approximations set against exact DySCO at DySCO's own point (the `test-variants` part):
# each runs at the model's committed dev choice for "dysco" (its selection: beta, K, p, ...) with
# these of its own parameters, teacher forced on the test cells, and is reported only against
# DySCO (`harness_report.variants`), never chosen on any split. dysco-lagged needs no run here: the
# dev rule gave it DySCO's point on both models.
AT_DYSCO_POINT: dict[str, tuple[Point, ...]] = {
    # block-sparse hard DySCO at its defaults (64-token blocks, at most 64 of them, 64 sinks, a
    # 256-key window): the layers after the deepest QRHead sparse, then every layer; then both with
    # the blocks DySCO's few selected keys leave empty filled by relevance (added after the first
    # two had run: at DySCO's K of 8 they kept at most 8 of the 64 blocks that each step pays for)
    "dysco-sparse": ({}, {"sparse_layers": "all"},
                     {"fill_blocks": True}, {"sparse_layers": "all", "fill_blocks": True}),
}
AT_DYSCO_RULE = ("per model: each of AT_DYSCO_POINT's points over the committed dev choice of dysco (the point's "
                 "own parameters win), teacher forced on the test cells of the run's tasks and lengths, paired "
                 "with DySCO's test records instance by instance; no choice is made from these runs")

# Parameters the protocol binds per task, never a grid's: a method's parameter of one of these
# names takes the task's instruction texts (`TaskSpec.instruction`; none: the last user message).
INSTRUCTION_PARAMS = ("instruction", "emphasize")
# A grid point's entry that is no parameter: how many of the best heads of the model-and-task head
# profile (`PROFILE`) the method steers; the harness binds its `heads` to them per task.
PROFILED = "profiled_heads"

# The head profile's rule (PASTA's per-head profiling, on the dev split), fixed with the grids.
PROFILE_LENGTH, PROFILE_N, PROFILE_ALPHA = "2k", 16, 0.01
PROFILE_RULE = ("per model and task: every head steered alone by PASTA at alpha, the task's instruction emphasised, "
                "on the first n dev instances at the length; its score is the mean teacher-forced log-probability "
                "of the gold answer minus vanilla's; heads ranked best first")
Profile = Callable[[str, int], str]  # (task, n) -> the profile's best n heads, "L{l}H{h} ..."


def bind(method: str, point: Point, task: str, profile: Profile | None = None) -> DecodingConfig:
    """The config `method` runs at grid `point` on `task`: the point's parameters, the task's
    instruction texts in the parameters named so (`INSTRUCTION_PARAMS`), and the profile's best
    heads where the point names how many (`PROFILED`)."""
    values = dict(point)
    n_heads = values.pop(PROFILED, None)
    config = DecodingConfig(method=method)
    declared = () if config.params is None else config.params.as_dict()
    for name in INSTRUCTION_PARAMS:
        if name in declared and name not in values:
            values[name] = list(get_task(task).instruction)
    if n_heads is not None:
        if not isinstance(n_heads, int) or isinstance(n_heads, bool) or n_heads < 1:
            raise ConfigError(f"{PROFILED} must be a positive whole number, got {n_heads!r}")
        if "heads" not in declared:
            raise ConfigError(f"method {method!r} has no parameter 'heads' for {PROFILED!r} to set")
        values["heads"] = "L0H0" if profile is None else profile(task, n_heads)
    return config.with_params(**values)


def check_grid(method: str, grid: Sequence[Point]) -> tuple[DecodingConfig, ...]:
    """The configs of `method`'s grid (bound to the first task, a profile's heads stood in for); a
    ConfigError for an empty, too large or repeated grid, or a point its `Params` refuse (before
    any model loads)."""
    if not grid:
        raise ConfigError(f"method {method!r} has an empty grid")
    if len(grid) > MAX_GRID:
        raise ConfigError(f"method {method!r} has {len(grid)} grid points; the protocol allows at most {MAX_GRID}")
    if any(grid[i] == grid[j] for j in range(len(grid)) for i in range(j)):
        raise ConfigError(f"method {method!r} lists one grid point twice")
    return tuple(bind(method, point, TASKS[0]) for point in grid)


def grid_of(method: str, grids: Mapping[str, Sequence[Point]] = GRIDS) -> tuple[DecodingConfig, ...]:
    """`method`'s grid as configs (a method without a grid runs at its defaults: one point)."""
    return check_grid(method, grids.get(method, ({},)))


def point_label(method: str, point: Point) -> str:
    """How stores and the leaderboard name a grid point: the method and the entries the point sets."""
    return " ".join([method, *(f"{k}={v}" for k, v in sorted(point.items()))])


def choose(records: Sequence[Mapping], model: str, method: str,
           grids: Mapping[str, Sequence[Point]] = GRIDS, profile: Profile | None = None) -> dict:
    """`model`'s choice of `method`'s grid point on the dev `records` by `RULE`: {point, label,
    mean_rank, ranking (every point run on every cell, best first), cells}. A point is found in
    each task's records as the config it binds to there (`profile`: the heads the dev runs used)."""
    points = grids.get(method, ({},))
    check_grid(method, points)
    dev = [r for r in records if str(r["model"]) == model]
    index: dict[tuple[str, MethodKey], int] = {}  # (task, key) -> the grid point's index
    for task in sorted({str(r["task"]) for r in dev}):
        for i, point in enumerate(points):
            index.setdefault((task, method_key({"config": bind(method, point, task, profile).record_fields()})), i)
    gains: dict[int, dict] = {}
    for key, by_cell in paired_gains(dev, primary_metrics(forced=True)).items():
        for cell, gain in by_cell.items():
            if (cell[1], key) in index:
                gains.setdefault(index[(cell[1], key)], {})[cell] = gain
    cells, rank = mean_ranks_over_cells(gains)
    if not rank:
        raise ConfigError(f"no grid point of {method!r} was run with vanilla on every dev cell of {model}")
    order = sorted(rank, key=lambda i: (rank[i], i))  # ties: the point listed first
    rows = [{"point": dict(points[i]), "label": point_label(method, points[i]), "mean_rank": rank[i],
             "gains": {"/".join(map(str, c)): round(gains[i][c], 5) for c in cells}} for i in order]
    return {**rows[0], "rule": RULE, "ranking": rows, "cells": ["/".join(map(str, c)) for c in cells]}


def long_methods(choices: Mapping[str, Mapping], n: int = N_LONG) -> list[str]:
    """The `n` methods that run at `LONG_LENGTH`, by `LONG_RULE`, from a model's dev choices
    (`choose`'s results, each with its chosen point's per-cell `gains`), best first."""
    gains = {m: c["gains"] for m, c in choices.items()}
    if not any(gains.values()):
        raise ConfigError("the dev choices hold no per-cell gains to rank the methods by")
    _, rank = mean_ranks_over_cells(gains)
    order = list(choices)
    return sorted(rank, key=lambda m: (rank[m], order.index(m)))[:n]

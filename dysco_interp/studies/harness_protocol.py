"""The steering harness's protocol: every attention-steering method on one set of tasks, lengths,
splits and rules, fixed here before any dev run (git order is the evidence).

- Tasks: Path Traversal and MRCR-style made with `DEV_SEED` for the dev split and `TEST_SEED`
  for the test split; Needle QA's test split uses `NEEDLE_TEST_SEED`, whose needles no head
  detection has seen (the shipped QRHeads were detected on Needle QA seed 0).
- Lengths: `LENGTHS` for both Qwen2.5-Coder models; the `N_LONG` best methods of the 1.5B also at
  `LONG_LENGTH` with YaRN factor `LONG_YARN`.
- Parameters: each method has a grid of at most `MAX_GRID` points (`GRIDS`, gentlest first), each
  point a set of its `Params` values over the method's defaults. `choose` picks one point per
  model and method on the dev split by `RULE`; vanilla is the baseline of every pair.
- Test: `TEST_N` instances per length, teacher forced and free, each method at its dev choice,
  paired with vanilla (counts, exact p, BH q over the whole table).

A method of one's own joins with a grid of its own (`grid_of`, `check_grid`) under the same rule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dysco_interp.analysis.method_key import method_key
from dysco_interp.decoding.config import DecodingConfig
from dysco_interp.decoding.methods import PAPER_TAUS
from dysco_interp.errors import ConfigError
from dysco_interp.studies.budget_choice import mean_ranks_over_cells, paired_gains, primary_metrics

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
}
# InstABoost needs each task's instruction text (its `instruction` parameter); until the tasks
# name theirs, the harness does not run it by default (`--grid instaboost=...` runs it by hand).


def check_grid(method: str, grid: Sequence[Point]) -> tuple[DecodingConfig, ...]:
    """The configs of `method`'s grid; a ConfigError for an empty, too large or repeated grid, or
    a point its `Params` refuse (before any model loads)."""
    if not grid:
        raise ConfigError(f"method {method!r} has an empty grid")
    if len(grid) > MAX_GRID:
        raise ConfigError(f"method {method!r} has {len(grid)} grid points; the protocol allows at most {MAX_GRID}")
    configs = tuple(DecodingConfig(method=method).with_params(**dict(point)) for point in grid)
    if len(set(configs)) != len(configs):
        raise ConfigError(f"method {method!r} lists one grid point twice")
    return configs


def grid_of(method: str, grids: Mapping[str, Sequence[Point]] = GRIDS) -> tuple[DecodingConfig, ...]:
    """`method`'s grid as configs (a method without a grid runs at its defaults: one point)."""
    return check_grid(method, grids.get(method, ({},)))


def choose(records: Sequence[Mapping], model: str, method: str,
           grids: Mapping[str, Sequence[Point]] = GRIDS) -> dict:
    """`model`'s choice of `method`'s grid point on the dev `records` by `RULE`: {point, label,
    mean_rank, ranking (every point run on every cell, best first), cells}."""
    points = grids.get(method, ({},))
    keys = [method_key({"config": c.record_fields()}) for c in check_grid(method, points)]
    dev = (r for r in records if str(r["model"]) == model)
    gains = {k: g for k, g in paired_gains(dev, primary_metrics(forced=True)).items() if k in keys}
    cells, rank = mean_ranks_over_cells(gains)
    if not rank:
        raise ConfigError(f"no grid point of {method!r} was run with vanilla on every dev cell of {model}")
    order = sorted(rank, key=lambda k: (rank[k], keys.index(k)))  # ties: the point listed first
    rows = [{"point": dict(points[keys.index(k)]), "label": k.label, "mean_rank": rank[k],
             "gains": {"/".join(map(str, c)): round(gains[k][c], 5) for c in cells}} for k in order]
    return {**rows[0], "rule": RULE, "ranking": rows, "cells": ["/".join(map(str, c)) for c in cells]}

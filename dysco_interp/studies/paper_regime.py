"""DySCO where the paper ran it: 16K-128K tokens (YaRN past the native window), the paper's
presets, the official quick check, the small budget, and one selection rule chosen on a dev
split that spans 2K-128K.

Parts (each writes resumable stores under `<out>/paper_regime/`, one record per instance x method):
- dev:       teacher-forced sweep of a slice of the budget study's grid, plus the paper's and the
             quick check's settings, on the dev split (seed 1; Path Traversal and MRCR-style)
             -> dev/<model>_<task>_<len>_tf.jsonl
- tau:       UniAttnS's temperature swept on the MRCR-style dev split -> dev/<model>_mrcr_<len>_tau.jsonl
- choose:    the dev choice (`length_rule.choose_rule`: the budget study's rule over every dev cell,
             the budget study's 2K and 8K cells included) and the tau -> chosen_<model>.json
- test:      Path Traversal, teacher forced, on the test split (seed 0): every preset, UniAttnS,
             the chosen rule and its random-head and static ablations -> test/<model>_path_traversal_<len>_tf.jsonl
- free:      Path Traversal decoded freely with many instances (the free-generation effect is
             small) -> test/<model>_path_traversal_<len>_free.jsonl
- format-forced: the same instances and methods with each answer's format forced and its cities
             decoded (does a teacher-forced city gain survive decoding once the format is given?)
             -> test/<model>_path_traversal_<len>_ff.jsonl
- tasks:     Needle QA and MRCR-style on the test split, teacher forced (Needle QA also freely)
             -> test/<model>_<task>_<len>_{tf,free}.jsonl
- yarn-cost: vanilla under YaRN at lengths the native window holds: what the stretch itself costs
             -> test/<model>_path_traversal_<len>_tf_yarn<F>.jsonl

A YaRN-scaled model is loaded by the caller (`load_model(..., yarn_factor=4)`); the stores record
it in their weights id, so native and stretched runs never share a store.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dysco_interp import checks
from dysco_interp.analysis.records import read_records
from dysco_interp.atomic import atomic_open
from dysco_interp.decoding.config import DecodingConfig, preset
from dysco_interp.decoding.methods import PAPER_TAUS
from dysco_interp.errors import ConfigError
from dysco_interp.experiments.evaluate import evaluate
from dysco_interp.heads import HeadSet
from dysco_interp.models import LoadedModel
from dysco_interp.models.yarn import yarn_factor
from dysco_interp.stores.archives import glob_stores, stored
from dysco_interp.studies.budget_study import (
    FORCED_TOKENS,
    FREE_TOKENS,
    batch_for,
    chosen_config,
    named,
    split_instances,
    uniattns,
)
from dysco_interp.studies.length_rule import best_tau, choose_rule

PARTS = ("dev", "tau", "choose", "test", "free", "format-forced", "tasks", "yarn-cost")
# a slice of the budget study's grid (every point of it was swept at 2K and 8K), so that the
# rule can rank each candidate over 2K-128K
DEV_K = (8, 32, 128, 1024, 4096)
DEV_BETAS = (1.5, 2.5)
DEV_FRACTIONS = (0.005, 0.02)
DEV_FRACTION_BETAS = (2.0, 3.0)
# UniAttnS's temperatures: the paper's own grid. (A first run swept 0.6-0.9, harsher than any
# temperature the paper tried; its dev records stay in the stores but no longer enter the choice.)
TAUS = PAPER_TAUS
# the data split of the Needle QA test cells: a seed never used for head detection (the shipped
# QRHeads were detected on needle_qa seed 0, whose gold facts and questions every length shares),
# for the gold-mass check of the heads (seed 1000), or for dev (seed 1)
NEEDLE_TEST_SPLIT = "heldout"
TASKS = ("needle_qa", "mrcr")
# the presets every test run reports, in table order
TEST_PRESETS = ("paper", "paper-long", "quick-check", "small-budget")


def dev_methods(max_new_tokens: int) -> dict[str, DecodingConfig]:
    base = preset("paper", max_new_tokens=max_new_tokens)
    configs = [base.replace(method="vanilla")]
    configs += [base.with_params(select_k=k, beta=b) for b in DEV_BETAS for k in DEV_K]
    configs += [base.with_params(select_k=4096, k_fraction=f, beta=b)
                for b in DEV_FRACTION_BETAS for f in DEV_FRACTIONS]
    configs += [preset(name, max_new_tokens=max_new_tokens) for name in ("paper-long", "quick-check")]
    return named(configs)


def tau_methods(max_new_tokens: int) -> dict[str, DecodingConfig]:
    base = preset("paper", max_new_tokens=max_new_tokens)
    return named([base.replace(method="vanilla")] + [uniattns(t, max_new_tokens) for t in TAUS])


def tau_is_current(choice: Mapping) -> bool:
    """Whether the choice's UniAttnS tau was chosen on today's grid (`TAUS`): a tau from an older
    grid is not run again."""
    return choice.get("tau_grid") == list(TAUS)


def test_methods(choice: Mapping, max_new_tokens: int, with_ablations: bool = True) -> dict[str, DecodingConfig]:
    """vanilla, UniAttnS at the dev tau (when it was chosen on `TAUS`), the presets, the chosen
    rule, the best candidate of the other kind (a share of the prompt if a fixed K won, and the
    reverse), and (`with_ablations`) the chosen budget with random heads and with static scaling."""
    base = preset("paper", max_new_tokens=max_new_tokens)
    best = chosen_config(choice["config"], max_new_tokens)
    configs = [base.replace(method="vanilla")]
    if tau_is_current(choice):
        configs.append(uniattns(float(choice["tau"]), max_new_tokens))
    configs += [preset(name, max_new_tokens=max_new_tokens) for name in TEST_PRESETS]
    configs.append(best)
    if choice.get("other_kind"):
        configs.append(chosen_config(choice["other_kind"], max_new_tokens))
    if with_ablations:
        configs += [best.replace(method="dysco-random"), best.replace(method="dysco-static")]
    return named(configs)


@dataclass(frozen=True)
class RegimeSettings:
    model_name: str
    data_dir: Path  # dev/, test/ and free/ task files, as make-data writes them
    out_dir: Path
    lengths: Sequence[str]  # the lengths this call runs (one YaRN setting per call)
    budget_dev: Path | None = None  # the budget study's dev stores (its 2K and 8K cells)
    backend: str = "static"
    tokens_per_batch: int = 512 * 1024  # instances decoded together: this many prompt tokens
    n: int | None = None
    command: str | None = None  # kept in each new record (`stores.provenance`)
    tasks: Sequence[str] = TASKS  # what the tasks part runs

    def store(self, split: str, task: str, length: str, kind: str) -> Path:
        return stored(self.out_dir / "paper_regime" / split / f"{self.model_name}_{task}_{length}_{kind}.jsonl")

    @property
    def choice_path(self) -> Path:
        return self.out_dir / "paper_regime" / f"chosen_{self.model_name}.json"

    def read_choice(self) -> dict:
        if not self.choice_path.is_file():
            raise ConfigError(f"no {self.choice_path}: run the dev, tau and choose parts first")
        return json.loads(self.choice_path.read_text())


def check_parts(parts: Sequence[str]) -> None:
    checks.check_parts(parts, PARTS)


def dev_stores(s: RegimeSettings, kind: str) -> list[Path]:
    """Every dev store of this model and kind: this study's, and the budget study's if given."""
    folders = [s.out_dir / "paper_regime" / "dev"] + ([s.budget_dev] if s.budget_dev else [])
    return [Path(p) for folder in folders for p in glob_stores(folder / f"{s.model_name}_*_{kind}.jsonl")]


def choose(s: RegimeSettings) -> dict:
    """The dev choice over every dev cell, with the tau, written to `s.choice_path`."""
    tf = [r for p in dev_stores(s, "tf") for r in read_records(p)]
    tau = [r for p in dev_stores(s, "tau") for r in read_records(p) if on_grid(r)]
    choice = {**choose_rule(tf), "tau": best_tau(tau), "tau_grid": list(TAUS), "model": s.model_name}
    with atomic_open(s.choice_path) as f:
        f.write(json.dumps(choice, indent=1) + "\n")
    return choice


def on_grid(record: Mapping) -> bool:
    """A tau-sweep record the choice reads: vanilla, or UniAttnS at a temperature of `TAUS`."""
    config = record.get("config") or {}  # the record's own "method" is its label ("uniattns tau=0.9")
    return config.get("method") != "uniattns" or float(config.get("tau", -1)) in TAUS


def run_regime(model: LoadedModel, heads: HeadSet, s: RegimeSettings, parts: Sequence[str],
               log: Callable[[str], None] = print) -> None:
    """Run `parts` at `s.lengths` with `model` (loaded with the YaRN factor these lengths need)."""
    check_parts(parts)
    stretch = yarn_factor(model.hf_config)

    def run(split: str, task: str, length: str, kind: str, methods: dict[str, DecodingConfig], forced: bool,
            data_split: str | None = None, format_forced: bool = False) -> None:
        t0 = time.perf_counter()
        instances = split_instances(s.data_dir, data_split or split, task, length, s.n, "analyses/paper_regime.py")
        batch = batch_for(instances, s.tokens_per_batch)
        done = evaluate(model, s.model_name, task, instances, methods, heads, s.store(split, task, length, kind),
                        backend=s.backend, batch_size=batch, teacher_forced=forced, command=s.command,
                        format_forced=format_forced)
        log(f"{done.path}: {len(done.new)} new records in {time.perf_counter() - t0:.1f}s (batch {batch})")

    if "dev" in parts:
        for length in s.lengths:
            for task in ("path_traversal", "mrcr"):
                run("dev", task, length, "tf", dev_methods(FORCED_TOKENS[task]), True)
    if "tau" in parts:
        for length in s.lengths:
            run("dev", "mrcr", length, "tau", tau_methods(FORCED_TOKENS["mrcr"]), True)
    if "choose" in parts:
        choice = choose(s)
        log(f"chosen on the dev split: {choice['config']}, UniAttnS tau {choice['tau']} ({s.choice_path})")
    if {"test", "free", "format-forced", "tasks"} & set(parts):
        choice = s.read_choice()
        for length in s.lengths:
            if "test" in parts:
                run("test", "path_traversal", length, "tf", test_methods(choice, FORCED_TOKENS["path_traversal"]),
                    True)
            for kind in ("free", "format-forced"):
                if kind in parts:
                    tokens = FREE_TOKENS["path_traversal"]
                    configs = [DecodingConfig(method="vanilla", max_new_tokens=tokens)]
                    configs += [preset(n, max_new_tokens=tokens) for n in ("paper", "small-budget")]
                    configs.append(chosen_config(choice["config"], tokens))
                    run("test", "path_traversal", length, "free" if kind == "free" else "ff", named(configs), False,
                        data_split="free", format_forced=kind == "format-forced")
            if "tasks" in parts:
                for task in s.tasks:
                    split = NEEDLE_TEST_SPLIT if task == "needle_qa" else None
                    run("test", task, length, "tf", test_methods(choice, FORCED_TOKENS[task], False), True, split)
                if "needle_qa" in s.tasks:
                    run("test", "needle_qa", length, "free", test_methods(choice, FREE_TOKENS["needle_qa"], False),
                        False, NEEDLE_TEST_SPLIT)
    if "yarn-cost" in parts:
        if stretch is None:
            raise ConfigError("the yarn-cost part measures a YaRN-scaled model: load it with --yarn")
        for length in s.lengths:
            vanilla = {"vanilla": DecodingConfig(method="vanilla", max_new_tokens=FORCED_TOKENS["path_traversal"])}
            run("test", "path_traversal", length, f"tf_yarn{stretch:g}", vanilla, True)

"""The decoding experiments behind the Path Traversal, ablation and robustness tables.

Parts (each a set of resumable `ResultStore` files under the output folder, one record per
(instance, method); a killed run continues where it stopped):
- tau:        UniAttnS temperatures on MRCR-style data -> mrcr/<model>_<len>_tau.jsonl
              (the paper picks tau on MRCR, over its own grid `PAPER_TAUS`; we never pick it
              on the test instances)
- pt:         vanilla, UniAttnS (the chosen tau) and DySCO per length
              -> path_traversal/<model>_<len>.jsonl
- ablation:   DySCO vs random heads vs static scaling, Path Traversal and MRCR
              -> ablations/<model>_<task>_<len>.jsonl
- robustness: p, K and beta varied one at a time around the paper's defaults
              -> robustness/<model>_<task>_<len>.jsonl
- reuse:      DySCO vs its one-pass variant (bias only after the deepest QRHead layer), both
              in one process -> reuse/<model>_<task>_<len>.jsonl
Data: the task files `path_traversal_<len>.jsonl` and `mrcr_<len>.jsonl` in the data folder.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dysco_interp import checks
from dysco_interp.analysis.records import read_records
from dysco_interp.analysis.result_tables import tau_sweep
from dysco_interp.decoding.config import DecodingConfig, param_values, preset
from dysco_interp.decoding.methods import PAPER_TAUS
from dysco_interp.errors import ConfigError
from dysco_interp.experiments.evaluate import evaluate
from dysco_interp.heads import HeadSet
from dysco_interp.models import LoadedModel
from dysco_interp.stores.archives import stored
from dysco_interp.studies.budget_study import uniattns
from dysco_interp.tasks import load_dataset

PARTS = ("tau", "pt", "ablation", "robustness", "reuse")
# The paper's robustness grid, one parameter at a time around (p 0.975, K 4096, beta 2).
GRID = {"top_p": (0.9, 0.95, 0.975, 0.99), "top_k": (1024, 2048, 4096, 8192), "beta": (1.5, 2.0, 2.5, 3.0)}
SMALL_GRID = {"top_p": (0.9,), "top_k": (256,), "beta": (1.5,)}
GRID_LABEL = {"top_p": "p", "top_k": "K", "beta": "beta"}
SMALL_TAUS = (0.975, 0.85)  # two of the paper's grid, which the tables choose on


class MissingRunInput(ConfigError):
    """A data file or the tau sweep a part needs is not there yet: make it first."""


def tau_label(tau: float) -> str:
    return f"uniattns-tau{tau:g}"


def grid_methods(base: DecodingConfig, grid: Mapping[str, Sequence[float]]) -> dict[str, DecodingConfig]:
    """"dysco" (the defaults) plus one config per other grid value, each differing in one parameter."""
    methods = {"dysco": base}
    for name, values in grid.items():
        for v in values:
            if v != getattr(base, name):
                methods[f"{GRID_LABEL[name]}={v:g}"] = base.with_params(**param_values({name: v}))
    return methods


@dataclass(frozen=True)
class RunSettings:
    """What to run and where: lengths are labels as in the data file names ("2k")."""

    model_name: str
    data_dir: Path
    out_dir: Path
    parts: Sequence[str] = PARTS
    backend: str = "sdpa"
    batch_size: int = 16
    n: int | None = None  # instances per file (None: all)
    pt_lengths: Sequence[str] = ("1k", "2k", "4k", "8k")
    ablation_lengths: Sequence[str] = ("2k", "8k")
    robustness_length: str = "2k"
    tau_length: str = "2k"
    taus: Sequence[float] = PAPER_TAUS  # swept, and the grid the choice is made on
    pt_new_tokens: int = 120  # 4 route lines take about 60
    mrcr_new_tokens: int = 160  # the answers take 60-120
    grid: Mapping[str, Sequence[float]] = field(default_factory=lambda: dict(GRID))

    def new_tokens(self, task: str) -> int:
        return self.pt_new_tokens if task == "path_traversal" else self.mrcr_new_tokens

    @property
    def tau_store(self) -> Path:
        return stored(self.out_dir / "mrcr" / f"{self.model_name}_{self.tau_length}_tau.jsonl")


def check_parts(parts: Sequence[str]) -> None:
    checks.check_parts(parts, PARTS)


def run_parts(model: LoadedModel, heads: HeadSet, s: RunSettings, log: Callable[[str], None] = print) -> None:
    """Run the parts `s.parts` in order (tau before pt: pt uses the tau the sweep chose)."""
    check_parts(s.parts)

    def data(task: str, length: str) -> list:
        path = s.data_dir / f"{task}_{length}.jsonl"
        if not path.exists():
            raise MissingRunInput(f"missing {path}; make it with `dysco-interp make-data {task} --model {s.model_name} "
                              f"--lengths {length} --out {s.data_dir}`")
        instances = load_dataset(path)
        return instances[: s.n] if s.n else instances

    def run(task: str, length: str, methods: dict[str, DecodingConfig], store_path: Path) -> None:
        t0 = time.perf_counter()
        done = evaluate(model, s.model_name, task, data(task, length), methods, heads, stored(store_path),
                        backend=s.backend, batch_size=s.batch_size)
        log(f"{done.path}: {len(done.new)} new records in {time.perf_counter() - t0:.1f}s")

    if "tau" in s.parts:
        methods = {tau_label(t): uniattns(t, s.mrcr_new_tokens) for t in s.taus}
        run("mrcr", s.tau_length, methods, s.tau_store)
    if "pt" in s.parts:
        if not s.tau_store.exists():
            raise MissingRunInput(f"part 'pt' needs the tau sweep {s.tau_store}; run part 'tau' first")
        sweep = tau_sweep(read_records(s.tau_store), grid=s.taus).get(s.model_name)
        if sweep is None:
            raise MissingRunInput(f"{s.tau_store} holds no UniAttnS records of {s.model_name} at the swept "
                                  f"temperatures {', '.join(f'{t:g}' for t in s.taus)}; run part 'tau' first")
        tau = sweep["chosen_tau"]
        log(f"UniAttnS tau chosen on MRCR: {tau:g} (sweep: {sweep['rows']})")
        base = preset("paper", max_new_tokens=s.pt_new_tokens)
        methods = {"vanilla": base.replace(method="vanilla"), "dysco": base}
        if tau != 1.0:  # tau = 1 is vanilla decoding; the table reads it from the vanilla runs
            methods[tau_label(tau)] = uniattns(tau, s.pt_new_tokens)
        for length in s.pt_lengths:
            run("path_traversal", length, methods, s.out_dir / "path_traversal" / f"{s.model_name}_{length}.jsonl")
    for task in ("path_traversal", "mrcr"):
        base = preset("paper", max_new_tokens=s.new_tokens(task))
        if "ablation" in s.parts:
            methods = {"dysco": base, "dysco-random": base.replace(method="dysco-random"),
                       "dysco-static": base.replace(method="dysco-static")}
            for length in s.ablation_lengths:
                run(task, length, methods, s.out_dir / "ablations" / f"{s.model_name}_{task}_{length}.jsonl")
        if "reuse" in s.parts:
            methods = {"dysco": base, "dysco-reuse": base.replace(method="dysco-reuse")}
            for length in s.ablation_lengths:
                run(task, length, methods, s.out_dir / "reuse" / f"{s.model_name}_{task}_{length}.jsonl")
        if "robustness" in s.parts:
            methods = {"vanilla": base.replace(method="vanilla"), **grid_methods(base, s.grid)}
            run(task, s.robustness_length, methods,
                s.out_dir / "robustness" / f"{s.model_name}_{task}_{s.robustness_length}.jsonl")

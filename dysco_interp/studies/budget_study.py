"""The selection-budget study: how many keys DySCO should boost at 1K-16K tokens.

The paper's selection (p 0.975, K 4096) was set for 64K-128K prompts, where K caps the
nucleus at ~3% of the context; at 1K-8K it never binds and the boost lands on hundreds of
keys. This study sweeps K (or a share of the prompt), p and beta on a dev split, chooses one
configuration there (`budget_choice`), and reports it on the test split.

Parts (each a set of resumable stores under `<out>/budget/`, one record per instance x method):
- dev-tf:    teacher-forced sweep on the dev split (MRCR-style and Path Traversal made with
             another seed) -> dev/<model>_<task>_<len>_tf.jsonl
- dev-free:  free generation on the dev split for vanilla, the paper preset and the best
             teacher-forced configurations -> dev/<model>_<task>_<len>_free.jsonl
- test-tf / test-free: the test split (Path Traversal, seed 0) under vanilla, UniAttnS (the tau
             its MRCR sweep chose on the paper's grid, `chosen_tau`), the paper preset, the
             chosen configuration and its random-head and static ablations
             -> test/<model>_path_traversal_<len>_{tf,free}.jsonl
The choice is written to `chosen_<model>.json` by `choose` and read by the test parts.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dysco_interp import checks
from dysco_interp.analysis.records import read_records
from dysco_interp.analysis.result_tables import tau_sweep
from dysco_interp.atomic import atomic_open
from dysco_interp.decoding.config import DecodingConfig, param_values, preset
from dysco_interp.decoding.methods import PAPER_TAUS
from dysco_interp.errors import ConfigError
from dysco_interp.experiments.evaluate import evaluate
from dysco_interp.heads import HeadSet
from dysco_interp.models import LoadedModel
from dysco_interp.stores.archives import glob_stores, stored
from dysco_interp.studies.budget_choice import choose_config, shortlist
from dysco_interp.tasks import load_dataset

PARTS = ("dev-tf", "dev-free", "test-tf", "test-free")
K_VALUES = (8, 16, 32, 64, 128, 256, 1024, 4096)
P_VALUES = (0.5, 0.8, 0.9, 0.975)
BETAS = (1.5, 2.0, 2.5, 3.0, 4.0)
FRACTIONS = (0.005, 0.01, 0.02, 0.05, 0.1)
RANDOM_BETAS = (2.0, 3.0)  # random heads at every K, at two strengths fixed in advance
FORCED_TOKENS = {"path_traversal": 400, "mrcr": 128, "needle_qa": 32}
FREE_TOKENS = {"path_traversal": 120, "mrcr": 160, "needle_qa": 32}


@dataclass(frozen=True)
class Grid:
    """The dev sweep: K x beta at p 0.975; p x (2, 3) at K 4096; shares of the prompt x (2, 3);
    random heads at every K and `random_betas`."""

    k_values: Sequence[int] = K_VALUES
    p_values: Sequence[float] = P_VALUES
    betas: Sequence[float] = BETAS
    fractions: Sequence[float] = FRACTIONS
    random_betas: Sequence[float] = RANDOM_BETAS


def label(config: DecodingConfig) -> str:
    """A store label that names every swept field (the tables group by config, not by label)."""
    value = config.parameter
    if config.method in ("vanilla", "uniattns"):
        return config.method if config.method == "vanilla" else f"uniattns tau={value('tau'):g}"
    cap = f"f={value('k_fraction'):g}" if value("k_fraction") is not None else f"K={value('select_k')}"
    return f"{config.method} {cap} p={value('select_p'):g} beta={value('beta'):g}"


def named(configs: Iterable[DecodingConfig]) -> dict[str, DecodingConfig]:
    out: dict[str, DecodingConfig] = {}
    for c in configs:
        out.setdefault(label(c), c)
    return out


def dev_methods(grid: Grid, max_new_tokens: int) -> dict[str, DecodingConfig]:
    base = preset("paper", max_new_tokens=max_new_tokens)
    configs = [base.replace(method="vanilla")]
    configs += [base.with_params(select_k=k, beta=b) for b in grid.betas for k in grid.k_values]
    configs += [base.with_params(select_p=p, select_k=4096, beta=b) for b in (2.0, 3.0) for p in grid.p_values]
    configs += [base.with_params(select_k=4096, k_fraction=f, beta=b) for b in (2.0, 3.0) for f in grid.fractions]
    configs += [base.replace(method="dysco-random").with_params(select_k=k, beta=b) for b in grid.random_betas
                for k in grid.k_values]
    return named(configs)


def chosen_config(fields: Mapping, max_new_tokens: int) -> DecodingConfig:
    return preset("paper", max_new_tokens=max_new_tokens, params=param_values(fields))


def uniattns(tau: float, max_new_tokens: int) -> DecodingConfig:
    """UniAttnS at `tau`, with the paper preset's shared settings as every table runs it."""
    return preset("paper", method="uniattns", max_new_tokens=max_new_tokens, params={"tau": tau})


def heldout_methods(chosen: Mapping, max_new_tokens: int, tau: float | None = None) -> dict[str, DecodingConfig]:
    """vanilla, UniAttnS at `tau` (none without one), the paper preset, the chosen configuration
    and its random-head and static ablations at the same budget."""
    base = preset("paper", max_new_tokens=max_new_tokens)
    best = chosen_config(chosen, max_new_tokens)
    configs = [base.replace(method="vanilla"), preset("paper", max_new_tokens=max_new_tokens), best,
               best.replace(method="dysco-random"), best.replace(method="dysco-static")]
    if tau is not None:
        configs.insert(1, uniattns(tau, max_new_tokens))
    return named(configs)


def choice_path(out_dir: Path, model_name: str) -> Path:
    """Where `choose` writes the dev split's choice for a model, and the studies that rerun it read it."""
    return out_dir / "budget" / f"chosen_{model_name}.json"


def tau_stores(out_dir: Path, model_name: str) -> list[Path]:
    """The MRCR tau sweeps UniAttnS's temperature is chosen on: the decoding runs' (part 'tau' of
    `studies.decoding_runs`, at 2K on seed 0, which no test table of this study reads), its first
    store and any later one beside it (`<model>_2k_tau_<suffix>.jsonl`), pooled."""
    folder = out_dir / "mrcr"
    return [Path(p) for pattern in (f"{model_name}_2k_tau.jsonl", f"{model_name}_2k_tau_*.jsonl")
            for p in glob_stores(folder / pattern)]


def chosen_tau(out_dir: Path, model_name: str) -> float | None:
    """UniAttnS's tau for `model_name`: the best of the paper's grid in its MRCR sweeps (None: no sweep)."""
    records = [r for path in tau_stores(out_dir, model_name) for r in read_records(path)]
    sweep = tau_sweep(records, grid=PAPER_TAUS).get(model_name)
    return None if sweep is None else float(sweep["chosen_tau"])


@dataclass(frozen=True)
class StudySettings:
    model_name: str
    data_dir: Path  # dev/ and test/ task files, as make-data writes them
    out_dir: Path
    parts: Sequence[str] = PARTS
    backend: str = "sdpa"
    batch_size: int = 50
    n: int | None = None
    dev_tasks: Sequence[tuple[str, str]] = (("mrcr", "2k"), ("mrcr", "8k"), ("path_traversal", "2k"),
                                            ("path_traversal", "8k"))
    test_lengths: Sequence[str] = ("1k", "2k", "4k", "8k", "16k")
    grid: Grid = field(default_factory=Grid)
    n_free: int = 3  # teacher-forced best configurations decoded freely on the dev split

    def store(self, split: str, task: str, length: str, kind: str) -> Path:
        return stored(self.out_dir / "budget" / split / f"{self.model_name}_{task}_{length}_{kind}.jsonl")

    @property
    def choice_path(self) -> Path:
        return choice_path(self.out_dir, self.model_name)


def check_parts(parts: Sequence[str]) -> None:
    checks.check_parts(parts, PARTS)


def dev_records(s: StudySettings, kind: str) -> list[dict]:
    paths = [s.store("dev", task, length, kind) for task, length in s.dev_tasks]
    return [r for p in paths if p.exists() for r in read_records(p)]


def choose(s: StudySettings) -> dict:
    """The dev split's choice (teacher-forced sweep, confirmed by free generation where run),
    written to `s.choice_path`."""
    choice = choose_config(dev_records(s, "tf"), dev_records(s, "free"))
    choice["model"] = s.model_name
    with atomic_open(s.choice_path) as f:
        f.write(json.dumps(choice, indent=1) + "\n")
    return choice


def split_instances(data_dir: Path, split: str, task: str, length: str, n: int | None, script: str) -> list:
    """The first `n` (all for None) instances of `data_dir/split/<task>_<length>.jsonl`, as
    make-data writes it; a missing file is a ConfigError naming the script that says how to make it."""
    path = data_dir / split / f"{task}_{length}.jsonl"
    if not path.exists():
        raise ConfigError(f"missing {path}: make the {split} split first (see {script})")
    instances = load_dataset(path)
    return instances[:n] if n else instances


def batch_for(instances: Sequence, tokens_per_batch: int) -> int:
    """How many instances to decode together: about `tokens_per_batch` prompt tokens, sized by the
    longest prompt, between 1 and 50."""
    return max(1, min(50, tokens_per_batch // max(i.n_tokens for i in instances)))


def run_study(model: LoadedModel, heads: HeadSet, s: StudySettings, log: Callable[[str], None] = print) -> None:
    check_parts(s.parts)

    def data(split: str, task: str, length: str) -> list:
        return split_instances(s.data_dir, split, task, length, s.n, "analyses/budget_study.py")

    def run(split: str, task: str, length: str, methods: dict[str, DecodingConfig], forced: bool) -> None:
        t0 = time.perf_counter()
        path = s.store(split, task, length, "tf" if forced else "free")
        done = evaluate(model, s.model_name, task, data(split, task, length), methods, heads, path,
                        backend=s.backend, batch_size=s.batch_size, teacher_forced=forced)
        log(f"{done.path}: {len(done.new)} new records in {time.perf_counter() - t0:.1f}s")

    if "dev-tf" in s.parts:
        for task, length in s.dev_tasks:
            run("dev", task, length, dev_methods(s.grid, FORCED_TOKENS[task]), True)
    if "dev-free" in s.parts:
        best = shortlist(dev_records(s, "tf"), s.n_free)
        for task, length in s.dev_tasks:
            tokens = FREE_TOKENS[task]
            configs = [DecodingConfig(method="vanilla", max_new_tokens=tokens), preset("paper", max_new_tokens=tokens)]
            run("dev", task, length, named(configs + [chosen_config(b, tokens) for b in best]), False)
    if "test-tf" in s.parts or "test-free" in s.parts:
        chosen = choose(s)
        log(f"chosen on the dev split: {chosen['config']} ({chosen['rule']})")
        tau = chosen_tau(s.out_dir, s.model_name)
        log(f"UniAttnS tau chosen on MRCR: {tau:g}" if tau is not None
            else f"no MRCR tau sweep under {s.out_dir / 'mrcr'}: UniAttnS is left out")
        for length in s.test_lengths:
            for forced in (True, False):
                if ("test-tf" if forced else "test-free") in s.parts:
                    tokens = (FORCED_TOKENS if forced else FREE_TOKENS)["path_traversal"]
                    run("test", "path_traversal", length, heldout_methods(chosen["config"], tokens, tau), forced)

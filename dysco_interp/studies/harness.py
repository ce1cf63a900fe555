"""The steering harness's runs: every method's grid on the dev split, one choice per method by the
protocol's rule, then each method at its choice on the test split (`harness_protocol` fixes
the tasks, lengths, splits, grids and rule).

Parts (resumable stores under `<out>/harness/`, one record per instance x run):
- profile: each task's head profile on the dev split, for the methods whose grid steers a
           profile's best heads (PASTA) -> profile/<model>_<task>.json
- dev:     vanilla and every grid point of every method, teacher forced, on the dev split
           -> dev/<model>_<task>_<len>.jsonl
- choose:  each method's point by the rule -> chosen_<model>.json (read by the test parts)
- test-tf / test-free: vanilla and each method at its choice on the test split, teacher forced
           and free -> test/<model>_<task>_<len>_{tf,free}.jsonl
- test-ff:  as test-free, each answer's format forced (`evaluate(format_forced=True)`), on the
           tasks whose answers name their format segments (Path Traversal)
           -> test/<model>_<task>_<len>_ff.jsonl
- test-variants: DySCO at its choice and its approximations at DySCO's point (`AT_DYSCO_POINT`),
           teacher forced on the test split, set against DySCO only (`harness_report.variants`);
           not a default part -> variants/<model>_<task>_<len>_tf.jsonl
- test-long: vanilla and the protocol's best methods by its rule on the dev choices
           (`long_methods`), at the protocol's long length, both modes; the model is loaded with
           YaRN (`LONG_YARN`), so this part runs on its own -> test/<model>_<task>_127k_{tf,free}.jsonl
A method of one's own (registered by `--methods-from`) joins with `--grid NAME=JSON`, a list of
its parameter sets; without one it runs at its defaults.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dysco_interp import checks
from dysco_interp.analysis.records import read_records
from dysco_interp.analysis.report import write_json
from dysco_interp.atomic import atomic_open
from dysco_interp.decoding.config import DecodingConfig
from dysco_interp.errors import ConfigError
from dysco_interp.experiments.evaluate import evaluate
from dysco_interp.heads import HeadSet
from dysco_interp.models import LoadedModel
from dysco_interp.stores.archives import stored
from dysco_interp.studies.budget_study import FORCED_TOKENS, FREE_TOKENS, batch_for, split_instances
from dysco_interp.studies.harness_protocol import (
    AT_DYSCO_POINT,
    GRIDS,
    LENGTHS,
    LONG_LENGTH,
    N_LONG,
    PROFILE_ALPHA,
    PROFILE_LENGTH,
    PROFILE_N,
    PROFILE_RULE,
    PROFILED,
    TASKS,
    Point,
    Profile,
    bind,
    check_grid,
    choose,
    long_methods,
    point_label,
)
from dysco_interp.tasks.registry import get_task

PARTS = ("profile", "dev", "choose", "test-tf", "test-free", "test-ff", "test-variants", "test-long")
# the long part loads the model otherwise (YaRN): it runs on its own; the variants part is asked for by name
DEFAULT_PARTS = tuple(p for p in PARTS if p not in ("test-variants", "test-long"))
TEST_PARTS = {"test-tf", "test-free", "test-ff", "test-variants", "test-long"}
SCRIPT = "analyses/harness.py"


@dataclass(frozen=True)
class HarnessSettings:
    model_name: str
    data_dir: Path  # dev/ and test/ task files, as make-data writes them
    out_dir: Path  # harness/ is written under it
    methods: Sequence[str]  # compared with vanilla, which every cell runs
    parts: Sequence[str] = DEFAULT_PARTS
    tasks: Sequence[str] = TASKS
    lengths: Sequence[str] = LENGTHS
    grids: Mapping[str, Sequence[Point]] = field(default_factory=lambda: dict(GRIDS))
    backend: str = "static"
    tokens_per_batch: int = 512 * 1024
    n: int | None = None  # instances per file (None: all)
    profile_length: str = PROFILE_LENGTH  # the dev files the head profile reads (the protocol's; tests take others)
    command: str | None = None

    @property
    def folder(self) -> Path:
        return self.out_dir / "harness"

    def store(self, split: str, task: str, length: str, kind: str | None = None) -> Path:
        name = f"{self.model_name}_{task}_{length}" + ("" if kind is None else f"_{kind}")
        return stored(self.folder / split / f"{name}.jsonl")

    def profile_path(self, task: str) -> Path:
        return self.folder / "profile" / f"{self.model_name}_{task}.json"

    @property
    def choice_path(self) -> Path:
        return self.folder / f"chosen_{self.model_name}.json"


def check_settings(s: HarnessSettings) -> None:
    """Every part, method and grid point checked before any model loads."""
    checks.check_parts(s.parts, PARTS)
    if "test-long" in s.parts and len(set(s.parts)) > 1:
        raise ConfigError("run 'test-long' on its own: it loads the model with YaRN for the long length")
    if "vanilla" in s.methods:
        raise ConfigError("vanilla is every cell's baseline: leave it out of the methods")
    if "test-variants" in s.parts and "dysco" not in s.methods:
        raise ConfigError("the test-variants part runs DySCO's variants at DySCO's dev choice: name dysco among "
                          "the methods")
    for method in s.methods:
        check_grid(method, s.grids.get(method, ({},)))
    unknown = sorted(set(s.grids) - set(GRIDS) - set(s.methods))
    if unknown:
        raise ConfigError(f"a grid for {unknown[0]!r}, which this run does not compare")
    if uses_profile(s) and "profile" not in s.parts and {"dev", "choose", "test-tf", "test-free"} & set(s.parts):
        for task in s.tasks:
            profile_heads_of(s)(task, 1)  # a ConfigError naming the profile a part would miss


def check_data(s: HarnessSettings) -> None:
    """The task files the parts read are there, and the dev choices the test parts read (a
    ConfigError naming the first one missing), so a run does not load a model to find that out."""
    splits = (["dev"] if "dev" in s.parts else []) + (["test"] if (TEST_PARTS - {"test-long"}) & set(s.parts)
                                                      else [])
    files = [("dev", task, s.profile_length) for task in s.tasks] if "profile" in s.parts and uses_profile(s) else []
    files += [(split, task, length) for split in splits for task in s.tasks for length in s.lengths]
    files += [("test", task, LONG_LENGTH) for task in s.tasks] if "test-long" in s.parts else []
    for split, task, length in files:
        path = s.data_dir / split / f"{task}_{length}.jsonl"
        if not path.is_file():
            raise ConfigError(f"missing {path}: make the {split} split first (see {SCRIPT})")
    if TEST_PARTS & set(s.parts) and "choose" not in s.parts:
        committed_choices(s)  # a ConfigError naming the missing choice file or method


def profile_heads_of(s: HarnessSettings) -> Profile:
    """The best heads of the model-and-task head profile the profile part wrote (a ConfigError
    naming the file when it is missing)."""
    def best(task: str, n: int) -> str:
        path = s.profile_path(task)
        if not path.is_file():
            raise ConfigError(f"no {path}: run the 'profile' part first")
        return " ".join(json.loads(path.read_text())["ranking"][:n])
    return best


def uses_profile(s: HarnessSettings) -> bool:
    return any(PROFILED in point for method in s.methods for point in s.grids.get(method, ({},)))


def task_methods(s: HarnessSettings, task: str, points: Mapping[str, Sequence[Point]],
                 tokens: int) -> dict[str, DecodingConfig]:
    """vanilla and each method of `points` at each of its points, bound to `task`, by their store labels."""
    profile = profile_heads_of(s) if uses_profile(s) else None
    configs = {"vanilla": DecodingConfig(method="vanilla")}
    for method, grid in points.items():
        for point in grid:
            configs[point_label(method, point)] = bind(method, point, task, profile)
    return {label: c.replace(max_new_tokens=tokens) for label, c in configs.items()}


def dev_methods(s: HarnessSettings, task: str, tokens: int) -> dict[str, DecodingConfig]:
    return task_methods(s, task, {m: s.grids.get(m, ({},)) for m in s.methods}, tokens)


def write_choices(s: HarnessSettings) -> dict:
    """Each method's dev choice for the model, written to `s.choice_path`."""
    records = [r for task in s.tasks for length in s.lengths
               if (path := s.store("dev", task, length)).exists() for r in read_records(path)]
    profile = profile_heads_of(s) if uses_profile(s) else None
    choices = {method: choose(records, s.model_name, method, s.grids, profile) for method in s.methods}
    with atomic_open(s.choice_path) as f:
        f.write(json.dumps({"model": s.model_name, "choices": choices}, indent=1) + "\n")
    return choices


def committed_choices(s: HarnessSettings) -> dict:
    """The model's dev choices (`choose`'s results per method), every method of the run among them."""
    if not s.choice_path.is_file():
        raise ConfigError(f"no {s.choice_path}: run the dev part and 'choose' first")
    chosen = json.loads(s.choice_path.read_text())["choices"]
    missing = [m for m in s.methods if m not in chosen]
    if missing:
        raise ConfigError(f"{s.choice_path} holds no choice for {', '.join(missing)}: run 'choose' again")
    return chosen


def variant_methods(s: HarnessSettings, task: str, tokens: int) -> dict[str, DecodingConfig]:
    """DySCO at its committed dev choice and each of `AT_DYSCO_POINT`'s points over that choice,
    bound to `task` (no vanilla: these runs are set against DySCO only)."""
    point = committed_choices(s)["dysco"]["point"]
    points = {"dysco": [point], **{m: [{**point, **own} for own in grid] for m, grid in AT_DYSCO_POINT.items()}}
    return {label: c for label, c in task_methods(s, task, points, tokens).items() if label != "vanilla"}


def test_methods(s: HarnessSettings, task: str, tokens: int, methods: Sequence[str] | None = None
                 ) -> dict[str, DecodingConfig]:
    """vanilla and each method (`methods`, by default the run's) at its committed dev choice, bound to `task`."""
    chosen = committed_choices(s)
    return task_methods(s, task, {m: [chosen[m]["point"]] for m in methods or s.methods}, tokens)


def write_profiles(model: LoadedModel, s: HarnessSettings, log: Callable[[str], None]) -> None:
    """Each task's head profile on the dev split (the protocol's `PROFILE_*`), for the methods that
    steer a profile's best heads."""
    from dysco_interp.decoding.baselines.pasta_profile import profile_heads, top_heads

    for task in s.tasks:
        path = s.profile_path(task)
        if path.is_file():
            continue
        instances = split_instances(s.data_dir, "dev", task, s.profile_length, PROFILE_N, SCRIPT)
        spec = get_task(task)
        t0 = time.perf_counter()
        scores = profile_heads(model, [spec.evaluation.prompt(i) for i in instances],
                               [spec.evaluation.gold(i) for i in instances], emphasize=spec.instruction,
                               alpha=PROFILE_ALPHA, batch_size=PROFILE_N)
        write_json(path, {"model": s.model_name, "task": task, "length": s.profile_length, "n": PROFILE_N,
                          "alpha": PROFILE_ALPHA, "rule": PROFILE_RULE,
                          "ranking": top_heads(scores, scores.numel()).split(),
                          "scores": [[round(float(v), 6) for v in row] for row in scores]})
        log(f"{path}: {scores.numel()} heads profiled in {time.perf_counter() - t0:.1f}s")


def run_harness(model: LoadedModel, heads: HeadSet, s: HarnessSettings, log: Callable[[str], None] = print) -> None:
    check_settings(s)

    def run(split: str, task: str, length: str, methods: dict[str, DecodingConfig], forced: bool,
            path: Path, format_forced: bool = False) -> None:
        instances = split_instances(s.data_dir, split, task, length, s.n, SCRIPT)
        t0 = time.perf_counter()
        done = evaluate(model, s.model_name, task, instances, methods, heads, path, backend=s.backend,
                        batch_size=batch_for(instances, s.tokens_per_batch), teacher_forced=forced,
                        command=s.command, format_forced=format_forced)
        log(f"{done.path}: {len(done.new)} new records in {time.perf_counter() - t0:.1f}s")

    if "profile" in s.parts and uses_profile(s):
        write_profiles(model, s, log)
    if "dev" in s.parts:
        for task in s.tasks:
            for length in s.lengths:
                run("dev", task, length, dev_methods(s, task, FORCED_TOKENS[task]), True, s.store("dev", task, length))
    if "choose" in s.parts:
        for method, choice in write_choices(s).items():
            log(f"{method}: {choice['label']} (mean rank {choice['mean_rank']:g} over {len(choice['cells'])} cells)")
    for forced, part in ((True, "test-tf"), (False, "test-free")):
        if part in s.parts:
            tokens = FORCED_TOKENS if forced else FREE_TOKENS
            for task in s.tasks:
                for length in s.lengths:
                    run("test", task, length, test_methods(s, task, tokens[task]), forced,
                        s.store("test", task, length, "tf" if forced else "free"))
    if "test-ff" in s.parts:
        for task in s.tasks:
            if get_task(task).evaluation.segments is None:
                log(f"{task}: its answers name no format segments, so no format-forced run")
                continue
            for length in s.lengths:
                run("test", task, length, test_methods(s, task, FREE_TOKENS[task]), False,
                    s.store("test", task, length, "ff"), format_forced=True)
    if "test-variants" in s.parts:
        for task in s.tasks:
            for length in s.lengths:
                run("test", task, length, variant_methods(s, task, FORCED_TOKENS[task]), True,
                    s.store("variants", task, length, "tf"))
    if "test-long" in s.parts:
        best = long_methods({m: c for m, c in committed_choices(s).items() if m in s.methods}, N_LONG)
        log(f"at {LONG_LENGTH}: {', '.join(best)} (the protocol's long-length rule on the dev choices)")
        for task in s.tasks:
            for forced, tokens in ((True, FORCED_TOKENS), (False, FREE_TOKENS)):
                run("test", task, LONG_LENGTH, test_methods(s, task, tokens[task], best), forced,
                    s.store("test", task, LONG_LENGTH, "tf" if forced else "free"))


__all__ = ["DEFAULT_PARTS", "PARTS", "HarnessSettings", "check_data", "check_settings", "committed_choices",
           "dev_methods", "profile_heads_of", "run_harness", "task_methods", "test_methods", "uses_profile",
           "variant_methods", "write_choices", "write_profiles"]

"""How far the small-budget effect moves under what a rerun may change: the accelerator, the
decode attention's precision, and the head set.

The reference is the budget study's test split for one model (Path Traversal, seed 0, its 50
instances at 2K and 8K, teacher forced, bf16, the static backend with CUDA graphs, the shipped
QRHeads), stored under `<out>/budget/test/`. Each variant reruns vanilla and the budget study's
chosen configuration on the same instances, changing one thing:

- machine: nothing but the machine this runs on (the reference records name theirs);
- fp32:    the static backend's decode attention in float32 (`decode_attention="float32"`);
- heads:   the chosen configuration with a second QRHead set, detected like the shipped one
           (QRScore, the same number of needle-QA examples and length) on another data seed.

Parts: detect (the second head set -> variance/heads_<model>_seed<S>.json), machine, fp32, heads
(-> variance/<model>_path_traversal_<len>_<variant>.jsonl, resumable). The report
(`variance_report`) pairs every effect with the reference's on the same instances.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dysco_interp import checks
from dysco_interp.decoding.backends import BackendSpec
from dysco_interp.decoding.config import DecodingConfig, preset
from dysco_interp.errors import ConfigError
from dysco_interp.experiments.evaluate import evaluate
from dysco_interp.heads import HeadSet
from dysco_interp.models import LoadedModel
from dysco_interp.stores.archives import stored
from dysco_interp.studies.budget_study import FORCED_TOKENS, choice_path, chosen_config, named, split_instances

PARTS = ("detect", "machine", "fp32", "heads")
VARIANTS = ("machine", "fp32", "heads")
TASK = "path_traversal"
LENGTHS = ("2k", "8k")
# a needle-QA seed no detection, dev split, held-out check (seed + 1000) or test split has used
SECOND_HEADS_SEED = 3
HELDOUT_EXAMPLES = 16  # the gold-mass check's examples, as the shipped set's


@dataclass(frozen=True)
class VarianceSettings:
    model_name: str
    data_dir: Path  # test/path_traversal_<len>.jsonl, as the budget study reads them
    out_dir: Path  # holds budget/ (the reference stores and the choice); variance/ is written
    parts: Sequence[str] = PARTS
    lengths: Sequence[str] = LENGTHS
    batch_size: int = 50
    n: int | None = None  # instances per length (None: all)
    heads_seed: int = SECOND_HEADS_SEED
    command: str | None = None

    @property
    def folder(self) -> Path:
        return self.out_dir / "variance"

    def store(self, length: str, variant: str) -> Path:
        return stored(self.folder / f"{self.model_name}_{TASK}_{length}_{variant}.jsonl")

    def reference(self, length: str) -> Path:
        return stored(self.out_dir / "budget" / "test" / f"{self.model_name}_{TASK}_{length}_tf.jsonl")

    @property
    def heads_path(self) -> Path:
        return self.folder / f"heads_{self.model_name}_seed{self.heads_seed}.json"

    @property
    def choice_path(self) -> Path:
        return choice_path(self.out_dir, self.model_name)


def check_parts(parts: Sequence[str]) -> None:
    checks.check_parts(parts, PARTS)


def methods(s: VarianceSettings) -> dict[str, DecodingConfig]:
    """vanilla and the budget study's choice, configured exactly as in its test stores (so the
    records carry the same method keys as the reference's)."""
    if not s.choice_path.is_file():
        raise ConfigError(f"no {s.choice_path}: the variance study reruns the budget study's choice")
    chosen = json.loads(s.choice_path.read_text())["config"]
    tokens = FORCED_TOKENS[TASK]
    return named([preset("paper", max_new_tokens=tokens).replace(method="vanilla"), chosen_config(chosen, tokens)])


def detect_second_heads(model: LoadedModel, shipped: HeadSet, s: VarianceSettings) -> HeadSet:
    """QRHeads detected as the shipped set was (its example count, length and head count), on the
    needle-QA seed `s.heads_seed`; written to `s.heads_path` with the usual checks beside it."""
    from dysco_interp.detection.api import make_detection_data
    from dysco_interp.detection.shipping import detect_and_check

    if s.heads_path.is_file():
        return HeadSet.from_json(s.heads_path)
    if len(shipped.detected_on) != 1 or len(shipped.detected_on[0].lengths) != 1:
        raise ConfigError("the shipped head file records no single detection set (task, n, length) to repeat")
    [origin] = shipped.detected_on
    if origin.seed == s.heads_seed:
        raise ConfigError(f"the second head set needs another seed than the shipped set's ({origin.seed})")
    length = origin.lengths[0]
    data = make_detection_data(model, origin.n, length, seed=s.heads_seed)
    heldout = make_detection_data(model, HELDOUT_EXAMPLES, length, seed=s.heads_seed + 1000)
    heads, checks = detect_and_check(model, data, heldout, top_k=len(shipped), seed=s.heads_seed,
                                     store=s.folder / "detect", command=s.command or "", length=length)
    s.folder.mkdir(parents=True, exist_ok=True)
    heads.to_json(s.heads_path)
    (s.folder / f"heads_{s.model_name}_seed{s.heads_seed}_checks.json").write_text(json.dumps(checks, indent=1) + "\n")
    return heads


def run_variance(model: LoadedModel, shipped: HeadSet, s: VarianceSettings,
                 log: Callable[[str], None] = print) -> None:
    check_parts(s.parts)
    wanted = methods(s)
    second = detect_second_heads(model, shipped, s) if {"detect", "heads"} & set(s.parts) else None
    chosen = {k: c for k, c in wanted.items() if c.method != "vanilla"}
    runs: dict[str, tuple[dict[str, DecodingConfig], HeadSet | None, BackendSpec]] = {
        "machine": (wanted, shipped, BackendSpec("static")),
        "fp32": (wanted, shipped, BackendSpec("static", decode_attention="float32")),
        "heads": (chosen, second, BackendSpec("static")),  # vanilla reads no heads: the machine run's
    }
    for variant in VARIANTS:
        if variant not in s.parts:
            continue
        configs, heads, backend = runs[variant]
        for length in s.lengths:
            instances = split_instances(s.data_dir, "test", TASK, length, s.n, "analyses/variance_study.py")
            t0 = time.perf_counter()
            done = evaluate(model, s.model_name, TASK, instances, configs, heads, s.store(length, variant),
                            backend=backend, batch_size=s.batch_size, teacher_forced=True, command=s.command)
            log(f"{done.path}: {len(done.new)} new records in {time.perf_counter() - t0:.1f}s")


__all__ = ["LENGTHS", "PARTS", "SECOND_HEADS_SEED", "VARIANTS", "VarianceSettings", "check_parts",
           "detect_second_heads", "methods", "run_variance"]

"""What DySCO fixes and what it breaks on Path Traversal, route step by route step, and a gate
derived from it.

Parts (each resumes from its store under OUT/step_account/):
  steps   vanilla and DySCO (the default preset), and on the test split the gate, teacher forced
          on the gold route of every instance; the gold route replayed under the QRHeads and all
          heads (`analysis.replay`). One record per instance: its route steps
          (`analysis.step_mechanism.StepMechanism`: attention on the gold edge, DySCO's
          selection, each method's pick, log-probability and margin) and the first gold token
          each method's argmax misses -> <split>/<model>_<length>_steps.jsonl
  gate    (dev) the gate's threshold by `gate_choice`'s rule -> gate_<model>.json
  free    vanilla, DySCO and the gate decoding freely (an `evaluate` store)
          -> test/<model>_<length>_free.jsonl

Greedy free decoding writes what teacher forcing's argmax predicts for as long as it stays on
the gold answer, so a free run leaves the gold route at the first gold token its forced argmax
misses: the report checks this against the free runs and reads the signals there.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dysco_interp import checks
from dysco_interp.analysis.replay import replay_path_traversal, route_steps, token_pieces
from dysco_interp.analysis.step_mechanism import step_mechanisms
from dysco_interp.atomic import atomic_open
from dysco_interp.decoding.choices import DEFAULT_PRESET
from dysco_interp.decoding.config import DecodingConfig, preset
from dysco_interp.decoding.loop import generate_batch
from dysco_interp.decoding.results import GenerationResult
from dysco_interp.errors import ConfigError
from dysco_interp.experiments.evaluate import evaluate
from dysco_interp.heads import HeadSet
from dysco_interp.models import LoadedModel, dtype_name
from dysco_interp.progress import tqdm
from dysco_interp.stores.archives import glob_stores, stored
from dysco_interp.stores.provenance import provenance
from dysco_interp.stores.store import ResultStore
from dysco_interp.studies.budget_study import FORCED_TOKENS, FREE_TOKENS, batch_for, split_instances
from dysco_interp.studies.gate_choice import choose_gate
from dysco_interp.tasks.path_traversal import PathTraversalInstance, teacher_forced_inputs

TASK = "path_traversal"
SCRIPT = "analyses/step_account.py"
PARTS = ("steps", "gate", "free")
KEY = ("model", "split", "length", "seed", "index")
FOLDER = "step_account"


@dataclass(frozen=True)
class AccountSettings:
    model_name: str
    data_dir: Path  # holds <split>/path_traversal_<length>.jsonl
    out_dir: Path
    split: str  # "dev" or "test"
    lengths: tuple[str, ...]
    backend: str = "static"
    tokens_per_batch: int = 512 * 1024  # instances decoded together: this many prompt tokens
    n: int | None = None
    command: str | None = None

    def store(self, length: str, kind: str) -> Path:
        return stored(self.out_dir / FOLDER / self.split / f"{self.model_name}_{length}_{kind}.jsonl")

    @property
    def gate_path(self) -> Path:
        return self.out_dir / FOLDER / f"gate_{self.model_name}.json"

    def read_gate(self) -> dict:
        if not self.gate_path.is_file():
            raise ConfigError(f"no {self.gate_path}: run the steps and gate parts on the dev split first")
        return json.loads(self.gate_path.read_text())


def check_parts(parts: Sequence[str], split: str) -> None:
    checks.check_parts(parts, PARTS)
    if "gate" in parts and split != "dev":
        raise ConfigError("the gate is chosen on the dev split only (--split dev)")
    if "free" in parts and split != "test":
        raise ConfigError("free generation runs on the test split (--split test)")


def methods(max_new_tokens: int, gate: dict | None) -> dict[str, DecodingConfig]:
    """vanilla, DySCO (the default preset) and, once chosen, the gate at the same selection."""
    dysco = preset(DEFAULT_PRESET, max_new_tokens=max_new_tokens, record_positions=True)  # the replay reads them
    out = {"vanilla": DecodingConfig(method="vanilla", max_new_tokens=max_new_tokens), "dysco": dysco}
    if gate is not None:
        out["gated"] = dysco.replace(method="dysco-gated").with_params(min_mass=gate["min_mass"])
    return out


def first_misses(results: dict[str, GenerationResult], gold: Sequence[int], pieces: Sequence[str],
                 steps: Sequence[int | None], city_starts: set[int]) -> dict[str, dict | None]:
    """method -> the first gold token its teacher-forced argmax misses: its index, text, route
    step, and whether it starts a city name (None: it misses none)."""
    out: dict[str, dict | None] = {}
    for name, res in results.items():
        assert res.forced is not None
        j = next((j for j, (a, g) in enumerate(zip(res.forced.argmax, gold)) if a != g), None)
        out[name] = None if j is None else {"token": j, "text": pieces[j], "step": steps[j], "city": j in city_starts}
    return out


def account_instance(model: LoadedModel, heads: HeadSet, inst: PathTraversalInstance,
                     results: dict[str, GenerationResult], backend: str) -> dict:
    """One instance's record: its route steps and each method's first miss."""
    inputs = teacher_forced_inputs(inst, model.tokenizer)
    replay = replay_path_traversal(model, inst, results["dysco"], heads, backend=backend)
    steps = step_mechanisms(replay, inputs, results, model.tokenizer, inst, results["dysco"])
    gold = list(inputs.input_ids[inputs.prompt_len:])
    pieces = token_pieces(model.tokenizer, gold)
    start = inputs.prompt_len - 1
    return {"instance": inst.id, "n_tokens": inst.n_tokens, "n_edges": inst.n_edges, "n_hops": inst.n_hops,
            "steps": [s.to_dict() for s in steps],
            "first_miss": first_misses(results, gold, pieces, route_steps(pieces, inst.n_hops),
                                       {p - start for p in inputs.first_token_positions})}


def run_steps(model: LoadedModel, heads: HeadSet, s: AccountSettings, length: str,
              configs: dict[str, DecodingConfig], log: Callable[[str], None]) -> None:
    t0 = time.perf_counter()
    instances = split_instances(s.data_dir, s.split, TASK, length, s.n, SCRIPT)
    settings = {"model": s.model_name, "task": TASK, "backend": s.backend, "dtype": dtype_name(model),
                "heads": sorted(list(h) for h in heads), "methods": {n: c.used_fields() for n, c in configs.items()}}
    with ResultStore(s.store(length, "steps"), KEY, settings, purpose="step_account") as store:
        def key(inst: PathTraversalInstance) -> dict:
            return {"model": s.model_name, "split": s.split, "length": inst.target_tokens, "seed": inst.seed,
                    "index": inst.index}

        todo = [inst for inst in instances if key(inst) not in store]
        batch = batch_for(instances, s.tokens_per_batch)
        for first in tqdm(range(0, len(todo), batch), desc=f"steps {s.model_name} {length}", unit="batch"):
            chunk = todo[first:first + batch]
            runs = generate_batch(model, [i.prompt for i in chunk], configs, heads,
                                  forced=[i.completion for i in chunk], backend=s.backend)
            for j, inst in enumerate(chunk):
                results = {name: rows[j] for name, rows in runs.items()}
                store.append({**key(inst), **account_instance(model, heads, inst, results, s.backend),
                              "run": provenance(model.device, s.command)})
    log(f"{store.path}: {len(todo)} new records in {time.perf_counter() - t0:.1f}s")


def dev_records(s: AccountSettings) -> list[dict]:
    folder = s.out_dir / FOLDER / "dev"
    return [r for p in glob_stores(folder / f"{s.model_name}_*_steps.jsonl") for r in step_records(p)]


def step_records(path: str | Path) -> list[dict]:
    """The records of a steps store (plain or archived), read without changing it."""
    return ResultStore(path, KEY, readonly=True).records()


def write_gate(s: AccountSettings) -> dict:
    """The gate chosen from the model's dev stores, written to `s.gate_path`."""
    choice = choose_gate(dev_records(s), s.model_name)
    with atomic_open(s.gate_path) as f:
        f.write(json.dumps(choice, indent=1) + "\n")
    return choice


def run_account(model: LoadedModel, heads: HeadSet, s: AccountSettings, parts: Sequence[str],
                log: Callable[[str], None] = print) -> None:
    check_parts(parts, s.split)
    if "steps" in parts:
        gate = s.read_gate() if s.split == "test" else None
        for length in s.lengths:
            run_steps(model, heads, s, length, methods(FORCED_TOKENS[TASK], gate), log)
    if "gate" in parts:
        choice = write_gate(s)
        log(f"gate for {s.model_name}: min_mass {choice['min_mass']} (helps on dev: {choice['helps_on_dev']})")
    if "free" in parts:
        gate = s.read_gate()
        for length in s.lengths:
            t0 = time.perf_counter()
            instances = split_instances(s.data_dir, s.split, TASK, length, s.n, SCRIPT)
            batch = batch_for(instances, s.tokens_per_batch)
            done = evaluate(model, s.model_name, TASK, instances, methods(FREE_TOKENS[TASK], gate), heads,
                            s.store(length, "free"), backend=s.backend, batch_size=batch, command=s.command)
            log(f"{done.path}: {len(done.new)} new records in {time.perf_counter() - t0:.1f}s")


__all__ = ["AccountSettings", "PARTS", "account_instance", "first_misses", "methods", "run_account", "write_gate"]

"""The DySCO paper's motivation study (Figure 3) on Path Traversal: per instance, ONE
teacher-forced pass over prompt + gold route gives, per step, whether every token of the
next city's name is the argmax, and at the position predicting the city's first token each
head's attention summed over every edge line. From those: is the gold edge among the top
5% of edges (ties count against it) for the QRHeads, for random heads of the same size and
for all heads, and the mass and rank of the gold edge. `motivation_summary` reads, sums up
and draws the records.

With a backend ("static" or "sdpa"), the same numbers come from read-outs of every head, fed
one token at a time after a prefill: no score matrix is built, so the figure reaches 128K
tokens (with a YaRN-scaled model past the native window).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from dysco_interp.analysis.edge_attention import EdgeAttention, readout_edge_attention, teacher_forced_edge_attention
from dysco_interp.detection import random_head_sets
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet, resolve_heads
from dysco_interp.hooks import Head
from dysco_interp.models import LoadedModel, dtype_name
from dysco_interp.models.yarn import yarn_factor
from dysco_interp.progress import tqdm
from dysco_interp.ranking import gold_rank
from dysco_interp.stores.store import ResultStore
from dysco_interp.studies.motivation_summary import HOPS, TASK
from dysco_interp.tasks import load_dataset, make_dataset
from dysco_interp.tasks.lengths import length_label
from dysco_interp.tasks.path_traversal import PathTraversalInstance


def head_metrics(att: EdgeAttention, heads: Iterable[Head], fraction: float) -> dict:
    """Per step: gold edge in the heads' top fraction, its mass, its rank (1 = most attended;
    ties count against the gold edge)."""
    per_edge = att.for_heads(heads)
    return {"gold_in_top": [int(x) for x in att.gold_in_top(heads, fraction).tolist()],
            "gold_mass": [round(float(x), 7) for x in att.gold_mass(heads)],
            "gold_rank": [int(x) for x in gold_rank(per_edge, att.gold)]}


def instance_record(model: LoadedModel, model_name: str, inst: PathTraversalInstance, qr: HeadSet,
                    randoms: list[HeadSet], fraction: float, backend: str | None = None) -> dict:
    """One pass for one instance: step accuracy and gold-edge attention of every head set
    (through the bridge, or with `backend` through its read-outs)."""
    spec = model.spec
    all_heads = [(layer, h) for layer in range(spec.n_layers) for h in range(spec.n_heads)]
    if backend is None:
        att = teacher_forced_edge_attention(model, inst, score_steps=True)
    else:
        att = readout_edge_attention(model, inst, all_heads, backend, score_steps=True)
    assert att.correct is not None  # score_steps=True scores every step
    draws = [head_metrics(att, r, fraction) for r in randoms]
    n_steps = len(att.gold)
    return {
        "model": model_name, "task": TASK, "length": inst.target_tokens, "seed": inst.seed, "index": inst.index,
        "id": inst.id, "n_tokens": inst.n_tokens, "n_edges": inst.n_edges, "hops": inst.n_hops,
        "dtype": dtype_name(model.dtype), "device": model.device.type, "backend": backend or "bridge",
        "yarn": yarn_factor(model.hf_config),
        "correct": [bool(c) for c in att.correct],
        "qrheads": {**head_metrics(att, qr, fraction), "heads": qr.labels()},
        "random": {
            "gold_in_top": [sum(d["gold_in_top"][k] for d in draws) / len(draws) for k in range(n_steps)],
            "gold_mass": [round(sum(d["gold_mass"][k] for d in draws) / len(draws), 7) for k in range(n_steps)],
            "draws": draws,
            "heads": [r.labels() for r in randoms],
        },
        "all_heads": head_metrics(att, all_heads, fraction),
    }


def check_instances(data: list, length: int, n: int, seed: int, source: str) -> list:
    """The instances with index 0..n-1 of one length and seed, in index order."""
    by_index = {}
    for inst in data:
        if inst.task != TASK:
            raise ConfigError(f"{source}: holds {inst.task!r} instances, not {TASK}")
        if inst.target_tokens == length and inst.seed == seed:
            by_index[inst.index] = inst
    missing = [i for i in range(n) if i not in by_index]
    if missing:
        raise ConfigError(f"{source}: no {length}-token instances with seed {seed} and index {missing[:5]}"
                          f"{' ...' if len(missing) > 5 else ''}; make {n} with `dysco-interp make-data`")
    out = [by_index[i] for i in range(n)]
    wrong = [x.index for x in out if x.n_hops != HOPS]
    if wrong:
        raise ConfigError(f"{source}: instances {wrong[:5]} have other than {HOPS} hops; the figure uses {HOPS}")
    return out


def dataset_getter(tokenizer, n: int, seed: int, data_dir: str | None) -> Callable[[int], list[PathTraversalInstance]]:
    """length -> instances: read DATA_DIR/path_traversal_<length>.jsonl, or generate (seeded)."""

    def get(length: int) -> list:
        if data_dir is None:
            data = make_dataset(TASK, tokenizer, length, n=n, seed=seed, hops=HOPS, progress=True)
            return check_instances(data, length, n, seed, f"generated {TASK} data")
        path = Path(data_dir) / f"{TASK}_{length_label(length)}.jsonl"
        if not path.exists():
            raise ConfigError(f"no {path}; make it with `dysco-interp make-data {TASK} --lengths "
                              f"{length_label(length)} --n {n} --seed {seed} --out {data_dir}`")
        return check_instances(load_dataset(path), length, n, seed, str(path))

    return get


def check_same_run(store: ResultStore, model_name: str, dtype: str, qr_labels: list[str]) -> None:
    """Records of one model in one store come from one dtype and one head set."""
    for r in store.records():
        if r["model"] != model_name:
            continue
        if r["dtype"] != dtype:
            raise ConfigError(f"{store.path} holds {model_name} records made in {r['dtype']}; this run uses "
                              f"{dtype}: use another --out-dir or the same --dtype")
        if r["qrheads"]["heads"] != qr_labels:
            raise ConfigError(f"{store.path} holds {model_name} records made with other QRHeads; "
                              "use another --out-dir")


def compute(model: LoadedModel, model_name: str, get_data: Callable[[int], list], lengths: Iterable[int], n: int,
            seed: int, store: ResultStore, qr: HeadSet, randoms: list[HeadSet], fraction: float,
            progress: bool = True, backend: str | None = None) -> int:
    """Fill the store with every missing (length, index) record; returns how many were added."""
    check_same_run(store, model_name, dtype_name(model.dtype), qr.labels())
    pending = {length: [i for i in range(n)
                        if {"model": model_name, "task": TASK, "length": length, "seed": seed, "index": i} not in store]
               for length in lengths}
    total = sum(len(v) for v in pending.values())
    added = 0
    with tqdm(total=total, desc=f"motivation {model_name}", unit="inst", disable=not progress) as bar:
        for length, todo in pending.items():
            if not todo:
                continue
            data = get_data(length)
            bar.set_postfix(length=length)
            for i in todo:
                store.append(instance_record(model, model_name, data[i], qr, randoms, fraction, backend))
                added += 1
                bar.update(1)
    return added


def load_head_sets(model: LoadedModel, heads_arg: str, draws: int, head_seed: int) -> tuple[HeadSet, list[HeadSet]]:
    """(QRHeads, random head sets of the same size) for the loaded model."""
    qr = resolve_heads(model, heads_arg)
    return qr, random_head_sets(model, len(qr), n_draws=draws, seed=head_seed)

"""Attention at the step where vanilla decoding first goes wrong on Path Traversal.

The query is the position whose logits chose the first token of the city that the first
wrong route line of the vanilla output leads to, under the vanilla output's own prefix (the
generated tokens from the record's trace, else the re-encoded text). One pass of the plain
model gives every head's attention there summed over each edge line; the same pass also
reads the position where the wrong line first differs from the gold line (when that is
earlier, e.g. a wrong transit). One record per instance goes to a resumable store;
`first_error_figures` draws them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from dysco_interp.analysis.edge_attention import span_attention_by_layer
from dysco_interp.analysis.records import read_records
from dysco_interp.analysis.route_lines import compare_route, first_error, route_lines
from dysco_interp.chat import encode_text
from dysco_interp.decoding.config import preset
from dysco_interp.errors import ConfigError
from dysco_interp.experiments.evaluate import evaluate
from dysco_interp.heads import HeadSet
from dysco_interp.models import LoadedModel, dtype_name
from dysco_interp.progress import tqdm
from dysco_interp.ranking import gold_rank_of, top_fraction_size
from dysco_interp.stores.archives import stored
from dysco_interp.stores.store import ResultStore
from dysco_interp.tasks import load_dataset, make_dataset
from dysco_interp.tasks.lengths import length_label
from dysco_interp.tasks.path_traversal import PathTraversalInstance, generate_instance, teacher_forced_inputs

TASK = "path_traversal"
STORE_NAME = "first_error.jsonl"
KEY = ("model", "task", "length", "seed", "index")
HEADER = {"analysis": "first_error", "task": TASK,
          "query": "position predicting the first token of the wrongly written city (vanilla prefix)",
          "heads": "QRHeads mean vs mean of all heads"}
TOP_FRACTION = 0.05
SMALL: dict[str, Any] = {"model": "smollm2-135m", "length": "1k", "n": 2, "out_dir": "results/first_error_small",
                         "max_new_tokens": 64}

# (instance, vanilla record, DySCO record or None)
Failure = tuple[PathTraversalInstance, dict, dict | None]


# ---------------------------------------------------------------------------- the vanilla prefix


def generated_ids(record: dict, tokenizer) -> tuple[list[int], str]:
    """The tokens the run generated: from its trace when stored (exact), else re-encoded text."""
    steps = (record.get("trace") or {}).get("steps") or []
    fed = [s["token"] for s in steps if s["phase"] == "decode"]
    if fed and record["output"].startswith(tokenizer.decode(fed, skip_special_tokens=True)):
        return fed, "trace"
    return encode_text(tokenizer, record["output"])[0], "re-encoded output"


def token_at_char(ids: list[int], tokenizer, char: int) -> int:
    """Index of the generated token whose decoded text covers character `char` of the output."""
    for k in range(len(ids)):
        if len(tokenizer.decode(ids[: k + 1], skip_special_tokens=True)) > char:
            return k
    raise ConfigError(f"character {char} lies past the generated tokens the record holds")


# ---------------------------------------------------------------------------- one instance


def edge_summary(per_edge: list[float], gold: int) -> dict:
    """Where the gold edge stands among the per-edge masses (ties count against it)."""
    order = sorted(range(len(per_edge)), key=lambda i: -per_edge[i])
    k = top_fraction_size(len(per_edge), TOP_FRACTION)
    rank = gold_rank_of(per_edge, gold)
    return {"gold_mass": per_edge[gold], "gold_rank": rank, "top_edge": order[0], "gold_in_top5pct": rank <= k,
            "top5pct_cutoff": per_edge[order[k - 1]]}


def analyse_instance(model: LoadedModel, model_name: str, inst: PathTraversalInstance, vanilla: dict,
                     dysco: dict | None, qr: HeadSet) -> dict:
    """The record for one instance whose vanilla route goes wrong."""
    err = first_error(inst, vanilla["output"])
    if err is None:
        raise ConfigError(f"the vanilla route of instance {inst.index} has no wrong line to inspect")
    tok = model.tokenizer
    ids, source = generated_ids(vanilla, tok)
    prompt = list(teacher_forced_inputs(inst, tok).input_ids[: inst.n_tokens])
    queries = {"divergence": token_at_char(ids, tok, err.diverge_at)}
    if err.line.dst_start is not None:
        queries["city"] = token_at_char(ids, tok, err.line.dst_start)
    last = max(queries.values())
    # The token at generated index j is chosen at position n_prompt + j - 1; the pass starts one
    # token before the generated ones so that position n_prompt - 1 can be a query too.
    names = list(queries)
    rows_at = torch.tensor([queries[q] for q in names])
    spec = model.spec
    masses = torch.empty(len(names), spec.n_layers, spec.n_heads, inst.n_edges)

    def store(layer: int, sums: torch.Tensor) -> None:
        masses[:, layer] = sums.transpose(0, 1)

    logits = span_attention_by_layer(model, prompt + ids[:last], len(prompt) - 1, rows_at,
                                     inst.edge_token_spans, store, logits_to_keep=0)
    argmax = logits[0, rows_at.to(logits.device)].argmax(-1).tolist()
    qr_idx = torch.tensor(list(qr), dtype=torch.long)
    gold = inst.gold_edge_indices[err.step]
    edges = inst.edges
    followed = [i for i, e in enumerate(edges) if err.written_city is not None and e.dst == err.written_city]
    out_queries = {}
    for q, name in enumerate(names):
        j = queries[name]
        qr_mass = [round(float(x), 7) for x in masses[q, qr_idx[:, 0], qr_idx[:, 1]].mean(0)]
        all_mass = [round(float(x), 7) for x in masses[q].mean((0, 1))]
        out_queries[name] = {
            "generated_index": j, "position": len(prompt) + j - 1,
            "wrote": tok.decode([ids[j]]), "argmax_now": tok.decode([argmax[q]]), "reproduced": argmax[q] == ids[j],
            "qrheads": qr_mass, "all_heads": all_mass,
            "summary": {"qrheads": edge_summary(qr_mass, gold), "all_heads": edge_summary(all_mass, gold)},
        }
    gold_lines = inst.answer_nl.strip().split("\n")
    return {
        "model": model_name, "task": TASK, "length": inst.target_tokens, "seed": inst.seed, "index": inst.index,
        "id": inst.id, "n_tokens": inst.n_tokens, "n_edges": inst.n_edges,
        "dtype": dtype_name(model.dtype), "device": model.device.type, "heads": qr.labels(),
        "question": inst.question_nl, "gold_route": gold_lines,
        "stored_first_error_step": vanilla.get("first_error_step"),
        "first_error": err.to_dict(), "step": err.step, "written_city": err.written_city,
        "gold_city": inst.edges[gold].dst, "gold_edge": gold, "followed_edges": followed, "prefix_source": source,
        "edges": [e.to_dict() for e in edges],
        "queries": out_queries,
        "routes": {"vanilla": {"output": vanilla["output"], "lines": compare_route(inst, vanilla["output"])},
                   **({"dysco": {"output": dysco["output"], "lines": compare_route(inst, dysco["output"])}}
                      if dysco else {})},
    }


# ---------------------------------------------------------------------------- choosing instances


def evaluation_records(path: str, model_name: str, length: int | None) -> tuple[int, dict[int, dict[str, dict]]]:
    """(length, {index: {method: record}}) of one model's Path Traversal records in a store."""
    path = str(stored(path))
    if not Path(path).exists():  # anything there is judged by the store reader
        raise ConfigError(f"no evaluation records at {path}")
    recs = [r for r in read_records(path) if r["model"] == model_name and r["task"] == TASK]
    lengths = sorted({r["length"] for r in recs})
    if not recs:
        raise ConfigError(f"{path} holds no {TASK} records of model {model_name!r}")
    if length is None:
        if len(lengths) > 1:
            raise ConfigError(f"{path} holds lengths {lengths}; pick one with --length")
        length = lengths[0]
    by_index: dict[int, dict[str, dict]] = {}
    for r in recs:
        if r["length"] == length:
            by_index.setdefault(r["index"], {})[r["method"]] = r
    if not by_index:
        raise ConfigError(f"{path} holds no {length}-token records of {model_name!r} (lengths: {lengths})")
    return length, by_index


def instance_getter(tokenizer, length: int, seed: int, data: str | None) -> Callable[[int], PathTraversalInstance]:
    """index -> instance: from a task file (or DIR/path_traversal_<length>.jsonl), or regenerated."""
    loaded = None
    if data is not None:
        path = Path(data)
        path = path / f"{TASK}_{length_label(length)}.jsonl" if path.is_dir() else path
        if not path.exists():
            raise ConfigError(f"no task data at {path}")
        loaded = {x.index: x for x in load_dataset(path) if x.target_tokens == length and x.seed == seed}

    def get(index: int):
        if loaded is None:
            return generate_instance(tokenizer, length, seed=seed, index=index)
        if index not in loaded:
            raise ConfigError(f"{data} has no {length}-token instance with seed {seed} and index {index}")
        return loaded[index]

    return get


def failures(by_index: dict[int, dict[str, dict]], get_instance, index: int | None, every: bool) -> list[Failure]:
    """The failures to analyse: the given index; with `every`, each instance whose vanilla
    route goes wrong; else the featured one (see `featured`)."""
    candidates = [index] if index is not None else sorted(i for i, m in by_index.items() if "vanilla" in m)
    found = []
    for i in candidates:
        methods = by_index.get(i, {})
        if "vanilla" not in methods:
            raise ConfigError(f"no vanilla record for instance {i}")
        inst = get_instance(i)
        if inst.id != methods["vanilla"]["id"]:
            raise ConfigError(f"instance {i} is {inst.id!r} but the record is of {methods['vanilla']['id']!r}: "
                              "pass the data seed with --seed, or the task data with --data")
        err = first_error(inst, methods["vanilla"]["output"])
        if err is None:
            if index is not None:
                raise ConfigError(f"the vanilla route of instance {i} has no wrong line to inspect")
            continue
        found.append(((inst, methods["vanilla"], methods.get("dysco")), err.written_city is not None))
        if not every and found[-1][1]:
            break  # the featured one: nothing after it is needed
    if every or index is not None:
        return [f for f, _ in found]
    return [f for f, has_city in found if has_city][:1] or [f for f, _ in found][:1]


def featured(records: list[dict]) -> list[dict]:
    """Per (model, length): the record of the lowest index whose first wrong line names a
    city, else the lowest index (the instance a run without --index/--all draws)."""
    out = []
    for key in sorted({(r["model"], r["length"]) for r in records}):
        group = sorted((r for r in records if (r["model"], r["length"]) == key), key=lambda r: r["index"])
        out.append(next((r for r in group if r["written_city"] is not None), group[0]))
    return out


# ---------------------------------------------------------------------------- running and reading the store


def generate_small(model: LoadedModel, model_name: str, heads: HeadSet, out_dir: Path, length: int | None,
                   seed: int) -> str:
    """Vanilla and DySCO records for SMALL['n'] instances (resumable), for the smoke run."""
    path = out_dir / "evaluation.jsonl"
    data = make_dataset(TASK, model.tokenizer, length, n=SMALL["n"], seed=seed)
    methods = {m: preset("paper", method=m, max_new_tokens=SMALL["max_new_tokens"]) for m in ("vanilla", "dysco")}
    return str(evaluate(model, model_name, TASK, data, methods, heads, path, keep_trace=True).path)


def analyse_failures(model: LoadedModel, model_name: str, qr: HeadSet, results: str, out_dir: Path, *,
                     length: int | None = None, seed: int = 0, data: str | None = None, index: int | None = None,
                     every: bool = False, command: str = "", progress: bool = True) -> tuple[int, list[dict]]:
    """(length, records) of the chosen failures in `results`, each analysed once into
    OUT_DIR/first_error.jsonl (a rerun reads the stored record)."""
    length, by_index = evaluation_records(results, model_name, length)
    chosen = failures(by_index, instance_getter(model.tokenizer, length, seed, data), index, every)
    if not chosen:
        return length, []
    store = ResultStore(out_dir / STORE_NAME, KEY, HEADER)
    records = []
    for inst, vanilla, dysco in tqdm(chosen, desc=f"first error {model_name}", unit="inst", disable=not progress):
        key = {"model": model_name, "task": TASK, "length": length, "seed": inst.seed, "index": inst.index}
        if key not in store:
            store.append({**analyse_instance(model, model_name, inst, vanilla, dysco, qr), "command": command,
                          "results": Path(results).name})
        records.append(store.get(key))
    store.close()
    return length, records


def stored_records(path: Path) -> list[dict]:
    """The records of a first-error store, read without modifying it."""
    if not path.exists():
        raise ConfigError(f"no results at {path}; run the analysis first (without --figures-only)")
    return ResultStore(path, KEY, HEADER, readonly=True).records()


def write_overview(records: list[dict], out_dir: Path, model_name: str, length: int, command: str) -> tuple[Path, dict]:
    """OUT_DIR/<model>_<length>_all.json: the `overview` of every analysed failure."""
    path = out_dir / f"{model_name}_{length_label(length)}_all.json"
    summary = overview(records)
    path.write_text(json.dumps({**summary, "command": command}, indent=1, ensure_ascii=False) + "\n")
    return path, summary


def overview(records: list[dict]) -> dict:
    """Across analysed instances: where the gold edge ranks at the wrong city, QRHeads vs all heads."""
    rows = []
    for r in sorted(records, key=lambda r: (r["model"], r["length"], r["index"])):
        q = r["queries"].get("city") or r["queries"]["divergence"]
        row = {"model": r["model"], "length": r["length"], "index": r["index"], "step": r["step"],
               "query": "city" if "city" in r["queries"] else "divergence", "wrote": r["written_city"],
               "wrote_question_destination": r["written_city"] == route_lines("\n".join(r["gold_route"]))[-1].dst,
               "reproduced": q["reproduced"], "n_edges": r["n_edges"]}
        for heads in ("qrheads", "all_heads"):
            s = q["summary"][heads]
            followed = max((q[heads][i] for i in r["followed_edges"]), default=None)
            row[heads] = {"gold_rank": s["gold_rank"], "gold_mass": s["gold_mass"],
                          "gold_in_top5pct": s["gold_in_top5pct"], "followed_edge_mass": followed}
        rows.append(row)

    def mean(values):
        values = [float(v) for v in values if v is not None]
        return round(sum(values) / len(values), 5) if values else None

    means = {heads: {m: mean(row[heads][m] for row in rows) for m in ("gold_rank", "gold_mass", "gold_in_top5pct",
                                                                      "followed_edge_mass")}
             for heads in ("qrheads", "all_heads")}
    return {"n": len(rows), "means": means,
            "wrote_question_destination": mean(row["wrote_question_destination"] for row in rows), "rows": rows}

"""Attention at the step where vanilla decoding first goes wrong on Path Traversal: per-edge
attention of the QRHeads vs the mean of all heads, with the gold edge and the edge the model
followed marked; and the gold, vanilla and DySCO routes side by side.

Small run (CPU, one to two minutes; smollm2-135m at 1K, 2 instances, vanilla and DySCO
generated first into OUT_DIR/evaluation.jsonl):

    python analyses/first_error.py --small --out-dir results/first_error_small

Full run, on stored evaluation records (CPU, ~1 min for one 2K instance; the instance is
regenerated from its seed and length, or read with --data-dir / --data):

    python analyses/first_error.py --results figures/traced_runs/qwen2.5-coder-0.5b_2k_vanilla_dysco.jsonl \\
        --model qwen2.5-coder-0.5b --out-dir figures/first_error
    python analyses/first_error.py --figures-only --out-dir figures/first_error

The query is the position whose logits chose the first token of the city that the first
wrong route line of the vanilla output leads to, under the vanilla output's own prefix (the
generated tokens from the record's trace, else the re-encoded text). One pass of the plain
model gives every head's attention there summed over each edge line; the same pass also
reads the position where the wrong line first differs from the gold line (when that is
earlier, e.g. a wrong transit). Results go to OUT_DIR/first_error.jsonl (one record per
instance, resumable); the figure and tables to OUT_DIR/<model>_<length>_<index>*.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

TASK = "path_traversal"
STORE_NAME = "first_error.jsonl"
KEY = ("model", "task", "length", "seed", "index")
SMALL = {"model": "smollm2-135m", "length": "1k", "n": 2, "out_dir": "results/first_error_small", "max_new_tokens": 64}
HEADER = {"analysis": "first_error", "task": TASK,
          "query": "position predicting the first token of the wrongly written city (vanilla prefix)",
          "heads": "QRHeads mean vs mean of all heads"}
TOP_FRACTION = 0.05


# ---------------------------------------------------------------------------- the vanilla prefix


def generated_ids(record: dict, tokenizer) -> tuple[list[int], str]:
    """The tokens the run generated: from its trace when stored (exact), else re-encoded text."""
    from dysco_interp.chat import encode_text

    steps = (record.get("trace") or {}).get("steps") or []
    fed = [s["token"] for s in steps if s["phase"] == "decode"]
    if fed and record["output"].startswith(tokenizer.decode(fed, skip_special_tokens=True)):
        return fed, "trace"
    return encode_text(tokenizer, record["output"])[0], "re-encoded output"


def token_at_char(ids: list[int], tokenizer, char: int) -> int:
    """Index of the generated token whose decoded text covers character `char` of the output."""
    from dysco_interp.errors import ConfigError

    for k in range(len(ids)):
        if len(tokenizer.decode(ids[: k + 1], skip_special_tokens=True)) > char:
            return k
    raise ConfigError(f"character {char} lies past the generated tokens the record holds")


# ---------------------------------------------------------------------------- one instance (torch)


def edge_summary(per_edge: list[float], gold: int) -> dict:
    import math

    order = sorted(range(len(per_edge)), key=lambda i: -per_edge[i])
    k = max(1, math.ceil(TOP_FRACTION * len(per_edge)))
    return {"gold_mass": per_edge[gold], "gold_rank": 1 + sum(v > per_edge[gold] for v in per_edge),
            "top_edge": order[0], "gold_in_top5pct": gold in order[:k], "top5pct_cutoff": per_edge[order[k - 1]]}


def analyse_instance(model, model_name: str, inst, vanilla: dict, dysco: dict | None, qr) -> dict:
    """The record for one instance whose vanilla route goes wrong."""
    import torch

    from dysco_interp.analysis.edge_attention import span_attention_by_layer
    from dysco_interp.analysis.route_lines import compare_route, first_error
    from dysco_interp.errors import ConfigError
    from dysco_interp.models import dtype_name
    from dysco_interp.tasks.path_traversal import teacher_forced_inputs

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
    from dysco_interp.analysis.stores import read_records
    from dysco_interp.errors import ConfigError

    if not Path(path).is_file():
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


def instance_getter(tokenizer, length: int, seed: int, data: str | None):
    """index -> instance: from a task file (or DIR/path_traversal_<length>.jsonl), or regenerated."""
    from dysco_interp.errors import ConfigError
    from dysco_interp.tasks import load_dataset
    from dysco_interp.cli.make_data import length_label
    from dysco_interp.tasks.path_traversal import generate_instance

    loaded = None
    if data is not None:
        path = Path(data)
        path = path / f"{TASK}_{length_label(length)}.jsonl" if path.is_dir() else path
        if not path.is_file():
            raise ConfigError(f"no task data at {path}")
        loaded = {x.index: x for x in load_dataset(path) if x.target_tokens == length and x.seed == seed}

    def get(index: int):
        if loaded is None:
            return generate_instance(tokenizer, length, seed=seed, index=index)
        if index not in loaded:
            raise ConfigError(f"{data} has no {length}-token instance with seed {seed} and index {index}")
        return loaded[index]

    return get


def failures(by_index: dict[int, dict[str, dict]], get_instance, index: int | None, every: bool) -> list[tuple]:
    """(instance, vanilla record, dysco record or None) to analyse: the given index; with
    `every`, each instance whose vanilla route goes wrong; else the featured one (`featured`)."""
    from dysco_interp.analysis.route_lines import first_error
    from dysco_interp.errors import ConfigError

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


def overview(records: list[dict]) -> dict:
    """Across analysed instances: where the gold edge ranks at the wrong city, QRHeads vs all heads."""
    from dysco_interp.analysis.route_lines import route_lines

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
            row[heads] = {"gold_rank": s["gold_rank"], "gold_mass": s["gold_mass"], "gold_in_top5pct": s["gold_in_top5pct"],
                          "followed_edge_mass": followed}
        rows.append(row)

    def mean(values):
        values = [float(v) for v in values if v is not None]
        return round(sum(values) / len(values), 5) if values else None

    means = {heads: {m: mean(row[heads][m] for row in rows) for m in ("gold_rank", "gold_mass", "gold_in_top5pct",
                                                                      "followed_edge_mass")}
             for heads in ("qrheads", "all_heads")}
    return {"n": len(rows), "means": means,
            "wrote_question_destination": mean(row["wrote_question_destination"] for row in rows), "rows": rows}


# ---------------------------------------------------------------------------- figures (no torch)


def stem_of(record: dict) -> str:
    from dysco_interp.cli.make_data import length_label

    return f"{record['model']}_{length_label(record['length'])}_{record['index']}"


def _edge_label(e: dict) -> str:
    return f"{e['src']} → {e['dst']}"


def draw_attention(record: dict, out_dir: Path) -> list[Path]:
    from dysco_interp.viz.plots import BarPanel, save_bars

    name = "city" if "city" in record["queries"] else "divergence"
    q = record["queries"][name]
    gold = record["gold_edge"]
    also = " (also into the written city)" if gold in record["followed_edges"] else ""
    marks = {gold: f"gold edge (step {record['step'] + 1}){also}"}  # first: the first mark colour
    marks.update({i: "edge into the written city" for i in record["followed_edges"] if i != gold})
    panels = [
        BarPanel(f"QRHeads ({len(record['heads'])} heads, mean)", "attention mass", q["qrheads"],
                 q["summary"]["qrheads"]["top5pct_cutoff"], "top-5% cut-off"),
        BarPanel("all heads (mean)", "attention mass", q["all_heads"],
                 q["summary"]["all_heads"]["top5pct_cutoff"], "top-5% cut-off"),
    ]
    what = "the city" if name == "city" else "the first wrong token"
    title = (f"{record['model']}, {record['n_tokens']} tokens, instance {record['index']}: vanilla first goes wrong "
             f"at step {record['step'] + 1}\nattention where it writes {what} {q['wrote'].strip()!r} "
             f"(gold city: {record['gold_city']!r})")
    stem = out_dir / stem_of(record)
    return list(save_bars(panels, [_edge_label(e) for e in record["edges"]], stem, title=title,
                          xlabel="edge lines in context order", marks=marks))


def _cell(row: dict | None) -> tuple[str, str | None]:
    if row is None or row["written"] is None:
        return "(nothing)", "muted"
    mark = {"right": "✓", "wrong": "✗", "extra": "+"}[row["verdict"]]
    note = f" ({row['edge']})" if row["verdict"] != "right" and row["edge"] else ""
    return f"{mark} {row['written']}{note}", {"right": "good", "wrong": "bad", "extra": "muted"}[row["verdict"]]


def route_table(record: dict) -> tuple[list[str], list[list[str]], list[list[str | None]]]:
    """Headers, rows and cell classes of the gold / vanilla / DySCO side-by-side table."""
    methods = [m for m in ("vanilla", "dysco") if m in record["routes"]]
    lines = {m: record["routes"][m]["lines"] for m in methods}
    n = max(len(record["gold_route"]), *(len(v) for v in lines.values()))
    headers = ["step", "gold route"] + [{"vanilla": "vanilla", "dysco": "DySCO"}[m] for m in methods]
    rows, classes = [], []
    for i in range(n):
        gold = record["gold_route"][i] if i < len(record["gold_route"]) else ""
        cells = [_cell(lines[m][i] if i < len(lines[m]) else None) for m in methods]
        rows.append([str(i + 1), gold] + [c[0] for c in cells])
        classes.append([None, None] + [c[1] for c in cells])
    return headers, rows, classes


def draw_routes(record: dict, out_dir: Path) -> list[Path]:
    from dysco_interp.viz.plots import table_html, table_markdown

    headers, rows, classes = route_table(record)
    stem = out_dir / f"{stem_of(record)}_routes"
    title = f"{record['model']}, {record['n_tokens']} tokens, instance {record['index']}: {record['question']}"
    note = "✓ equals the gold line, ✗ differs (with whether the written step is an edge of the context), + past the gold route."
    md = stem.with_name(stem.name + ".md")
    md.write_text(f"**{title}**\n\n" + table_markdown(headers, rows) + f"\n{note}\n", encoding="utf-8")
    html = table_html(headers, rows, stem.with_name(stem.name + ".html"), title=title, classes=classes, notes=[note])
    js = stem.with_name(stem.name + ".json")
    js.write_text(json.dumps({"question": record["question"], "gold": record["gold_route"],
                              **{m: r for m, r in record["routes"].items()}}, indent=1, ensure_ascii=False) + "\n")
    return [md, html, js]


def draw(record: dict, out_dir: Path, command: str, figures: bool = True) -> list[Path]:
    """The record as JSON, then (unless `figures` is off) its bar figure and route table."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{stem_of(record)}.json"
    path.write_text(json.dumps({**record, "command": command}, indent=1, ensure_ascii=False) + "\n")
    written = [path]
    if figures:
        try:
            written += draw_attention(record, out_dir)
        except ImportError as e:
            print(f"not drawing ({e.name} is not installed); draw later with --figures-only", file=sys.stderr)
        written += draw_routes(record, out_dir)
    return written


def describe(record: dict) -> str:
    lines = [f"instance {record['index']} ({record['id']}): {record['question']}",
             f"first wrong step {record['step'] + 1}: wrote {record['first_error']['line']['text']!r}; "
             f"gold {record['first_error']['gold_line']!r}"]
    for name, q in record["queries"].items():
        s = q["summary"]
        lines.append(f"  at the {name} token {q['wrote']!r} (reproduced: {q['reproduced']}): gold edge rank "
                     f"QRHeads {s['qrheads']['gold_rank']}/{record['n_edges']} (mass {s['qrheads']['gold_mass']:.4f}), "
                     f"all heads {s['all_heads']['gold_rank']}/{record['n_edges']} (mass {s['all_heads']['gold_mass']:.4f}); "
                     f"QRHeads' top edge: {_edge_label(record['edges'][s['qrheads']['top_edge']])}")
    return "\n".join(lines)


def read_store(path: Path):
    from dysco_interp.errors import ConfigError
    from dysco_interp.experiments.store import ResultStore

    if not path.is_file():
        raise ConfigError(f"no results at {path}; run the analysis first (without --figures-only)")
    return ResultStore(path, KEY, HEADER, readonly=True)


# ---------------------------------------------------------------------------- command line


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", default=None, help="evaluation records (vanilla, and DySCO for the side-by-side)")
    p.add_argument("--model", default=None, help="the records' model (registry alias or folder)")
    p.add_argument("--length", default=None, help="which length of the records (when they hold several)")
    p.add_argument("--index", type=int, default=None, help="instance index (default: the first vanilla failure)")
    p.add_argument("--all", action="store_true",
                   help="analyse every vanilla failure (resumable) and write <model>_<length>_all.json; "
                        "figures are drawn for the first one only")
    p.add_argument("--seed", type=int, default=0, help="the data seed of the instances")
    p.add_argument("--data", "--data-dir", dest="data", default=None,
                   help="task JSONL (or a folder of path_traversal_<length>.jsonl) instead of regenerating")
    p.add_argument("--heads", default="shipped", help="'shipped' or a head file")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out-dir", default=None, help="default figures/first_error")
    p.add_argument("--small", action="store_true", help="generate vanilla + DySCO for smollm2-135m at 1K (2 instances) first")
    p.add_argument("--figures-only", action="store_true", help="draw every stored record; loads no model")
    p.add_argument("--no-figures", action="store_true", help="write the record JSON only")
    args = p.parse_args(argv)
    if args.out_dir is None:
        args.out_dir = SMALL["out_dir"] if args.small else "figures/first_error"
    if args.small:
        args.model = args.model or SMALL["model"]
        args.length = args.length or SMALL["length"]
    elif not args.figures_only and (args.results is None or args.model is None):
        p.error("give --results and --model (or --small, or --figures-only)")
    return args


def generate_small(model, model_name: str, heads, out_dir: Path, length: int, seed: int) -> str:
    """Vanilla and DySCO records for SMALL['n'] instances (resumable), for the smoke run."""
    from dysco_interp.decoding.config import DecodingConfig
    from dysco_interp.experiments.evaluate import evaluate
    from dysco_interp.tasks import make_dataset

    path = out_dir / "evaluation.jsonl"
    data = make_dataset(TASK, model.tokenizer, length, n=SMALL["n"], seed=seed)
    methods = {m: DecodingConfig(method=m, max_new_tokens=SMALL["max_new_tokens"]) for m in ("vanilla", "dysco")}
    return str(evaluate(model, model_name, TASK, data, methods, heads, path, keep_trace=True).path)


def main(argv=None) -> int:
    args = parse_args(argv)
    command = "python analyses/first_error.py " + " ".join(sys.argv[1:] if argv is None else argv)
    out_dir = Path(args.out_dir)
    if args.figures_only:
        recs = [r for r in read_store(out_dir / STORE_NAME).records()
                if (args.model is None or r["model"] == args.model) and (args.index is None or r["index"] == args.index)]
        if args.index is None and not args.all:
            recs = featured(recs)
        for r in recs:
            for path in draw(r, out_dir, r.get("command", command)):
                print(f"wrote {path}")
        return 0

    import torch
    from tqdm.auto import tqdm

    from dysco_interp.heads import load_heads, shipped_heads
    from dysco_interp.models import load_model
    from dysco_interp.experiments.store import ResultStore
    from dysco_interp.tasks.common import parse_length

    if args.threads:
        torch.set_num_threads(args.threads)
    length = parse_length(args.length) if args.length else None
    model = load_model(args.model, device=args.device, dtype=args.dtype, progress=False)
    qr = shipped_heads(model.spec.name, spec=model.spec) if args.heads == "shipped" else load_heads(args.heads, spec=model.spec)
    results = args.results
    if args.small:
        results = generate_small(model, args.model, qr, out_dir, length, args.seed)
    length, by_index = evaluation_records(results, args.model, length)
    chosen = failures(by_index, instance_getter(model.tokenizer, length, args.seed, args.data), args.index, args.all)
    if not chosen:
        print(f"no vanilla route in {results} has a wrong line to inspect; nothing to draw")
        return 0
    store = ResultStore(out_dir / STORE_NAME, KEY, HEADER)
    records = []
    for inst, vanilla, dysco in tqdm(chosen, desc=f"first error {args.model}", unit="inst"):
        key = {"model": args.model, "task": TASK, "length": length, "seed": inst.seed, "index": inst.index}
        if key not in store:
            store.append({**analyse_instance(model, args.model, inst, vanilla, dysco, qr), "command": command,
                          "results": Path(results).name})
        records.append(store.get(key))
    store.close()
    for record in records if args.index is not None else featured(records):
        print(describe(record))
        for path in draw(record, out_dir, record.get("command", command), figures=not args.no_figures):
            print(f"wrote {path}")
    if args.all:
        from dysco_interp.cli.make_data import length_label

        path = out_dir / f"{args.model}_{length_label(length)}_all.json"
        summary = overview(records)
        path.write_text(json.dumps({**summary, "command": command}, indent=1, ensure_ascii=False) + "\n")
        m = summary["means"]
        print(f"{summary['n']} failures: gold edge rank at the wrong city, QRHeads {m['qrheads']['gold_rank']} vs all heads "
              f"{m['all_heads']['gold_rank']}; in top 5%: {m['qrheads']['gold_in_top5pct']} vs "
              f"{m['all_heads']['gold_in_top5pct']}\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

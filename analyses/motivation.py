"""The DySCO paper's motivation figure (Figure 3) on Path Traversal: accuracy falls with context
length while the QRHeads keep attending to the gold edge.

Small run (CPU, about a minute; smollm2-135m, 1K and 2K, 2 instances):

    python analyses/motivation.py --small --out-dir results/motivation_small

Full run (the paper's sizes; on a GPU). Make the data where the city-name package is
installed, compute on the GPU machine, draw anywhere (matplotlib and plotly are needed
only for drawing):

    dysco-interp make-data path_traversal --model qwen2.5-coder-0.5b --lengths 1k,2k,4k,8k --n 50 --seed 0 --out DATA
    python analyses/motivation.py --model qwen2.5-coder-0.5b --lengths 1k,2k,4k,8k --n 50 --seed 0 \\
        --data-dir DATA --device cuda --dtype bfloat16 --out-dir figures/motivation
    python analyses/motivation.py --figures-only --out-dir figures/motivation

For every (length, instance) ONE teacher-forced pass over prompt + gold route gives, per
step (4 hops): whether every token of the next city's name is the argmax; and, at the
position predicting the city's first token, each head's attention summed over every edge
line. From those: is the gold edge among the top 5% of edges for the shipped QRHeads and
for random heads (mean of 5 seeded draws of the same size), and the mass on the gold edge.
Records go to OUT_DIR/motivation.jsonl, one per finished instance, so a killed run resumes.
The figure (OUT_DIR/<model>.png, .html and the numbers in <model>_summary.json) shows
step 2 (`--step`) against length, with 95% bootstrap intervals over instances.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

TASK = "path_traversal"
HOPS = 4
STORE_NAME = "motivation.jsonl"
KEY = ("model", "task", "length", "seed", "index")
SMALL = {"model": "smollm2-135m", "lengths": "1k,2k", "n": 2, "out_dir": "results/motivation_small"}
FULL = {"model": "qwen2.5-coder-0.5b", "lengths": "1k,2k,4k,8k", "n": 50, "out_dir": "figures/motivation"}
# Every series keeps its colour in every panel, model and format.
COLORS = {"teacher-forced accuracy": "#1f77b4", "QRHeads": "#d62728", "random heads": "#7f7f7f"}


# ---------------------------------------------------------------------------- compute (torch)


def store_header(draws: int, head_seed: int, fraction: float) -> dict:
    """Settings every record in one store shares; reopening with others is an error."""
    return {"analysis": "motivation", "task": TASK, "hops": HOPS, "top_fraction": fraction,
            "random_draws": draws, "random_head_seed": head_seed,
            "query": "position predicting the first token of each step's city",
            "accuracy": "every token of the city name is the argmax (teacher forced)"}


def head_metrics(att, heads, fraction: float) -> dict:
    """Per step: gold edge in the heads' top fraction, its mass, its rank (1 = most attended)."""
    per_edge = att.for_heads(heads)
    gold = per_edge.gather(1, att.gold[:, None])
    return {"gold_in_top": [int(x) for x in att.gold_in_top(heads, fraction).tolist()],
            "gold_mass": [round(float(x), 7) for x in gold[:, 0]],
            "gold_rank": [int(x) for x in (per_edge > gold).sum(1) + 1]}


def instance_record(model, model_name: str, inst, qr, randoms, fraction: float) -> dict:
    """One pass for one instance: step accuracy and gold-edge attention of every head set."""
    from dysco_interp.analysis.edge_attention import teacher_forced_edge_attention
    from dysco_interp.models import dtype_name

    att = teacher_forced_edge_attention(model, inst, score_steps=True)
    spec = model.spec
    draws = [head_metrics(att, r, fraction) for r in randoms]
    n_steps = len(att.gold)
    all_heads = [(layer, h) for layer in range(spec.n_layers) for h in range(spec.n_heads)]
    return {
        "model": model_name, "task": TASK, "length": inst.target_tokens, "seed": inst.seed, "index": inst.index,
        "id": inst.id, "n_tokens": inst.n_tokens, "n_edges": inst.n_edges, "hops": inst.n_hops,
        "dtype": dtype_name(model.dtype), "device": model.device.type,
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
    from dysco_interp.errors import ConfigError

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


def dataset_getter(tokenizer, n: int, seed: int, data_dir: str | None):
    """length -> instances: read DATA_DIR/path_traversal_<length>.jsonl, or generate (seeded)."""
    from dysco_interp.errors import ConfigError
    from dysco_interp.tasks import load_dataset, make_dataset
    from dysco_interp.cli.make_data import length_label

    def get(length: int) -> list:
        if data_dir is None:
            data = make_dataset(TASK, tokenizer, length, n=n, seed=seed, hops=HOPS, progress=True)
            return check_instances(data, length, n, seed, f"generated {TASK} data")
        path = Path(data_dir) / f"{TASK}_{length_label(length)}.jsonl"
        if not path.is_file():
            raise ConfigError(f"no {path}; make it with `dysco-interp make-data {TASK} --lengths "
                              f"{length_label(length)} --n {n} --seed {seed} --out {data_dir}`")
        return check_instances(load_dataset(path), length, n, seed, str(path))

    return get


def check_same_run(store, model_name: str, dtype: str, qr_labels: list[str]) -> None:
    """Records of one model in one store come from one dtype and one head set."""
    from dysco_interp.errors import ConfigError

    for r in store.records():
        if r["model"] != model_name:
            continue
        if r["dtype"] != dtype:
            raise ConfigError(f"{store.path} holds {model_name} records made in {r['dtype']}; this run uses "
                              f"{dtype}: use another --out-dir or the same --dtype")
        if r["qrheads"]["heads"] != qr_labels:
            raise ConfigError(f"{store.path} holds {model_name} records made with other QRHeads; "
                              "use another --out-dir")


def compute(model, model_name: str, get_data, lengths, n: int, seed: int, store, qr, randoms,
            fraction: float, progress: bool = True) -> int:
    """Fill the store with every missing (length, index) record; returns how many were added."""
    from tqdm.auto import tqdm

    from dysco_interp.models import dtype_name

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
                store.append(instance_record(model, model_name, data[i], qr, randoms, fraction))
                added += 1
                bar.update(1)
    return added


def load_head_sets(model, heads_arg: str, draws: int, head_seed: int):
    """(QRHeads, random head sets of the same size) for the loaded model."""
    from dysco_interp.detection import random_head_sets
    from dysco_interp.heads import load_heads, shipped_heads

    qr = shipped_heads(model.spec.name, spec=model.spec) if heads_arg == "shipped" else load_heads(heads_arg, spec=model.spec)
    return qr, random_head_sets(model, len(qr), n_draws=draws, seed=head_seed)


# ---------------------------------------------------------------------------- summary and figure (numpy only)


def read_store(path: Path):
    """The settings and records of a motivation store, read without modifying it."""
    from dysco_interp.errors import ConfigError
    from dysco_interp.experiments import store as runner

    if not path.is_file():
        raise ConfigError(f"no results at {path}; run the computation first (without --figures-only)")
    contents = runner.read_store(path)
    settings = contents.settings if contents is not None else None
    if not settings or settings.get("analysis") != "motivation":
        raise ConfigError(f"{path}: not a motivation store (no motivation settings header)")
    return settings, runner.ResultStore(path, KEY, settings, readonly=True).records()


def _step_values(record: dict, field: tuple[str, ...], step: int | None) -> float:
    """One instance's value: the given 1-based step, or the mean over its steps (None)."""
    vals = record
    for key in field:
        vals = vals[key]
    vals = [float(v) for v in vals]
    return sum(vals) / len(vals) if step is None else vals[step - 1]


METRICS = {  # summary name -> record field
    "accuracy": ("correct",),
    "top_qrheads": ("qrheads", "gold_in_top"),
    "top_random": ("random", "gold_in_top"),
    "top_all_heads": ("all_heads", "gold_in_top"),
    "mass_qrheads": ("qrheads", "gold_mass"),
    "mass_random": ("random", "gold_mass"),
    "mass_all_heads": ("all_heads", "gold_mass"),
    "rank_qrheads": ("qrheads", "gold_rank"),
}


def summarise(records: list[dict], model: str, step: int, n_boot: int = 2000, seed: int = 0) -> dict:
    """Per length: mean and bootstrap CI over instances of every metric, at `step` and over all steps."""
    from dysco_interp.analysis.bootstrap import bootstrap_ci
    from dysco_interp.errors import ConfigError

    mine = [r for r in records if r["model"] == model]
    if not mine:
        raise ConfigError(f"no records of model {model!r}")
    hops = {len(r["correct"]) for r in mine}
    if not 1 <= step <= min(hops):
        raise ConfigError(f"--step must be between 1 and {min(hops)}, got {step}")
    rows = []
    for length in sorted({r["length"] for r in mine}):
        recs = sorted((r for r in mine if r["length"] == length), key=lambda r: (r["seed"], r["index"]))
        row = {"length": length, "n": len(recs), "dtype": sorted({r["dtype"] for r in recs}),
               "n_tokens": [min(r["n_tokens"] for r in recs), max(r["n_tokens"] for r in recs)]}
        for label, which in ((f"step_{step}", step), ("all_steps", None)):
            row[label] = {name: bootstrap_ci([_step_values(r, f, which) for r in recs], n_boot=n_boot, seed=seed).as_dict()
                          for name, f in METRICS.items()}
        row["mean_by_step"] = {name: [round(sum(_step_values(r, f, k) for r in recs) / len(recs), 5)
                                      for k in range(1, min(hops) + 1)] for name, f in METRICS.items()}
        rows.append(row)
    return {"model": model, "task": TASK, "figure_step": step, "ci": "95% percentile bootstrap over instances",
            "n_boot": n_boot, "bootstrap_seed": seed, "rows": rows}


def length_tick(tokens: int) -> str:
    return f"{tokens // 1024}K" if tokens % 1024 == 0 else str(tokens)


def figure_panels(summary: dict):
    """The three panels (accuracy, gold in top 5%, gold-edge mass) from a summary."""
    from dysco_interp.viz.plots import CIPanel, CISeries

    key = f"step_{summary['figure_step']}"
    rows = summary["rows"]

    def series(name: str, metric: str) -> CISeries:
        cis = [r[key][metric] for r in rows]
        return CISeries(name, [c["mean"] for c in cis], [c["lo"] for c in cis], [c["hi"] for c in cis], COLORS[name])

    step = summary["figure_step"]
    return [
        CIPanel(f"Accuracy at edge {step}", "teacher-forced step accuracy",
                [series("teacher-forced accuracy", "accuracy")], ylim=(-0.02, 1.02)),
        CIPanel(f"Gold edge in the top 5% of edges (edge {step})", "fraction of instances",
                [series("QRHeads", "top_qrheads"), series("random heads", "top_random")], ylim=(-0.02, 1.02)),
        CIPanel(f"Attention mass on the gold edge (edge {step})", "mean attention mass",
                [series("QRHeads", "mass_qrheads"), series("random heads", "mass_random")]),
    ]


def draw(out_dir: Path, store_path: Path, models: list[str] | None, step: int, n_boot: int, command: str,
         figures: bool = True) -> list[Path]:
    """<model>_summary.json, and unless `figures` is off <model>.png and <model>.html, for each model."""
    header, records = read_store(store_path)
    names = models or sorted({r["model"] for r in records})
    written = []
    for model in names:
        summary = summarise(records, model, step, n_boot=n_boot)
        summary.update({"settings": header, "source": store_path.name, "command": command})
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / f"{model}_summary.json"
        path.write_text(json.dumps(summary, indent=1) + "\n")
        written.append(path)
        if not figures:
            continue
        try:
            from dysco_interp.viz.plots import save_ci_lines

            n = sorted({r["n"] for r in summary["rows"]})
            title = (f"{model}: Path Traversal ({header['hops']} hops), teacher forced\nmean and 95% bootstrap CI "
                     f"over {n[0] if len(n) == 1 else f'{n[0]}-{n[-1]}'} instances per length")
            written += save_ci_lines(figure_panels(summary), [length_tick(r["length"]) for r in summary["rows"]],
                                     out_dir / model, title=title, xlabel="context length (tokens)")
        except ImportError as e:  # a compute-only machine: the numbers are written, the drawing waits
            print(f"not drawing ({e.name} is not installed); draw later with --figures-only", file=sys.stderr)
    return written


def print_summary(summary: dict) -> None:
    key = f"step_{summary['figure_step']}"
    print(f"{summary['model']} (step {summary['figure_step']}; all steps in brackets)")
    for r in summary["rows"]:
        s, a = r[key], r["all_steps"]
        print(f"  {r['length']:>6} tokens, n={r['n']}: accuracy {s['accuracy']['mean']:.2f} [{a['accuracy']['mean']:.2f}]  "
              f"top-5% QRHeads {s['top_qrheads']['mean']:.2f} [{a['top_qrheads']['mean']:.2f}] vs random "
              f"{s['top_random']['mean']:.2f} [{a['top_random']['mean']:.2f}]  gold mass QRHeads "
              f"{s['mass_qrheads']['mean']:.4f} [{a['mass_qrheads']['mean']:.4f}] vs random "
              f"{s['mass_random']['mean']:.4f} [{a['mass_random']['mean']:.4f}]")


# ---------------------------------------------------------------------------- command line


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help=f"registry alias or folder (default {FULL['model']}; "
                   "with --figures-only: every model in the store)")
    p.add_argument("--lengths", default=None, help=f"default {FULL['lengths']}")
    p.add_argument("--n", type=int, default=None, help=f"instances per length (default {FULL['n']})")
    p.add_argument("--seed", type=int, default=0, help="data seed")
    p.add_argument("--heads", default="shipped", help="'shipped' or a head file")
    p.add_argument("--draws", type=int, default=5, help="random head sets (same size as the QRHeads)")
    p.add_argument("--head-seed", type=int, default=0, help="seed of the first random head set")
    p.add_argument("--top-fraction", type=float, default=0.05)
    p.add_argument("--data-dir", default=None, help="read DIR/path_traversal_<length>.jsonl instead of generating")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when present)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: float32 on CPU, bf16 on GPU)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out-dir", default=None, help=f"default {FULL['out_dir']} ({SMALL['out_dir']} with --small)")
    p.add_argument("--step", type=int, default=2, help="the route step (1-based) the figure shows")
    p.add_argument("--n-boot", type=int, default=2000)
    p.add_argument("--small", action="store_true", help="smollm2-135m, 1K and 2K, 2 instances (a CPU smoke run)")
    p.add_argument("--figures-only", action="store_true", help="draw from the stored records; loads no model")
    p.add_argument("--no-figures", action="store_true", help="compute only (write the summary JSON, no drawing)")
    args = p.parse_args(argv)
    preset = SMALL if args.small else FULL
    for name in ("lengths", "n", "out_dir"):
        if getattr(args, name) is None:
            setattr(args, name, preset[name])
    if args.model is None and not args.figures_only:
        args.model = preset["model"]
    if args.n < 1:
        p.error("--n must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    command = "python analyses/motivation.py " + " ".join(sys.argv[1:] if argv is None else argv)
    out_dir = Path(args.out_dir)
    store_path = out_dir / STORE_NAME
    models = [args.model] if args.model else None
    if args.figures_only:
        for path in draw(out_dir, store_path, models, args.step, args.n_boot, command):
            print(f"wrote {path}")
        return 0

    import torch

    from dysco_interp.models import load_model
    from dysco_interp.experiments.store import ResultStore
    from dysco_interp.tasks.common import parse_lengths

    lengths = parse_lengths(args.lengths)
    if args.threads:
        torch.set_num_threads(args.threads)
    store = ResultStore(store_path, KEY, store_header(args.draws, args.head_seed, args.top_fraction))
    model = load_model(args.model, device=args.device, dtype=args.dtype, progress=False)
    qr, randoms = load_head_sets(model, args.heads, args.draws, args.head_seed)
    get_data = dataset_getter(model.tokenizer, args.n, args.seed, args.data_dir)
    added = compute(model, args.model, get_data, lengths, args.n, args.seed, store, qr, randoms, args.top_fraction)
    print(f"{added} new record(s); {len(store)} in {store_path}")
    store.close()
    _, records = read_store(store_path)
    print_summary(summarise(records, args.model, args.step, n_boot=args.n_boot))
    for path in draw(out_dir, store_path, [args.model], args.step, args.n_boot, command, figures=not args.no_figures):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

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

How the query position is found: dysco_interp/studies/first_error.py. Results go to
OUT_DIR/first_error.jsonl (one record per instance, resumable); the figure and tables to
OUT_DIR/<model>_<length>_<index>*.
"""

from __future__ import annotations

import sys
from pathlib import Path

from dysco_interp.cli import args as cli_args
from dysco_interp.cli import user_methods
from dysco_interp.studies.first_error import SMALL, STORE_NAME, featured, stored_records
from dysco_interp.studies.first_error_figures import describe, draw
from dysco_interp.studies.study_arguments import print_reports


def parse_args(argv):
    p = cli_args.ArgumentParser(description=__doc__.splitlines()[0])
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
    user_methods.add_methods_from_flag(p)
    p.add_argument("--heads", default="shipped", help="'shipped' or a head file")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out-dir", type=cli_args.output_folder, default=None, help="default figures/first_error")
    p.add_argument("--small", action="store_true",
                   help="generate vanilla + DySCO for smollm2-135m at 1K (2 instances) first")
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


def main(argv=None) -> int:
    args = parse_args(argv)
    command = "python analyses/first_error.py " + " ".join(sys.argv[1:] if argv is None else argv)
    return print_reports("first_error", lambda: run(args, command))


def run(args, command: str) -> list[str]:
    """The analysis (or, --figures-only, the figures of its stored records), printing as it goes."""
    out_dir = Path(args.out_dir)
    if args.figures_only:
        recs = [r for r in stored_records(out_dir / STORE_NAME)
                if (args.model is None or r["model"] == args.model)
                and (args.index is None or r["index"] == args.index)]
        for r in recs if args.index is not None or args.all else featured(recs):
            for path in draw(r, out_dir, r.get("command", command), figures=not args.no_figures):
                print(f"wrote {path}")
        return []

    import torch

    from dysco_interp.heads import resolve_heads
    from dysco_interp.models import load_model
    from dysco_interp.studies.first_error import (
        analyse_failures,
        evaluation_records,
        generate_small,
        instance_getter,
        write_overview,
    )
    from dysco_interp.tasks.lengths import parse_length

    if args.threads:
        torch.set_num_threads(args.threads)
    length = parse_length(args.length) if args.length else None
    if not args.small:  # what is read is refused before the model loads (analyse_failures reads it again)
        found, _ = evaluation_records(args.results, args.model, length)
        instance_getter(None, found, args.seed, args.data)
    model = load_model(args.model, device=args.device, dtype=args.dtype, progress=False)
    qr = resolve_heads(model, args.heads)
    results = generate_small(model, args.model, qr, out_dir, length, args.seed) if args.small else args.results
    length, records = analyse_failures(model, args.model, qr, results, out_dir, length=length, seed=args.seed,
                                       data=args.data, index=args.index, every=args.all, command=command)
    if not records:
        return [f"no vanilla route in {results} has a wrong line to inspect; nothing to draw"]
    for record in records if args.index is not None else featured(records):
        print(describe(record))
        for path in draw(record, out_dir, record.get("command", command), figures=not args.no_figures):
            print(f"wrote {path}")
    if args.all:
        path, summary = write_overview(records, out_dir, args.model, length, command)
        m = summary["means"]
        print(f"{summary['n']} failures: gold edge rank at the wrong city, "
              f"QRHeads {m['qrheads']['gold_rank']} vs all heads "
              f"{m['all_heads']['gold_rank']}; in top 5%: {m['qrheads']['gold_in_top5pct']} vs "
              f"{m['all_heads']['gold_in_top5pct']}\nwrote {path}")
    return []


if __name__ == "__main__":
    sys.exit(main())

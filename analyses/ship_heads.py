"""Detect QRHeads for a packaged model, check them on held-out data, and ship the head file.

Writes dysco_interp/heads/data/shipped/<model>.json (top-k QRScore heads, with provenance and this
command), the score heatmap under figures/heads/, and a report JSON with:
- held-out gold-document attention mass of the QRHeads vs 16 random heads (mean of 5 seeded
  draws) and their ratio, on needle-QA data made with another seed;
- split-half stability (top-k overlap of detections on two disjoint halves);
- overlap with the copy-paste retrieval heads (Wu et al.) on the same data;
- where the heads sit (layer histogram, relative depth) against the paper's middle layers.

    python analyses/ship_heads.py --model qwen2.5-coder-0.5b --n 24 --length 2k --heldout 10
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dysco_interp.cli import args as cli_args
from dysco_interp.cli.flags import add_renamed_flag
from dysco_interp.paths import safe_component

REPO = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    p = cli_args.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--n", type=int, default=24, help="detection examples")
    p.add_argument("--length", default="2k")
    p.add_argument("--heldout", type=int, default=10, help="held-out examples (another seed)")
    add_renamed_flag(p, "--n-heads", "--top-k", dest="n_heads", type=int, default=16, help="heads to keep")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--work", type=cli_args.output_folder, default="results/heads", help="resumable per-example records")
    p.add_argument("--data-dir", default=None,
                   help="read detect.jsonl and heldout.jsonl from here instead of generating them")
    p.add_argument("--no-figures", action="store_true", help="skip the heatmap (draw it later with --figures-only)")
    p.add_argument("--figures-only", action="store_true", help="draw the heatmap from the shipped head file")
    args = p.parse_args(argv)
    command = "python analyses/ship_heads.py " + " ".join(argv if argv is not None else sys.argv[1:])

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from dysco_interp import detection as D
    from dysco_interp.detection.shipping import detect_and_check
    from dysco_interp.heads import HeadSet
    from dysco_interp.models import load_model
    from dysco_interp.studies.pipeline import draw_head_heatmap
    from dysco_interp.tasks.lengths import parse_length

    # the model name becomes a file name: one path component, never a way out of the folder
    out_file = REPO / "dysco_interp" / "heads" / "data" / "shipped" / f"{safe_component(args.model)}.json"
    fig_dir = REPO / "figures" / "heads"
    if args.figures_only:
        draw_head_heatmap(HeadSet.from_json(out_file), args.model, fig_dir)
        return 0

    length = parse_length(args.length)
    model = load_model(args.model, progress=False)
    if args.data_dir:
        from dysco_interp.tasks import load_dataset

        data = load_dataset(Path(args.data_dir) / "detect.jsonl")[: args.n]
        heldout = load_dataset(Path(args.data_dir) / "heldout.jsonl")[: args.heldout]
    else:
        data = D.make_detection_data(model, args.n, length, seed=args.seed)
        heldout = D.make_detection_data(model, args.heldout, length, seed=args.seed + 1000)
    heads, checks = detect_and_check(model, data, heldout, top_k=args.n_heads, seed=args.seed,
                                     store=Path(args.work) / args.model / "detect", command=command, length=length)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    heads.to_json(out_file)
    fig_dir.mkdir(parents=True, exist_ok=True)
    if not args.no_figures:
        draw_head_heatmap(HeadSet.from_json(out_file), args.model, fig_dir)
    report = {
        "model": args.model,
        **checks,
        "files": {"heads": str(out_file.relative_to(REPO)),
                  "heatmap": f"figures/heads/{args.model}_qrscore_heatmap.png"},
        "command": command,
    }
    (fig_dir / f"{args.model}_report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: report[k] for k in ("heads", "heldout", "split_half", "copy_paste", "layers")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

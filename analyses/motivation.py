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

Past 16K the bridge's score matrices no longer fit: `--backend static` reads every head from
the static backend's read-outs instead, and `--yarn 4` stretches the model past its window
(figures/motivation_128k, 16K-127K).

What one teacher-forced pass per instance measures: dysco_interp/studies/motivation.py.
Records go to OUT_DIR/motivation.jsonl, one per finished instance, so a killed run resumes.
The figure (OUT_DIR/<model>.png, .html and the numbers in <model>_summary.json) shows
step 2 (`--step`) against length, with 95% bootstrap intervals over instances.
"""

from __future__ import annotations

import sys
from pathlib import Path

from dysco_interp.cli import args as cli_args
from dysco_interp.stores.archives import stored
from dysco_interp.studies.motivation_summary import (
    KEY,
    STORE_NAME,
    draw,
    print_summary,
    read_store,
    store_header,
    summarise,
)
from dysco_interp.studies.study_arguments import add_head_study_arguments, apply_preset

SMALL = {"model": "smollm2-135m", "lengths": "1k,2k", "n": 2, "out_dir": "results/motivation_small"}
FULL = {"model": "qwen2.5-coder-0.5b", "lengths": "1k,2k,4k,8k", "n": 50, "out_dir": "figures/motivation"}


def parse_args(argv):
    p = cli_args.ArgumentParser(description=__doc__.splitlines()[0])
    add_head_study_arguments(p, FULL, SMALL, small_help="smollm2-135m, 1K and 2K, 2 instances (a CPU smoke run)",
                             data_help="read DIR/path_traversal_<length>.jsonl instead of generating")
    p.add_argument("--seed", type=int, default=0, help="data seed")
    p.add_argument("--top-fraction", type=float, default=0.05)
    p.add_argument("--step", type=int, default=2, help="the route step (1-based) the figure shows")
    p.add_argument("--backend", choices=("static", "sdpa"), default=None,
                   help="read every head through this backend's read-outs instead of the bridge's patterns "
                        "(no score matrix: reaches 32K-128K tokens)")
    p.add_argument("--yarn", type=cli_args.positive_float, default=None, metavar="FACTOR",
                   help="YaRN-scale the model's rope by FACTOR (lengths past the native window)")
    args = p.parse_args(argv)
    apply_preset(p, args, FULL, SMALL)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    command = "python analyses/motivation.py " + " ".join(sys.argv[1:] if argv is None else argv)
    out_dir = Path(args.out_dir)
    store_path = stored(out_dir / STORE_NAME)
    models = [args.model] if args.model else None
    if args.figures_only:
        for path in draw(out_dir, store_path, models, args.step, args.n_boot, command, figures=not args.no_figures):
            print(f"wrote {path}")
        return 0

    import torch

    from dysco_interp.models import load_model
    from dysco_interp.stores.store import ResultStore
    from dysco_interp.studies.motivation import compute, dataset_getter, load_head_sets
    from dysco_interp.tasks.lengths import parse_lengths

    lengths = parse_lengths(args.lengths)
    if args.threads:
        torch.set_num_threads(args.threads)
    store = ResultStore(store_path, KEY, store_header(args.draws, args.head_seed, args.top_fraction))
    model = load_model(args.model, device=args.device, dtype=args.dtype, progress=False, yarn_factor=args.yarn)
    qr, randoms = load_head_sets(model, args.heads, args.draws, args.head_seed)
    get_data = dataset_getter(model.tokenizer, args.n, args.seed, args.data_dir)
    added = compute(model, args.model, get_data, lengths, args.n, args.seed, store, qr, randoms, args.top_fraction,
                    backend=args.backend)
    print(f"{added} new record(s); {len(store)} in {store_path}")
    store.close()
    _, records = read_store(store_path)
    print_summary(summarise(records, args.model, args.step, n_boot=args.n_boot))
    for path in draw(out_dir, store_path, [args.model], args.step, args.n_boot, command, figures=not args.no_figures):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

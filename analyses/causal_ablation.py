"""Are the QRHeads causal? Mean-ablate a head set's attention outputs and measure what a task loses.

Each listed head's output z (`blocks.L.attn.hook_z`, before W_O) is replaced at every position by
its mean over all prompt tokens of the (task, length) instances: dysco_interp/studies/head_ablation.py.
Head sets: the QRHeads (--heads), --draws seeded random sets of the same size, the copy-paste top 16.
Teacher forced, one pass per (instance, head set) plus one unablated: Path Traversal step accuracy,
needle-QA answer accuracy and mean log-prob. Drops with paired 95% bootstrap CIs, random draws pooled.

Small run (CPU, about 15 minutes): python analyses/causal_ablation.py --small
Full run (GPU; data made on the CPU, where the city-name package is; draw on the CPU):

    dysco-interp make-data path_traversal --model MODEL --lengths 2k,8k --n 50 --seed 0 --out DATA
    dysco-interp make-data needle_qa --model MODEL --lengths 2k,8k --n 50 --seed 0 --out DATA
    python analyses/causal_ablation.py --model MODEL --lengths 2k,8k --n 50 --seed 0 --data-dir DATA \
        --device cuda --dtype bfloat16 --out-dir figures/ablations_causal
    python analyses/causal_ablation.py --figures-only --out-dir figures/ablations_causal

OUT_DIR/<model>.jsonl: one record per (head set, instance), so a killed run resumes; head means in
OUT_DIR/<model>_means/ (<task>_<len>.json.xz); summary and figure in OUT_DIR/<model>_summary.json, .png, .html.
"""

from __future__ import annotations

import sys
from pathlib import Path

from dysco_interp.cli import args as cli_args
from dysco_interp.studies.ablation_summary import KEY, store_path, summarise, summary_lines, write_outputs
from dysco_interp.studies.study_arguments import add_head_study_arguments, apply_preset

REPO = Path(__file__).resolve().parents[1]
SMALL = {"model": "smollm2-135m", "lengths": "1k", "n": 2, "out_dir": "results/ablations_causal_small"}
FULL = {"model": "qwen2.5-coder-0.5b", "lengths": "2k,8k", "n": 50, "out_dir": "figures/ablations_causal"}


def parse_args(argv):
    p = cli_args.ArgumentParser(description=__doc__.splitlines()[0])
    add_head_study_arguments(p, FULL, SMALL, small_help="smollm2-135m, 1K, 2 instances (a CPU smoke run)",
                             data_help="read DIR/<task>_<length>.jsonl instead of generating")
    p.add_argument("--seed", type=int, default=0, help="data seed (Path Traversal; needle QA too unless --qa-seed)")
    p.add_argument("--qa-seed", type=int, default=None, help="needle-QA data seed (default: --seed)")
    p.add_argument("--tasks", default="path_traversal,needle_qa")
    p.add_argument("--copy-paste-heads", default="report",
                   help="'report' (figures/heads/<model>_report.json), 'detect', 'none', or a report or head file")
    p.add_argument("--chunk-size", type=int, default=1024, help="prompt tokens per bridge pass (chunk x n scores)")
    args = p.parse_args(argv)
    apply_preset(p, args, FULL, SMALL)
    if args.chunk_size < 1:
        p.error("--chunk-size must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    command = "python analyses/causal_ablation.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.figures_only:
        for path in write_outputs(args.out_dir, [args.model] if args.model else None, args.n_boot, command):
            print(f"wrote {path}")
        return 0

    import torch

    from dysco_interp.detection import random_head_sets
    from dysco_interp.heads import resolve_heads
    from dysco_interp.models import load_model, load_tokenizer
    from dysco_interp.stores.store import ResultStore
    from dysco_interp.studies import head_ablation as ha
    from dysco_interp.tasks import get_task
    from dysco_interp.tasks.lengths import parse_lengths

    lengths, tasks = parse_lengths(args.lengths), [get_task(t).name for t in args.tasks.split(",")]
    seeds = {t: args.qa_seed if t == "needle_qa" and args.qa_seed is not None else args.seed for t in tasks}
    if args.heads != "shipped":
        resolve_heads(args.model, args.heads)  # a bad head file fails before the model loads
    data = ha.study_instances(load_tokenizer(args.model), tasks, lengths, args.n, seeds, args.data_dir)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(args.model, device=args.device, dtype=args.dtype, progress=False)
    qr = resolve_heads(model, args.heads)
    sets = ha.study_head_sets(qr, random_head_sets(model, len(qr), n_draws=args.draws, seed=args.head_seed),
                              ha.copy_paste_heads(model, args.copy_paste_heads, REPO / "figures" / "heads"))
    path = store_path(args.out_dir, args.model)
    with ResultStore(path, KEY, ha.store_settings(model, args.model, sets, args.chunk_size)) as store:
        before = len(store)
        records = ha.ablation_study(model, data, sets, model_name=args.model, store=store, chunk_size=args.chunk_size,
                                    means_dir=path.with_name(f"{path.stem}_means"))
        print(f"{len(store) - before} new record(s); {len(store)} in {path}")
    print("\n".join(summary_lines(summarise(records, args.model, n_boot=args.n_boot))))
    for out in write_outputs(args.out_dir, [args.model], args.n_boot, command, figures=not args.no_figures):
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

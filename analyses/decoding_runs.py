"""The decoding experiments behind the Path Traversal, ablation and robustness tables.

Parts: tau (UniAttnS temperatures on MRCR), pt (vanilla / UniAttnS / DySCO on Path
Traversal), ablation, robustness and reuse; each writes resumable stores under --out-dir
(layout and methods: dysco_interp/studies/decoding_runs.py).

Data: the task files `path_traversal_<len>.jsonl` and `mrcr_<len>.jsonl` in --data-dir
(made with `dysco-interp make-data ... --model MODEL`).

    python analyses/decoding_runs.py --model qwen2.5-coder-0.5b --data-dir DATA --device cuda \
        --dtype bfloat16 --backend sdpa --batch-size 50 --parts tau,pt,ablation,robustness
    python analyses/decoding_runs.py --small --data-dir DATA --out-dir OUT   # smollm2-135m, CPU, minutes
"""

from __future__ import annotations

import sys
from pathlib import Path

from dysco_interp.cli import args as cli_args
from dysco_interp.decoding.choices import BACKENDS
from dysco_interp.decoding.methods import PAPER_TAUS
from dysco_interp.errors import ConfigError
from dysco_interp.studies.decoding_runs import (
    GRID,
    PARTS,
    SMALL_GRID,
    SMALL_TAUS,
    MissingRunInput,
    RunSettings,
    check_parts,
    run_parts,
)


def main(argv=None) -> int:
    p = cli_args.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="default qwen2.5-coder-0.5b (smollm2-135m with --small)")
    p.add_argument("--data-dir", required=True)
    p.add_argument("--out-dir", type=cli_args.output_folder, default="figures")
    p.add_argument("--parts", default=",".join(PARTS))
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--backend", default="sdpa", choices=list(BACKENDS))
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--n", type=int, default=None, help="instances per file (default: all)")
    p.add_argument("--pt-lengths", default="1k,2k,4k,8k")
    p.add_argument("--ablation-lengths", default="2k,8k")
    p.add_argument("--robustness-length", default="2k")
    p.add_argument("--tau-length", default="2k")
    p.add_argument("--taus", default=",".join(f"{t:g}" for t in PAPER_TAUS),
                   help="UniAttnS temperatures swept on MRCR, and the grid tau is chosen on (default: the paper's)")
    p.add_argument("--pt-new-tokens", type=int, default=120, help="4 route lines take about 60")
    p.add_argument("--mrcr-new-tokens", type=int, default=160, help="the answers take 60-120")
    p.add_argument("--heads", default="shipped")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--small", action="store_true",
                   help="smollm2-135m at 1k, 2 instances, 8 new tokens, one other value per parameter (CPU, minutes)")
    args = p.parse_args(argv)
    args.model = args.model or ("smollm2-135m" if args.small else "qwen2.5-coder-0.5b")
    if args.small:
        args.n, args.batch_size = args.n or 2, 2
        args.pt_lengths = args.ablation_lengths = args.robustness_length = args.tau_length = "1k"
        args.taus, args.pt_new_tokens, args.mrcr_new_tokens = ",".join(map(str, SMALL_TAUS)), 8, 8
    parts = [x for x in args.parts.split(",") if x]
    try:
        check_parts(parts)
    except ConfigError as e:
        raise SystemExit(str(e)) from None

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from dysco_interp.heads import resolve_heads
    from dysco_interp.models import load_model

    model = load_model(args.model, device=args.device, dtype=args.dtype, progress=False)
    heads = resolve_heads(model, args.heads)
    lengths = lambda text: [x for x in text.split(",") if x]  # noqa: E731
    settings = RunSettings(
        args.model, Path(args.data_dir), Path(args.out_dir), parts, args.backend, args.batch_size, args.n,
        lengths(args.pt_lengths), lengths(args.ablation_lengths), args.robustness_length, args.tau_length,
        [float(t) for t in args.taus.split(",")], args.pt_new_tokens, args.mrcr_new_tokens,
        SMALL_GRID if args.small else GRID)
    try:
        run_parts(model, heads, settings, log=lambda line: print(line, flush=True))
    except MissingRunInput as e:
        raise SystemExit(str(e)) from None
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The selection-budget study: sweep K / share of the prompt, p and beta on a dev split, choose
one configuration there, report it on the test split (dysco_interp/studies/budget_study.py).

Data (--data-dir): dev/ (made with seed 1, never reported) and test/ (seed 0), e.g.

    dysco-interp make-data path_traversal --model qwen2.5-coder-0.5b --lengths 2k,8k --n 50 --seed 1 --out DATA/dev
    dysco-interp make-data mrcr --model qwen2.5-coder-0.5b --lengths 2k,8k --n 50 --seed 1 --out DATA/dev
    dysco-interp make-data path_traversal --model qwen2.5-coder-0.5b --lengths 1k,2k,4k,8k,16k --n 50 \
        --seed 0 --out DATA/test
    python analyses/budget_study.py --model qwen2.5-coder-0.5b --data-dir DATA --device cuda \
        --dtype bfloat16 --backend sdpa --batch-size 50 --parts dev-tf,dev-free,test-tf,test-free
    python analyses/budget_study.py --figures-only        # tables and figures from the stores
"""

from __future__ import annotations

import sys
from pathlib import Path

from dysco_interp.cli import args as cli_args
from dysco_interp.cli import user_methods
from dysco_interp.cli.flags import add_renamed_flag
from dysco_interp.decoding.choices import BACKENDS
from dysco_interp.errors import ConfigError
from dysco_interp.studies.budget_study import (
    BETAS,
    FRACTIONS,
    K_VALUES,
    P_VALUES,
    PARTS,
    RANDOM_BETAS,
    Grid,
    StudySettings,
    check_parts,
    run_study,
)
from dysco_interp.studies.study_arguments import print_reports


def numbers(kind):
    return lambda text: tuple(kind(x) for x in text.split(",") if x)


def main(argv=None) -> int:
    p = cli_args.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-coder-0.5b")
    p.add_argument("--data-dir", default=None, help="holds dev/ and test/ task files")
    p.add_argument("--out-dir", type=cli_args.output_folder, default="figures")
    p.add_argument("--parts", default=",".join(PARTS))
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--backend", default="sdpa", choices=list(BACKENDS))
    p.add_argument("--batch-size", type=int, default=50)
    p.add_argument("--n", type=int, default=None, help="instances per file (default: all)")
    # DySCO's selection, named as on the command line (--select-k/--select-p); sampling is not swept
    add_renamed_flag(p, "--select-ks", "--k", dest="select_ks", type=numbers(int), default=K_VALUES,
                     help="the K values swept")
    add_renamed_flag(p, "--select-ps", "--p", dest="select_ps", type=numbers(float), default=P_VALUES,
                     help="the nucleus p values swept")
    p.add_argument("--betas", type=numbers(float), default=BETAS)
    p.add_argument("--fractions", type=numbers(float), default=FRACTIONS)
    p.add_argument("--random-betas", type=numbers(float), default=RANDOM_BETAS)
    p.add_argument("--dev-tasks", default="mrcr:2k,mrcr:8k,path_traversal:2k,path_traversal:8k")
    p.add_argument("--test-lengths", default="1k,2k,4k,8k,16k")
    p.add_argument("--heads", default="shipped")
    p.add_argument("--figures-only", action="store_true", help="tables and figures from the stores under --out-dir")
    user_methods.add_methods_from_flag(p)
    args = p.parse_args(argv)
    if args.figures_only:
        from dysco_interp.studies.budget_report import write_reports

        return print_reports("budget_study", lambda: write_reports(Path(args.out_dir) / "budget"))
    if args.data_dir is None:
        raise SystemExit("--data-dir is required unless --figures-only")
    parts = [x for x in args.parts.split(",") if x]
    try:
        check_parts(parts)
        dev_tasks = [tuple(x.split(":")) for x in args.dev_tasks.split(",") if x]
        if any(len(t) != 2 for t in dev_tasks):
            raise ConfigError(f"--dev-tasks takes task:length pairs, got {args.dev_tasks!r}")
    except ConfigError as e:
        raise SystemExit(str(e)) from None

    from dysco_interp.heads import resolve_heads
    from dysco_interp.models import load_model

    model = load_model(args.model, device=args.device, dtype=args.dtype, progress=False)
    heads = resolve_heads(model, args.heads)
    settings = StudySettings(
        args.model, Path(args.data_dir), Path(args.out_dir), parts, args.backend, args.batch_size, args.n,
        [(t, n) for t, n in dev_tasks], [x for x in args.test_lengths.split(",") if x],
        Grid(args.select_ks, args.select_ps, args.betas, args.fractions, args.random_betas))
    try:
        run_study(model, heads, settings, log=lambda line: print(line, flush=True))
    except ConfigError as e:
        raise SystemExit(str(e)) from None
    return 0


if __name__ == "__main__":
    sys.exit(main())

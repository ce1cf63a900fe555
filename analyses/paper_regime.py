"""DySCO in the paper's regime: 16K-128K tokens, YaRN past the native window, the paper's presets,
the quick check, the small budget and one rule chosen on a dev split from 2K to 128K
(dysco_interp/studies/paper_regime.py says what each part runs).

Data (--data-dir): dev/ (seed 1, never reported), test/ (seed 0), free/ (seed 0, many
instances) and heldout/ (Needle QA's test split: seed 2, since the shipped QRHeads were detected on
needle_qa seed 0), e.g. for the lengths past 32K add `--yarn 4` to make-data:

    dysco-interp make-data path_traversal --model qwen2.5-coder-1.5b --lengths 31k --n 16 --seed 1 --out DATA/dev
    dysco-interp make-data path_traversal --model qwen2.5-coder-1.5b --lengths 127k --n 16 --seed 1 --yarn 4 \\
        --out DATA/dev
    (mrcr likewise; test/: path_traversal 16k,31k,64k,127k --n 30, mrcr 31k,127k --n 20;
     heldout/: needle_qa 31k --n 50 and 127k --n 20 --seed 2; free/: path_traversal 1k,2k,16k,31k --n 200)

One call per YaRN setting; the choice needs every dev cell:

    python analyses/paper_regime.py --model qwen2.5-coder-1.5b --data-dir DATA --parts dev,tau --lengths 31k
    python analyses/paper_regime.py --model qwen2.5-coder-1.5b --data-dir DATA --parts dev --lengths 127k --yarn 4
    python analyses/paper_regime.py --model qwen2.5-coder-1.5b --parts choose --budget-dev figures/budget/dev
    python analyses/paper_regime.py --model qwen2.5-coder-1.5b --data-dir DATA --parts test --lengths 16k,31k
    python analyses/paper_regime.py --model qwen2.5-coder-1.5b --data-dir DATA --parts test --lengths 64k,127k --yarn 4
    python analyses/paper_regime.py --model qwen2.5-coder-1.5b --data-dir DATA --parts free,format-forced \\
        --lengths 16k,31k
    python analyses/paper_regime.py --figures-only      # tables and figures from the stores
"""

from __future__ import annotations

import sys
from pathlib import Path

from dysco_interp.analysis.report import command_line
from dysco_interp.cli import args as cli_args
from dysco_interp.errors import ConfigError
from dysco_interp.studies.paper_regime import PARTS, TASKS, RegimeSettings, check_parts
from dysco_interp.studies.study_arguments import add_split_study_arguments, load_study_model, print_reports, run_study


def main(argv=None) -> int:
    p = cli_args.ArgumentParser(description=__doc__.splitlines()[0])
    add_split_study_arguments(p, data_help="holds dev/, test/ and free/ task files")
    p.add_argument("--parts", default="choose", help=f"comma-separated, from {', '.join(PARTS)}")
    p.add_argument("--lengths", default="", help="the lengths this call runs, e.g. 16k,31k (one YaRN setting)")
    p.add_argument("--yarn", type=cli_args.positive_float, default=None, metavar="FACTOR",
                   help="YaRN-scale the model by FACTOR (lengths past the native window)")
    p.add_argument("--tasks", default=",".join(TASKS), help=f"what the tasks part runs, from {', '.join(TASKS)} "
                   "(default: both)")
    p.add_argument("--budget-dev", default=None, help="the budget study's dev stores (its 2K and 8K cells), "
                   "ranked with this study's for the choice")
    args = p.parse_args(argv)
    if args.figures_only:
        from dysco_interp.studies.paper_regime_report import write_reports

        return print_reports("paper_regime", lambda: write_reports(Path(args.out_dir) / "paper_regime"))
    parts = [x for x in args.parts.split(",") if x]
    lengths = [x for x in args.lengths.split(",") if x]
    tasks = [x for x in args.tasks.split(",") if x]
    try:
        check_parts(parts)
        if not tasks or set(tasks) - set(TASKS):
            raise ConfigError(f"--tasks takes {' and '.join(TASKS)}, got {args.tasks!r}")
        if set(parts) - {"choose"} and (args.data_dir is None or not lengths):
            raise ConfigError("--data-dir and --lengths are needed for every part but choose")
    except ConfigError as e:
        p.error(str(e))
    settings = RegimeSettings(args.model, Path(args.data_dir or "."), Path(args.out_dir), lengths,
                              Path(args.budget_dev) if args.budget_dev else None, args.backend,
                              args.tokens_per_batch, args.n,
                              command_line("analyses/paper_regime.py", sys.argv[1:] if argv is None else argv), tasks)

    def work() -> None:
        if parts == ["choose"]:
            from dysco_interp.studies.paper_regime import choose

            choice = choose(settings)
            print(f"chosen on the dev split: {choice['config']}, UniAttnS tau {choice['tau']} ({settings.choice_path})")
            return
        from dysco_interp.studies.paper_regime import run_regime

        model, heads = load_study_model(args, args.yarn)
        run_regime(model, heads, settings, parts, log=lambda line: print(line, flush=True))

    return run_study("paper_regime", args, work)


if __name__ == "__main__":
    sys.exit(main())

"""How far the small-budget effect moves with the machine, fp32 decode attention and a second
head set (dysco_interp/studies/variance.py says what each part runs).

Data (--data-dir): test/ as the budget study's (Path Traversal, seed 0, 50 instances), e.g.

    dysco-interp make-data path_traversal --model qwen2.5-coder-1.5b --lengths 2k,8k --n 50 --seed 0 --out DATA/test
    python analyses/variance_study.py --model qwen2.5-coder-1.5b --data-dir DATA --device cuda --dtype bfloat16
    python analyses/variance_study.py --figures-only      # tables and figures from the stores

--out-dir must hold the budget study's stores (budget/test/, budget/chosen_<model>.json): they are
the reference every run is paired with.
"""

from __future__ import annotations

import sys
from pathlib import Path

from dysco_interp.analysis.report import command_line
from dysco_interp.cli import args as cli_args
from dysco_interp.errors import ConfigError
from dysco_interp.studies.study_arguments import add_split_study_arguments, load_study_model, print_reports, run_study
from dysco_interp.studies.variance import LENGTHS, PARTS, VarianceSettings, check_parts


def main(argv=None) -> int:
    p = cli_args.ArgumentParser(description=__doc__.splitlines()[0])
    add_split_study_arguments(p, data_help="holds test/ task files")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, from {', '.join(PARTS)}")
    p.add_argument("--lengths", default=",".join(LENGTHS), help="e.g. 2k,8k")
    p.add_argument("--batch-size", type=cli_args.positive_int, default=50)
    args = p.parse_args(argv)
    lengths = tuple(x for x in args.lengths.split(",") if x)
    if args.figures_only:
        from dysco_interp.studies.variance_report import write_reports

        return print_reports("variance_study", lambda: write_reports(Path(args.out_dir), lengths))
    parts = [x for x in args.parts.split(",") if x]
    try:
        check_parts(parts)
        if args.data_dir is None:
            raise ConfigError("--data-dir is needed unless --figures-only")
    except ConfigError as e:
        p.error(str(e))
    settings = VarianceSettings(args.model, Path(args.data_dir), Path(args.out_dir), parts, lengths, args.batch_size,
                                args.n, command=command_line("analyses/variance_study.py",
                                                     sys.argv[1:] if argv is None else argv))

    def work() -> None:
        from dysco_interp.studies.variance import methods, run_variance

        methods(settings)  # the budget study's choice must be there before the model loads
        model, heads = load_study_model(args)
        run_variance(model, heads, settings, log=lambda line: print(line, flush=True))

    return run_study("variance_study", args, work, batch_flag="--batch-size")


if __name__ == "__main__":
    sys.exit(main())

"""What DySCO fixes and what it breaks on Path Traversal, step by step, and a gate derived from it
(dysco_interp/studies/step_account.py says what each part runs).

Data (--data-dir): dev/ (seed 1, never reported) and test/ (seed 0), e.g.

    dysco-interp make-data path_traversal --model qwen2.5-coder-1.5b --lengths 2k,8k --n 16 --seed 1 --out DATA/dev
    dysco-interp make-data path_traversal --model qwen2.5-coder-1.5b --lengths 1k,4k,16k,31k --n 30 --seed 0 \\
        --out DATA/test

The gate's rule (dysco_interp/studies/gate_choice.py) is fixed before the test split runs:

    python analyses/step_account.py --model M --data-dir DATA --split dev --parts steps,gate --lengths 2k,8k
    python analyses/step_account.py --model M --data-dir DATA --split test --parts steps,free --lengths 1k,4k,16k,31k
    python analyses/step_account.py --figures-only      # tables and figures from the stores
"""

from __future__ import annotations

import sys
from pathlib import Path

from dysco_interp.analysis.report import command_line
from dysco_interp.cli import args as cli_args
from dysco_interp.errors import ConfigError
from dysco_interp.studies.step_account import PARTS, AccountSettings, check_parts
from dysco_interp.studies.study_arguments import add_split_study_arguments, load_study_model, print_reports, run_study


def main(argv=None) -> int:
    p = cli_args.ArgumentParser(description=__doc__.splitlines()[0])
    add_split_study_arguments(p, data_help="holds dev/ and test/ task files")
    p.add_argument("--split", default="dev", choices=["dev", "test"])
    p.add_argument("--parts", default="steps", help=f"comma-separated, from {', '.join(PARTS)}")
    p.add_argument("--lengths", default="", help="e.g. 2k,8k")
    args = p.parse_args(argv)
    if args.figures_only:
        from dysco_interp.studies.step_account_report import write_reports

        return print_reports("step_account", lambda: write_reports(Path(args.out_dir) / "step_account"))
    parts = [x for x in args.parts.split(",") if x]
    lengths = tuple(x for x in args.lengths.split(",") if x)
    try:
        check_parts(parts, args.split)
        if set(parts) & {"steps", "free"} and (args.data_dir is None or not lengths):
            raise ConfigError("--data-dir and --lengths are needed for the steps and free parts")
    except ConfigError as e:
        p.error(str(e))
    settings = AccountSettings(args.model, Path(args.data_dir or "."), Path(args.out_dir), args.split, lengths,
                               args.backend, args.tokens_per_batch, args.n,
                               command_line("analyses/step_account.py", sys.argv[1:] if argv is None else argv))

    def work() -> None:
        from dysco_interp.studies.step_account import run_account, write_gate

        if parts == ["gate"]:  # reads the dev stores only
            choice = write_gate(settings)
            print(f"gate for {args.model}: min_mass {choice['min_mass']} ({settings.gate_path})")
            return
        model, heads = load_study_model(args)
        run_account(model, heads, settings, parts, log=lambda line: print(line, flush=True))

    return run_study("step_account", args, work)


if __name__ == "__main__":
    sys.exit(main())

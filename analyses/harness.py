"""The steering harness: every attention-steering method on one protocol, its grid chosen on the
dev split, its test rows beside vanilla (dysco_interp/studies/harness.py; the protocol in
dysco_interp/studies/harness_protocol.py).

Data (--data-dir): dev/ (seed 1) and test/ (seed 0; Needle QA with seed 2, needles no head
detection has seen), one file per task and length, as many instances as the protocol's
DEV_N and TEST_N, e.g.

    for t in path_traversal mrcr needle_qa; do
      dysco-interp make-data $t --model qwen2.5-coder-1.5b --lengths 2k,8k --n 30 --seed 1 --out DATA/dev
      dysco-interp make-data $t --model qwen2.5-coder-1.5b --lengths 31k --n 16 --seed 1 --out DATA/dev
    done
    for t in path_traversal mrcr; do
      dysco-interp make-data $t --model qwen2.5-coder-1.5b --lengths 2k,8k --n 100 --seed 0 --out DATA/test
      dysco-interp make-data $t --model qwen2.5-coder-1.5b --lengths 31k --n 50 --seed 0 --out DATA/test
    done
    dysco-interp make-data needle_qa --model qwen2.5-coder-1.5b --lengths 2k,8k --n 100 --seed 2 --out DATA/test
    dysco-interp make-data needle_qa --model qwen2.5-coder-1.5b --lengths 31k --n 50 --seed 2 --out DATA/test
    python analyses/harness.py --model qwen2.5-coder-1.5b --data-dir DATA --device cuda --dtype bfloat16 \
        --parts profile,dev,choose,test-tf,test-free,test-ff
    # DySCO's approximations against DySCO, at DySCO's dev choice (teacher forced)
    python analyses/harness.py --model qwen2.5-coder-1.5b --data-dir DATA --device cuda --dtype bfloat16 \
        --parts test-variants --lengths 2k,8k
    # the best three methods by the protocol's rule on the dev choices, at 127K with YaRN 4 (the 1.5B)
    for t in path_traversal mrcr; do
      dysco-interp make-data $t --model qwen2.5-coder-1.5b --lengths 127k --yarn 4 --n 20 --seed 0 --out DATA/test
    done
    dysco-interp make-data needle_qa --model qwen2.5-coder-1.5b --lengths 127k --yarn 4 --n 20 --seed 2 --out DATA/test
    python analyses/harness.py --model qwen2.5-coder-1.5b --data-dir DATA --device cuda --dtype bfloat16 \
        --parts test-long
    python analyses/harness.py --figures-only     # the leaderboard and figures from the stores (run_all too)

Each task's instruction texts are bound to the methods that emphasise an instruction (their
`instruction` or `emphasize` parameter), and a grid point's "profiled_heads": N to the best N heads
of the model-and-task head profile that the profile part writes.

A method of one's own: --methods-from my_methods.py --methods mine --grid 'mine=[{"alpha": 0.01}, {"alpha": 0.05}]'.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dysco_interp.analysis.report import command_line
from dysco_interp.cli import args as cli_args
from dysco_interp.cli import user_methods
from dysco_interp.errors import ConfigError
from dysco_interp.studies.harness import DEFAULT_PARTS, PARTS, HarnessSettings, check_data, check_settings
from dysco_interp.studies.harness_protocol import GRIDS, LENGTHS, LONG_YARN, TASKS
from dysco_interp.studies.study_arguments import add_split_study_arguments, load_study_model, print_reports, run_study


def grid_flag(text: str) -> tuple[str, list]:
    """NAME=JSON, the JSON a list of parameter objects."""
    name, points = user_methods.named_json(text)
    if not isinstance(points, list) or not all(isinstance(p, dict) for p in points):
        raise argparse.ArgumentTypeError(f"--grid takes NAME=[{{...}}, ...], a list of parameter objects, "
                                                  f"got {text!r}")
    return name, points


def items(text: str) -> tuple[str, ...]:
    return tuple(x for x in text.split(",") if x)


def main(argv=None) -> int:
    p = cli_args.ArgumentParser(description=__doc__.splitlines()[0])
    add_split_study_arguments(p, data_help="holds dev/ and test/ task files")
    p.add_argument("--methods", default=",".join(GRIDS), help="comma-separated methods compared with vanilla")
    p.add_argument("--grid", type=grid_flag, action="append", default=[], metavar="NAME=JSON",
                   help="a method's grid: a list of its parameter sets (at most six; replaces a built-in grid)")
    p.add_argument("--parts", default=",".join(DEFAULT_PARTS),
                   help=f"comma-separated, from {', '.join(PARTS)} (test-long on its own)")
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--lengths", default=",".join(LENGTHS))
    args = p.parse_args(argv)
    if args.figures_only:
        from dysco_interp.studies.harness_report import write_reports

        return print_reports("harness", lambda: write_reports(Path(args.out_dir)))
    grids = {**GRIDS, **dict(args.grid)}
    settings = HarnessSettings(args.model, Path(args.data_dir or "."), Path(args.out_dir), items(args.methods),
                               items(args.parts), items(args.tasks), items(args.lengths), grids, args.backend,
                               args.tokens_per_batch, args.n, command=
                               command_line("analyses/harness.py", sys.argv[1:] if argv is None else argv))
    try:
        check_settings(settings)
        if args.data_dir is None and set(settings.parts) - {"choose"}:
            raise ConfigError("--data-dir is needed to run the dev and test parts")
        check_data(settings)
    except ConfigError as e:
        p.error(str(e))

    def work() -> None:
        from dysco_interp.studies.harness import run_harness, write_choices

        if set(settings.parts) == {"choose"}:  # records in, a choice out: no model
            for method, choice in write_choices(settings).items():
                print(f"{method}: {choice['label']} (mean rank {choice['mean_rank']:g})")
            return
        # the long length is past the models' trained window: YaRN, as the protocol fixes
        model, heads = load_study_model(args, yarn_factor=LONG_YARN if "test-long" in settings.parts else None)
        run_harness(model, heads, settings, log=lambda line: print(line, flush=True))

    return run_study("harness", args, work)


if __name__ == "__main__":
    sys.exit(main())

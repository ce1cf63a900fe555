"""`dysco-interp make-data TASK ...`: write one JSONL per target length and print a summary.

`cli.main` wires it in with `add_make_data_parser(subparsers)`; the parser's default
`func` is `run_make_data`. Every length is generated and checked (against the tolerance and
the model's context) before any file is written, and each file is written atomically.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from dysco_interp.cli import args as cli_args
from dysco_interp.cli import flags
from dysco_interp.errors import ConfigError, DataError
from dysco_interp.tasks import load_dataset, make_dataset, save_dataset
from dysco_interp.tasks.lengths import length_label, parse_lengths
from dysco_interp.tasks.registry import TASKS, get_task


def add_make_data_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "make-data",
        help=f"generate task data ({', '.join(spec.title for spec in TASKS.values())}) at target prompt lengths",
        description=(
            "Generate task instances sized to target prompt lengths (in tokens of the model's "
            "tokenizer, chat template applied) and write one JSONL file per length."
        ),
    )
    p.add_argument("task", metavar="TASK", help=f"one of: {', '.join(TASKS)}")
    flags.add_model_flag(p, help="model whose tokenizer measures length")
    p.add_argument("--lengths", default="1k,2k,4k,8k", help="comma-separated target lengths, e.g. 1k,2k,4k,8k or 1500")
    p.add_argument("--n", type=cli_args.positive_int, default=50, help="instances per length (default 50)")
    p.add_argument("--seed", type=cli_args.seed, default=0,
                   help="data seed (default 0): the same seed and options give the same instances")
    p.add_argument("--out", type=cli_args.output_folder, required=True,
                   help="output folder (one TASK_LENGTH.jsonl per length)")
    p.add_argument("--tolerance", type=cli_args.open_fraction, default=0.05,
                   help="allowed relative length error (default 0.05)")
    p.add_argument("--yarn", type=cli_args.positive_float, default=None, metavar="FACTOR",
                   help="allow lengths up to the model's context x FACTOR (data for `evaluate --yarn FACTOR`)")
    p.add_argument(
        "--thinking",
        choices=("on", "off"),
        default=None,
        help="pass enable_thinking to the chat template (Qwen3-style models)",
    )
    for spec in TASKS.values():  # each task's own options, under its name
        if spec.flags:
            group = p.add_argument_group(spec.name)
            for flag in spec.flags:
                group.add_argument(flag.flag, dest=flag.dest, type=flag.type, choices=flag.choices, default=None,
                                   help=flag.help)
    p.set_defaults(func=run_make_data)
    return p


def _options(spec_name: str, args) -> dict:
    opts: dict = {"tolerance": args.tolerance}
    if args.thinking is not None:
        opts["enable_thinking"] = args.thinking == "on"
    for spec in TASKS.values():
        for flag in spec.flags:
            value = getattr(args, flag.dest, None)
            if value is None:
                continue
            if spec.name != spec_name:
                raise ConfigError(f"{flag.flag} applies to task {spec.name!r}, not {spec_name!r}")
            opts[flag.option] = value
    return opts


def check_replaceable(path: Path, task: str) -> None:
    """ConfigError unless `path` is free or holds data of `task` (which a new set replaces):
    a result store, another task's data or any other file there is left alone."""
    if not path.exists() and not path.is_symlink():
        return
    try:
        found = {x.task for x in load_dataset(path)}
    except DataError:
        found = set()
    if found != {task}:
        what = f"it holds {', '.join(sorted(found))} data" if found else "it does not read as task data"
        raise ConfigError(f"{path} exists and is not a {task} data file ({what}); it was left untouched: "
                          "move it, or choose another --out")


def _range(values: list) -> str:
    lo, hi = min(values), max(values)
    mean = sum(values) / len(values)
    return f"{lo}" if lo == hi else f"{mean:.0f} ({lo}-{hi})"


def _check_context(lengths: list[int], context: int | None, args) -> None:
    from dysco_interp.models.yarn import scaled_context

    model = args.model
    if context is None:
        print(f"dysco-interp: note: the context length of {model} is unknown; lengths are not checked against it",
              file=sys.stderr)
        return
    limit = scaled_context(context, args.yarn)
    too_long = [length for length in lengths if length > limit]
    if too_long:
        window = (f"{model}'s {context}-token context x {args.yarn:g} (YaRN) = {limit} tokens" if args.yarn
                  else f"{model}'s {context}-token context; pass --yarn FACTOR for data that "
                       "`evaluate --yarn FACTOR` can read")
        raise ConfigError(f"--lengths {','.join(length_label(n) for n in too_long)}: longer than {window}")


def run_make_data(args) -> int:
    spec = get_task(args.task)
    lengths = parse_lengths(args.lengths)
    repeated = sorted({length_label(n) for n in lengths if lengths.count(n) > 1})
    if repeated:
        raise ConfigError(f"--lengths names {', '.join(repeated)} more than once")
    options = _options(spec.name, args)
    out = Path(args.out)
    paths = {length: out / f"{spec.name}_{length_label(length)}.jsonl" for length in lengths}
    for path in paths.values():
        check_replaceable(path, spec.name)
    from dysco_interp.models import context_length, load_tokenizer
    from dysco_interp.models.yarn import scaled_context

    model = args.model
    with contextlib.redirect_stdout(sys.stderr):  # status lines; stdout is the summary table
        tokenizer = load_tokenizer(model)
    context = context_length(model)
    _check_context(lengths, context, args)
    # every length is generated before anything is written: a length that cannot be
    # reached (or does not fit) leaves no partial set of files behind
    datasets = {}
    for length in lengths:
        data = make_dataset(spec.name, tokenizer, length, n=args.n, seed=args.seed, progress=True, **options)
        limit = None if context is None else scaled_context(context, args.yarn)
        over = [x for x in data if limit is not None and x.n_tokens > limit]
        if over:
            raise ConfigError(
                f"--lengths {length_label(length)}: {len(over)} instance(s) came out longer than the "
                f"{limit} tokens {model} can take (up to {max(x.n_tokens for x in over)} tokens); "
                "pick a shorter length or a smaller --tolerance"
            )
        datasets[length] = data
    rows = []
    for length, data in datasets.items():
        path = save_dataset(paths[length], data)
        summaries = [spec.summary(x) for x in data]
        row = {"target": length, "file": str(path)}
        for key in summaries[0]:
            row[key] = _range([s[key] for s in summaries])
        rows.append(row)
    _print_table(rows, sys.stdout)
    return 0


def _print_table(rows: list[dict], stream) -> None:
    keys = list(rows[0])
    keys.remove("file")
    keys.append("file")
    header = {"target": "target", "tokens": "tokens reached"}
    cells = [[header.get(k, k) for k in keys]] + [[str(r[k]) for k in keys] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(keys))]
    for j, row in enumerate(cells):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip(), file=stream)
        if j == 0:
            print("  ".join("-" * w for w in widths), file=stream)

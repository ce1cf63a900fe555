"""`dysco-interp make-data TASK ...`: write one JSONL per target length and print a summary.

The main CLI wires it in with `add_make_data_parser(subparsers)`; the parser's default
`func` is `run_make_data`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dysco_interp.errors import ConfigError
from dysco_interp.packaged_models import DEFAULT_MODEL
from dysco_interp.tasks import TASKS, get_task, make_dataset, save_dataset
from dysco_interp.tasks.common import parse_lengths


def add_make_data_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "make-data",
        help="generate task data (path traversal, needle QA, MRCR) at target prompt lengths",
        description=(
            "Generate task instances sized to target prompt lengths (in tokens of the model's "
            "tokenizer, chat template applied) and write one JSONL file per length."
        ),
    )
    p.add_argument("task", metavar="TASK", help=f"one of: {', '.join(TASKS)}")
    p.add_argument("--model", default=None, help="model whose tokenizer measures length (default: the default model)")
    p.add_argument("--lengths", default="1k,2k,4k,8k", help="comma-separated target lengths, e.g. 1k,2k,4k,8k or 1500")
    p.add_argument("--n", type=int, default=50, help="instances per length (default 50)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="output folder (one TASK_LENGTH.jsonl per length)")
    p.add_argument("--tolerance", type=float, default=0.05, help="allowed relative length error (default 0.05)")
    p.add_argument(
        "--thinking",
        choices=("on", "off"),
        default=None,
        help="pass enable_thinking to the chat template (Qwen3-style models)",
    )
    g = p.add_argument_group("path_traversal")
    g.add_argument(
        "--hops",
        default=None,
        help="route length: N, a list '24,29,34,39' or a range '24-39' drawn per instance (default 4)",
    )
    g.add_argument("--topology", choices=("merge", "longproc"), default=None, help="distractor edge process")
    g = p.add_argument_group("mrcr")
    g.add_argument("--needles", type=int, default=None, help="times the request repeats (2, 4 or 8; default 4)")
    g = p.add_argument_group("needle_qa")
    g.add_argument("--gold-position", type=float, default=None, help="relative depth of the gold document (0-1)")
    p.set_defaults(func=run_make_data)
    return p


def parse_hops(text: str) -> int | list[int]:
    """'4' -> 4; '24,29,34,39' -> [24, 29, 34, 39]; '24-39' -> [24, ..., 39]."""
    text = str(text).strip()
    try:
        if "-" in text:
            lo, hi = (int(x) for x in text.split("-", 1))
            if lo > hi:
                raise ValueError
            return list(range(lo, hi + 1))
        if "," in text:
            return [int(x) for x in text.split(",") if x.strip()]
        return int(text)
    except ValueError:
        raise ConfigError(f"invalid --hops {text!r}: use N, a list such as 24,29,34,39, or a range 24-39") from None


def length_label(tokens: int) -> str:
    return f"{tokens // 1024}k" if tokens % 1024 == 0 else str(tokens)


def _options(spec_name: str, args) -> dict:
    opts: dict = {"tolerance": args.tolerance}
    if args.thinking is not None:
        opts["enable_thinking"] = args.thinking == "on"
    given = {
        "path_traversal": {"hops": args.hops, "topology": args.topology},
        "mrcr": {"n_needles": args.needles},
        "needle_qa": {"gold_position": args.gold_position},
    }
    for task, values in given.items():
        for key, value in values.items():
            if value is None:
                continue
            if task != spec_name:
                flag = {"n_needles": "--needles", "gold_position": "--gold-position"}.get(key, f"--{key}")
                raise ConfigError(f"{flag} applies to task {task!r}, not {spec_name!r}")
            opts[key] = parse_hops(value) if key == "hops" else value
    return opts


def _range(values: list) -> str:
    lo, hi = min(values), max(values)
    mean = sum(values) / len(values)
    return f"{lo}" if lo == hi else f"{mean:.0f} ({lo}-{hi})"


def run_make_data(args) -> int:
    spec = get_task(args.task)
    lengths = parse_lengths(args.lengths)
    if args.n < 1:
        raise ConfigError(f"--n must be at least 1, got {args.n}")
    options = _options(spec.name, args)
    from dysco_interp.models import load_tokenizer

    tokenizer = load_tokenizer(args.model or DEFAULT_MODEL)
    out = Path(args.out)
    rows = []
    for length in lengths:
        data = make_dataset(spec.name, tokenizer, length, n=args.n, seed=args.seed, progress=True, **options)
        path = save_dataset(out / f"{spec.name}_{length_label(length)}.jsonl", data)
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

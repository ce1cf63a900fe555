"""`dysco-interp step-classes`: which teacher-forced steps one method fixes and which it breaks
against another (`analysis.step_classes`)."""

from __future__ import annotations

import argparse
import json

from dysco_interp.cli import args as cli_args
from dysco_interp.errors import ConfigError


def add_step_classes_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "step-classes", help="steps one teacher-forced run fixes and breaks against another",
        description="Pair two teacher-forced runs instance by instance (two stores, or one store twice) and "
                    "classify every step: fixed (the base wrong, the other right), broken, both right, both "
                    "wrong. Path Traversal steps are route steps; other tasks' are gold tokens. Prints the "
                    "rates per length with 95%% bootstrap intervals over instances.")
    p.add_argument("base", help="the reference run's result store")
    p.add_argument("other", help="the compared run's result store (may be the same file)")
    p.add_argument("--base-method", default="vanilla", help="the method name in BASE (default vanilla)")
    p.add_argument("--other-method", default=None,
                   help="the method name in OTHER (default: its one method other than --base-method)")
    p.add_argument("--data", default=None, metavar="FILE.jsonl",
                   help="the task file both runs decoded: with stores written with --keep-trace, each step also "
                        "gets what OTHER's trace said there against the step's gold span (keys selected, their "
                        "relevance mass, the gold span's place and mass among the top spans; the gold span's "
                        "share of the keys where the run recorded positions)")
    p.add_argument("--out", type=cli_args.output_file, default=None,
                   help="also write every classified step and the rates as JSON")
    p.add_argument("--n-boot", type=cli_args.positive_int, default=2000, help="bootstrap resamples")
    p.set_defaults(func=run_step_classes)
    return p


def pick(records: list[dict], method: str | None, not_this: str, path: str) -> tuple[str, list[dict]]:
    """The records of `method`, or of the store's one method other than `not_this`."""
    if not records:
        raise ConfigError(f"{path} holds no records: a store written by evaluate --teacher-forced, with results")
    names = sorted({str(r.get("method")) for r in records})
    if method is None:
        others = [n for n in names if n != not_this]
        if len(others) != 1:
            raise ConfigError(f"{path} holds methods {', '.join(names)}; name one with --other-method")
        method = others[0]
    mine = [r for r in records if r.get("method") == method]
    if not mine:
        raise ConfigError(f"{path} holds no records of method {method!r} (it holds {', '.join(names)})")
    return method, mine


def print_trace_signals(rows: list[dict]) -> None:
    """Per class, the mean of each trace signal over its steps (where the trace had it)."""
    from dysco_interp.analysis.step_classes import CLASSES

    names = ("other_n_selected", "other_selected_mass", "other_gold_selected_share", "other_gold_top_span_mass")
    print("OTHER's trace at the step, mean per class (keys selected, their mass, gold span's share of them, "
          "gold span's mass among the top spans):")
    for c in CLASSES:
        mine = [r for r in rows if r["class"] == c]
        means = []
        for name in names:
            values = [r[name] for r in mine if r.get(name) is not None]
            means.append(f"{sum(values) / len(values):.3f}" if values else "-")
        print(f"  {c:>10} ({len(mine)} steps): " + "  ".join(means))


def run_step_classes(args) -> int:
    from dysco_interp.analysis.records import read_records
    from dysco_interp.analysis.step_classes import CLASSES, class_rates, classify
    from dysco_interp.atomic import atomic_open

    instances = None
    if args.data is not None:
        from dysco_interp.tasks import load_dataset

        instances = {inst.id: inst for inst in load_dataset(args.data)}
    base_name, base = pick(read_records(args.base), args.base_method, "", args.base)
    other_name, other = pick(read_records(args.other), args.other_method, base_name, args.other)
    rows = classify(base, other, instances)
    if not rows:
        raise ConfigError(f"{args.base} ({base_name}) and {args.other} ({other_name}) share no instance")
    rates = class_rates(rows, n_boot=args.n_boot)
    print(f"{other_name} against {base_name}, per {rows[0]['unit']}: share of steps, 95% bootstrap interval over "
          "instances")
    print(f"{'tokens':>8} {'inst.':>5} {'steps':>6}  " + "  ".join(f"{c:>22}" for c in (*CLASSES, "net")))
    for r in rates:
        cells = [r["rates"][c] for c in CLASSES] + [r["net"]]
        print(f"{r['length']:>8} {r['instances']:>5} {r['steps']:>6}  "
              + "  ".join(f"{c['mean']:+.3f} [{c['lo']:+.3f}, {c['hi']:+.3f}]" for c in cells))
    if instances is not None:
        print_trace_signals(rows)
    if args.out:
        with atomic_open(args.out) as f:
            json.dump({"base": {"store": args.base, "method": base_name},
                       "other": {"store": args.other, "method": other_name}, "rates": rates, "steps": rows}, f,
                      indent=1)
        print(f"wrote {args.out}")
    return 0

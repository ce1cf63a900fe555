"""`dysco-interp demo`: the main job, vanilla vs DySCO on one Path Traversal instance, with an
attention-replay HTML."""

from __future__ import annotations

import argparse

from dysco_interp.cli import args as cli_args
from dysco_interp.cli import flags
from dysco_interp.cli.prepare import check_head_file, dysco_overrides, load_model_from_flags


def add_demo_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("demo", help="the main job: vanilla vs DySCO on one Path Traversal instance, "
                                           "with an attention-replay HTML")
    flags.add_model_flag(p)
    flags.add_heads_flag(p)
    p.add_argument("--length", type=cli_args.positive_int, default=1024,
                   help="prompt tokens of the instance (default 1024)")
    p.add_argument("--hops", type=cli_args.positive_int, default=4, help="route length (default 4)")
    p.add_argument("--seed", type=cli_args.seed, default=0, help="seed of the Path Traversal instance (default 0)")
    p.add_argument("--max-new-tokens", type=cli_args.positive_int, default=None,
                   help="default: the gold answer's length + 8")
    flags.add_dysco_flags(p)
    # checked when the command line is read: a folder here used to fail after the whole run
    p.add_argument("--out", type=cli_args.output_file, default="dysco-demo/attention_replay.html",
                   help="the replay HTML file to write")
    flags.add_device_flags(p)
    p.set_defaults(func=run_demo, yarn=None)
    return p


def run_demo(args) -> int:
    from dysco_interp.decoding.config import preset
    from dysco_interp.experiments import demo as demo_job
    from dysco_interp.heads import resolve_heads
    from dysco_interp.viz.replay_view import write_replay_html

    dysco = preset(args.preset, **dysco_overrides(args))
    check_head_file(args.heads, args.model)
    model = load_model_from_flags(args)
    heads = resolve_heads(model, args.heads)
    demo = demo_job.run_demo(model, heads, length=args.length, seed=args.seed, hops=args.hops,
                            dysco=dysco, max_new_tokens=args.max_new_tokens)
    html = write_replay_html(demo.replays, args.out, title=demo.title)
    print(demo_job.format_report(demo, html))
    return 0

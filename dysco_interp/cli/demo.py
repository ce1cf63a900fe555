"""`dysco-interp demo`: the main job, what DySCO does on one seeded Path Traversal instance
(teacher-forced and free, vanilla vs DySCO), printed and drawn as one offline HTML page."""

from __future__ import annotations

import argparse

from dysco_interp.cli import args as cli_args
from dysco_interp.cli import flags
from dysco_interp.cli.prepare import (
    check_head_file,
    dysco_overrides,
    heads_from_flags,
    load_model_from_flags,
    preset_words,
)


def add_demo_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("demo", help="the main job: what DySCO does on one seeded Path Traversal instance, "
                                           "teacher-forced and free, vanilla vs DySCO, with an HTML page",
                              description="What DySCO does on one seeded Path Traversal instance: the gold "
                                          "route teacher-forced and both free routes, vanilla vs DySCO, "
                                          "printed as tables and written to one HTML page with the "
                                          "attention replays.")
    flags.add_model_flag(p)
    flags.add_heads_flag(p)
    p.add_argument("--length", type=cli_args.positive_int, default=1024,
                   help="prompt tokens of the instance (default 1024)")
    p.add_argument("--hops", type=cli_args.positive_int, default=4, help="route length (default 4)")
    p.add_argument("--seed", type=cli_args.seed, default=0,
                   help="seed of the Path Traversal instance (default 0): the instance is "
                        "generate_instance(tokenizer, length, seed, hops), never picked by hand")
    p.add_argument("--index", type=cli_args.seed, default=0,
                   help="the instance's index under that seed (default 0): `make-data`'s instance of the same "
                        "length, seed and index, e.g. one a study reports")
    p.add_argument("--max-new-tokens", type=cli_args.positive_int, default=None,
                   help="free generation's budget (default: the gold answer's length + 8; "
                        "teacher forcing always feeds the whole gold route)")
    flags.add_dysco_flags(p)
    # checked when the command line is read: a folder here used to fail after the whole run
    p.add_argument("--out", type=cli_args.html_file, default="dysco-demo/demo.html",
                   help="the HTML page to write (default dysco-demo/demo.html)")
    flags.add_device_flags(p)
    p.set_defaults(func=run_demo, yarn=None)
    return p


def run_demo(args) -> int:
    from dysco_interp.decoding.config import preset
    from dysco_interp.experiments import demo as demo_job
    from dysco_interp.viz.demo_page import write_demo_page

    dysco = preset(args.preset, **dysco_overrides(args))
    heads_line = check_head_file(args.heads, args.model, args.allow_other_model)
    model = load_model_from_flags(args, heads_line)
    heads = heads_from_flags(model, args, heads_line is not None)
    demo = demo_job.run_demo(model, heads, length=args.length, seed=args.seed, index=args.index, hops=args.hops,
                            dysco=dysco, max_new_tokens=args.max_new_tokens)
    html = write_demo_page(demo, args.out)
    print(demo_job.format_report(demo, html))
    print(f"DySCO ran with {preset_words(args)}")
    return 0

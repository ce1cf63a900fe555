"""`dysco-interp evaluate`: score decoding methods on task data, into a resumable result store.

Data-parallel under torchrun (`torchrun --nproc-per-node N -m dysco_interp.cli evaluate ...`):
each rank decodes its share, rank 0 prints the table (`dysco_interp.distributed`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dysco_interp.cli import args as cli_args
from dysco_interp.cli import flags
from dysco_interp.cli.prepare import (
    backend_from_flags,
    check_head_file,
    context_window,
    decoding_config,
    heads_from_flags,
    load_model_from_flags,
    preset_words,
)
from dysco_interp.errors import ConfigError, DataError
from dysco_interp.tasks.registry import DEFAULT_TASK, get_task, task_names


def add_evaluate_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "evaluate", help="score decoding methods on task data (resumable)",
        description="Run each decoding method on task data from `dysco-interp make-data`, score every "
                    "instance, and print a table of the scores per length and method with bootstrap "
                    "intervals. Records go to --out as they finish: the same command resumes.")
    p.add_argument("--task", type=task_name, default=DEFAULT_TASK,
                   help=f"{task_names(DEFAULT_TASK)}: the task of the --data files")
    p.add_argument("--data", required=True, help="a folder from make-data, or one JSONL file")
    p.add_argument("--out", type=cli_args.output_file, required=True,
                   help="result store (JSONL): created, or resumed with finished items skipped; "
                   "other settings are refused")
    p.add_argument("--limit", type=cli_args.positive_int, default=None, help="instances per file (default: all)")
    p.add_argument("--keep-trace", action="store_true", help="store each run's per-step trace")
    p.add_argument("--teacher-forced", action="store_true",
                   help="feed each instance's gold answer through every method's steps and score the predictions "
                        "(argmax agreement, gold log-probability; Path Traversal: step accuracy) instead of decoding "
                        "freely; at most --max-new-tokens gold tokens")
    p.add_argument("--format-forced", action="store_true",
                   help="force each answer's format (Path Traversal: the tags, the step template and the means of "
                        "transport) and let each method write its content (the cities), then score the text as free "
                        "output; tasks that name their answers' segments only; not with --teacher-forced")
    p.add_argument("--batch-size", type=cli_args.positive_int, default=1,
                   help="instances decoded together (backends sdpa and static)")
    p.add_argument("--if-settings-differ", choices=["error", "new"], default="error",
                   help="when --out holds results of other settings: stop with an error naming them (default), "
                        "or write to the first free or matching sibling file (results.2.jsonl, ...)")
    flags.add_model_flag(p)
    flags.add_device_flags(p)
    flags.add_split_flag(p)
    flags.add_generation_flags(p)
    flags.add_method_flags(p, multi=True)
    p.set_defaults(func=run_evaluate, max_new_tokens=256,
                   on_interrupt="finished items are kept in --out; the same command resumes")
    return p


def task_name(text: str) -> str:
    """argparse type of --task: a known task (or alias), checked before anything loads."""
    try:
        return get_task(text).name
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e).rstrip(".")) from None


def run_evaluate(args) -> int:
    from dysco_interp import distributed
    from dysco_interp.experiments.evaluate import (
        check_modes,
        check_store_files,
        check_task,
        evaluate,
        instance_id,
        method_settings,
        precheck,
        store_settings,
    )
    from dysco_interp.experiments.summary import format_table, summarise, summary_notes
    from dysco_interp.models import resolve_device, resolve_dtype
    from dysco_interp.tasks import load_dataset

    # under torchrun: this rank's device; every rank refuses bad input itself, before the model loads
    launch = distributed.torchrun_launch()
    if args.devices and (launch or args.device):
        raise ConfigError("--devices splits one process's model: not with --device, nor under torchrun "
                          "(where each rank takes one GPU)")
    args.device = distributed.rank_device(launch, args.device)
    backend = backend_from_flags(args)
    task = get_task(args.task).name
    check_modes(task, args.teacher_forced, args.format_forced)
    folder = Path(args.data).is_dir()
    files = sorted(Path(args.data).glob(f"{task}_*.jsonl")) if folder else [Path(args.data)]
    # what is there is judged by the data reader: a FIFO or a device is no regular file, not "no data"
    if not files or not (folder or files[0].exists()):
        raise DataError(f"no {task} data in {args.data}; make it with `dysco-interp make-data {task} ...`")
    # everything that can be refused is refused before the model loads
    data = {f: load_dataset(f)[: args.limit] for f in files}
    instances = [inst for part in data.values() for inst in part]
    check_task(task, instances)
    methods = {m: decoding_config(args, m) for m in args.methods.split(",")}
    needs_heads = any(c.uses_heads for c in methods.values())
    heads_line = check_head_file(args.heads, args.model, args.allow_other_model) if needs_heads else None
    check_data_fits(data, args)
    traces_for = [instance_id(inst) for inst in instances] if args.keep_trace else None
    # the store's lock is probed by taking it: under torchrun only rank 0, which alone writes the
    # store, probes it (ranks probing at the same moment refused each other)
    busy = launch is None or launch.rank == 0
    if args.if_settings_differ == "error":
        device = args.devices[0] if args.devices else resolve_device(args.device)
        known = store_settings(args.model, task, backend, resolve_dtype(args.dtype, device), device,
                               teacher_forced=args.teacher_forced, format_forced=args.format_forced)
        precheck(args.out, known, {m: method_settings(c, None) for m, c in methods.items()}, traces_for, busy)
    else:
        check_store_files(args.out, task, args.if_settings_differ, busy)
    with distributed.process_group(launch, args.device) as world, distributed.quiet_unless_main(world):
        model = load_model_from_flags(args, heads_line)
        heads = heads_from_flags(model, args, heads_line is not None) if needs_heads else None
        run = evaluate(model, args.model, task, instances, methods, heads, args.out, keep_trace=args.keep_trace,
                       backend=backend, batch_size=args.batch_size, if_differs=args.if_settings_differ,
                       teacher_forced=args.teacher_forced, command=args.command_line,
                       format_forced=args.format_forced)
    if not world.is_main:
        return 0  # rank 0 reports the whole run
    scores = get_task(task).metrics
    metrics = scores.forced if args.teacher_forced else scores.free
    summary = summarise(run.records, metrics)
    notes = summary_notes(summary, metrics, scores.extraction, args.teacher_forced)
    if args.json:
        rows = [{"length": length, "method": method, **row} for (length, method), row in summary.items()]
        print(json.dumps({"results": str(run.path), "new_records": len(run.new),
                          "preset": args.preset if needs_heads else None, "rows": rows, "notes": notes}))
        return 0
    print(format_table(summary, metrics))
    for note in notes:
        print(f"note: {note}")
    dysco = f"; DySCO methods: {preset_words(args)}" if needs_heads else ""
    print(f"results: {run.path} ({len(run.new)} new records{dysco})")
    return 0


def check_data_fits(data: dict, args) -> None:
    """ConfigError naming the first instance whose recorded prompt length plus the tokens it
    decodes exceeds the model's context (read from its config; unchecked when that needs the
    weights). Decoded freely, an instance may take --max-new-tokens; teacher-forced, only its gold
    answer's tokens (at most --max-new-tokens), counted with the tokenizer alone where the free
    budget would not fit."""
    window = context_window(args.model, args.yarn)
    if window is None:
        return
    limit, words = window
    gold_tokens = GoldTokens(args) if args.teacher_forced else None
    for path, instances in data.items():
        for inst in instances:
            if inst.n_tokens + args.max_new_tokens <= limit:
                continue
            budget, what = args.max_new_tokens, f"with --max-new-tokens {args.max_new_tokens}"
            if gold_tokens is not None:
                budget = min(budget, gold_tokens(inst))
                what = f"with its {budget}-token gold answer"
            if inst.n_tokens + budget > limit:
                more = "a larger --yarn" if args.yarn else "--yarn FACTOR"
                smaller = "" if gold_tokens is not None else " a smaller --max-new-tokens,"
                raise ConfigError(
                    f"{path}: instance {inst.id!r} has a {inst.n_tokens}-token prompt; {what} it needs "
                    f"{inst.n_tokens + budget} tokens, more than {words}: pass {more},{smaller} or shorter data")


class GoldTokens:
    """An instance's gold answer in tokens, as teacher forcing encodes it; the tokenizer is
    loaded (without the weights) at the first call."""

    def __init__(self, args):
        self.args = args
        self.tokenizer = None

    def __call__(self, inst) -> int:
        from dysco_interp.chat import encode_text
        from dysco_interp.models import load_tokenizer

        if self.tokenizer is None:
            self.tokenizer = load_tokenizer(self.args.model, progress=False)
        gold = get_task(self.args.task).evaluation.gold(inst)
        return len(encode_text(self.tokenizer, gold)[0])

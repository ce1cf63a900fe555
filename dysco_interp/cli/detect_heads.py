"""`dysco-interp detect-heads`: find retrieval heads, print them, write the head file and heatmaps.

`cli.main` wires it in with `add_detect_parser(subparsers)`; the parser's default `func`
is `run_detect`, which returns an exit code and lets `DyscoError`s reach `main` (which
prints them). Inputs are checked before the model loads, so a typo costs nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys
import tempfile
from pathlib import Path

from dysco_interp.cli import args as cli_args
from dysco_interp.cli import flags
from dysco_interp.errors import ConfigError, NoSignalError
from dysco_interp.outputs import OutputPathError, check_output_file, output_target

METHOD_CHOICES = ("qrscore", "qrscore-ndcg", "copy", "copy-paste")
DEFAULT_N = 20


def add_detect_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "detect-heads",
        help="find retrieval heads (QRScore or copy-paste) and write a head file",
        description=(
            "Score every attention head on synthetic multi-document QA (or a saved needle-QA JSONL), "
            "print the top heads, write the head set as JSON and the score heatmap as "
            "<out stem>_heatmap.png and .html."
        ),
    )
    flags.add_model_flag(p)
    p.add_argument("--data", default="needle-qa", help="'needle-qa' (generated) or a needle-QA JSONL from make-data")
    p.add_argument("--n", type=cli_args.positive_int, default=None,
                   help="examples: to generate (default 20), or the first N of --data FILE")
    p.add_argument("--length", default="2k", help="target prompt length in tokens, e.g. 8k or 4000 (default 2k)")
    p.add_argument("--method", choices=METHOD_CHOICES, default="qrscore",
                   help="qrscore (query-focused retrieval mass on the gold document, default), qrscore-ndcg "
                        "(NDCG@10 of the document ranking) or copy-paste (alias copy: the retrieval-head score)")
    flags.add_renamed_flag(p, "--n-heads", "--top-k", dest="n_heads", type=cli_args.positive_int, default=16,
                           help="heads to keep (default 16)")
    p.add_argument("--seed", type=cli_args.seed, default=0, help="data seed (and split-half seed)")
    p.add_argument("--out", type=cli_args.output_file, required=True, help="head file to write (JSON)")
    p.add_argument("--split-half", action="store_true",
                   help="also report the overlap of the --n-heads top heads of two disjoint halves")
    p.add_argument("--resume-dir", type=cli_args.output_folder, default=None,
                   help="folder for per-example records; a re-run resumes there")
    p.add_argument("--compare", default=None, help="a head file to compare the result with (overlap, Jaccard)")
    p.add_argument("--max-new-tokens", type=cli_args.positive_int, default=12,
                   help="copy-paste: greedy tokens per example")
    flags.add_device_flags(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run_detect)
    return p


def _check_args(args) -> None:
    """Everything that can be checked before loading a model (numeric ranges and whether --out
    and --resume-dir can be written: argparse types)."""
    from dysco_interp.tasks.lengths import parse_length
    from dysco_interp.viz.heatmap import heatmap_paths

    args.length_tokens = parse_length(args.length)
    if Path(args.out).suffix.lower() != ".json":
        raise ConfigError(f"--out must name a .json head file, got {args.out!r}")
    # the heatmaps go beside the head file itself: through a symbolic link, beside its target
    for path in heatmap_paths(output_target(args.out)):
        try:
            check_output_file(path)
        except OutputPathError as e:
            raise ConfigError(f"--out {args.out}: its heatmap cannot be written: {e}") from None


def _check_resume_dir(args) -> None:
    """Scores stored with other settings, known before the model loads, are refused now (the
    weights and the heads are compared once it is loaded)."""
    from dysco_interp.detection.api import check_store
    from dysco_interp.models import dtype_name, resolve_device, resolve_dtype
    from dysco_interp.stores.store import StoreError

    if args.resume_dir is None:
        return
    dtype = dtype_name(resolve_dtype(args.dtype, resolve_device(args.device)))
    try:
        check_store(args.resume_dir, args.method, model=args.model, dtype=dtype, max_new_tokens=args.max_new_tokens)
    except StoreError as e:
        raise ConfigError(f"--resume-dir {args.resume_dir}: {e}") from None


def _load_compare(path: str | None):
    if path is None:
        return None
    from dysco_interp.heads import load_heads

    return load_heads(path)  # a malformed or missing file fails here, before the model loads


def _data_file(args) -> Path | None:
    """--data as a file to read, or None for generated needle-QA data; checked before the model loads."""
    from dysco_interp.tasks.needle_qa.spec import NEEDLE_QA
    from dysco_interp.tasks.registry import get_task

    path = Path(args.data)
    if path.is_file() or path.suffix.lower() == ".jsonl":
        return path
    try:
        task = get_task(args.data).name
    except ConfigError:
        if path.exists():
            return path  # a folder: the loader says so
        raise ConfigError(
            f"--data {args.data!r} is neither 'needle-qa' (generated) nor an existing JSONL file"
        ) from None
    if task != NEEDLE_QA.name:
        raise ConfigError(f"--data {args.data!r}: detection uses needle-QA data ('needle-qa' or its JSONL)")
    return None


def _load_file_examples(path: Path, n: int | None) -> list:
    """Needle-QA examples from a make-data file, read before the model loads."""
    from dysco_interp.errors import DataError
    from dysco_interp.tasks import load_dataset
    from dysco_interp.tasks.needle_qa.spec import NEEDLE_QA

    examples = load_dataset(path)  # missing, folder, binary, truncated or empty: one DataError
    if any(getattr(x, "task", None) != NEEDLE_QA.name for x in examples):
        raise DataError(f"{path}: expected needle_qa examples (make-data needle_qa)")
    return examples if n is None else examples[:n]


def _generated_examples(args, model):
    from dysco_interp.detection import make_detection_data

    return make_detection_data(model, args.n or DEFAULT_N, args.length_tokens, args.seed, progress=not args.no_progress)


def informative_top(result, top_k: int, method: str) -> tuple[int, str | None]:
    """How many of the top-k heads carry a score, and a note when that is fewer than top_k.

    Copy-paste scores count copies, so a head that never copied scores 0 and ranks only by
    its index: listing L0H0..L0H7 as "top heads" would be noise presented as a finding.
    A NoSignalError when no head scores at all (or every head scores the same).
    """
    from dysco_interp.detection import COPY_PASTE, resolve_method

    scores = [s for _, s in result.ranking()]
    n = len(result.per_example)
    if resolve_method(method) == COPY_PASTE:
        positive = sum(s > 0 for s in scores)
        if positive == 0:
            raise NoSignalError(
                f"every copy-paste score is zero on {n} example(s): no head's most-attended token was a gold-document "
                "token that the model then copied, so there is nothing to rank and no head file was written; try "
                "more examples (--n), more new tokens (--max-new-tokens), a larger model, or --method qrscore"
            )
        if positive < top_k:
            return positive, (f"only {positive} head(s) have a non-zero copy-paste score on {n} example(s); "
                              f"the head file keeps those {positive}, not {top_k}")
        return top_k, None
    if scores and max(scores) == min(scores):
        raise NoSignalError(f"every head scored {scores[0]:g} on {n} example(s): no ranking; nothing was written")
    return top_k, None


def format_head_table(headset) -> str:
    """rank, label, layer, head, score: one line per head."""
    lines = [f"{'rank':>4}  {'label':<8} {'layer':>5} {'head':>4}  score"]
    scores = headset.scores or [float("nan")] * len(headset)
    for i, ((layer, head), score) in enumerate(zip(headset.heads, scores), 1):
        lines.append(f"{i:>4}  {f'L{layer}H{head}':<8} {layer:>5} {head:>4}  {score:.5f}")
    return "\n".join(lines)


def _command_line() -> str:
    return shlex.join(["dysco-interp", *sys.argv[1:]])


def run_detect(args) -> int:
    from dysco_interp import distributed
    from dysco_interp.threads import apply_threads

    # under torchrun: this rank's device; every rank refuses bad input itself, before the model loads
    launch = distributed.torchrun_launch()
    args.device = distributed.rank_device(launch, args.device)
    _check_args(args)
    _check_resume_dir(args)
    reference = _load_compare(args.compare)
    data_file = _data_file(args)
    file_examples = None if data_file is None else _load_file_examples(data_file, args.n)
    if args.resume_dir:
        args.on_interrupt = f"finished examples are kept in {args.resume_dir}; the same command resumes"
    apply_threads(args.threads)
    with distributed.process_group(launch, args.device) as world:
        with distributed.quiet_unless_main(world):
            result, examples, model = _detect(args, reference, file_examples)
        top_k, note = informative_top(result, args.n_heads, args.method)  # every rank: each stops on no signal
        if not world.is_main:
            return 0  # rank 0 prints and writes the results of the whole run
    return _report(args, result, examples, model, reference, top_k, note)


def _detect(args, reference, file_examples):
    """Load the model and score the heads (this rank's share of the examples under torchrun)."""
    from dysco_interp.detection import COPY_PASTE, detect, resolve_method
    from dysco_interp.hooks import sliding_layers
    from dysco_interp.models import load_model

    # load_model's status line is not output: stdout carries the head table only
    with contextlib.redirect_stdout(sys.stderr):
        model = load_model(args.model, device=args.device, dtype=args.dtype)
    if reference is not None:
        reference.validate_for(model.spec, allow_other_model=reference.model is None)
    # QRScore skips sliding-window layers: fail now rather than after the whole run
    skipped = 0 if resolve_method(args.method) == COPY_PASTE else len(sliding_layers(model.spec))
    n_scorable = (model.spec.n_layers - skipped) * model.spec.n_heads
    if args.n_heads > n_scorable:
        raise ConfigError(
            f"--n-heads {args.n_heads} is larger than the {n_scorable} heads of {model.spec.name} that "
            f"{args.method} scores"
        )
    examples = file_examples if file_examples is not None else _generated_examples(args, model)
    result = detect(
        model, examples, seed=args.seed, method=args.method, progress=not args.no_progress,
        store=args.resume_dir, max_new_tokens=args.max_new_tokens,
    )
    return result, examples, model


def _report(args, result, examples, model, reference, top_k: int, note: str | None) -> int:
    """Print the head table (and split-half, comparison), write the head file and heatmaps."""
    import dataclasses

    from dysco_interp.detection import head_overlap, split_half
    from dysco_interp.viz.heatmap import save_head_heatmaps

    if note:
        print(f"dysco-interp: note: {note}", file=sys.stderr)
    headset = result.headset(top_k, command=_command_line())
    print(f"\n{headset.method} on {model.spec.name}: top {len(headset)} of {headset.extra['n_scored_heads']} "
          f"scored heads, {len(examples)} examples")
    print(format_head_table(headset))
    if args.split_half:
        sh = split_half(result, top_k, args.seed)
        headset = dataclasses.replace(headset, extra={**headset.extra, "split_half": sh.as_dict()})
        print(f"split-half (seed {args.seed}, {len(sh.halves[0])} + {len(sh.halves[1])} examples): "
              f"top-{top_k} overlap {sh.overlap.count}/{top_k}, Jaccard {sh.overlap.jaccard:.3f}")
    if reference is not None:
        ov = head_overlap(headset, reference)
        print(f"vs {args.compare}: {ov.count} shared heads of {ov.size_a} / {ov.size_b}, Jaccard {ov.jaccard:.3f}")
    out = _write_head_file(headset, args.out, args.resume_dir)
    png, html = save_head_heatmaps(
        result.scores, output_target(out), model=model.spec.name, method=result.method, scored=result.scored,
        highlight=headset.heads, n_examples=len(examples),
    )
    print(f"wrote {out}, {png}, {html}")
    return 0


def _write_head_file(headset, out: str, resume_dir: str | None) -> Path:
    """The head file at `out`; when it cannot be written there after all (the folder went away or
    turned read-only during the run), the scores of the whole run are not lost: the head file,
    score matrix included, is kept in the first folder that takes it, which the error names."""
    try:
        return headset.to_json(out)
    except (OSError, OutputPathError) as e:
        reason = (e.strerror if isinstance(e, OSError) else None) or str(e)
        failure = e
    stem = Path(out).stem
    for folder in dict.fromkeys([Path(out).parent, *([Path(resume_dir)] if resume_dir else []), Path.cwd(),
                                 Path(tempfile.gettempdir())]):
        try:
            fd, kept = tempfile.mkstemp(prefix=f"{stem}.", suffix=".json", dir=folder)  # a name of its own
        except OSError:
            continue
        os.close(fd)
        try:
            headset.to_json(kept)
        except (OSError, OutputPathError):
            Path(kept).unlink(missing_ok=True)
            continue
        # an OSError: like any file-system error, `main` shows it in one line and exits with 1
        raise OSError(getattr(failure, "errno", None), f"cannot write {out} ({reason}); "
                      f"the head file was kept in {Path(kept).resolve()}") from None
    raise OSError(getattr(failure, "errno", None), f"cannot write {out} ({reason}), nor keep the head file "
                  "in its folder, --resume-dir, the working folder or the temporary folder") from None


__all__ = ["add_detect_parser", "format_head_table", "informative_top", "run_detect"]


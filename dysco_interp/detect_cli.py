"""`dysco-interp detect-heads`: find retrieval heads, print them, write the head file and heatmaps.

The main CLI wires it in with `add_detect_parser(subparsers)`; the parser's default `func`
is `run_detect`, which returns an exit code and lets `DyscoError`s reach the main CLI
(which prints them). Inputs are checked before the model loads, so a typo costs nothing.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from dysco_interp.errors import ConfigError

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
    p.add_argument("--model", default=None, help="registry alias, local folder or hub name (default: the default model)")
    p.add_argument("--data", default="needle-qa", help="'needle-qa' (generated) or a needle-QA JSONL from make-data")
    p.add_argument("--n", type=int, default=None, help="examples: to generate (default 20), or the first N of --data FILE")
    p.add_argument("--length", default="2k", help="target prompt length in tokens, e.g. 8k or 4000 (default 2k)")
    p.add_argument("--method", choices=METHOD_CHOICES, default="qrscore")
    p.add_argument("--top-k", type=int, default=16, help="heads to keep (default 16)")
    p.add_argument("--seed", type=int, default=0, help="data seed (and split-half seed)")
    p.add_argument("--out", required=True, help="head file to write (JSON)")
    p.add_argument("--split-half", action="store_true", help="also report top-k overlap of two disjoint halves")
    p.add_argument("--resume-dir", default=None, help="folder for per-example records; a re-run resumes there")
    p.add_argument("--compare", default=None, help="a head file to compare the result with (overlap, Jaccard)")
    p.add_argument("--max-new-tokens", type=int, default=12, help="copy-paste: greedy tokens per example")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N")
    p.add_argument("--dtype", default=None, help="float32 / bfloat16 / float16")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run_detect)
    return p


def _check_args(args) -> None:
    """Everything that can be checked before loading a model."""
    from dysco_interp.tasks.common import parse_length

    for name in ("n", "top_k", "max_new_tokens"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be a positive integer, got {value}")
    if args.seed < 0:
        raise ConfigError(f"--seed must be >= 0, got {args.seed}")
    args.length_tokens = parse_length(args.length)
    if Path(args.out).suffix.lower() != ".json":
        raise ConfigError(f"--out must name a .json head file, got {args.out!r}")
    if Path(args.out).is_dir():
        raise ConfigError(f"--out {args.out!r} is a folder; name a .json file")


def _load_compare(path: str | None):
    if path is None:
        return None
    from dysco_interp.heads import load_heads

    return load_heads(path)  # a malformed or missing file fails here, before the model loads


def _load_examples(args, model):
    from dysco_interp.detect import make_detection_data
    from dysco_interp.tasks import get_task, load_dataset

    data_path = Path(args.data)
    if data_path.suffix.lower() == ".jsonl" or data_path.is_file():
        if not data_path.is_file():
            raise ConfigError(f"--data file not found: {args.data}")
        examples = load_dataset(data_path)
        if not examples or any(getattr(x, "task", None) != "needle_qa" for x in examples):
            raise ConfigError(f"{args.data}: expected needle_qa examples (make-data needle_qa)")
        return examples if args.n is None else examples[: args.n]
    if get_task(args.data).name != "needle_qa":
        raise ConfigError(f"--data {args.data!r}: detection uses needle-QA data ('needle-qa' or its JSONL)")
    return make_detection_data(model, args.n or DEFAULT_N, args.length_tokens, args.seed, progress=not args.no_progress)


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
    import dataclasses

    import torch

    from dysco_interp.detect import COPY_PASTE, detect, head_overlap, resolve_method, sliding_layers, split_half
    from dysco_interp.models import load_model
    from dysco_interp.plots import save_head_heatmaps

    _check_args(args)
    reference = _load_compare(args.compare)
    if args.threads:
        torch.set_num_threads(args.threads)
    from dysco_interp import packaged_models

    model = load_model(args.model or packaged_models.DEFAULT_MODEL, device=args.device, dtype=args.dtype)
    if reference is not None:
        reference.validate_for(model.spec, allow_other_model=reference.model is None)
    # QRScore skips sliding-window layers: fail now rather than after the whole run
    skipped = 0 if resolve_method(args.method) == COPY_PASTE else len(sliding_layers(model.spec))
    n_scorable = (model.spec.n_layers - skipped) * model.spec.n_heads
    if args.top_k > n_scorable:
        raise ConfigError(
            f"--top-k {args.top_k} is larger than the {n_scorable} heads of {model.spec.name} that {args.method} scores"
        )
    examples = _load_examples(args, model)
    result = detect(
        model, examples, seed=args.seed, method=args.method, progress=not args.no_progress,
        store=args.resume_dir, max_new_tokens=args.max_new_tokens,
    )
    headset = result.headset(args.top_k, command=_command_line())
    print(f"\n{headset.method} on {model.spec.name}: top {len(headset)} of {headset.extra['n_scored_heads']} "
          f"scored heads, {len(examples)} examples")
    print(format_head_table(headset))
    if args.split_half:
        sh = split_half(result, args.top_k, args.seed)
        headset = dataclasses.replace(headset, extra={**headset.extra, "split_half": sh.as_dict()})
        print(f"split-half (seed {args.seed}, {len(sh.halves[0])} + {len(sh.halves[1])} examples): "
              f"top-{args.top_k} overlap {sh.overlap.count}/{args.top_k}, Jaccard {sh.overlap.jaccard:.3f}")
    if reference is not None:
        ov = head_overlap(headset, reference)
        print(f"vs {args.compare}: {ov.count} shared heads of {ov.size_a} / {ov.size_b}, Jaccard {ov.jaccard:.3f}")
    out = headset.to_json(args.out)
    png, html = save_head_heatmaps(
        result.scores, out, model=model.spec.name, method=result.method, scored=result.scored,
        highlight=headset.heads, n_examples=len(examples),
    )
    print(f"wrote {out}, {png}, {html}")
    return 0


__all__ = ["add_detect_parser", "format_head_table", "run_detect"]


if __name__ == "__main__":  # pragma: no cover - normally run as `dysco-interp detect-heads`
    parser = argparse.ArgumentParser(prog="dysco-interp")
    add_detect_parser(parser.add_subparsers(dest="command", required=True))
    ns = parser.parse_args()
    try:
        sys.exit(ns.func(ns))
    except Exception as e:
        from dysco_interp.errors import DyscoError

        if isinstance(e, DyscoError):
            print(f"dysco-interp: error: {e}", file=sys.stderr)
            sys.exit(2)
        raise

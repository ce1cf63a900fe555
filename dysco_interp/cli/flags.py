"""The flags that several commands share, each defined once, with their argparse types.

The commands add them in the order they show in `--help`; a flag's default or help that
differs between commands is a keyword argument here.
"""

from __future__ import annotations

import argparse

from dysco_interp.cli import args as cli_args

MODEL_HELP = "registry alias, local folder or hub name"
BACKENDS = ("bridge", "sdpa", "static")


def add_model_flag(parser: argparse.ArgumentParser, *, help: str = MODEL_HELP) -> None:
    """--model, the packaged default model unless given."""
    from dysco_interp.models.packaged import DEFAULT_MODEL

    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"{help} (default: {DEFAULT_MODEL})")


def add_device_flags(parser: argparse.ArgumentParser) -> None:
    """--device, --dtype and --threads: where and how the model runs."""
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if present)")
    parser.add_argument("--dtype", default=None,
                        help="float32 / bfloat16 / float16 (default: fp32 on CPU, bf16 on GPU)")
    parser.add_argument("--threads", type=cli_args.positive_int, default=None, help="torch CPU threads")


def add_split_flag(parser: argparse.ArgumentParser) -> None:
    """--devices: one model split by layers over several devices (not with --device)."""
    parser.add_argument("--devices", type=cli_args.devices, default=None, metavar="DEV,DEV[,...]",
                        help="split the model's layers over these devices, e.g. cuda:0,cuda:1, for a model too "
                             "large for one (not with --device)")


def add_generation_flags(parser: argparse.ArgumentParser) -> None:
    """Token budget, sampling, YaRN and --json of the commands that generate text."""
    parser.add_argument("--max-new-tokens", type=cli_args.positive_int, default=48,
                        help="generated tokens at most (teacher forcing: gold tokens at most)")
    parser.add_argument("--temperature", type=cli_args.nonnegative_float, default=0.0, help="0 = greedy")
    parser.add_argument("--top-p", type=cli_args.probability, default=1.0,
                        help="sampling nucleus (with --temperature > 0; DySCO's selection is --p)")
    parser.add_argument("--top-k", type=cli_args.nonnegative_int, default=0, help="0 = no top-k cut")
    parser.add_argument("--seed", type=cli_args.seed, default=None, help="sampling seed (with --temperature > 0)")
    parser.add_argument("--yarn", type=float, default=None, metavar="FACTOR",
                        help="YaRN rope scaling (context x FACTOR); combines with any method")
    parser.add_argument("--json", action="store_true", help="print the result as JSON (only JSON on stdout)")


def add_heads_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--heads", default="shipped", help="head file (any supported format) or 'shipped'")
    parser.add_argument("--allow-other-model", action="store_true",
                        help="use a head file made for another model of the same layers and heads")


def add_dysco_flags(parser: argparse.ArgumentParser, default_preset: str = "paper") -> None:
    """--preset and the overrides of its strength and key selection (--beta, --p, --k)."""
    from dysco_interp.decoding.config import PRESETS
    from dysco_interp.decoding.prompts import SCHEDULES
    from dysco_interp.decoding.template import MASKING_MODES

    parser.add_argument("--preset", default=default_preset, choices=list(PRESETS),
                        help=f"DySCO parameters (default: {default_preset})")
    parser.add_argument("--beta", type=cli_args.positive_float, default=None, help="override the preset's strength")
    parser.add_argument("--p", dest="nucleus_p", type=cli_args.probability, default=None,
                        help="override the preset's top_p")
    parser.add_argument("--k", dest="nucleus_k", type=cli_args.positive_int, default=None,
                        help="override the preset's top_k")
    parser.add_argument("--k-fraction", dest="top_k_fraction", type=cli_args.probability, default=None,
                        help="also cap the selection at this share of each prompt's tokens")
    parser.add_argument("--schedule", choices=list(SCHEDULES), default=None,
                        help="reference: T_w - 1 unbiased warm-up tokens, then n_gen + 1 biased prompt steps, as "
                             "the official code (default); paper: T_w unbiased, the generation prompt biased")
    parser.add_argument("--template-masking", choices=list(MASKING_MODES), default=None,
                        help="tokens never selected: the official code's template sequences (reference, "
                             "default), every token outside the messages (skeleton), or none (off)")


def add_method_flags(parser: argparse.ArgumentParser, *, multi: bool) -> None:
    """--method (or --methods when `multi`), the heads, DySCO's and UniAttnS' parameters, the backend."""
    from dysco_interp.decoding.backends.decode_attention import DECODE_ATTENTION
    from dysco_interp.decoding.config import METHODS

    if multi:
        # uniattns is not a default: it needs a tau chosen for the model (see --tau)
        parser.add_argument("--methods", type=method_list, default="vanilla,dysco",
                            help=f"comma-separated, from {', '.join(METHODS)} (default: vanilla,dysco)")
    else:
        parser.add_argument("--method", default="vanilla", choices=list(METHODS),
                            help="decoding method (default vanilla)")
    add_heads_flag(parser)
    add_dysco_flags(parser)
    parser.add_argument("--tau", type=cli_args.positive_float, default=None,
                        help="UniAttnS temperature, required by uniattns (tau 1 is vanilla decoding; see the README)")
    parser.add_argument("--head-seed", type=cli_args.seed, default=0, help="seed of dysco-random's heads")
    parser.add_argument("--backend", default="bridge", choices=list(BACKENDS),
                        help="bridge: TransformerLens hooks (eager); sdpa: fast, same tokens, batches; "
                             "static: sdpa prefill, fixed KV buffers, CUDA graphs on a GPU (fastest decoding)")
    parser.add_argument("--decode-attention", choices=list(DECODE_ATTENTION), default=None,
                        help="the static backend's decoding attention: sdpa (fused, the default; on a GPU, reruns "
                             "can differ in rare tokens) or float32 (bitwise repeatable on a GPU, so reruns and "
                             "torchrun shards give identical records; slower at long contexts)")


def method_list(text: str) -> str:
    """argparse type of --methods: every name known, none twice; the comma-separated text back."""
    from dysco_interp.decoding.config import METHODS

    names = [m.strip() for m in str(text).split(",") if m.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"no method named; choose from {', '.join(METHODS)}")
    unknown = [m for m in names if m not in METHODS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(METHODS)}")
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"a method is named twice in {text!r}")
    return ",".join(names)

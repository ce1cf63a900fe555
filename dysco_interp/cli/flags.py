"""The flags that several commands share, each defined once, with their argparse types.

The commands add them in the order they show in `--help`; a flag's default or help that
differs between commands is a keyword argument here.
"""

from __future__ import annotations

import argparse
import sys

from dysco_interp.cli import args as cli_args
from dysco_interp.cli import user_methods

# the choices only, never their implementations: building the parser must not import torch
from dysco_interp.decoding.choices import (
    BACKENDS,
    DECODE_ATTENTION,
    DEFAULT_PRESET,
    KNOWN_METHODS,
    MASKING_MODES,
    PRESET_NAMES,
    SCHEDULES,
)

MODEL_HELP = "registry alias, local folder or hub name"


class RenamedFlag(argparse.Action):
    """An old spelling of a renamed flag: stores into the new flag's destination and says, in one
    line on stderr, what the flag is called now."""

    def __init__(self, option_strings, dest, new_flag: str, **kwargs):
        self.new_flag = new_flag
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog}: note: {option_string} is now {self.new_flag}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_renamed_flag(parser: argparse.ArgumentParser, flag: str, old: str, *, dest: str, **kwargs) -> None:
    """`flag`, and `old` as its hidden alias with a notice (`RenamedFlag`); both set `dest`."""
    parser.add_argument(flag, dest=dest, **kwargs)
    # the new flag's default stands: the alias sets the destination only when given
    parser.add_argument(old, dest=dest, default=argparse.SUPPRESS, action=RenamedFlag, new_flag=flag,
                        help=argparse.SUPPRESS, **{k: v for k, v in kwargs.items() if k not in ("help", "default")})


def add_model_flag(parser: argparse.ArgumentParser, *, help: str = MODEL_HELP) -> None:
    """--model, the packaged default model unless given."""
    from dysco_interp.models.packaged.registry import DEFAULT_MODEL

    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"{help} (default: {DEFAULT_MODEL})")


def add_device_flags(parser: argparse.ArgumentParser) -> None:
    """--device, --dtype and --threads: where and how the model runs."""
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if present)")
    parser.add_argument("--dtype", default=None,
                        help="float32 / bfloat16 / float16 (default: fp32 on CPU, bf16 on GPU)")
    parser.add_argument("--threads", type=cli_args.positive_int, default=None,
                        help="torch CPU threads (default: $OMP_NUM_THREADS if set, else the cores free to this "
                             "process: its CPU affinity less the machine's current load, at least 1)")


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
                        help="sampling: the nucleus of next tokens (with --temperature > 0; DySCO's key "
                             "selection is --select-p)")
    parser.add_argument("--top-k", type=cli_args.nonnegative_int, default=0,
                        help="sampling: the K likeliest next tokens, 0 = no cut (DySCO's key cap is --select-k)")
    parser.add_argument("--seed", type=cli_args.seed, default=None, help="sampling seed (with --temperature > 0)")
    parser.add_argument("--yarn", type=float, default=None, metavar="FACTOR",
                        help="YaRN rope scaling (context x FACTOR); combines with any method")
    parser.add_argument("--json", action="store_true", help="print the result as JSON (only JSON on stdout)")


def add_heads_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--heads", default="shipped", help="head file (any supported format) or 'shipped'")
    parser.add_argument("--allow-other-model", action="store_true",
                        help="use a head file made for another model of the same layers and heads")


def add_dysco_flags(parser: argparse.ArgumentParser) -> None:
    """--preset and the overrides of its strength and key selection (--beta, --select-p, --select-k)."""
    parser.add_argument("--preset", default=DEFAULT_PRESET, choices=list(PRESET_NAMES),
                        help=f"DySCO parameters (default: {DEFAULT_PRESET}, the rule our dev split chose from 2K to "
                             "128K tokens; paper, paper-long: the paper's)")
    parser.add_argument("--beta", type=cli_args.positive_float, default=None, help="override the preset's strength")
    add_renamed_flag(parser, "--select-p", "--p", dest="select_p", metavar="P",  type=cli_args.probability,
                     help="DySCO: override the preset's nucleus of selected keys (top_p)")
    add_renamed_flag(parser, "--select-k", "--k", dest="select_k", metavar="K",  type=cli_args.positive_int,
                     help="DySCO: override the preset's cap on selected keys (top_k)")
    parser.add_argument("--k-fraction", dest="top_k_fraction", type=cli_args.probability, default=None,
                        help="also cap the selection at this share of each prompt's tokens")
    parser.add_argument("--schedule", choices=list(SCHEDULES), default=None,
                        help="reference: T_w - 1 unbiased warm-up tokens, then n_gen + 1 biased prompt steps, as "
                             "the official code (default); paper: T_w unbiased, the generation prompt biased")
    parser.add_argument("--template-masking", choices=list(MASKING_MODES), default=None,
                        help="tokens never selected: the official code's template sequences (reference, "
                             "default), every token outside the messages (skeleton), or none (off)")


def add_method_flags(parser: cli_args.ArgumentParser, *, multi: bool) -> None:
    """--method (or --methods when `multi`), the files of one's own methods and their options, the
    heads, DySCO's and UniAttnS' parameters, the backend."""
    built_in = ", ".join(KNOWN_METHODS)
    if multi:
        # uniattns is not a default: it needs a tau chosen for the model (see --tau)
        parser.add_argument("--methods", type=user_methods.method_list, default="vanilla,dysco", metavar="NAME,...",
                            help=f"comma-separated, from {built_in} and the methods --methods-from registers "
                                 "(default: vanilla,dysco)")
    else:
        parser.add_argument("--method", type=user_methods.method_name, default="vanilla", metavar="NAME",
                            help=f"decoding method: {built_in}, or one --methods-from registers (default vanilla)")
    parser.add_argument(user_methods.FILES_FLAG, dest="methods_from", action="append", default=None, metavar="FILE.py",
                        help=user_methods.METHODS_FROM_HELP)
    parser.add_argument(user_methods.OPTIONS_FLAG, user_methods.OPTIONS_ALIAS, dest="method_options", action="append",
                        default=None, type=user_methods.method_option, metavar="NAME=JSON",
                        help="a method's own parameters, a JSON object checked against the parameters it "
                             "declares (its Params) before any model loads and recorded with its results, e.g. "
                             "'pasta={\"alpha\": 0.05}' (repeat the flag for several methods; unset parameters "
                             "keep their defaults)")
    parser.add_check(user_methods.check_method_flags)
    add_heads_flag(parser)
    add_dysco_flags(parser)
    parser.add_argument("--tau", type=cli_args.positive_float, default=None,
                        help="UniAttnS temperature, required by uniattns (tau 1 is vanilla decoding; "
                             "figures/README.md gives the values chosen for the Qwen models)")
    parser.add_argument("--head-seed", type=cli_args.seed, default=0, help="seed of dysco-random's heads")
    parser.add_argument("--backend", default="bridge", choices=list(BACKENDS),
                        help="bridge: TransformerLens hooks (eager); sdpa: fast, same tokens, batches; "
                             "static: sdpa prefill, fixed KV buffers, CUDA graphs on a GPU (fastest decoding)")
    parser.add_argument("--decode-attention", choices=list(DECODE_ATTENTION), default=None,
                        help="the static backend's decoding attention: sdpa (fused, the default; on a GPU, reruns "
                             "can differ in rare tokens) or float32 (bitwise repeatable on a GPU, so reruns and "
                             "torchrun shards give identical records; slower at long contexts)")

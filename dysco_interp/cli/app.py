"""The `dysco-interp` parser, built from one module per command, and `main`, which runs one
command and turns what goes wrong on purpose into one line on stderr and an exit code."""

from __future__ import annotations

import argparse
import shlex
import sys
import traceback
import warnings

from dysco_interp.cli import args as cli_args
from dysco_interp.cli.demo import add_demo_parser
from dysco_interp.cli.detect_heads import add_detect_parser
from dysco_interp.cli.evaluate import add_evaluate_parser
from dysco_interp.cli.generate import add_generate_parser
from dysco_interp.cli.install_model import add_install_model_parser
from dysco_interp.cli.make_data import add_make_data_parser
from dysco_interp.cli.models import add_models_parser
from dysco_interp.cli.step_classes import add_step_classes_parser
from dysco_interp.errors import DyscoError, MethodExitError

DESCRIPTION = (
    "DySCO decoding on TransformerLens: query-focused retrieval heads pick the relevant context "
    "tokens at every decoding step, and those tokens are up-weighted in every head. Find the heads, "
    "generate and evaluate with DySCO and its baselines, and see what DySCO changes "
    "(start with `dysco-interp demo`)."
)
# the order `dysco-interp --help` lists the commands in
COMMANDS = (add_models_parser, add_install_model_parser, add_generate_parser, add_evaluate_parser,
            add_make_data_parser, add_detect_parser, add_step_classes_parser, add_demo_parser)


def build_parser() -> argparse.ArgumentParser:
    from dysco_interp import __version__

    parser = cli_args.ArgumentParser(prog="dysco-interp", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"dysco-interp {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for add_parser in COMMANDS:
        add_parser(sub)
    return parser


# what may come before the command; argparse also takes any unambiguous prefix of these
TOP_FLAGS = ("-h", "--help", "--version")


def stray_flag(words: list[str]) -> str | None:
    """The first flag before the command that the top level does not know: argparse would
    report the missing command instead, which hides the mistake."""
    for word in words:
        if word in ("-", "--") or not word.startswith("-"):
            return None  # the command (or what argparse reads as one): its own parser reports the rest
        if not any(flag == word or (len(word) > 2 and flag.startswith(word)) for flag in TOP_FLAGS):
            return word
    return None


def main(argv: list[str] | None = None) -> int:
    """Run one command; what goes wrong on purpose ends in one line on stderr, never a traceback.

    Exit codes: 0 done; 2 bad input (a DyscoError, an argparse usage error, a command that
    exits with a message); 1 a file-system error, a closed output pipe, the device out of memory,
    or an unexpected error in a command that resumes (its traceback, then where its finished work
    is kept); 130 Ctrl-C.
    Returns the code in every case (`--help` included), so callers in Python never catch SystemExit.
    """
    args = None
    try:
        try:
            parser = build_parser()
            flag = stray_flag(list(sys.argv[1:] if argv is None else argv))
            if flag is not None:
                parser.error(f"unrecognized arguments: {flag}")
            args = parser.parse_args(argv)
        except SystemExit as e:  # argparse printed its one line (or the help) already
            sys.stdout.flush()
            return e.code if isinstance(e.code, int) else 0
        # kept in the records a command writes (`stores.provenance`)
        args.command_line = shlex.join(["dysco-interp", *(sys.argv[1:] if argv is None else argv)])
        with warnings.catch_warnings():  # restores the display below when the command ends
            cli_args.show_warnings_as_lines()
            code = args.func(args)
        sys.stdout.flush()  # a reader that went away (`| head`) shows up here, inside the handler
        return code
    except MethodExitError as e:  # mid-run: what was finished is kept, as after Ctrl-C
        print(f"dysco-interp: error: {cli_args.one_line(e)}{resume_hint(args)}", file=sys.stderr)
        return 2
    except DyscoError as e:
        print(f"dysco-interp: error: {cli_args.one_line(e)}", file=sys.stderr)
        return 2
    except SystemExit as e:
        if isinstance(e.code, str):
            print(f"dysco-interp: error: {cli_args.one_line(e.code)}", file=sys.stderr)
            return 2
        return 0 if e.code is None else e.code
    except KeyboardInterrupt:
        print(f"dysco-interp: interrupted{resume_hint(args)}", file=sys.stderr)
        return 130
    except BrokenPipeError:
        cli_args.stdout_to_devnull()
        return 1
    except OSError as e:
        # disk full, permission denied, a path that vanished: the machine's answer, not a bug
        where = f": {e.filename}" if getattr(e, "filename", None) else ""
        print(f"dysco-interp: error: {cli_args.one_line(e.strerror or e)}{where}", file=sys.stderr)
        return 1
    except Exception as e:
        memory = cli_args.out_of_memory(e)
        if memory is not None:  # the machine's limit, not a bug: what to change, in one line
            print(f"dysco-interp: error: {memory}; a smaller --batch-size, a shorter context or fewer processes "
                  f"on the device fit{resume_hint(args)}", file=sys.stderr)
            return 1
        if not resume_hint(args):
            raise
        # a bug, most often in a researcher's own method: its traceback is what they need, and
        # then that the run they spent time on is not lost
        traceback.print_exc()
        print(f"dysco-interp: stopped by the error above{resume_hint(args)}", file=sys.stderr)
        return 1


def resume_hint(args: argparse.Namespace | None) -> str:
    """What a resumable command tells after a stop (where its finished work is), as a "; ..." tail."""
    resume = getattr(args, "on_interrupt", None)
    return f"; {resume}" if resume else ""

"""Every input file of every command and script (each --data, --stores, --results, --bench, positional
store and --prompt-file), tried with what cannot be read as one: a FIFO, a device that never ends
(like /dev/zero), a file with a line over the readers' cap, and an xz archive that decompresses to
one endless line after a valid store header.

What is checked, each time:
- the run ends with exit 2 and one line (no traceback) that names the input, within seconds: a FIFO
  that is opened for reading would block, so every case runs under an alarm;
- nothing is loaded first: a model or tokenizer load fails the case (the inputs are read first);
- memory stays bounded by the line cap, not by the file: each case runs in a forked child, whose
  peak memory may grow far less than the endless line it was handed.

Commands run in the child as in this process (`cli.app.main`, each script's `main(argv)`), so the
grid costs seconds. A test also reads every parser: an input flag that the grid does not cover, and
that is not exempted below with its reason, fails it.
"""

from __future__ import annotations

import argparse
import io
import json
import lzma
import os
import resource
import runpy
import signal
import stat
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest

from dysco_interp.jsonl import MAX_LINE, MAX_WHOLE_FILE

REPO = Path(__file__).resolve().parents[1]
ROOT = os.geteuid() == 0
# how long an endless line is, decompressed or sparse: far beyond the cap, and what the old readers held
ENDLESS = 256 << 20
# how much a case's peak memory may grow: a line at the cap, and what reading it costs besides
GROWTH = 96 << 20


# ---------------------------------------------------------------------------- the inputs


@dataclass(frozen=True)
class Input:
    """One input of one command or script. `argv` holds "{in}" where the input goes and "{ok}" for the
    folder of valid inputs; `what` is what it should hold: "data" (a task file), "store", "bench" (a
    benchmark JSON file), "text" (a prompt), "heads" (a head file), "notebook" or "png"."""

    name: str
    argv: tuple[str, ...]
    what: str
    script: str | None = None  # analyses/<script>.py; None for the `dysco-interp` command line


def cli(name, what, *argv):
    return Input(name, tuple(argv), what)


def script(name, what, *argv):
    return Input(name, tuple(argv), what, name.split()[0])


TINY = ("--model", "tiny-llama")
OK_DATA, OK_STORE = "{ok}/path_traversal_1900.jsonl", "{ok}/store.jsonl"

INPUTS = [
    cli("evaluate --data", "data", "evaluate", *TINY, "--data", "{in}", "--out", "{box}/r.jsonl"),
    cli("detect-heads --data", "data", "detect-heads", *TINY, "--data", "{in}", "--out", "{box}/h.json"),
    cli("step-classes base", "store", "step-classes", "{in}", OK_STORE),
    cli("step-classes other", "store", "step-classes", OK_STORE, "{in}"),
    cli("step-classes --data", "data", "step-classes", OK_STORE, OK_STORE, "--data", "{in}"),
    cli("generate --prompt-file", "text", "generate", *TINY, "--prompt-file", "{in}"),
    cli("evaluate --heads", "heads", "evaluate", *TINY, "--data", OK_DATA, "--methods", "vanilla,dysco", "--heads",
        "{in}", "--out", "{box}/r.jsonl"),
    script("pt_table --stores", "store", "--stores", "{in}", "--tau-stores", OK_STORE, "--out", "{box}/t"),
    script("pt_table --tau-stores", "store", "--stores", OK_STORE, "--tau-stores", "{in}", "--out", "{box}/t"),
    script("preset_table --stores", "store", "--stores", "{in}", "--out", "{box}/t"),
    script("ablation_table --stores", "store", "--stores", "{in}", "--out", "{box}/t"),
    script("robustness --stores", "store", "--stores", "{in}", "--out", "{box}/t"),
    script("overhead --stores", "store", "--bench", "--stores", "{in}", "--out", "{box}/t"),
    script("overhead --bench", "bench", "--bench", "{in}", "--stores", "--out", "{box}/t"),
    script("failure_trace --results", "store", "--results", "{in}", "--data", OK_DATA, *TINY, "--out", "{box}/f.json"),
    script("failure_trace --data", "data", "--results", OK_STORE, "--data", "{in}", *TINY, "--out", "{box}/f.json"),
    script("first_error --results", "store", "--results", "{in}", *TINY, "--out-dir", "{box}/fe"),
    script("first_error --data", "data", "--results", OK_STORE, "--data", "{in}", *TINY, "--out-dir", "{box}/fe"),
    script("notebook_outputs NOTEBOOK", "notebook", "{in}"),
    script("optimise_pngs PNG_FILE", "png", "{in}"),
]

# inputs the grid does not feed, and why: each is read by a reader that the grid's rows exercise, or
# is no file of records
EXEMPT = {
    "--heads": "a head file: the evaluate --heads row tries the one reader of head files",
    "--compare": "a head file, as --heads",
    "causal_ablation --copy-paste-heads": "a head file, as --heads (or a detection report, JSON)",
    "generate --prompt": "the prompt's text itself, not a file",
    "budget_study --dev-tasks": "task and length names, not files",
    "--methods-from": "a Python file, imported: load_method_file refuses what is no regular .py file",
    "--data-dir": "a folder of task files, each read by load_dataset, the reader of the --data rows",
    "--budget-dev": "a folder of stores, each read by read_store, the reader of the --stores rows",
    "--figures-dir": "the folder of committed stores, each read by read_store",
    "install-model aliases": "model names, not files",
    "make-data TASK": "a task name, not a file",
}

KINDS = ("fifo", "device", "oversized", "bomb")
WHOLE = ("text", "heads", "notebook", "png")  # inputs read whole, up to MAX_WHOLE_FILE


def applies(inp: Input, kind: str) -> bool:
    """A prompt, a head file, a notebook and a PNG are read whole, up to `MAX_WHOLE_FILE`, and benchmark
    files are JSON read as they are: none of them is ever decompressed, so no bomb for them."""
    return not (inp.what in WHOLE + ("bench",) and kind == "bomb")


# ---------------------------------------------------------------------------- what is put there


def make_device(path: Path) -> None:
    """A character device that never ends, like /dev/zero (1, 5), made inside the sandbox; only root may."""
    if not ROOT:
        pytest.skip("making a device node needs root")
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 5))


def first_lines(inp: Input, ok: Path) -> bytes:
    """What a valid input of its kind begins with: a store's header and record, a data record, or the start
    of a JSON object (a head file, a benchmark file, a prompt)."""
    if inp.what == "store":
        return (ok / "store.jsonl").read_bytes()
    if inp.what == "data":
        return (ok / "path_traversal_1900.jsonl").read_bytes()
    return b'{"results": [\n'


def oversized(path: Path, head: bytes) -> None:
    """`head`, then one line of ENDLESS NUL bytes: a sparse file, so it costs no disk and no time."""
    with open(path, "wb") as f:
        f.write(head)
        f.seek(len(head) + ENDLESS)
        f.write(b"\n")


@pytest.fixture(scope="session")
def bomb_tail() -> bytes:
    """xz streams that decompress to ENDLESS bytes of "0" (no newline): one stream of 16 MiB, compressed
    once and repeated, since xz files decompress as the concatenation of their streams."""
    block = lzma.compress(b"0" * (16 << 20), preset=0)
    return block * (ENDLESS // (16 << 20))


def place(kind: str, inp: Input, path: Path, ok: Path, bomb_tail: bytes) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        make_device(path)
    elif kind == "oversized":
        oversized(path, first_lines(inp, ok))
    else:
        path.write_bytes(lzma.compress(first_lines(inp, ok).splitlines(keepends=True)[0], preset=0) + bomb_tail)


# ---------------------------------------------------------------------------- the valid inputs


def record(method: str, index: int, instance) -> dict:
    """An evaluation record of `instance` as evaluate writes it, teacher-forced (step-classes reads those)."""
    return {"model": "tiny-llama", "task": "path_traversal", "length": instance.target_tokens, "method": method,
            "seed": instance.seed, "index": index, "id": instance.id, "instance": instance.id, "output": "x",
            "finished": True, "accuracy": 0.0, "step_accuracy": 0.0, "partial_accuracy": 0.0,
            "tf_step_accuracy": 0.5, "tf_token_correct": [True, False], "n_forced": 2,
            "config": {"method": method, "max_new_tokens": 4}}


@pytest.fixture(scope="module")
def ok(tmp_path_factory) -> Path:
    """Valid inputs beside the one under test: a Path Traversal data file and a store of records on it."""
    from dysco_interp.models.tiny import tiny_tokenizer
    from dysco_interp.tasks import make_dataset, save_dataset

    d = tmp_path_factory.mktemp("ok")
    [inst] = make_dataset("path_traversal", tiny_tokenizer("llama"), 1900, n=1)
    save_dataset(d / "path_traversal_1900.jsonl", [inst])
    header = {"kind": "dysco-interp-store", "format": 2, "purpose": "results",
              "settings": {"model": "tiny-llama", "task": "path_traversal", "dtype": "float32", "device": "cpu"}}
    lines = [header, record("vanilla", 0, inst), record("dysco", 0, inst)]
    (d / "store.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return d


# ---------------------------------------------------------------------------- running, in a child


class Hung(Exception):
    pass


def run_case(inp: Input, argv: list[str], seconds: int, script_code) -> dict:
    """In this (forked) process: the command under an alarm, with model loads refused; its exit code,
    stderr, whether it loaded anything, and how much its peak memory grew."""
    import dysco_interp.models as models
    from dysco_interp.cli.app import main as cli_main

    loaded = []

    def refuse(*args, **kwargs):
        loaded.append(True)
        raise Hung("a model or tokenizer was loaded before the input was read")

    for name in ("load_model", "load_tokenizer"):
        setattr(models, name, refuse)

    def alarm(signum, frame):
        raise Hung(f"still ran after {seconds} s (blocked on a FIFO?)")

    err = io.StringIO()
    sys.stderr = sys.stdout = err
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        code = cli_main(argv) if inp.script is None else script_code(inp.script, argv)
    except BaseException:  # noqa: BLE001 - a hang, a traceback: reported to the test, not raised in the child
        traceback.print_exc(file=err)
        code = -1
    finally:
        signal.alarm(0)
    growth = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
    return {"code": code, "err": err.getvalue(), "loaded": bool(loaded), "growth": growth}


def in_child(inp: Input, argv: list[str], script_code, seconds: int = 20) -> dict:
    """`run_case` in a forked child, so that its peak memory is its own; the parent waits."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(read)
            result = json.dumps(run_case(inp, argv, seconds, script_code)).encode()
            with os.fdopen(write, "wb") as f:
                f.write(result)
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        result = json.loads(f.read() or b'{"code": -1, "err": "the child died", "loaded": false, "growth": 0}')
    os.waitpid(pid, 0)
    return result


@pytest.fixture(scope="module")
def imported():
    """What the commands import, imported before the children fork: each case then costs only its own work."""
    import dysco_interp.analysis.records  # noqa: F401
    import dysco_interp.cli.app  # noqa: F401
    import dysco_interp.studies.table_reports  # noqa: F401


def grid() -> list:
    return [pytest.param(inp, kind, id=f"{inp.name}-{kind}") for inp in INPUTS for kind in KINDS if applies(inp, kind)]


@pytest.mark.parametrize("inp,kind", grid())
def test_an_input_that_cannot_be_read_is_one_line_at_once(inp: Input, kind: str, tmp_path, ok, bomb_tail, imported,
                                                          script_code):
    box = tmp_path / "box"
    box.mkdir()
    name = {"store": "input.jsonl", "data": "path_traversal_1900.jsonl", "bench": "bench.json", "text": "prompt.txt",
            "heads": "heads.json", "notebook": "nb.ipynb", "png": "figure.png"}
    path = box / (name[inp.what] + (".xz" if kind == "bomb" else ""))
    place(kind, inp, path, ok, bomb_tail)
    argv = [a.replace("{in}", str(path)).replace("{ok}", str(ok)).replace("{box}", str(box)) for a in inp.argv]
    result = in_child(inp, argv, script_code)
    err = result["err"]
    assert "Traceback" not in err, err
    assert not result["loaded"], "a model or tokenizer was loaded before the input was read"
    assert result["code"] == 2, f"{kind} at {inp.name} was not refused (exit {result['code']}): {err}"
    lines = err.strip("\n").split("\n")
    assert len(lines) == 1 and path.name in lines[0], err
    words = {"fifo": "a FIFO (named pipe), not a regular file", "device": "a character device, not a regular file",
             "oversized": f"longer than {MAX_LINE >> 20} MiB", "bomb": ""}[kind]
    if inp.what == "bench" and kind == "oversized":
        words = f"larger than {MAX_LINE >> 20} MiB"
    if inp.what in WHOLE and kind == "oversized":
        words = f"larger than {MAX_WHOLE_FILE >> 20} MiB"
    assert words in lines[0], lines[0]
    assert result["growth"] < GROWTH, f"peak memory grew by {result['growth'] >> 20} MiB"


# ---------------------------------------------------------------------------- the grid covers every input


class Parsed(Exception):
    def __init__(self, parser):
        self.parser = parser


def script_parser(name: str, monkeypatch) -> argparse.ArgumentParser:
    """The parser an analyses/ script builds, caught as it parses."""

    def catch(self, args=None, namespace=None):
        raise Parsed(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", catch)
    path = REPO / "analyses" / f"{name}.py"
    with pytest.raises(Parsed) as caught:
        runpy.run_path(str(path), run_name="adversarial")["main"]([])
    monkeypatch.undo()
    return caught.value.parser


def all_parsers(monkeypatch) -> dict[str, argparse.ArgumentParser]:
    from dysco_interp.cli.app import build_parser

    parsers = {}
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            parsers.update(action.choices)
    for path in sorted((REPO / "analyses").glob("*.py")):
        parsers[path.stem] = script_parser(path.stem, monkeypatch)
    return parsers


# what may name an input: a positional, or a flag that takes a path-like string (no number, no choice, no
# output type), of one of these words
INPUT_WORDS = {"data", "stores", "results", "bench", "file", "prompt", "heads", "compare", "dev", "dir", "from"}


def test_every_input_of_every_command_and_script_is_in_the_grid(monkeypatch):
    from dysco_interp.cli import args as cli_args

    outputs = (cli_args.output_file, cli_args.output_folder, cli_args.output_stem)
    covered = {inp.name.split()[0] + " " + inp.name.split()[1] for inp in INPUTS}
    missing = []
    for name, parser in all_parsers(monkeypatch).items():
        for action in parser._actions:
            if action.type in outputs or action.help == argparse.SUPPRESS or isinstance(
                    action, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)):
                continue
            flag = action.option_strings[0] if action.option_strings else None
            label = flag or action.metavar or action.dest
            takes_a_path = action.nargs != 0 and action.type in (None, str) and not action.choices
            if flag is not None and not (takes_a_path and INPUT_WORDS & set(action.dest.split("_"))):
                continue
            if f"{name} {label}" not in covered and label not in EXEMPT and f"{name} {label}" not in EXEMPT:
                missing.append(f"{name} {label}")
    assert not missing, f"inputs the grid does not try (add them to INPUTS, or to EXEMPT with why): {missing}"

"""Every output path of every command and script, tried with what a careless or hostile user may put
there: a missing path, a regular file of another kind, a folder, a device node, a FIFO, symlinks and
an unwritable place.

What is checked, each time:
- a refusal is one line (no traceback) that names the output, and leaves every byte as it was:
  the sandbox around the output is checksummed before and after, and so is the repository's tree;
- a run that is allowed to succeed changes nothing but its named output (a store's lock file
  included), and writes through a symlink into its target;
- nothing hangs: a FIFO that is opened for reading would block, so every case runs under an alarm.

Commands run in this process (`cli.app.main`, each script's `main(argv)`), so the whole grid costs
seconds; the cases that decode run on the tiny random model.
"""

from __future__ import annotations

import hashlib
import os
import runpy
import signal
import stat
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dysco_interp.cli.app import main as cli_main
from dysco_interp.models.tiny import tiny_tokenizer
from dysco_interp.tasks import make_dataset, save_dataset

REPO = Path(__file__).resolve().parents[1]
ROOT = os.geteuid() == 0
HEADS = REPO / "tests" / "data" / "heads" / "ours_tiny_llama.json"


# ---------------------------------------------------------------------------- the targets


@dataclass(frozen=True)
class Target:
    """One output flag of one command or script.

    `argv` holds "{out}" where the output goes and "{in}" for the shared inputs folder. `shape` is
    what the output is: "file"; "stem" (the command writes files named STEM.*, or STEM_*); or
    "folder". `runs` names the valid kinds that make a cheap run here (on the tiny model): those
    are run to the end; the others are only tried with paths that must be refused. A file's folder
    may also receive plotly.min.js, the one copy of plotly.js that HTML figures beside it share.
    """

    name: str
    argv: tuple[str, ...]
    shape: str
    runs: tuple[str, ...] = ()
    script: str | None = None  # analyses/<script>.py; None for the `dysco-interp` command line
    suffix: str = ""  # the output's file name ends so (".jsonl", ".json", ".html")


RUNS = ("missing", "symlink_to_missing", "folder")  # every valid kind


def cli(name, shape, *argv, runs=(), suffix=""):
    return Target(name, tuple(argv), shape, runs, None, suffix)


def script(name, shape, *argv, runs=(), suffix=""):
    return Target(name, tuple(argv), shape, runs, name.split()[0], suffix)


TINY = ("--model", "tiny-llama")
EVAL = ("evaluate", *TINY, "--task", "needle_qa", "--data", "{in}/needle_qa_600.jsonl", "--methods", "vanilla",
        "--max-new-tokens", "2")
DATA = "{in}/path_traversal_1900.jsonl"
DETECT = ("detect-heads", *TINY, "--n", "2", "--length", "600", "--no-progress")
STORES = ("--stores", "{in}/store.jsonl")

TARGETS = [
    cli("evaluate --out", "file", *EVAL, "--out", "{out}", runs=RUNS, suffix=".jsonl"),
    cli("make-data --out", "folder", "make-data", "needle_qa", *TINY, "--lengths", "600", "--n", "1",
        "--out", "{out}", runs=RUNS),
    cli("detect-heads --out", "stem", *DETECT, "--out", "{out}", runs=RUNS, suffix=".json"),
    cli("detect-heads --resume-dir", "folder", *DETECT, "--out", "{box}/fresh/heads.json",
        "--resume-dir", "{out}", runs=RUNS),
    cli("demo --out", "file", "demo", *TINY, "--heads", str(HEADS), "--length", "1900", "--hops", "2",
        "--max-new-tokens", "2", "--out", "{out}", runs=("missing",), suffix=".html"),  # 25 s a run
    script("pt_table --out", "stem", *STORES, "--tau-stores", "{in}/store.jsonl", "--out", "{out}", runs=RUNS),
    script("ablation_table --out", "stem", *STORES, "--out", "{out}", runs=RUNS),
    script("robustness --out", "stem", *STORES, "--out", "{out}", runs=RUNS),
    script("overhead --out", "stem", *STORES, "--out", "{out}"),
    script("bench_decode --out", "file", *TINY, "--out", "{out}", suffix=".json"),
    script("bench_prefill --out", "file", *TINY, "--out", "{out}", suffix=".json"),
    script("bench_data_parallel --out", "file", "--out", "{out}", "--", *TINY, suffix=".json"),
    script("bench_data_parallel --work-dir", "folder", "--work-dir", "{out}", "--out", "{box}/fresh/dp.json",
           "--", *TINY),
    script("decode_exactness --out", "file", *TINY, "--out", "{out}", suffix=".json"),
    script("failure_trace --out", "file", "--results", "{in}/store.jsonl", "--data", DATA,
           *TINY, "--out", "{out}", suffix=".json"),
    script("budget_study --out-dir", "folder", *TINY, "--data-dir", "{in}", "--out-dir", "{out}"),
    script("causal_ablation --out-dir", "folder", *TINY, "--data-dir", "{in}", "--out-dir", "{out}"),
    script("decoding_runs --out-dir", "folder", *TINY, "--data-dir", "{in}", "--out-dir", "{out}"),
    script("first_error --out-dir", "folder", "--results", "{in}/store.jsonl", *TINY, "--out-dir", "{out}"),
    script("motivation --out-dir", "folder", *TINY, "--data-dir", "{in}", "--out-dir", "{out}"),
    script("run_all --out-dir", "folder", "--out-dir", "{out}"),
    script("ship_heads --work", "folder", *TINY, "--work", "{out}"),
]


# ---------------------------------------------------------------------------- what is put at the output

KINDS = ("missing", "other_file", "folder", "device", "fifo", "symlink_to_missing", "symlink_to_other_file",
         "symlink_to_device", "unwritable")


def valid_kinds(target: Target) -> set[str]:
    """The kinds a target may succeed on; every other kind must be refused."""
    ok = {"missing", "symlink_to_missing"}
    if target.shape == "folder":
        ok.add("folder")
    return ok


def place(kind: str, out: Path, box: Path) -> Path | None:
    """Put `kind` at `out`; returns where a symlink points (its target), else None."""
    out.parent.mkdir(parents=True, exist_ok=True)
    elsewhere = box / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    if kind == "missing":
        return None
    if kind == "other_file":
        out.write_bytes(b"notes a person keeps, not written by dysco-interp\n")
    elif kind == "folder":
        out.mkdir()
        (out / "kept.txt").write_text("a file of the user's, inside the folder\n")
    elif kind == "device":
        make_device(out)
    elif kind == "fifo":
        os.mkfifo(out)
    elif kind.startswith("symlink_to_"):
        target = elsewhere / f"target{out.suffix}"
        if kind == "symlink_to_other_file":
            target.write_bytes(b"notes a person keeps, not written by dysco-interp\n")
        elif kind == "symlink_to_device":
            make_device(target)
        out.symlink_to(target)
        return target
    return None


def make_device(path: Path) -> None:
    """A character device like /dev/null, made inside the sandbox so that a writer that replaces it
    harms nothing; only root may make one."""
    if not ROOT:
        pytest.skip("making a device node needs root")
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))


def unwritable(box: Path, name: str) -> Path:
    """A path that cannot be created: below a read-only folder for a user, below /proc for root
    (root passes every permission check, and os.access says yes even where creating a file fails)."""
    if ROOT:
        return Path("/proc") / "dysco-interp-no-such-folder" / name
    ro = box / "read-only"
    ro.mkdir()
    ro.chmod(0o555)
    return ro / name


# ---------------------------------------------------------------------------- watching the disk


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under `root`, without following links or opening anything but regular files."""
    seen: dict[str, tuple] = {}
    for folder, dirs, files in os.walk(root, followlinks=False):
        for name in dirs + files:
            p = Path(folder) / name
            st = p.lstat()
            rel = p.relative_to(root).as_posix()
            if stat.S_ISLNK(st.st_mode):
                seen[rel] = ("link", os.readlink(p))
            elif stat.S_ISREG(st.st_mode):
                seen[rel] = ("file", hashlib.sha256(p.read_bytes()).hexdigest())
            elif stat.S_ISDIR(st.st_mode):
                seen[rel] = ("dir",)
            else:
                seen[rel] = ("special", stat.S_IFMT(st.st_mode), st.st_rdev)
    return seen


def changed(before: dict, after: dict) -> set[str]:
    return {k for k in set(before) | set(after) if before.get(k) != after.get(k)}


def repo_state() -> str:
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout


# ---------------------------------------------------------------------------- running


class Hung(Exception):
    pass


def run(target: Target, argv: list[str], monkeypatch, capsys, seconds: int = 120) -> tuple[int, str]:
    """(exit code, stderr) of one command or script, in this process, under an alarm."""

    def alarm(signum, frame):
        raise Hung(f"{target.name} still ran after {seconds} s (blocked on a FIFO?)")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        if target.script is None:
            code = cli_main(argv)
        else:
            path = REPO / "analyses" / f"{target.script}.py"
            monkeypatch.setattr("sys.argv", [str(path), *argv])
            try:
                code = runpy.run_path(str(path), run_name="adversarial")["main"](argv)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
                if isinstance(e.code, str):
                    print(e.code, file=__import__("sys").stderr)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return code or 0, capsys.readouterr().err



@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """What the commands read: a needle-QA and a Path Traversal data file, and an evaluation store
    of the latter (vanilla and DySCO with the paper's preset, whose parameters the robustness
    table moves one at a time)."""
    d = tmp_path_factory.mktemp("inputs")
    tokenizer = tiny_tokenizer("llama")
    save_dataset(d / "needle_qa_600.jsonl", make_dataset("needle_qa", tokenizer, 600, n=1))
    save_dataset(d / "path_traversal_1900.jsonl", make_dataset("path_traversal", tokenizer, 1900, n=1))
    code = cli_main(["evaluate", *TINY, "--data", str(d / "path_traversal_1900.jsonl"),
                     "--methods", "vanilla,dysco", "--preset", "paper", "--heads", str(HEADS), "--max-new-tokens", "4",
                     "--out", str(d / "store.jsonl")])
    assert code == 0
    (d / "store.jsonl.lock").unlink(missing_ok=True)
    return d


@dataclass
class Case:
    target: Target
    kind: str
    box: Path
    out: Path
    link_target: Path | None = None
    argv: list[str] = field(default_factory=list)


def prepare(target: Target, kind: str, tmp_path: Path, inputs: Path) -> Case:
    box = tmp_path / "box"
    (box / "cwd").mkdir(parents=True)
    (box / "bystander.txt").write_text("a file beside the output that nobody named\n")
    name = f"result{target.suffix}" if target.shape != "folder" else "results"
    # a stem's files are STEM.md/.json (tables) or STEM.json + STEM_heatmap.* (heads): the kind is
    # put at the file the command writes first
    out = unwritable(box, name) if kind == "unwritable" else box / "out" / name
    probe = out.with_name(out.name + ".json") if target.shape == "stem" and not target.suffix else out
    link_target = None if kind == "unwritable" else place(kind, probe, box)
    if kind != "unwritable":
        (box / "out").mkdir(exist_ok=True)
    argv = [a.replace("{out}", str(out)).replace("{in}", str(inputs)).replace("{box}", str(box)) for a in target.argv]
    return Case(target, kind, box, probe, link_target, argv)


def allowed(case: Case, path: str) -> bool:
    """Whether a successful run may have changed `path` (relative to the sandbox): its named output
    (what a link points to), a store's lock file, the shared plotly.min.js beside it, and what the
    case names under {box}/fresh for a second output of the same command."""
    named = case.link_target if case.link_target is not None else case.out
    rel = named.relative_to(case.box).as_posix()
    folders = {p.relative_to(case.box).parent.as_posix() for p in (named, case.out)}
    if path == "fresh" or path.startswith("fresh/") or path in folders | {f"{f}/plotly.min.js" for f in folders}:
        return True
    if case.target.shape == "stem":  # the files beside the one a link stands for are written as named
        stems = {p.relative_to(case.box).as_posix().removesuffix(".json") for p in (named, case.out)}
        return any(path.startswith(stem + ".") or path.startswith(stem + "_") for stem in stems)
    return path == rel or path.startswith(rel + "/") or path == rel + ".lock"


def grid() -> list:
    cases = []
    for target in TARGETS:
        for kind in KINDS:
            expensive = kind in valid_kinds(target) and kind not in target.runs
            marks = [pytest.mark.skip(reason="a valid path makes a long run; its refusals are tried")] if expensive \
                else []
            cases.append(pytest.param(target, kind, id=f"{target.name}-{kind}", marks=marks))
    return cases


@pytest.mark.parametrize("target,kind", grid())
def test_an_output_path_is_refused_or_written_and_nothing_else_changes(target: Target, kind: str, tmp_path,
                                                                      inputs, monkeypatch, capsys, error_line):
    case = prepare(target, kind, tmp_path, inputs)
    monkeypatch.chdir(case.box / "cwd")
    before, repo_before = snapshot(case.box), repo_state()
    inputs_before = snapshot(inputs)
    code, err = run(target, case.argv, monkeypatch, capsys)
    after = snapshot(case.box)
    assert repo_state() == repo_before, "the repository's tree changed"
    assert snapshot(inputs) == inputs_before, "the inputs changed"
    if kind in valid_kinds(target):
        assert code == 0, err
        outside = {p for p in changed(before, after) if not allowed(case, p)}
        assert not outside, f"changed outside the named output: {sorted(outside)}"
        if case.link_target is not None:
            assert case.out.is_symlink(), "the symlink was replaced instead of written through"
            assert case.link_target.exists(), "the symlink's target was never written"
    else:
        assert code == 2, f"{kind} at {target.name} was not refused (exit {code}): {err}"
        line = error_line(err)
        assert case.out.name in line or str(case.out.parent) in line or case.out.parent.name in line, line
        assert changed(before, after) == set(), f"a refusal changed {sorted(changed(before, after))}"

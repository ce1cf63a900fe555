import os

# Tests never reach a model hub; set before transformers is imported anywhere.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")

import subprocess  # noqa: E402
import sys  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from dysco_interp.decoding.template import TemplateMaskingFallbackWarning  # noqa: E402
from dysco_interp.models.tiny import STYLES, tiny_model  # noqa: E402

torch.set_num_threads(1)

_TINY_CACHE: dict = {}


# The tiny gemma3 template is of no family DySCO's reference code lists, on purpose: DySCO's default
# masking falls back to "skeleton" on it, and says so once per run. A test of that model expects the
# fallback (test_template_mask checks the warning itself); pytest restores the filter after each test.
NO_FAMILY_STYLES = ("gemma3",)
FALLBACK_WARNING = f"{TemplateMaskingFallbackWarning.__module__}.{TemplateMaskingFallbackWarning.__qualname__}"


def get_tiny(style: str):
    if style in NO_FAMILY_STYLES:
        warnings.filterwarnings("ignore", category=TemplateMaskingFallbackWarning)
    # Models are read-only in tests (hooks are removed after each run), so share them.
    if style not in _TINY_CACHE:
        _TINY_CACHE[style] = tiny_model(style)
    return _TINY_CACHE[style]


def pytest_collection_modifyitems(items):
    # a real model costs seconds to load and run: what `make test-fast` leaves out
    for item in items:
        if item.get_closest_marker("real_model") is not None:
            item.add_marker(pytest.mark.slow)
        # a test run on a no-family style (its `tiny` fixture or its own style parameter) expects the fallback
        params = getattr(getattr(item, "callspec", None), "params", {})
        if any(isinstance(v, str) and v in NO_FAMILY_STYLES for v in params.values()):
            item.add_marker(pytest.mark.filterwarnings(f"ignore::{FALLBACK_WARNING}"))


@pytest.fixture
def tiny_of():
    """The shared tiny model of a style, by name: tiny_of("gemma3")."""
    return get_tiny


@pytest.fixture(params=STYLES)
def tiny(request):
    return get_tiny(request.param)


@pytest.fixture
def tiny_llama():
    return get_tiny("llama")


def _refuse_loads(monkeypatch, names: tuple[str, ...]) -> None:
    import dysco_interp.models as models

    def refuse(*args, **kwargs):
        raise AssertionError("a model or tokenizer was loaded before the input was checked")

    for name in names:
        monkeypatch.setattr(models, name, refuse)


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model or a tokenizer fails the test: these errors must come before any load."""
    _refuse_loads(monkeypatch, ("load_model", "load_tokenizer"))


@pytest.fixture
def no_weights(monkeypatch):
    """Loading a model fails the test (a tokenizer may be read first, as generate does to count a prompt)."""
    _refuse_loads(monkeypatch, ("load_model",))


def _error_line(err: str) -> str:
    assert "Traceback" not in err
    tail = err.rsplit("\r", 1)[-1]  # after a progress bar that cleared itself, nothing else
    lines = tail.strip("\n").split("\n")
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def error_line():
    """The one line a terminal shows of stderr; fails on a traceback or a second line."""
    return _error_line


@pytest.fixture(scope="session")
def real_model():
    from dysco_interp import load_model

    return load_model("smollm2-135m", progress=False)


REPO = Path(__file__).resolve().parents[1]
# makes `import NAME` fail for the listed top-level packages, as on a machine without them
_BLOCK = """
import importlib.abc
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {blocked!r}:
            raise ImportError(f'blocked {{name}}', name=name.split('.')[0])
sys.meta_path.insert(0, Block())
"""
# runs the script as `python analyses/NAME.py ARGS` would
_RUN_SCRIPT = """
import runpy
sys.argv = [{script!r}, *{argv!r}]
try:
    runpy.run_path({script!r}, run_name='__main__')
except SystemExit as e:
    assert e.code in (0, None), e.code
"""


def run_analysis_script(name: str, argv: list[str], cwd: Path, *, blocked: list[str] | tuple = (),
                        prelude: str = "", timeout: int = 600) -> subprocess.CompletedProcess:
    """analyses/<name>.py in a fresh interpreter in `cwd`, with the `blocked` packages unimportable
    and `prelude` (e.g. a patched loader) run first."""
    script = str(REPO / "analyses" / f"{name}.py")
    code = "import sys\n" + (_BLOCK.format(blocked=list(blocked)) if blocked else "") + prelude
    code += _RUN_SCRIPT.format(script=script, argv=list(argv))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def run_script():
    """`run_analysis_script`: an analysis script run as its command line would run it."""
    return run_analysis_script


def run_script_main(name: str, argv: list[str], monkeypatch) -> int:
    """analyses/<name>.py's `main(argv)` in this process (seconds cheaper than a fresh interpreter):
    its exit code, argparse's exits included."""
    import runpy

    path = REPO / "analyses" / f"{name}.py"
    monkeypatch.setattr("sys.argv", [str(path), *argv])
    try:
        return runpy.run_path(str(path), run_name="in_process")["main"](argv) or 0
    except SystemExit as e:
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)


@pytest.fixture
def script_code(monkeypatch):
    """`run_script_main` with this test's monkeypatch: (name, argv) -> the script's exit code."""
    return lambda name, argv: run_script_main(name, [str(a) for a in argv], monkeypatch)


@pytest.fixture
def script_main(script_code, capsys):
    """`run_script_main`, returning (exit code, stdout, stderr)."""

    def run(name: str, *argv) -> tuple[int, str, str]:
        code = script_code(name, argv)
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """One Path Traversal instance for tiny-llama, made by `make-data` as a user makes it."""
    from dysco_interp.cli import main

    out = tmp_path_factory.mktemp("data")
    assert main(["make-data", "path_traversal", "--model", "tiny-llama", "--lengths", "1950", "--n", "1",
                 "--out", str(out)]) == 0
    return out


@pytest.fixture
def machine_paths() -> tuple[str, ...]:
    """Where the machine that ran something keeps its files: no committed output may name them."""
    return ("/tmp/", "/home/", "/root/", "/work/", "/Users/", "\\Users\\")


def drawn_trace_types(page: Path) -> set[str]:
    """The trace types that an HTML page's plots and their animation frames draw (not those its
    template merely styles)."""
    import json
    import re

    html = page.read_text(encoding="utf-8")
    types = set()
    for call in re.finditer(r"""Plotly\.(newPlot|addFrames)\(\s*["'][^"']*["'],\s*""", html):
        found, _ = json.JSONDecoder().raw_decode(html, call.end())
        traces = found if call.group(1) == "newPlot" else [t for frame in found for t in frame.get("data", [])]
        types |= {t.get("type", "scatter") for t in traces}  # plotly.js draws an untyped trace as scatter
    return types


@pytest.fixture
def trace_types():
    """`drawn_trace_types(page)`."""
    return drawn_trace_types


@pytest.fixture(scope="session")
def cartesian_trace_types() -> set[str]:
    """The trace types that the shipped cartesian plotly.js registers: a page that loads it draws
    no trace of another type."""
    import re

    from dysco_interp.viz.render_html import cartesian_plotlyjs

    return {m.decode() for m in re.findall(rb'moduleType:"trace",name:"(\w+)"', cartesian_plotlyjs())}


def tokens_on_every_backend(model, configs, prompts, heads=None) -> dict[str, dict[str, list[list[int]]]]:
    """backend -> method -> each prompt's tokens: the bridge one prompt at a time, sdpa and static
    every prompt in one left-padded batch (`heads`: the QRHeads of methods that read them)."""
    from dysco_interp.decoding.loop import generate_batch

    bridge: dict[str, list[list[int]]] = {name: [] for name in configs}
    for prompt in prompts:
        for name, results in generate_batch(model, [prompt], configs, heads, backend="bridge").items():
            bridge[name] += [r.tokens for r in results]
    out = {"bridge": bridge}
    for backend in ("sdpa", "static"):
        batch = generate_batch(model, list(prompts), configs, heads, backend=backend)
        out[backend] = {name: [r.tokens for r in results] for name, results in batch.items()}
    return out


@pytest.fixture
def tokens_everywhere():
    """`tokens_on_every_backend(model, configs, prompts)`: for tests that hold a method's tokens
    equal across the backends."""
    return tokens_on_every_backend

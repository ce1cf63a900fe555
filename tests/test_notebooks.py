"""The notebooks run top to bottom on the default model, in a kernel of this very interpreter.

The kernel is started from `sys.executable` (not from whatever `python3` kernelspec the
machine has), so a fresh clone's `.venv` tests its own install.
"""

import os
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from traitlets import default

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 600


class ThisPythonSpecs(KernelSpecManager):
    """Every kernel name resolves to an ipykernel on the interpreter running the tests."""

    def get_kernel_spec(self, kernel_name):
        argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        return KernelSpec(argv=argv, display_name=f"Python ({sys.executable})", language="python")


class ThisPythonKernel(AsyncKernelManager):
    @default("kernel_spec_manager")
    def _kernel_spec_manager_default(self):
        return ThisPythonSpecs(data_dir=self.data_dir)


def kernel_env() -> dict:
    env = dict(os.environ)
    # importable without an install, and one thread per process as in conftest
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    # no MPLBACKEND: the kernel's inline backend shows matplotlib figures as the notebooks intend
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    env.pop("MPLBACKEND", None)
    return env


def display_types(cell) -> list[str]:
    """The rich outputs of a code cell (images, plotly figures), in order: what a reader sees
    beyond text. Text streams vary with timings and progress bars; these do not."""
    return [t for o in cell.outputs if o.output_type in ("display_data", "execute_result")
            for t in sorted(o.data) if not t.startswith("text/")]


def test_the_notebooks_are_committed_with_outputs_that_read_anywhere(machine_paths):
    names = ["01_quickstart.ipynb", "02_retrieval_heads.ipynb", "03_attention_replay.ipynb",
             "04_your_own_methods.ipynb"]
    assert [p.name for p in NOTEBOOKS] == names
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        code = [c for c in nb.cells if c.cell_type == "code"]
        # run top to bottom once: GitHub, nbconvert and the documentation site show these outputs
        assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), f"{path.name}: not run in order"
        assert all(c.outputs for c in code), f"{path.name}: a cell without output"
        outputs = [o for c in code for o in c.outputs]
        assert not [o for o in outputs if o.output_type == "error"], path.name
        text = nbformat.writes(nb)
        assert not [m for m in machine_paths if m in text], f"{path.name} names a path of the machine that ran it"
        assert "plotly.js inlined" not in text  # every HTML page loads the plotly.min.js beside it
        for cell in code:
            kinds = display_types(cell)
            if "application/vnd.plotly.v1+json" in kinds:
                # an interactive figure shows nowhere without JavaScript: a static image follows it
                assert "image/png" in kinds[kinds.index("application/vnd.plotly.v1+json"):] or "image/png" in \
                    display_types(code[code.index(cell) + 1]), f"{path.name}: a plotly figure without a static image"
            # plotly.js from a CDN draws nothing offline
            assert "cdn.plot.ly" not in str(cell.outputs)
            # a progress bar keeps its final state only (`analyses/notebook_outputs.py`): every state
            # it drew shows as a red block of its own on GitHub and the documentation site
            errs = [o.text for o in cell.outputs if o.output_type == "stream" and o.name == "stderr"]
            assert not [t for t in errs if t.startswith("\r") or not t.strip()], \
                f"{path.name}: a cell keeps intermediate progress-bar states; run analyses/notebook_outputs.py"


@pytest.mark.real_model
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_top_to_bottom(path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", kernel_manager_class=ThisPythonKernel,
        resources={"metadata": {"path": str(tmp_path)}},  # the kernel's working directory
    )
    committed = [display_types(c) for c in nb.cells if c.cell_type == "code"]
    client.execute(env=kernel_env())
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    streams = [o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [t for t in streams if "TqdmWarning" in t]  # progress bars that suit a notebook
    assert all(c.execution_count for c in nb.cells if c.cell_type == "code")
    # the committed outputs are this code's: every cell shows the same kinds of figures
    assert [display_types(c) for c in nb.cells if c.cell_type == "code"] == committed

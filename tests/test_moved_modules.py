"""Modules that moved keep their old paths for one release: importing one warns once, naming the
new place, and gives the very objects the new module holds. The project itself imports only the
new paths, so its own runs never warn."""

import ast
import importlib
import json
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# old path -> the modules its names now live in, each with the names it took (None: all of its `__all__`)
MOVED = {
    "dysco_interp.experiments.store": {"dysco_interp.stores.store": None},
    "dysco_interp.experiments.store_format": {"dysco_interp.stores.format": None},
    "dysco_interp.experiments.provenance": {"dysco_interp.stores.provenance": None},
    "dysco_interp.analysis.store_archives": {"dysco_interp.stores.archives": None},
    # the table logic stayed in the analysis library; finding the files went to the stores
    "dysco_interp.analysis.stores": {"dysco_interp.analysis.records": None,
                                     "dysco_interp.stores.archives": ("expand",)},
    # the bridge's hooks live with the bridge backend
    "dysco_interp.decoding.interventions": {"dysco_interp.decoding.backends.bridge_hooks": None},
    # data-parallel runs serve the libraries under the jobs too
    "dysco_interp.experiments.distributed": {"dysco_interp.distributed": None},
}


def moved_names(old: str) -> dict[str, object]:
    """Each name the old path must still give, and the object it must be."""
    out = {}
    for new, names in MOVED[old].items():
        module = importlib.import_module(new)
        out |= {name: getattr(module, name) for name in names or module.__all__}
    return out


def fresh_import(name: str, monkeypatch) -> tuple[object, list[warnings.WarningMessage]]:
    """The module imported anew (as a first import in a process would), and what it warned."""
    monkeypatch.delitem(sys.modules, name, raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        __import__(name)  # as an import statement does: importlib.import_module would be the importer
    return sys.modules[name], [w for w in caught if issubclass(w.category, DeprecationWarning)]


@pytest.mark.parametrize("old", MOVED)
def test_an_old_path_warns_once_and_gives_the_new_objects(old, monkeypatch):
    expected = moved_names(old)
    module, warned = fresh_import(old, monkeypatch)
    assert len(warned) == 1, [str(w.message) for w in warned]
    message = str(warned[0].message)
    assert message.startswith(f"{old} moved to {next(iter(MOVED[old]))}") and "the next release" in message
    # the warning points at the importing line, where the path is to be changed
    assert Path(warned[0].filename).name == Path(__file__).name
    assert set(module.__all__) == set(expected)
    assert all(getattr(module, name) is obj for name, obj in expected.items())


def imported_modules(source: str) -> set[str]:
    """Every module and module.name an import in `source` names."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


def project_sources() -> dict[str, str]:
    """The Python of the package, the scripts, the tests and the notebooks' code cells, by file;
    the old paths themselves and this test left out."""
    shims = {ROOT / (old.replace(".", "/") + ".py") for old in MOVED}
    files = [p for folder in ("dysco_interp", "analyses", "tests", "docs") for p in (ROOT / folder).rglob("*.py")]
    sources = {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in files
               if p not in shims and p.resolve() != Path(__file__).resolve()}
    for notebook in (ROOT / "notebooks").glob("*.ipynb"):
        cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
        code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
        # IPython's magics and shell lines are no Python
        lines = [ln for cell in code for ln in cell.splitlines() if not ln.lstrip().startswith(("%", "!"))]
        sources[str(notebook.relative_to(ROOT))] = "\n".join(lines)
    return sources


def test_nothing_in_the_project_imports_an_old_path():
    using = sorted(f"{where} imports {m}" for where, source in project_sources().items()
                   for m in imported_modules(source) if m in MOVED)
    assert using == []

"""The package's shape: no import cycles, no private names across modules, the paper's studies on
top of the library (nothing in the package imports them), the result stores below everything that
writes or reads them, no code outside the backends that tells a backend by its name, modules of a
readable size, and tests that import the package, never other tests or the analysis scripts."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dysco_interp"
MAX_LINES = 600
# the paper's studies: only the analyses/ scripts and the tests import them, so the library
# (`analysis`), `viz`, `experiments` and the rest of the package never depend on one study
STUDIES = "dysco_interp.studies"
LIBRARY = "dysco_interp.analysis"
# result stores: the jobs write them and the library reads them, so they build on neither; they
# import only each other and the package's shared top-level modules (jsonl, atomic, errors, ...)
STORES = "dysco_interp.stores"
# what a backend can do is asked of its class (`supports_graphs`, `runs_hooks`, its `Options`;
# `choices.backends_with` before torch is imported), never read off its name, so a registered
# backend takes every path a built-in one does; only the backends' own package names them
BACKENDS = "dysco_interp.decoding.backends"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def runtime_tree(path: Path) -> ast.Module:
    """The module's syntax tree without its `if TYPE_CHECKING:` blocks (never imported at run time)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            node.body = [ast.Pass()]
    return tree


def imported(name: str, path: Path) -> list[tuple[str, list[str]]]:
    """(module, names) of every import in the file, function-level ones included, relative ones resolved."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(runtime_tree(path)):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            out.append((base, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
    return out


def owner(name: str) -> str | None:
    """The package module that defines `name` (a module, or a name inside one)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for name, path in MODULES.items():
        for module, names in imported(name, path):
            if not module.startswith("dysco_interp"):
                continue
            targets = [owner(f"{module}.{n}") for n in names] or [owner(module)]
            graph[name] |= {t for t in targets if t and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_checker_sees_a_cycle_and_a_function_level_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    tree = imported("dysco_interp.decoding.loop", MODULES["dysco_interp.decoding.loop"])
    assert any(module == "dysco_interp.decoding.backends" for module, _ in tree)


def test_no_import_cycles_in_the_package():
    assert cycles(import_graph()) == []


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_nothing_in_the_package_imports_a_study():
    graph = import_graph()
    studies = [m for m in graph if within(m, STUDIES)]
    # the rule guards something: the studies are there, and the checker sees them stand on the library
    assert len(studies) > 1 and any(within(t, LIBRARY) for m in studies for t in graph[m])
    upward = sorted(f"{m} imports {t}" for m, targets in graph.items() if not within(m, STUDIES)
                    for t in targets if within(t, STUDIES))
    assert upward == [], "the library, viz/, experiments/ and the rest never import a study"


def shared(module: str) -> bool:
    """A module at the top of the package (jsonl, atomic, ...), or the package itself; no subpackage."""
    return module == "dysco_interp" or (module.count(".") == 1 and MODULES[module].name != "__init__.py")


def test_the_stores_import_only_each_other_and_shared_modules():
    graph = import_graph()
    stores = [m for m in graph if within(m, STORES)]
    # the rule guards something: jobs and the library build on the stores
    assert len(stores) > 1 and any(within(t, STORES) for m in graph if within(m, LIBRARY) for t in graph[m])
    upward = sorted(f"{m} imports {t}" for m in stores for t in graph[m] if not (within(t, STORES) or shared(t)))
    assert upward == [], "the stores are below every job, library module and command that uses them"


def test_no_private_names_cross_a_module_boundary():
    crossing = [
        f"{name} imports {module}.{n}"
        for name, path in MODULES.items()
        for module, names in imported(name, path)
        if module.startswith("dysco_interp")
        for n in names
        if n.startswith("_") and not n.startswith("__")
    ]
    assert crossing == []


def backend_name_tests(source: str) -> list[int]:
    """The lines where a comparison (==, !=, in, not in) or a `case` tests against a built-in backend's name."""
    from dysco_interp.decoding.choices import BACKENDS as NAMES

    def names_one(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return isinstance(node.value, str) and node.value in NAMES
        return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(names_one(e) for e in node.elts)

    return sorted(node.lineno for node in ast.walk(ast.parse(source))
                  if isinstance(node, ast.Compare) and any(names_one(n) for n in (node.left, *node.comparators))
                  or isinstance(node, ast.MatchValue) and names_one(node.value))


def test_the_checker_sees_a_backend_told_by_its_name():
    source = ('a = spec.name == "static"\nb = "sdpa" != name\nc = name in ("bridge", "x")\n'
              'match name:\n    case "static":\n        pass\n'
              'make(attn_implementation="sdpa")\nd = name == "statics"\ne = options == ("x",)\n')
    assert backend_name_tests(source) == [1, 2, 3, 5]


def test_no_code_outside_the_backends_tells_a_backend_by_its_name():
    told = [f"{name}:{line}" for name, path in MODULES.items() if not within(name, BACKENDS)
            for line in backend_name_tests(path.read_text(encoding="utf-8"))]
    assert told == [], "ask the backend's class (or choices.backends_with), not its name"


def test_modules_stay_readable_or_say_why_not():
    long = []
    for name, path in MODULES.items():
        text = path.read_text(encoding="utf-8")
        n_lines = text.count("\n")
        doc = ast.get_docstring(ast.parse(text)) or ""
        if n_lines > MAX_LINES and "longer than" not in doc:
            long.append(f"{name}: {n_lines} lines")
    assert long == []


@pytest.mark.parametrize("path", sorted((ROOT / "tests").glob("*.py")), ids=lambda p: p.name)
def test_tests_import_the_package_never_other_tests_or_scripts(path):
    own = {p.stem for p in (ROOT / "tests").glob("*.py")} | {"tests", "analyses", "conftest"}
    bad = [module for module, _ in imported("tests." + path.stem, path) if module.split(".")[0] in own]
    assert bad == [], f"{path.name} imports {bad}"

"""MkDocs hooks: the pages that come from the repository itself rather than from `docs/`.

- `index.md` is README.md and `figures/index.md` is figures/README.md, each figure's PNG shown
  in the section that names it; relative links are rewritten to the site's copies;
- `guide/*.md` are the guides in docs/guide/, written with repository-relative links so that they
  read the same on the forge as on the site;
- `notebooks/*.ipynb` are the committed notebooks, rendered by mkdocs-jupyter without running them;
- `cli.md` is the command-line reference, read from the real argparse parser;
- `api/index.md` lists the public API (`dysco_interp.__all__`); `api/<subpackage>.md` and
  `api/core.md` (the top-level modules) document every module once, from its docstrings: the
  modules that define public names first, then the rest under "Internals".
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import fnmatch
import html
import os
import posixpath
import re
import warnings
from collections.abc import Iterator
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "dysco_interp"
# repository files shown as pages under another name
SITE_PAGES = {"README.md": "index.md", "figures/README.md": "figures/index.md"}
# the guides' sources; docs_dir is docs/, so each is published under its path below it
GUIDES = "docs/guide"
# linked files larger than this stay in the repository; the link names the file instead
MAX_LINKED_BYTES = 2_000_000
# argparse wraps usage lines to the terminal width; a fixed width keeps the page the same everywhere
USAGE_COLUMNS = "80"

# nbconvert cannot draw a plotly figure without JavaScript and says so once per figure; the
# notebooks show a static image right after each (tests/test_notebooks.py checks)
warnings.filterwarnings("ignore", message="Your element with mimetype", category=UserWarning)

_FENCE = re.compile(r"^\s*(```|~~~)")
_LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)((?:\s+\"[^\"]*\")?)\)")
_BRACES = re.compile(r"\{([^{}]*)\}")
_HEADING = re.compile(r"^## ")


# ---------------------------------------------------------------- Markdown helpers


def _prose_lines(lines: list[str]) -> Iterator[tuple[int, bool]]:
    """(index, outside a fenced code block) for every line."""
    fenced = False
    for i, line in enumerate(lines):
        if _FENCE.match(line):
            fenced = not fenced
            yield i, False
        else:
            yield i, not fenced


def _outside_code_spans(line: str, change) -> str:
    """`change` applied to the parts of `line` that are not `code spans`."""
    parts = line.split("`")
    return "`".join(change(p) if i % 2 == 0 else p for i, p in enumerate(parts))


def md_text(text: str) -> str:
    """Plain text (argparse help) as Markdown: code spans kept, everything else literal."""

    def escape(part: str) -> str:
        part = html.escape(part, quote=False)
        return re.sub(r"([\\*_\[\]|])", r"\\\1", part)

    return _outside_code_spans(" ".join(text.split()), escape)


# ---------------------------------------------------------------- pages from the repository


def guides() -> list[str]:
    """Repository paths of the guides, in the order the site lists them."""
    return sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / GUIDES).glob("*.md"))


def site_page(repo_path: str) -> str:
    """The site path of a repository file: its page name, or its path below docs/, or its own path."""
    if repo_path in SITE_PAGES:
        return SITE_PAGES[repo_path]
    return repo_path.removeprefix("docs/") if repo_path.startswith("docs/") else repo_path


def rewrite_links(text: str, source: str, page: str, published: set[str]) -> str:
    """Point the relative links of `source` (a repository path), shown as site page `page`, at
    the site's copies.

    A target that is published (a page or a copied file) gets the path relative to `page`; one
    that exists but is not published becomes its repository path in code; a missing one is left
    as it is, so the strict build reports it.
    """

    def rewrite(match: re.Match) -> str:
        bang, label, target, title = match.groups()
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
            return match.group(0)
        path, _, fragment = target.partition("#")
        repo_path = posixpath.normpath(posixpath.join(posixpath.dirname(source), path))
        site_path = site_page(repo_path)
        if site_path in published:
            new = posixpath.relpath(site_path, posixpath.dirname(page) or ".")
            return f"{bang}[{label}]({new}{'#' + fragment if fragment else ''}{title})"
        if (ROOT / repo_path).exists():
            return f"{label} (`{repo_path}`)" if label else f"`{repo_path}`"
        return match.group(0)

    lines = text.splitlines()
    for i, prose in _prose_lines(lines):
        if prose:
            lines[i] = _outside_code_spans(lines[i], lambda part: _LINK.sub(rewrite, part))
    return "\n".join(lines) + "\n"


def linked_files(text: str, source: str) -> list[str]:
    """Repository paths of the small files under figures/ that `text` links to."""
    found = []
    for line in text.splitlines():
        for part in line.split("`")[0::2]:
            for match in _LINK.finditer(part):
                path = match.group(3).partition("#")[0]
                repo_path = posixpath.normpath(posixpath.join(posixpath.dirname(source), path))
                file = ROOT / repo_path
                if repo_path.startswith("figures/") and file.is_file() and file.stat().st_size <= MAX_LINKED_BYTES:
                    found.append(repo_path)
    return found


def shared_scripts(published: list[str]) -> list[str]:
    """Repository paths of the shared plotly.min.js that the published HTML figures load, however
    large: a figure published without it draws nothing."""
    from dysco_interp.viz.render_html import loaded_plotlyjs

    found = set()
    for repo_path in published:
        js = loaded_plotlyjs(ROOT / repo_path) if repo_path.endswith(".html") else None
        if js is not None and js.is_file() and js.is_relative_to(ROOT):
            found.add(js.relative_to(ROOT).as_posix())
    return sorted(found - set(published))


def _expand_braces(pattern: str) -> list[str]:
    match = _BRACES.search(pattern)
    if not match:
        return [pattern]
    head, tail = pattern[: match.start()], pattern[match.end():]
    return [p for choice in match.group(1).split(",") for p in _expand_braces(head + choice + tail)]


def _named_pngs(span: str, pngs: list[str]) -> list[str]:
    """The PNGs (relative to figures/) that a code span such as `heads/<model>_x.{png,html}` names."""
    pattern = re.sub(r"<[^>]*>", "*", span.strip())
    hits = []
    for expanded in _expand_braces(pattern):
        hits += [p for p in pngs if fnmatch.fnmatchcase(p, expanded) and p not in hits]
    return hits


def figures_page(text: str, pngs: list[str]) -> str:
    """figures/README.md with every PNG shown at the end of the first section that names it;
    PNGs no section names are shown at the end."""
    lines = text.rstrip("\n").splitlines()
    sections: list[list[str]] = [[]]
    prose: list[list[str]] = [[]]
    for i, outside in _prose_lines(lines):
        if outside and _HEADING.match(lines[i]):
            sections.append([])
            prose.append([])
        sections[-1].append(lines[i])
        if outside:
            prose[-1].append(lines[i])
    shown: list[str] = []
    images: list[list[str]] = []
    for section_prose in prose:
        named = [png for span in re.findall(r"`([^`]+)`", "\n".join(section_prose))
                 for png in _named_pngs(span, pngs)]
        images.append([png for png in dict.fromkeys(named) if png not in shown])
        shown += images[-1]
    rest = [png for png in pngs if png not in shown]
    if rest:
        sections.append(["## Other figures"])
        images.append(rest)
    out = []
    for section, section_images in zip(sections, images):
        out += section
        for png in section_images:
            out += ["", f"![{png}]({png})", f"*`{png}`*"]
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


# ---------------------------------------------------------------- the command line


@contextlib.contextmanager
def _columns(width: str) -> Iterator[None]:
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = width
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = before


def subcommands(parser: argparse.ArgumentParser) -> dict[str, tuple[argparse.ArgumentParser, str]]:
    """Each subcommand's parser and its one-line summary, in the order `--help` lists them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            summaries = {a.dest: a.help or "" for a in action._choices_actions}
            return {name: (sub, summaries.get(name, "")) for name, sub in action.choices.items()}
    return {}


def _invocation(action: argparse.Action) -> str:
    if not action.option_strings:
        return str(action.metavar or action.dest)
    flags = ", ".join(action.option_strings)
    if action.nargs == 0:
        return flags
    if action.metavar is not None:
        metavar = action.metavar if isinstance(action.metavar, str) else " ".join(action.metavar)
    elif action.choices is not None:
        metavar = "{" + ",".join(map(str, action.choices)) + "}"
    else:
        metavar = action.dest.upper()
    return f"{flags} {metavar}"


def _help(action: argparse.Action, prog: str) -> str:
    """The help text as `--help` prints it (`%(default)s` and the like filled in)."""
    text = action.help or ""
    params = {k: v for k, v in dict(vars(action), prog=prog).items() if v is not argparse.SUPPRESS}
    if params.get("choices") is not None:
        params["choices"] = ", ".join(map(str, params["choices"]))
    text = text % params if "%" in text else text
    if action.option_strings and action.required:
        text = f"{text} (required)" if text else "required"
    return text


def _options_tables(parser: argparse.ArgumentParser) -> list[str]:
    out = []
    for group in parser._action_groups:
        actions = [a for a in group._group_actions
                   if a.help is not argparse.SUPPRESS and not isinstance(a, argparse._SubParsersAction)]
        if not actions:
            continue
        out += ["", f"**{md_text(group.title or 'options')}**", ""]
        if group.description:
            out += [md_text(group.description), ""]
        out += ["| argument | meaning |", "|---|---|"]
        for action in actions:
            invocation = _invocation(action).replace("|", "\\|")
            out.append(f"| `{invocation}` | {md_text(_help(action, parser.prog))} |")
    return out


def cli_reference_markdown(parser: argparse.ArgumentParser | None = None) -> str:
    """The command-line reference page: every subcommand's usage and every argument with its help."""
    if parser is None:
        from dysco_interp.cli.app import build_parser

        parser = build_parser()
    with _columns(USAGE_COLUMNS):
        out = [
            "# Command line",
            "",
            f"`{parser.prog}` runs one command; `{parser.prog} COMMAND --help` prints what this page "
            "shows for that command. This page is generated from the parser itself.",
            "",
            "```text",
            parser.format_usage().rstrip(),
            "```",
        ]
        if parser.description:
            out += ["", md_text(parser.description)]
        out += _options_tables(parser)
        commands = subcommands(parser)
        out += ["", "| command | what it does |", "|---|---|"]
        out += [f"| [`{name}`](#{name}) | {md_text(summary)} |" for name, (_, summary) in commands.items()]
        for name, (sub, summary) in commands.items():
            out += ["", f"## {name} {{#{name}}}", "", md_text(summary)]
            out += ["", "```text", sub.format_usage().rstrip(), "```"]
            if sub.description:
                out += ["", md_text(sub.description)]
            if sub.epilog:
                out += ["", md_text(sub.epilog)]
            out += _options_tables(sub)
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- API pages


def _lazy_names() -> dict[str, str]:
    """The package's lazily imported names and the modules that define them, read from its source
    (importing those modules would load torch)."""
    tree = ast.parse((ROOT / PACKAGE / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets):
            return ast.literal_eval(node.value)
    return {}


def load_package():
    """The package as griffe reads it from source (nothing is imported)."""
    import griffe

    return griffe.load(PACKAGE, search_paths=[str(ROOT)])


def public_api(package) -> dict[str, object]:
    """Each name of `dysco_interp.__all__` (but `__version__`) and the griffe object that defines it."""
    import dysco_interp

    lazy = _lazy_names()
    found = {}
    for name in dysco_interp.__all__:
        if name == "__version__":
            continue
        obj = package[lazy[name].removeprefix(PACKAGE + ".")][name] if name in lazy else package[name]
        found[name] = obj.final_target if obj.is_alias else obj
    return found


def api_index_markdown(package) -> str:
    """The public API: each name of `dysco_interp.__all__`, its kind, summary and a link to its entry."""
    rows = []
    for name, target in public_api(package).items():
        doc = target.docstring.value.split("\n\n")[0] if target.docstring else ""
        rows.append(f"| [`{name}`][{target.path}] | {target.kind.value} | {' '.join(doc.split())} |")
    docstring = package.docstring.value if package.docstring else ""
    return "\n".join([
        "# Public API",
        "",
        docstring,
        "",
        "Everything below is importable from `dysco_interp` directly; the link leads to its full entry.",
        "",
        # the class lets docs/stylesheets/extra.css keep each name on one line (the theme breaks code
        # anywhere, which split `DecodingConfig` in this narrow column)
        '<div class="api-names" markdown>',
        "",
        "| name | kind | summary |",
        "|---|---|---|",
        *rows,
        "",
        "</div>",
    ]) + "\n"


def _block(module, level: int, public: list[str]) -> list[str]:
    """The mkdocstrings block of one module, the names in `public` first. A package shows only what
    it defines itself: what it re-exports is documented once, in the module that defines it."""
    out = ["", f"::: {module.path}", "    options:", f"      heading_level: {level}"]
    own = [m.name for m in module.members.values() if not (m.is_alias or m.is_module or m.name.startswith("_"))]
    first = [name for name in public if name in own]
    if module.is_init_module:
        # without a list mkdocstrings would also render what the package imports
        out.append(f"      members: [{', '.join(first + [n for n in own if n not in first])}]" if own
                   else "      members: false")
    elif first:
        out.append(f"      members: [{', '.join(first + [n for n in own if n not in first])}]")
    elif not own:
        # a module that only re-exports (the old path of a moved module): its names are
        # documented once, where they are defined, and its docstring says where that is
        out.append("      members: false")
    if first:
        # grouped by kind, a module's constants would come before its public classes and functions
        out.append("      group_by_category: false")
    return out


def _below(module) -> list:
    """Every module under a package, nested packages followed by their own modules."""
    out = []
    for _, sub in sorted(module.modules.items()):
        out.append(sub)
        if sub.is_init_module:
            out += _below(sub)
    return out


def _page_blocks(modules: list, public: dict[str, list[str]], level: int) -> list[str]:
    """The blocks of `modules` on one page: those that define public names first, in the order of
    `dysco_interp.__all__`, then the rest under "Internals" one heading level down."""
    order = list(public)
    first = sorted((m for m in modules if m.path in public), key=lambda m: order.index(m.path))
    rest = [m for m in modules if m.path not in public]
    out = [line for m in first for line in _block(m, level, public[m.path])]
    if first and rest:
        out += ["", f"{'#' * level} Internals", "",
                "The modules that the public API above is built from, for work on the package itself."]
        level += 1
    return out + [line for m in rest for line in _block(m, level, [])]


def api_pages(package) -> dict[str, str]:
    """`api/<name>.md` for each subpackage (its modules and nested packages on one page) and
    `api/core.md` for the top-level modules: every module once, the public API first."""
    public: dict[str, list[str]] = {}
    for name, target in public_api(package).items():
        public.setdefault(target.parent.path, []).append(name)
    pages = {}
    for name, sub in sorted(package.modules.items()):
        if sub.is_init_module:
            blocks = _block(sub, 1, public.get(sub.path, [])) + _page_blocks(_below(sub), public, 2)
            pages[f"api/{name}.md"] = "\n".join(blocks).lstrip("\n") + "\n"
    core = ["# Shared modules", "", "The modules at the top of the package, which every subpackage uses."]
    core += _page_blocks([m for _, m in sorted(package.modules.items()) if not m.is_init_module], public, 2)
    pages["api/core.md"] = "\n".join(core) + "\n"
    return pages


# ---------------------------------------------------------------- the hook


def _read(repo_path: str) -> str:
    return (ROOT / repo_path).read_text(encoding="utf-8")


@event_priority(100)  # before mkdocs-jupyter's on_files, which must see the notebooks
def on_files(files: Files, config) -> Files:
    def add(src_uri: str, content: str) -> None:
        # a guide is also a file under docs_dir; its page is the rewritten one
        if (existing := files.get_file_from_path(src_uri)) is not None:
            files.remove(existing)
        files.append(File.generated(config, src_uri, content=content))

    def add_repo_file(repo_path: str) -> None:
        # a File read from the repository root keeps its path there (mkdocs-jupyter needs a real
        # source path, which a generated File lacks)
        files.append(File(repo_path, src_dir=str(ROOT), dest_dir=config["site_dir"],
                          use_directory_urls=config["use_directory_urls"]))

    notebooks = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    pngs = sorted(p.relative_to(ROOT / "figures").as_posix() for p in (ROOT / "figures").rglob("*.png"))
    readme, figures_readme = _read("README.md"), _read("figures/README.md")
    linked = linked_files(readme, "README.md") + linked_files(figures_readme, "figures/README.md")
    linked += [f for g in guides() for f in linked_files(_read(g), g)]
    extra = sorted(set(linked) - {f"figures/{p}" for p in pngs} - set(SITE_PAGES))
    extra += shared_scripts(extra)

    for repo_path in [f"notebooks/{name}" for name in notebooks] + [f"figures/{png}" for png in pngs] + extra:
        add_repo_file(repo_path)

    published = ({f.src_uri for f in files} | set(SITE_PAGES.values()) | {"cli.md"}
                 | {site_page(g) for g in guides()})
    add("index.md", rewrite_links(readme, "README.md", "index.md", published))
    add("figures/index.md", figures_page(
        rewrite_links(figures_readme, "figures/README.md", "figures/index.md", published), pngs))
    for repo_path in guides():
        page = site_page(repo_path)
        add(page, rewrite_links(_read(repo_path), repo_path, page, published))
    add("cli.md", cli_reference_markdown())
    package = load_package()
    add("api/index.md", api_index_markdown(package))
    for uri, page in api_pages(package).items():
        add(uri, page)
    return files

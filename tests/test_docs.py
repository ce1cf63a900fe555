"""The documentation site's generated pages cover what they document: every command and option
of the real parser, every notebook, every subpackage and public name, every committed figure.
The strict build itself (`mkdocs build --strict`) runs in `make test`."""

import argparse
import html
import importlib.util
import re
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("mkdocs", reason="the docs extra is not installed")
pytest.importorskip("griffe", reason="the docs extra is not installed")

import dysco_interp  # noqa: E402
from dysco_interp.cli.app import build_parser  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def hooks():
    spec = importlib.util.spec_from_file_location("dysco_docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


@pytest.fixture(scope="module")
def cli_page(hooks):
    return hooks.cli_reference_markdown()


def plain(markdown: str) -> str:
    """The text a reader sees: escapes and entities undone, whitespace collapsed."""
    return " ".join(html.unescape(re.sub(r"\\(.)", r"\1", markdown)).split())


def sections(page: str) -> dict[str, str]:
    parts = re.split(r"^## (\S+) \{#[^}]*\}$", page, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def the_subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    [action] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_the_cli_page_documents_every_option_of_every_subcommand(cli_page):
    parser = build_parser()
    commands = the_subparsers(parser)
    by_command = sections(cli_page)
    assert list(by_command) == list(commands)  # every command, in the order --help lists them
    for name, sub in commands.items():
        section = plain(by_command[name])
        assert f"usage: dysco-interp {name}" in section
        for action in sub._actions:
            if action.help == argparse.SUPPRESS:
                continue
            for flag in action.option_strings or [action.metavar or action.dest]:
                assert flag in section, f"{name}: {flag} missing"
            expected = action.help or ""
            if "%" in expected:
                expected = expected % dict(vars(action), prog=sub.prog)
            assert plain(expected) in section, f"{name}: the help of {action.option_strings} missing"


def test_the_cli_page_lists_the_top_level_options(cli_page):
    top = plain(cli_page.split("\n## ")[0])
    for action in build_parser()._actions:
        for flag in action.option_strings:
            assert flag in top


def test_help_text_is_shown_literally(hooks):
    # argparse help is plain text: Markdown syntax and HTML in it must show as written
    text = "a <model> name, 2*3 or T_w | x (see `evaluate --yarn`)"
    rendered = hooks.md_text(text)
    assert "<model>" not in rendered and "`evaluate --yarn`" in rendered
    assert plain(rendered) == text


def nav_pages(nav) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in nav_pages(value)]
    return [page for item in nav for page in nav_pages(item)]


def test_the_nav_lists_every_notebook():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    listed = [p for p in nav_pages(config["nav"]) if p.startswith("notebooks/")]
    on_disk = sorted(f"notebooks/{p.name}" for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert len(on_disk) >= 3
    assert sorted(listed) == on_disk
    [jupyter] = [p["mkdocs-jupyter"] for p in config["plugins"] if isinstance(p, dict) and "mkdocs-jupyter" in p]
    assert jupyter["execute"] is False  # the site shows the committed outputs and never runs a model


def test_the_nav_lists_every_guide_and_its_links_reach_the_site(hooks):
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    listed = [p for p in nav_pages(config["nav"]) if p.startswith("guide/")]
    assert sorted(listed) == sorted(hooks.site_page(g) for g in hooks.guides()) and listed
    published = {"index.md", "figures/index.md", "cli.md", *listed}
    for guide in hooks.guides():
        page = hooks.rewrite_links((ROOT / guide).read_text(encoding="utf-8"), guide, hooks.site_page(guide), published)
        # every relative link of a guide is a page of the site or a repository path in code
        for target in re.findall(r"\]\(([^)#\s]+)", page):
            assert target.startswith("http") or target.endswith(".md"), (guide, target)


@pytest.fixture(scope="module")
def package(hooks):
    return hooks.load_package()


def test_the_api_pages_document_every_module_once(hooks, package):
    pages = hooks.api_pages(package)
    blocks = [m for page in pages.values() for m in re.findall(r"^::: (\S+)$", page, flags=re.M)]
    files = [p.relative_to(ROOT).with_suffix("") for p in (ROOT / "dysco_interp").rglob("*.py")]
    modules = [".".join(p.parts[:-1] if p.name == "__init__" else p.parts) for p in files]
    assert sorted(blocks) == sorted(m for m in modules if m != "dysco_interp")
    # every page is in the nav, and the nav names no API page that is not generated
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    in_nav = {p for p in nav_pages(config["nav"]) if p.startswith("api/")}
    assert in_nav == set(pages) | {"api/index.md"}


def test_a_package_page_shows_what_the_package_defines_not_what_it_re_exports(hooks, package):
    pages = hooks.api_pages(package)
    tasks = pages["api/tasks.md"]
    assert re.search(r"^::: dysco_interp.tasks\n.*\n.*\n      members: \[.*\bmake_dataset\b.*\]$", tasks, flags=re.M)
    heads = pages["api/heads.md"]  # HeadSet is re-exported by heads and defined in heads.headset
    assert re.search(r"^::: dysco_interp.heads\n.*\n.*\n      members: false$", heads, flags=re.M)
    assert "::: dysco_interp.heads.headset" in heads


def test_the_public_api_page_lists_every_exported_name(hooks, package):
    page = hooks.api_index_markdown(package)
    linked = dict(re.findall(r"^\| \[`([^`]+)`\]\[([\w.]+)\]", page, flags=re.M))
    assert set(linked) == set(dysco_interp.__all__) - {"__version__"}
    # each link names where the object is defined, so the entry it points to exists
    assert linked["generate"] == "dysco_interp.decoding.loop.generate"
    assert linked["ConfigError"] == "dysco_interp.errors.ConfigError"


def test_the_figures_page_shows_every_committed_png(hooks):
    pngs = sorted(p.relative_to(ROOT / "figures").as_posix() for p in (ROOT / "figures").rglob("*.png"))
    assert pngs
    page = hooks.figures_page((ROOT / "figures" / "README.md").read_text(encoding="utf-8"), pngs)
    assert sorted(re.findall(r"^!\[[^\]]*\]\(([^)]+)\)$", page, flags=re.M)) == pngs


def test_a_png_is_shown_in_the_section_that_names_it(hooks):
    text = "# R\n\n## A\n\n`a/<model>.{png,html}`\n\n```\n## not a heading `b/x.png`\n```\n\n## B\n\n`b/x.{png,json}`\n"
    page = hooks.figures_page(text, ["a/m1.png", "a/m2.png", "b/x.png", "c/y.png"])
    a, b, other = page.split("## A")[1].split("## B")[0], page.split("## B")[1], page.split("## Other figures")[1]
    assert "![a/m1.png](a/m1.png)" in a and "![a/m2.png](a/m2.png)" in a and "b/x.png)" not in a
    assert "![b/x.png](b/x.png)" in b and "![c/y.png](c/y.png)" in other


def test_links_point_at_the_site_copies(hooks):
    published = {"index.md", "figures/index.md", "figures/heads/h.png", "notebooks/01_quickstart.ipynb"}
    readme = ("See [the results](figures/README.md#overhead), ![h](figures/heads/h.png), "
              "[nb](notebooks/01_quickstart.ipynb), [code](dysco_interp/cli/app.py), [gone](no/such.md), "
              "[site](https://example.org/x.md) and `[not a link](figures/README.md)`.")
    out = hooks.rewrite_links(readme, "README.md", "index.md", published)
    assert "[the results](figures/index.md#overhead)" in out
    assert "![h](figures/heads/h.png)" in out and "[nb](notebooks/01_quickstart.ipynb)" in out
    assert "code (`dysco_interp/cli/app.py`)" in out  # in the repository, not on the site
    assert "[gone](no/such.md)" in out  # left for the strict build to report
    assert "[site](https://example.org/x.md)" in out and "`[not a link](figures/README.md)`" in out
    back = hooks.rewrite_links("[home](../README.md) ![h](heads/h.png)", "figures/README.md", "figures/index.md",
                               published)
    assert back == "[home](../index.md) ![h](heads/h.png)\n"


# ---------------------------------------------------------------- pages as the site renders them

_LIST_ITEM = re.compile(r"^\s{0,3}([-*+]|\d+\.)\s+\S")


@pytest.fixture(scope="module")
def render():
    """Markdown to HTML with the site's own extensions and their settings from mkdocs.yml (the
    theme and the plugins are left out: the body of a page is what is checked)."""
    import markdown

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    names, settings = [], {}
    for entry in config["markdown_extensions"]:
        name, options = next(iter(entry.items())) if isinstance(entry, dict) else (entry, None)
        names.append(name)
        if options:
            settings[name] = options
    return lambda text: markdown.markdown(text, extensions=names, extension_configs=settings)


def text_of(fragment: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", fragment)).split())


def test_a_list_right_after_a_colon_line_renders_as_a_list(hooks, render):
    # GitHub starts a list on the line after a paragraph; Python-Markdown wants a blank line first
    found = 0
    for source in ["README.md", *hooks.guides()]:
        text = (ROOT / source).read_text(encoding="utf-8")
        lines = text.splitlines()
        introductions = [lines[i] for i, prose in hooks._prose_lines(lines)
                         if prose and i + 1 < len(lines) and lines[i].rstrip().endswith(":")
                         and not _LIST_ITEM.match(lines[i]) and _LIST_ITEM.match(lines[i + 1])]
        found += len(introductions)
        page = render(hooks.rewrite_links(text, source, hooks.site_page(source), {"index.md"}))
        before_a_list = [text_of(p) for p in re.findall(r"<p>(.*?)</p>\s*<[uo]l>", page, flags=re.S)]
        for line in introductions:
            tail = text_of(render(line))[-30:]
            assert any(p.endswith(tail) for p in before_a_list), f"{source}: no list after {line!r}"
    assert found  # "It prints:" and the like


def test_no_paragraph_of_the_readmes_runs_a_list_into_its_text(hooks, render):
    pngs = sorted(p.relative_to(ROOT / "figures").as_posix() for p in (ROOT / "figures").rglob("*.png"))
    for page in [*(render((ROOT / source).read_text(encoding="utf-8")) for source in ["README.md", *hooks.guides()]),
                 render(hooks.figures_page((ROOT / "figures" / "README.md").read_text(encoding="utf-8"), pngs))]:
        for paragraph in re.findall(r"<p>(.*?)</p>", page, flags=re.S):
            run_on = [line for line in paragraph.splitlines()[1:] if re.match(r"\s*([-*+]|\d+\.) ", line)]
            assert not run_on, f"a list item inside a paragraph: {run_on[0]!r}"


@pytest.fixture(scope="module")
def api_table(hooks, package, render):
    """(name cell, kind, summary) for each row of the Public API page's table, as HTML."""
    page = render(hooks.api_index_markdown(package))
    [table] = re.findall(r'<div class="api-names">\s*(<table>.*?</table>)\s*</div>', page, flags=re.S)
    return [tuple(re.findall(r"<td>(.*?)</td>", row, flags=re.S))
            for row in re.findall(r"<tr>(.*?)</tr>", table, flags=re.S)[1:]]


def test_the_public_api_table_keeps_each_name_on_one_line(api_table):
    # mkdocs-autorefs turns `[name][path]` into the link later in the build
    names = [re.fullmatch(r"\[<code>(\w+)</code>\]\[[\w.]+\]", cell) for cell, _, _ in api_table]
    assert all(names) and {m.group(1) for m in names} == set(dysco_interp.__all__) - {"__version__"}
    # the theme breaks inline code between any two letters; the site's stylesheet stops that in
    # this table's name column
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    css = "\n".join((ROOT / "docs" / sheet).read_text(encoding="utf-8") for sheet in config["extra_css"])
    rule = re.search(r"\.api-names td:first-child code\s*\{([^}]*)\}", css)
    assert rule and "white-space: nowrap" in rule.group(1)


def test_every_public_name_has_a_summary(api_table):
    summaries = {re.sub(r"</?code>|\[|\]\[.*", "", cell): text_of(summary) for cell, _, summary in api_table}
    assert summaries["GenerationResult"] and summaries["Trace"]
    assert all(summaries.values()), [name for name, summary in summaries.items() if not summary]


def test_a_package_page_opens_with_its_public_api(hooks, package):
    page = hooks.api_pages(package)["api/decoding.md"]
    blocks = re.findall(r"^::: (\S+)$|^(## Internals)$", page, flags=re.M)
    order = [block or heading for block, heading in blocks]
    internals = order.index("## Internals")
    # the modules that define `generate`, `DecodingConfig`, `GenerationResult`... come first, the
    # validators and the backends after
    for public in ["config", "sampling", "loop", "passes", "results"]:
        assert order.index(f"dysco_interp.decoding.{public}") < internals
    for internal in ["arguments", "backends", "backends.base", "relevance"]:
        assert order.index(f"dysco_interp.decoding.{internal}") > internals
    # and within a module, the public names before its helpers
    loop = page.split("::: dysco_interp.decoding.loop\n")[1].split(":::")[0]
    assert re.search(r"members: \[generate, generate_batch, compare_methods, dysco_generate, ", loop)


def test_wide_code_blocks_wrap_instead_of_being_cut():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    css = "\n".join((ROOT / "docs" / sheet).read_text(encoding="utf-8") for sheet in config["extra_css"])
    rule = re.search(r"\.md-typeset pre > code\s*\{([^}]*)\}", css)
    assert rule and "white-space: pre-wrap" in rule.group(1) and "overflow-wrap: anywhere" in rule.group(1)

"""The committed figures and result stores read anywhere: none names a path of the machine that made it."""

import lzma
from pathlib import Path

FIGURES = Path(__file__).resolve().parents[1] / "figures"
TEXT = (".md", ".json", ".jsonl", ".html", ".txt", ".js")


def committed_text(path: Path) -> str | None:
    """A figure file's text (a compressed store's decompressed), or None for an image."""
    if path.suffix == ".xz":
        with lzma.open(path, "rt", encoding="utf-8") as f:
            return f.read()
    return path.read_text(encoding="utf-8") if path.suffix in TEXT else None


def test_no_figure_or_store_names_a_path_of_the_machine_that_ran_it(machine_paths):
    files = sorted(p for p in FIGURES.rglob("*") if p.is_file())
    assert any(p.suffix == ".xz" for p in files)  # the stores are read, not only the pages
    named = {}
    for path in files:
        text = committed_text(path)
        found = [m for m in machine_paths if text is not None and m in text]
        if found:
            named[str(path.relative_to(FIGURES))] = found
    assert not named, f"machine paths in committed figures (record commands with relative paths): {named}"

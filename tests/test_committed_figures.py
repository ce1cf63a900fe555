"""The committed figures and stores read anywhere (no path of the machine that made them), within the tree's budget."""

import lzma
import shutil
import subprocess
from pathlib import Path

import pytest

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


# The tracked tree's budget: a clone stays quick to fetch as the studies grow. Stores are committed
# compressed (.jsonl.xz), PNGs recompressed losslessly (analyses/optimise_pngs.py), and the HTML
# pages share one plotly.min.js (figures/.plotlyjs-shared): plotly.js's cartesian partial bundle
# (1.5 MB, not the full 4.8 MB), or the full one where a plotly release bundles another plotly.js.
# Raised from 20 MB to hold the steering harness's test stores and figures (about 1 MB of evidence
# in `figures/harness/`, every row behind its leaderboard and variants table), then to 22 MB for its
# completed 31K cells, its 127K cells and the filled sparse variants (every PNG is already at the
# optimiser's level, and nothing left in the tree is neither evidence nor a figure people look at).
TREE_BUDGET_BYTES = 22_000_000


def test_the_tracked_tree_stays_within_its_budget():
    root = FIGURES.parent
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
    paths = [root / p for p in tracked.decode().split("\0") if p]
    size = sum(p.stat().st_size for p in paths if p.is_file() and not p.is_symlink())
    largest = sorted(paths, key=lambda p: p.stat().st_size if p.is_file() else 0)[-5:]
    assert size <= TREE_BUDGET_BYTES, f"tracked tree {size:,} bytes; largest: " + ", ".join(
        f"{p.relative_to(root)} ({p.stat().st_size:,})" for p in reversed(largest))
    assert (FIGURES / ".plotlyjs-shared").is_file()  # figures/<kind>/ pages load figures/plotly.min.js

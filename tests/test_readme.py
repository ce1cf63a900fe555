"""Every Python block of the README and of each guide runs as written, on the default model: the
README's blocks in order in one namespace, each guide's in a namespace of its own (a guide is read
on its own, so its first block sets up what its others use)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
GUIDES = sorted((ROOT / "docs" / "guide").glob("*.md"))


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S)


def test_the_readme_has_python_blocks_and_links_every_guide():
    assert len(python_blocks(README)) >= 2
    readme = README.read_text(encoding="utf-8")
    assert GUIDES and all(f"(docs/guide/{g.name})" in readme for g in GUIDES)


def run_blocks(page: Path) -> None:
    namespace: dict = {}
    for i, block in enumerate(python_blocks(page)):
        try:
            exec(compile(block, f"{page.name} python block {i + 1}", "exec"), namespace)
        except Exception as e:  # name the block that failed
            raise AssertionError(f"{page.name} python block {i + 1} fails: {type(e).__name__}: {e}") from e


@pytest.mark.real_model
@pytest.mark.parametrize("page", [README] + [g for g in GUIDES if python_blocks(g)], ids=lambda p: p.name)
def test_every_python_block_runs_as_written(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a block that writes files writes them here
    run_blocks(page)


def example_outputs(page: Path) -> set[str]:
    """What the page's shell examples write into the working folder: each --out or --out-dir
    path, placeholders (DIR, DATA, ...) and committed figures/ left out."""
    blocks = re.findall(r"^```(\w*)\n(.*?)^```", page.read_text(encoding="utf-8"), flags=re.S | re.M)
    shell = "\n".join(text for language, text in blocks if language in ("", "bash"))
    paths = re.findall(r"--out(?:-dir)? ([^\s\\]+)", shell)
    return {p for p in paths if not p.isupper() and not p.startswith(("figures/", "DATA", "DIR", "$"))}


def test_the_examples_outputs_are_git_ignored():
    import shutil
    import subprocess

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    outputs = sorted(set().union(*(example_outputs(p) for p in [README, *GUIDES])))
    assert {"data", "tf.jsonl", "free.jsonl", "heads.json"} <= set(outputs)
    done = subprocess.run(["git", "check-ignore", "--no-index", *outputs], cwd=ROOT, capture_output=True, text=True)
    assert sorted(done.stdout.split()) == outputs, "not git-ignored: " + ", ".join(
        sorted(set(outputs) - set(done.stdout.split())))


def test_two_commands_are_two_and_the_paper_is_linked():
    readme = README.read_text(encoding="utf-8")
    section = readme.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    assert re.findall(r"```bash\n(.*?)```", section, flags=re.S) == ["make demo\n", "make test\n"]
    assert "also builds the docs" in " ".join(section.split())
    assert "(https://arxiv.org/abs/2602.22175)" in readme  # Ye et al. 2026, the DySCO paper

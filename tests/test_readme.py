"""Every Python block of the README runs as written, in order, in one namespace, on the default model."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_the_readme_has_python_blocks():
    assert len(python_blocks()) >= 5


@pytest.mark.real_model
def test_every_python_block_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a block that writes files writes them here
    namespace: dict = {}
    for i, block in enumerate(python_blocks()):
        try:
            exec(compile(block, f"README python block {i + 1}", "exec"), namespace)
        except Exception as e:  # name the block that failed
            raise AssertionError(f"README python block {i + 1} fails: {type(e).__name__}: {e}") from e

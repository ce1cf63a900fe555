"""The Makefile's quiet steps say what they do: `make demo` on a fresh clone installs for minutes,
and pip's -q alone would leave the terminal silent all that time."""

import re
from pathlib import Path

MAKEFILE = Path(__file__).resolve().parents[1] / "Makefile"


def recipes() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    target = None
    for line in MAKEFILE.read_text(encoding="utf-8").splitlines():
        if line.startswith("\t") and target is not None:
            out[target].append(line.strip())
        elif re.match(r"^[^\s#][^=]*:(?!=)", line):
            target = line.split(":")[0]
            out[target] = []
        elif not line.strip() or line.startswith("#"):
            target = None
    return out


def test_every_quiet_install_is_announced_by_the_line_before_it():
    quiet = 0
    for target, lines in recipes().items():
        for i, line in enumerate(lines):
            if "pip install -q" in line or "install-model" in line:
                quiet += 1
                assert i > 0 and lines[i - 1].startswith("@echo "), f"{target}: {line!r} runs unannounced"
    assert quiet >= 4  # torch, the package, the model, the docs tools

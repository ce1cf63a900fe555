"""Import a script of analyses/ as a module, for the tests that call its functions."""

import importlib.util
import sys
from pathlib import Path

ANALYSES = Path(__file__).resolve().parents[1] / "analyses"


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(f"analyses_{name}", ANALYSES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module

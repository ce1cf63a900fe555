"""The `dysco-interp` command line: `main` runs one command (see `cli.app`).

One module per command (`models`, `install_model`, `generate`, `evaluate`, `make_data`,
`detect_heads`, `demo`), each with its `add_<command>_parser` and `run_<command>`; the flags
several commands share are defined once in `flags`, argument types and one-line errors in `args`,
a researcher's own methods (`--methods-from`, `--method-options`) in `user_methods`.
"""

from dysco_interp.cli.app import main

__all__ = ["main"]

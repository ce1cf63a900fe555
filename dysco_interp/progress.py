"""Progress bars for long work: widgets in a notebook with ipywidgets, text bars everywhere else.

`tqdm.auto` in a Jupyter kernel without ipywidgets falls back to text bars but first prints a
TqdmWarning into the notebook; choosing the text bars ourselves gives the same bars without it.
"""

from __future__ import annotations

import importlib.util

if importlib.util.find_spec("ipywidgets") is not None:
    from tqdm.auto import tqdm
else:
    from tqdm.std import tqdm

__all__ = ["tqdm"]

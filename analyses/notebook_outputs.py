"""Keep only the final state of each progress bar in the committed notebooks' outputs.

A bar redrawn in a notebook leaves one stderr output per state; GitHub and the documentation
site show every one of them, each as a red block. `make notebooks` runs this after executing
them; the notebooks' test checks that no cell holds more than one state of a bar.

    python analyses/notebook_outputs.py notebooks/*.ipynb
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

from dysco_interp.atomic import atomic_open
from dysco_interp.cli import args as cli_args
from dysco_interp.errors import DataError
from dysco_interp.jsonl import read_input


def is_bar_state(output) -> bool:
    """A stderr output that a redrawn bar wrote: it starts by returning to the line's start."""
    return output.output_type == "stream" and output.name == "stderr" and output.text.startswith("\r")


def final_states(outputs: list) -> list:
    """`outputs` with each run of bar states cut to its last one, which takes the newline the bar
    printed when it closed (a lone stderr newline, after the cell's other output)."""
    kept: list = []
    for output in outputs:
        bars = [i for i, o in enumerate(kept) if is_bar_state(o)]
        if kept and is_bar_state(output) and is_bar_state(kept[-1]):
            kept[-1] = output
        elif bars and output.output_type == "stream" and output.name == "stderr" and output.text == "\n":
            kept[bars[-1]] = nbformat.v4.new_output("stream", name="stderr", text=kept[bars[-1]].text + "\n")
        else:
            kept.append(output)
    return [nbformat.v4.new_output("stream", name="stderr", text=o.text.lstrip("\r")) if is_bar_state(o) else o
            for o in kept]


def read_notebook(path: str):
    """The notebook at `path`; DataError for anything that is no readable notebook (a FIFO, a
    device, a file too large to be one, invalid JSON), read before anything is rewritten."""
    data = read_input(path, "notebook")
    try:
        return nbformat.reads(data.decode("utf-8"), as_version=4)
    except (UnicodeDecodeError, ValueError) as e:  # nbformat's NotJSONError is a ValueError
        raise DataError(f"{path} is not a notebook ({str(e).splitlines()[0][:80]})") from None


def main(argv=None) -> int:
    p = cli_args.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("notebooks", nargs="+", metavar="NOTEBOOK", help="notebooks (.ipynb), rewritten in place")
    args = p.parse_args(argv)
    try:
        notebooks = {path: read_notebook(path) for path in args.notebooks}  # every one read before any is written
    except DataError as e:
        p.error(str(e))
    for path, nb in notebooks.items():
        for cell in nb.cells:
            if cell.cell_type == "code":
                cell.outputs = final_states(cell.outputs)
        with atomic_open(Path(path)) as f:
            nbformat.write(nb, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())

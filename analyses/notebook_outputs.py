"""Keep only the final state of each progress bar in the committed notebooks' outputs.

A bar redrawn in a notebook leaves one stderr output per state; GitHub and the documentation
site show every one of them, each as a red block. `make notebooks` runs this after executing
them; the notebooks' test checks that no cell holds more than one state of a bar.

    python analyses/notebook_outputs.py notebooks/*.ipynb
"""

from __future__ import annotations

import sys

import nbformat


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


def main(argv=None) -> int:
    paths = list(sys.argv[1:] if argv is None else argv)
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                cell.outputs = final_states(cell.outputs)
        nbformat.write(nb, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

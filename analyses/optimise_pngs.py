"""Recompress PNG files losslessly (oxipng), for the committed figures: matplotlib writes zlib at
its default level with no filter search, a third more bytes than the same pixels need.

oxipng is a tool of this script only, not a dependency of the package:

    pip install pyoxipng
    python analyses/optimise_pngs.py $(git ls-files '*.png')

Each file is rewritten only when smaller, and only after its decoded pixels are checked equal.
"""

from __future__ import annotations

import io
import sys

import numpy as np
from PIL import Image

from dysco_interp.atomic import atomic_write_bytes
from dysco_interp.cli import args as cli_args
from dysco_interp.errors import DataError
from dysco_interp.jsonl import read_input


def pixels(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGBA"))


def read_png(path: str) -> bytes:
    """A PNG's bytes; DataError for anything that is no regular file of a PNG's size."""
    data = read_input(path, "PNG file")
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        raise DataError(f"{path} is not a PNG file")
    return data


def main(argv=None) -> int:
    p = cli_args.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("pngs", nargs="+", metavar="PNG_FILE", help="PNG files, rewritten in place when smaller")
    args = p.parse_args(argv)
    try:
        files = {path: read_png(path) for path in args.pngs}  # every one read before any is rewritten
    except DataError as e:
        p.error(str(e))
    try:
        import oxipng
    except ImportError:  # the script's own tool, not the package's
        p.error("this script needs oxipng: pip install pyoxipng")
    saved = 0
    for path, data in files.items():
        # "safe" drops only chunks that do not change how the image is shown (the DPI is kept)
        smaller = oxipng.optimize_from_memory(data, level=4, strip=oxipng.StripChunks.safe())
        if len(smaller) >= len(data):
            continue
        if not np.array_equal(pixels(data), pixels(smaller)):
            p.error(f"{path}: the recompressed pixels differ; left as it was")
        atomic_write_bytes(path, smaller)
        saved += len(data) - len(smaller)
        print(f"{path}: {len(data)} -> {len(smaller)} bytes")
    print(f"saved {saved} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())

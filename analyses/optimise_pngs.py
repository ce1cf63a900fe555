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
from pathlib import Path

import numpy as np
from PIL import Image

try:
    import oxipng
except ImportError:  # pragma: no cover - the script's own tool
    raise SystemExit("this script needs oxipng: pip install pyoxipng") from None


def pixels(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGBA"))


def main(argv=None) -> int:
    saved = 0
    for path in list(sys.argv[1:] if argv is None else argv):
        data = Path(path).read_bytes()
        # "safe" drops only chunks that do not change how the image is shown (the DPI is kept)
        smaller = oxipng.optimize_from_memory(data, level=4, strip=oxipng.StripChunks.safe())
        if len(smaller) >= len(data):
            continue
        if not np.array_equal(pixels(data), pixels(smaller)):
            raise SystemExit(f"{path}: the recompressed pixels differ; left as it was")
        Path(path).write_bytes(smaller)
        saved += len(data) - len(smaller)
        print(f"{path}: {len(data)} -> {len(smaller)} bytes")
    print(f"saved {saved} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())

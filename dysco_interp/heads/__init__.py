"""Attention-head sets: the HeadSet class, head files in five formats, random and shipped sets.

A head is `(layer, query_head)`, 0-indexed, labelled `L{layer}H{head}` (TransformerLens).

- `headset`: HeadSet, its geometry, and our own JSON format (geometry and provenance);
- `formats`: `load_heads` and the importers of QRHead's, DySCO's and Retrieval_Head's files;
- `safe_parse`: JSON and safe YAML reading (nothing unpickled or evaluated), depth-limited;
- `values`: checked labels, indices and scores; `errors`: the HeadSetError family;
- `random`: seeded random head sets (the random-heads ablation);
- `shipped`: the packaged head files (`data/`), the paper's head list, and `resolve_heads`,
  which turns a heads option ("shipped" or a file) into a head set.
"""

from dysco_interp.heads.errors import HeadFileError, HeadModelMismatchError, HeadSetError
from dysco_interp.heads.formats import FORMATS, load_heads
from dysco_interp.heads.headset import FORMAT, FORMAT_VERSION, Geometry, HeadSet, geometry_of, normalize_model_id
from dysco_interp.heads.random import random_heads, random_like
from dysco_interp.heads.shipped import (
    SHIPPED,
    available_shipped_heads,
    describe_heads,
    paper_heads,
    resolve_heads,
    resolve_heads_origin,
    shipped_heads,
)
from dysco_interp.heads.values import parse_head_label
from dysco_interp.hooks import head_label

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "FORMATS",
    "SHIPPED",
    "Geometry",
    "HeadFileError",
    "HeadModelMismatchError",
    "HeadSet",
    "HeadSetError",
    "available_shipped_heads",
    "describe_heads",
    "geometry_of",
    "head_label",
    "load_heads",
    "normalize_model_id",
    "paper_heads",
    "parse_head_label",
    "random_heads",
    "random_like",
    "resolve_heads",
    "resolve_heads_origin",
    "shipped_heads",
]

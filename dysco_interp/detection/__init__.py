"""Retrieval-head detection: QRScore (query-focused retrieval heads) and copy-paste score.

**QRScore** (QRHead; Wu, Zhang, Chen et al. 2025). For one multi-document QA example,
the attention of each head from the query span (late instruction + question + assistant
header, to the end of the prompt) to the context, averaged over the query tokens, minus
the same with the null query "N/A" (calibration: what the head reads whatever the
question). Per document, calibrated token scores below mean - 2 sigma (per head, within
the document) are zeroed and the rest summed. A head's example score is the gold
document's score ("qrscore", attention mass) or the NDCG@10 of the gold document in the
ranking the document scores induce ("qrscore-ndcg"); a head's score is the mean over
examples.

**Copy-paste retrieval score** (Wu et al. 2024, "Retrieval Head Mechanistically Explains
Long-Context Factuality"): greedy decoding of a few tokens; at each step a head whose
top-1 attended key lies in the needle (here: the gold document) and holds the token just
generated gains 1 / len(needle).

Conventions (as TransformerLens' `head_detector`): scores are `[n_layers, n_heads]`
float tensors with -1 (`hooks.NOT_SCORED`) for heads not scored (outside `heads=`, or
sliding-window layers for QRScore; `selection` says why).

Modules: `methods` (names and parameters), `scores` (the pure tensor math), `selection`
(the heads= argument), `examples` (checked needle-QA examples), `passes` (the model
passes), `result` (DetectionResult), `api` (detect and friends, resumable stores),
`stability` (split-half), `ablation` (gold-document mass against random head sets).
"""

from dysco_interp.detection.ablation import gold_attention_mass, gold_mass_per_head, random_baseline, random_head_sets
from dysco_interp.detection.api import copy_paste_score, detect, detect_qr_heads, make_detection_data, qrscore
from dysco_interp.detection.methods import (
    COPY_PASTE,
    DEFAULT_TOP_K,
    METHODS,
    QRSCORE,
    QRSCORE_NDCG,
    DetectionInputError,
    resolve_method,
)
from dysco_interp.detection.passes import copy_paste_one, example_query_attention, qrscore_one, query_attention
from dysco_interp.detection.result import DetectionResult
from dysco_interp.detection.scores import (
    absolute_top1,
    check_doc_spans,
    copy_paste_hits,
    filtered_doc_scores,
    mean_over_examples,
    mean_query_rows,
    ndcg_at_k,
    qrscore_example,
    rank_heads,
)
from dysco_interp.detection.selection import qrscore_heads, requested_heads
from dysco_interp.detection.stability import HeadOverlap, SplitHalf, head_overlap, split_half, split_half_stability

__all__ = [
    "COPY_PASTE", "DEFAULT_TOP_K", "METHODS", "QRSCORE", "QRSCORE_NDCG",
    "DetectionInputError", "DetectionResult", "HeadOverlap", "SplitHalf",
    "absolute_top1", "check_doc_spans", "copy_paste_hits", "copy_paste_one", "copy_paste_score", "detect",
    "detect_qr_heads",
    "example_query_attention", "filtered_doc_scores", "gold_attention_mass", "gold_mass_per_head",
    "head_overlap", "make_detection_data", "mean_over_examples", "mean_query_rows", "ndcg_at_k", "qrscore",
    "qrscore_example", "qrscore_heads", "qrscore_one", "query_attention", "random_baseline", "random_head_sets",
    "rank_heads", "requested_heads", "resolve_method", "split_half", "split_half_stability",
]

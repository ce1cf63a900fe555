"""The pure tensor math of detection: QRScore's filtered document scores and NDCG, copy-paste hits.

Everything here works on hand-made tensors (no model): attention rows in, per-head
scores out. Scores are `[n_layers, n_heads]` (or any leading shape), with NOT_SCORED
where a head was not scored, as in TransformerLens' `head_detector`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dysco_interp.detection.methods import FILTER_SIGMAS, NDCG_K, DetectionInputError
from dysco_interp.errors import ConfigError
from dysco_interp.hooks import NOT_SCORED, Head
from dysco_interp.ranking import gold_rank

Span = tuple[int, int]


def mean_query_rows(pattern: torch.Tensor, n_context: int) -> torch.Tensor:
    """[1, H, q, k] attention pattern -> [H, n_context]: mean over query rows, context keys only."""
    if pattern.ndim != 4 or pattern.shape[0] != 1:
        raise ValueError(f"expected a pattern [1, H, q, k], got {tuple(pattern.shape)}")
    return pattern[0, :, :, :n_context].float().mean(dim=1)


def check_doc_spans(doc_spans: Sequence[Span], n_context: int) -> torch.Tensor:
    """Validated spans as a LongTensor [D, 2]: non-empty, inside [0, n_context), disjoint, ordered."""
    if len(doc_spans) == 0:
        raise DetectionInputError("no document spans")
    spans = torch.tensor([tuple(s) for s in doc_spans], dtype=torch.long).reshape(-1, 2)
    starts, ends = spans[:, 0], spans[:, 1]
    if (starts < 0).any() or (ends > n_context).any() or (ends <= starts).any():
        raise DetectionInputError(
            f"document token spans must be non-empty and inside the context [0, {n_context}), "
            f"got {list(map(tuple, spans.tolist()))}"
        )
    if (starts[1:] < ends[:-1]).any():
        raise DetectionInputError("document token spans overlap or are out of order")
    return spans


def _segments(spans: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(positions [P], document id of each [P], length of each document [D]) for the spans."""
    lengths = spans[:, 1] - spans[:, 0]
    doc_id = torch.repeat_interleave(torch.arange(len(spans)), lengths)
    # position = span start + offset inside the span, without a Python loop over positions
    offsets = torch.arange(int(lengths.sum())) - torch.repeat_interleave(torch.cumsum(lengths, 0) - lengths, lengths)
    positions = spans[doc_id, 0] + offsets
    return positions.to(device), doc_id.to(device), lengths.to(device)


def filtered_doc_scores(
    token_scores: torch.Tensor, doc_spans: Sequence[Span], n_sigma: float = FILTER_SIGMAS
) -> torch.Tensor:
    """Per-document scores [..., D] from per-token scores [..., n_context].

    Within each document and separately for every leading index (layer, head), tokens
    below mean - n_sigma * std are zeroed (QRHead's outlier filter: calibration leaves a
    few very negative tokens) and the rest summed. std is the sample std (torch's
    default, as QRHead); a one-token document has std 0. Tokens exactly at the threshold
    are kept (QRHead keeps only tokens strictly above it; the two differ only on ties,
    e.g. a document whose tokens are all equal).
    """
    x = token_scores.float()
    spans = check_doc_spans(doc_spans, x.shape[-1])
    positions, doc_id, lengths = _segments(spans, x.device)
    n_docs = len(spans)
    vals = x[..., positions]  # [..., P]
    lead = vals.shape[:-1]
    sums = torch.zeros(*lead, n_docs, device=x.device).index_add_(-1, doc_id, vals)
    mean = sums / lengths
    dev2 = (vals - mean[..., doc_id]) ** 2
    ss = torch.zeros(*lead, n_docs, device=x.device).index_add_(-1, doc_id, dev2)
    std = torch.sqrt(ss / (lengths - 1).clamp(min=1))
    threshold = mean - n_sigma * std
    kept = vals * (vals >= threshold[..., doc_id])
    return torch.zeros(*lead, n_docs, device=x.device).index_add_(-1, doc_id, kept)


def ndcg_at_k(doc_scores: torch.Tensor, gold_index: int, k: int = NDCG_K) -> torch.Tensor:
    """NDCG@k with one relevant document: 1 / log2(1 + rank) if rank <= k else 0 (ideal DCG is 1).

    The rank is `ranking.gold_rank`'s: ties count against the gold document, so a head that
    scores every document equally earns nothing.
    """
    if k < 1:
        raise ConfigError(f"k must be >= 1, got {k}")
    rank = gold_rank(doc_scores, gold_index).double()
    return torch.where(rank <= k, 1.0 / torch.log2(rank + 1.0), torch.zeros_like(rank))


def qrscore_example(
    real: torch.Tensor, null: torch.Tensor, doc_spans: Sequence[Span], gold_index: int, k: int = NDCG_K
) -> tuple[torch.Tensor, torch.Tensor]:
    """(gold-document mass, NDCG@k), each [...], from query attention real/null [..., n_context]."""
    if real.shape != null.shape:
        raise ValueError(f"real and null attention differ in shape: {tuple(real.shape)} vs {tuple(null.shape)}")
    if not 0 <= gold_index < len(doc_spans):
        raise DetectionInputError(f"gold index {gold_index} is not one of the {len(doc_spans)} documents")
    docs = filtered_doc_scores(real.float() - null.float(), doc_spans)
    return docs[..., gold_index], ndcg_at_k(docs, gold_index, k)


def copy_paste_hits(
    top1: torch.Tensor, token: int, prompt_ids: torch.Tensor, needle_span: Span
) -> torch.Tensor:
    """One decode step's copy-paste credit [...]: 1/len(needle) where a head's top-1 key is a
    needle position holding the generated token, else 0. top1 holds absolute key positions."""
    start, end = needle_span
    if not 0 <= start < end <= len(prompt_ids):
        raise DetectionInputError(f"needle span {needle_span} is outside the prompt of {len(prompt_ids)} tokens")
    inside = (top1 >= start) & (top1 < end)
    at = prompt_ids.to(top1.device)[top1.clamp(0, len(prompt_ids) - 1)]
    return (inside & (at == token)).double() / (end - start)


def absolute_top1(pattern: torch.Tensor, n_keys: int) -> torch.Tensor:
    """[H] absolute key position each head attends most, from a decode step's pattern
    [1, H, q, width]: a sliding-window layer's `width` keys are the LAST of the n_keys."""
    width = pattern.shape[-1]
    if width > n_keys:
        raise ValueError(f"pattern has {width} keys but only {n_keys} exist")
    return pattern[0, :, -1, :].argmax(dim=-1) + (n_keys - width)


def rank_heads(scores: torch.Tensor, scored: torch.Tensor) -> list[tuple[Head, float]]:
    """Scored heads by descending score; ties keep (layer, head) order."""
    flat = scores.flatten().double()
    idx = torch.nonzero(scored.flatten(), as_tuple=False).flatten()
    order = torch.sort(-flat[idx], stable=True).indices
    n_heads = scores.shape[1]
    return [((int(i) // n_heads, int(i) % n_heads), float(flat[i])) for i in idx[order].tolist()]


def mean_over_examples(per_example: Sequence[torch.Tensor], scored: torch.Tensor) -> torch.Tensor:
    """Mean of per-example [L, H] matrices (float64) as float32, NOT_SCORED where not scored."""
    mean = torch.stack([t.double() for t in per_example]).mean(dim=0)
    return torch.where(scored, mean, torch.full_like(mean, NOT_SCORED)).float()

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

How it runs: the context (every token before the query span) is prefilled ONCE through
the SDPA twin (`runtime.prefill`: no n x n score matrix); the real and the null query
tokens then run through the bridge on a read-only view of that cache (`FrozenCache`,
via `runtime.partial_step`), with `hook_pattern` hooks that reduce each layer's pattern
`[1, H, q, k]` at once to `[H, n_context]`. Full patterns are never kept.

**Copy-paste retrieval score** (Wu et al. 2024, "Retrieval Head Mechanistically Explains
Long-Context Factuality"): greedy decoding of a few tokens; at each step a head whose
top-1 attended key lies in the needle (here: the gold document) and holds the token just
generated gains 1 / len(needle).

Conventions (as TransformerLens' `head_detector`): scores are `[n_layers, n_heads]`
float tensors with -1 for heads not scored (outside `heads=`, or sliding-window layers
for QRScore). Sliding-window layers (Gemma-3): when a query *chunk* runs on a cache,
their key axis is the window, not the absolute context, and they cannot see most
documents of a long prompt anyway, so QRScore scores full-attention layers only. The
copy-paste score reads one query row per step, whose window is right-aligned to the
absolute length, so it scores every layer.

Resumable runs: with `store=DIR`, each finished example is appended (flushed, fsynced)
as one JSON line to DIR/<family>.jsonl, a `runner.ResultStore` whose header holds the
model, its weights, the scored heads and the method's parameters; a re-run skips examples
whose content is already there (never matched on ids alone); a truncated last line (a
killed run) is dropped. Nothing is pickled.

Layout: pure tensor math first (testable on hand-made tensors), then the model passes,
then the store, the public API, split-half stability and evaluation helpers.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dysco_interp import __version__
from dysco_interp.models import dtype_name
from dysco_interp.errors import ConfigError
from dysco_interp.heads import Head, HeadSet, head_label, random_heads
from dysco_interp.experiments.store import ResultStore, content_hash

Span = tuple[int, int]
Hook = tuple[str, Any]
HeadsArg = Sequence[Head] | Mapping[int, Sequence[int]] | HeadSet | None
HooksArg = Sequence[Hook] | Callable[[Any], Sequence[Hook]] | None

QRSCORE = "qrscore"
QRSCORE_NDCG = "qrscore-ndcg"
COPY_PASTE = "copy-paste"
METHODS = (QRSCORE, QRSCORE_NDCG, COPY_PASTE)
_METHOD_ALIASES = {"copy": COPY_PASTE, "copy_paste": COPY_PASTE, "qrscore_ndcg": QRSCORE_NDCG, "ndcg": QRSCORE_NDCG}
DEFAULT_TOP_K = 16
NDCG_K = 10
FILTER_SIGMAS = 2.0
DEFAULT_MAX_NEW_TOKENS = 12


class DetectionInputError(ConfigError):
    """Detection data that cannot be scored: no examples, spans outside the prompt, ..."""


def resolve_method(method: str) -> str:
    key = str(method).strip().lower()
    key = _METHOD_ALIASES.get(key, key)
    if key not in METHODS:
        raise ConfigError(f"unknown detection method {method!r}; choose one of {', '.join(METHODS)} (or 'copy')")
    return key


# =========================================================================== pure math


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
            f"document token spans must be non-empty and inside the context [0, {n_context}), got {list(map(tuple, spans.tolist()))}"
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


def gold_rank(doc_scores: torch.Tensor, gold_index: int) -> torch.Tensor:
    """1-based rank of the gold document by descending score; ties count against it.

    Pessimistic ties: a head that scores every document equally ranks the gold one
    last, not first, so degenerate heads earn nothing.
    """
    gold = doc_scores[..., gold_index : gold_index + 1]
    return (doc_scores >= gold).sum(dim=-1)


def ndcg_at_k(doc_scores: torch.Tensor, gold_index: int, k: int = NDCG_K) -> torch.Tensor:
    """NDCG@k with one relevant document: 1 / log2(1 + rank) if rank <= k else 0 (ideal DCG is 1)."""
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
    """Mean of per-example [L, H] matrices (float64) as float32, -1 where not scored."""
    mean = torch.stack([t.double() for t in per_example]).mean(dim=0)
    return torch.where(scored, mean, torch.full_like(mean, -1.0)).float()


# =========================================================================== heads and layers


def requested_heads(spec, heads: HeadsArg) -> torch.Tensor:
    """Bool [L, H] of the heads to score; `heads` as in TL's detect_head: None (all),
    [(layer, head), ...], {layer: [heads]}, or a HeadSet."""
    mask = torch.zeros(spec.n_layers, spec.n_heads, dtype=torch.bool)
    if heads is None:
        return mask.fill_(True)
    if isinstance(heads, HeadSet):
        heads.validate_for(spec)
        pairs = list(heads.heads)
    elif isinstance(heads, Mapping):
        pairs = [(layer, h) for layer, hs in heads.items() for h in hs]
    else:
        pairs = [tuple(p) for p in heads]
    if not pairs:
        raise ConfigError("heads= is empty: pass None to score every head")
    for pair in pairs:
        if len(pair) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in pair):
            raise ConfigError(f"a head must be a (layer, head) pair of ints, got {pair!r}")
        layer, head = pair
        if not (0 <= layer < spec.n_layers and 0 <= head < spec.n_heads):
            raise ConfigError(
                f"head {head_label(layer, head)} is outside the model ({spec.n_layers} layers x {spec.n_heads} heads)"
            )
        mask[layer, head] = True
    return mask


def sliding_layers(spec) -> list[int]:
    """Layers with sliding-window attention (Gemma-3 style); empty for full-attention models."""
    if spec.sliding_window is None:
        return []
    return [i for i, t in enumerate(spec.layer_types) if t == "sliding_attention"]


def qrscore_heads(spec, heads: HeadsArg) -> torch.Tensor:
    """Requested heads minus those of sliding-window layers (see the module docstring)."""
    mask = requested_heads(spec, heads)
    mask[sliding_layers(spec)] = False
    if not mask.any():
        raise ConfigError("no head left to score: every requested head is in a sliding-window layer")
    return mask


# =========================================================================== examples


def _as_example(x: Any):
    from dysco_interp.tasks.needle_qa import NeedleQAExample

    if isinstance(x, NeedleQAExample):
        ex = x
    elif isinstance(x, Mapping):
        ex = NeedleQAExample.from_dict(x)
    else:
        raise DetectionInputError(f"expected needle-QA examples (NeedleQAExample or dict), got {type(x).__name__}")
    if ex.is_null_query:
        raise DetectionInputError(f"example {ex.id!r} is a null-query example; pass the real ones")
    return ex


def check_examples(examples: Iterable[Any]) -> list:
    """Examples as NeedleQAExample, non-empty, with unique ids (the store keys on them)."""
    if examples is None:
        raise DetectionInputError("no detection examples given")
    out = [_as_example(x) for x in examples]
    if not out:
        raise DetectionInputError("no detection examples: the data set is empty")
    seen: set[str] = set()
    for ex in out:
        if ex.id in seen:
            raise DetectionInputError(f"duplicate example id {ex.id!r}: ids key the resumable store")
        seen.add(ex.id)
    return out


def prompt_ids(model, example) -> list[int]:
    """The example's prompt ids, checked against its recorded length and spans."""
    from dysco_interp.chat import encode_text, render_chat

    # Spans index the example's rendering: this model's template and tokenizer must reproduce it.
    if render_chat(model.tokenizer, example.prompt, True, example.enable_thinking) != example.prompt_text:
        raise DetectionInputError(
            f"example {example.id!r} was rendered with another chat template (made for {example.tokenizer!r}); "
            "regenerate the data for this model"
        )
    ids = encode_text(model.tokenizer, example.prompt_text)[0]
    if len(ids) != example.n_tokens:
        raise DetectionInputError(
            f"example {example.id!r} has {example.n_tokens} tokens in its record but {len(ids)} with this "
            f"model's tokenizer (made for {example.tokenizer!r}); regenerate the data for this model"
        )
    q0, q1 = example.query_token_span
    if not 0 < q0 < q1 <= len(ids):
        raise DetectionInputError(
            f"example {example.id!r}: query span {tuple(example.query_token_span)} is outside the prompt "
            f"of {len(ids)} tokens (or leaves no context before it)"
        )
    check_doc_spans(example.doc_token_spans, q0)
    if not 0 <= example.gold_index < len(example.doc_token_spans):
        raise DetectionInputError(
            f"example {example.id!r}: gold index {example.gold_index} is not one of its "
            f"{len(example.doc_token_spans)} documents"
        )
    return ids


def _hooks_for(hooks: HooksArg, example) -> list[Hook]:
    if hooks is None:
        return []
    return list(hooks(example) if callable(hooks) else hooks)


def describe_examples(examples: Sequence[Any]) -> str:
    """A one-line description of detection data for provenance."""
    lengths = [ex.n_tokens for ex in examples]
    seeds = sorted({ex.seed for ex in examples if ex.seed is not None})
    targets = sorted({ex.target_tokens for ex in examples if ex.target_tokens})
    tasks = sorted({ex.task for ex in examples})
    parts = [
        f"{'+'.join(tasks)}: {len(examples)} examples",
        f"{min(lengths)}-{max(lengths)} tokens" + (f" (target {', '.join(map(str, targets))})" if targets else ""),
    ]
    if seeds:
        parts.append(f"seed {', '.join(map(str, seeds))}")
    return ", ".join(parts)


# =========================================================================== model passes


def _pattern_name(layer: int) -> str:
    return f"blocks.{layer}.attn.hook_pattern"


def query_attention(
    model, cache, query_ids: Sequence[int], n_context: int, layers: Sequence[int], hooks: Sequence[Hook] = ()
) -> torch.Tensor:
    """[L, H, n_context] float32: mean attention of the query tokens to each context key.

    The query runs on a frozen view of `cache` (which holds exactly the n_context context
    tokens), so the cache is unchanged and can serve another query. Layers not in
    `layers` are left 0. Only `layers` are hooked and the pass stops after the deepest.
    """
    from dysco_interp.decoding import runtime

    spec = model.spec
    if runtime.cache_length(cache) != n_context:
        raise ValueError(f"cache holds {runtime.cache_length(cache)} tokens, expected the {n_context} context tokens")
    n_keys = n_context + len(query_ids)
    rows: dict[int, torch.Tensor] = {}

    def reader(pattern: torch.Tensor, hook) -> None:
        layer = int(hook.name.split(".")[1])
        if pattern.shape[-1] != n_keys:
            raise RuntimeError(
                f"layer {layer} attends over {pattern.shape[-1]} keys, expected {n_keys} (context + query): "
                "the cache was ignored (transformers >= 5.24 renames the cache argument) or the layer is sliding-window"
            )
        rows[layer] = mean_query_rows(pattern, n_context)

    layers = sorted(set(layers))
    reads = [(_pattern_name(layer), reader) for layer in layers]
    runtime.partial_step(model, cache, list(query_ids), layers[-1] + 1, reads + list(hooks))
    out = torch.zeros(spec.n_layers, spec.n_heads, n_context, device=model.device)
    for layer, row in rows.items():
        out[layer] = row
    return out


def _layers_of(mask: torch.Tensor) -> list[int]:
    return torch.nonzero(mask.any(dim=1)).flatten().tolist()


@torch.inference_mode()
def example_query_attention(
    model, example, mask: torch.Tensor, hooks: HooksArg = None, chunk_size: int | None = None, null: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(real, null) query attention [L, H, n_context] for one example, one context prefill."""
    from dysco_interp.decoding import runtime
    from dysco_interp.tasks.needle_qa import null_query

    ids = prompt_ids(model, example)
    q0 = example.query_token_span[0]
    layers = _layers_of(mask)
    cache, _ = runtime.prefill(model, ids[:q0], chunk_size or runtime.DEFAULT_CHUNK)
    real = query_attention(model, cache, ids[q0:], q0, layers, _hooks_for(hooks, example))
    if not null:
        return real, None
    null_ex = null_query(example, model.tokenizer)
    null_ids = prompt_ids(model, null_ex)
    if null_ex.query_token_span[0] != q0 or null_ids[:q0] != ids[:q0]:
        raise DetectionInputError(
            f"example {example.id!r}: the null query changes the context tokens before the query span; "
            "calibration would compare different contexts"
        )
    null_att = query_attention(model, cache, null_ids[q0:], q0, layers, _hooks_for(hooks, null_ex))
    return real, null_att


def qrscore_one(
    model, example, mask: torch.Tensor, hooks: HooksArg = None, chunk_size: int | None = None
) -> dict[str, torch.Tensor]:
    """Per-head QRScore of one example: {'mass': [L, H], 'ndcg': [L, H]} (float64)."""
    real, null = example_query_attention(model, example, mask, hooks, chunk_size)
    mass, ndcg = qrscore_example(real, null, example.doc_token_spans, example.gold_index)
    return {"mass": mass.double().cpu(), "ndcg": ndcg.double().cpu()}


@torch.inference_mode()
def copy_paste_one(
    model,
    example,
    mask: torch.Tensor,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    hooks: HooksArg = None,
    chunk_size: int | None = None,
) -> dict[str, Any]:
    """Copy-paste score of one example: {'copy': [L, H] float64, 'generated': [ids]}.

    Prefill all but the last prompt token, then greedy steps through the bridge starting
    with the last prompt token (as Wu et al.); each step's pattern rows give every head's
    top-1 key, checked against the token that step produces.
    """
    from dysco_interp.decoding import runtime

    ids = prompt_ids(model, example)
    model.check_fits(len(ids), max_new_tokens)
    spec = model.spec
    prompt = torch.tensor(ids, dtype=torch.long, device=model.device)
    needle = tuple(example.gold_token_span)
    layers = _layers_of(mask)
    sliding = set(sliding_layers(spec))
    top1 = torch.full((spec.n_layers, spec.n_heads), -1, dtype=torch.long, device=model.device)
    n_keys = len(ids)

    def reader(pattern: torch.Tensor, hook) -> None:
        layer = int(hook.name.split(".")[1])
        width = pattern.shape[-1]
        # sliding layers see only the last `width` keys: right-align onto absolute positions
        if width != n_keys and not (layer in sliding and width < n_keys):
            raise RuntimeError(f"layer {layer} attends over {width} keys, expected {n_keys}: the cache was ignored")
        top1[layer] = absolute_top1(pattern, n_keys)

    reads = [(_pattern_name(layer), reader) for layer in layers]
    cache, _ = runtime.prefill(model, ids[:-1], chunk_size or runtime.DEFAULT_CHUNK)
    score = torch.zeros(spec.n_layers, spec.n_heads, dtype=torch.float64, device=model.device)
    token, generated = ids[-1], []
    eos = model.eos_token_ids
    step_hooks = reads + _hooks_for(hooks, example)  # the callable runs once per example
    for _ in range(max_new_tokens):
        top1.fill_(-1)
        logits = runtime.step(model, cache, [token], step_hooks)
        token = int(logits[0].argmax())
        generated.append(token)
        score += copy_paste_hits(top1, token, prompt, needle)
        n_keys += 1
        if token in eos:
            break
    return {"copy": score.cpu(), "generated": generated}


# =========================================================================== resumable store


def _matrix_to_json(t: torch.Tensor, mask: torch.Tensor) -> list[list[float | None]]:
    vals = t.double().tolist()
    keep = mask.tolist()
    return [[v if k else None for v, k in zip(row, krow)] for row, krow in zip(vals, keep)]


def _matrix_from_json(rows: list[list[float | None]]) -> torch.Tensor:
    return torch.tensor([[0.0 if v is None else v for v in row] for row in rows], dtype=torch.float64)


# =========================================================================== results


@dataclass
class DetectionResult:
    """Head scores `[n_layers, n_heads]` (-1 = not scored) and what produced them."""

    scores: torch.Tensor
    scored: torch.Tensor  # bool [L, H]: -1 in `scores` is also a possible value, this is not ambiguous
    per_example: list[torch.Tensor]  # [L, H] float64 each, in example order
    example_ids: list[str]
    method: str
    model: str
    n_layers: int
    n_heads: int
    n_kv_heads: int | None
    data: str
    seed: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def ranking(self) -> list[tuple[Head, float]]:
        return rank_heads(self.scores, self.scored)

    def headset(self, top_k: int = DEFAULT_TOP_K, command: str | None = None) -> HeadSet:
        """The top-k heads by score, with provenance."""
        ranked = self.ranking()
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ConfigError(f"top_k must be a positive integer, got {top_k!r}")
        if top_k > len(ranked):
            raise ConfigError(
                f"top_k={top_k} is larger than the {len(ranked)} scored heads of {self.model} "
                f"({self.n_layers} layers x {self.n_heads} heads)"
            )
        top = ranked[:top_k]
        return HeadSet(
            heads=[h for h, _ in top],
            scores=[s for _, s in top],
            model=self.model,
            n_layers=self.n_layers,
            n_heads=self.n_heads,
            n_kv_heads=self.n_kv_heads,
            method=self.method,
            data=self.data,
            n_examples=len(self.per_example),
            seed=self.seed,
            package_version=__version__,
            command=command,
            extra={
                **self.extra,
                "n_scored_heads": len(ranked),
                "top_k_of": len(ranked),
                "score_matrix": _matrix_to_json(self.scores, self.scored),
            },
        )

    def subset(self, indices: Sequence[int]) -> DetectionResult:
        """The same detection aggregated over some of the examples only."""
        if not indices:
            raise ConfigError("an empty subset of examples")
        per = [self.per_example[i] for i in indices]
        return dataclasses.replace(
            self,
            scores=mean_over_examples(per, self.scored),
            per_example=per,
            example_ids=[self.example_ids[i] for i in indices],
        )


_EXTRA_QR = {
    "query_span": "late instruction + question + assistant header (to the prompt end)",
    "calibration": 'minus the same attention with the null query "N/A"',
    "doc_filter": "per document and head: tokens below mean - 2 std zeroed, rest summed",
    "aggregate": "mean over examples",
}


def _family(method: str) -> str:
    return COPY_PASTE if method == COPY_PASTE else QRSCORE


def _run(
    model,
    examples: Sequence[Any],
    method: str,
    mask: torch.Tensor,
    compute: Callable[[Any], dict[str, Any]],
    params: dict[str, Any],
    progress: bool,
    store: str | os.PathLike | None,
) -> tuple[list[torch.Tensor], list[dict[str, Any]]]:
    """Per-example score matrices for `method`, resuming from and appending to the store."""
    from tqdm.auto import tqdm

    spec = model.spec
    key = "copy" if method == COPY_PASTE else ("ndcg" if method == QRSCORE_NDCG else "mass")
    db = None
    if store is not None:
        family = _family(method)
        settings = {
            "family": family, "model": spec.name, "weights": model.weights_id,
            "dtype": dtype_name(model.dtype), "n_layers": spec.n_layers, "n_heads": spec.n_heads,
            "scored_heads": [list(h) for h in torch.nonzero(mask).tolist()], "params": params,
        }
        db = ResultStore(Path(store) / f"{family}.jsonl", key_fields=("example",), settings=settings, purpose="detect")
    # an example is known by its content, so data made with other options never reuses a score
    keys = {ex.id: {"example": content_hash(ex.to_dict())} for ex in examples}
    todo = sum(1 for ex in examples if db is None or keys[ex.id] not in db)
    bar = tqdm(total=len(examples), initial=len(examples) - todo, desc=f"{method} {spec.name}",
               unit="ex", disable=not progress)
    per, records = [], []
    try:
        for ex in examples:
            if db is not None and keys[ex.id] in db:
                rec = db.get(keys[ex.id])
            else:
                out = compute(ex)
                rec = {**keys[ex.id], "id": ex.id, "n_tokens": ex.n_tokens}
                for k, v in out.items():
                    rec[k] = _matrix_to_json(v, mask) if isinstance(v, torch.Tensor) else v
                if db is not None:
                    db.append(rec)
                bar.update(1)
            per.append(_matrix_from_json(rec[key]))
            records.append(rec)
    finally:
        bar.close()
        if db is not None:
            db.close()
    return per, records


def qrscore(
    model,
    examples: Iterable[Any],
    *,
    method: str = QRSCORE,
    heads: HeadsArg = None,
    progress: bool = True,
    store: str | os.PathLike | None = None,
    hooks: HooksArg = None,
    chunk_size: int | None = None,
    seed: int | None = None,
    data: str | None = None,
) -> DetectionResult:
    """QRScore of every (requested, full-attention) head, mean over examples.

    method: "qrscore" (calibrated, filtered attention mass on the gold document) or
    "qrscore-ndcg" (NDCG@10 of the gold document). heads: restrict scoring (TL style).
    store: a directory for a resumable JSONL record per finished example (both methods
    share it). hooks: extra TransformerLens hooks for the query passes (a list, or a
    callable example -> list; the null-query example has `is_null_query=True`); the
    context prefill runs on the SDPA twin and sees no hooks.
    """
    method = resolve_method(method)
    if method == COPY_PASTE:
        raise ConfigError("qrscore() computes qrscore or qrscore-ndcg; use copy_paste_score() for copy-paste")
    examples = check_examples(examples)
    mask = qrscore_heads(model.spec, heads)
    per, _ = _run(
        model, examples, method, mask,
        lambda ex: qrscore_one(model, ex, mask, hooks, chunk_size),
        {"ndcg_k": NDCG_K, "filter_sigmas": FILTER_SIGMAS}, progress, store,
    )
    extra = dict(_EXTRA_QR)
    if sliding_layers(model.spec):
        extra["unscored_sliding_layers"] = sliding_layers(model.spec)
    return _result(model, examples, method, mask, per, data, seed, extra)


def copy_paste_score(
    model,
    examples: Iterable[Any],
    *,
    heads: HeadsArg = None,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    progress: bool = True,
    store: str | os.PathLike | None = None,
    hooks: HooksArg = None,
    chunk_size: int | None = None,
    seed: int | None = None,
    data: str | None = None,
) -> DetectionResult:
    """Wu et al.'s retrieval score (needle = gold document), mean over examples."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    examples = check_examples(examples)
    mask = requested_heads(model.spec, heads)
    per, records = _run(
        model, examples, COPY_PASTE, mask,
        lambda ex: copy_paste_one(model, ex, mask, max_new_tokens, hooks, chunk_size),
        {"max_new_tokens": max_new_tokens, "needle": "gold document"}, progress, store,
    )
    extra = {
        "needle": "gold document token span",
        "decoding": f"greedy, up to {max_new_tokens} tokens",
        "aggregate": "mean over examples",
        "generated": {r["id"]: model.tokenizer.decode(r["generated"]) for r in records},
    }
    return _result(model, examples, COPY_PASTE, mask, per, data, seed, extra)


def _result(model, examples, method, mask, per, data, seed, extra) -> DetectionResult:
    spec = model.spec
    if seed is None:
        seeds = {ex.seed for ex in examples}
        seed = seeds.pop() if len(seeds) == 1 else None
    return DetectionResult(
        scores=mean_over_examples(per, mask),
        scored=mask.clone(),
        per_example=per,
        example_ids=[ex.id for ex in examples],
        method=method,
        model=spec.name,
        n_layers=spec.n_layers,
        n_heads=spec.n_heads,
        n_kv_heads=spec.n_kv_heads,
        data=data or describe_examples(examples),
        seed=seed,
        extra=extra,
    )


def make_detection_data(model, n: int, length: int, seed: int = 0, progress: bool = False) -> list:
    """n needle-QA examples of about `length` tokens for the model's tokenizer."""
    from dysco_interp.tasks import make_dataset

    return make_dataset("needle_qa", model.tokenizer, target_tokens=length, n=n, seed=seed, progress=progress)


def detect(
    model,
    examples: Iterable[Any] | None = None,
    *,
    n: int | None = None,
    length: int | None = None,
    seed: int = 0,
    method: str = QRSCORE,
    heads: HeadsArg = None,
    progress: bool = True,
    store: str | os.PathLike | None = None,
    hooks: HooksArg = None,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    chunk_size: int | None = None,
) -> DetectionResult:
    """Any method on given examples, or on n generated needle-QA examples of `length` tokens."""
    method = resolve_method(method)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {seed!r}")
    if examples is None:
        if n is None or length is None:
            raise ConfigError("pass examples, or n and length to generate needle-QA detection data")
        examples = make_detection_data(model, n, length, seed, progress)
    if method == COPY_PASTE:
        return copy_paste_score(
            model, examples, heads=heads, max_new_tokens=max_new_tokens, progress=progress, store=store,
            hooks=hooks, chunk_size=chunk_size, seed=seed,
        )
    return qrscore(
        model, examples, method=method, heads=heads, progress=progress, store=store, hooks=hooks,
        chunk_size=chunk_size, seed=seed,
    )


def detect_qr_heads(
    model,
    examples: Iterable[Any] | None = None,
    *,
    n: int | None = None,
    length: int | None = None,
    seed: int = 0,
    top_k: int = DEFAULT_TOP_K,
    method: str = QRSCORE,
    command: str | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, HeadSet]:
    """(scores [L, H] with -1 for unscored heads, HeadSet of the top_k). See `detect`."""
    result = detect(model, examples, n=n, length=length, seed=seed, method=method, **kwargs)
    return result.scores, result.headset(top_k, command=command)


# =========================================================================== stability


@dataclass(frozen=True)
class HeadOverlap:
    count: int
    jaccard: float
    shared: tuple[Head, ...]  # in the first set's order
    size_a: int
    size_b: int


def head_overlap(a: HeadSet | Iterable[Head], b: HeadSet | Iterable[Head]) -> HeadOverlap:
    """Shared heads of two sets: count and Jaccard |A and B| / |A or B|."""
    la = [tuple(h) for h in a]
    lb = [tuple(h) for h in b]
    sb = set(lb)
    shared = tuple(h for h in la if h in sb)
    union = len(set(la) | sb)
    return HeadOverlap(len(shared), len(shared) / union if union else 0.0, shared, len(la), len(lb))


@dataclass(frozen=True)
class SplitHalf:
    first: HeadSet
    second: HeadSet
    overlap: HeadOverlap
    halves: tuple[tuple[str, ...], tuple[str, ...]]  # example ids of each half

    def as_dict(self) -> dict[str, Any]:
        return {
            "top_k": len(self.first),
            "overlap": self.overlap.count,
            "jaccard": round(self.overlap.jaccard, 6),
            "n_first": len(self.halves[0]),
            "n_second": len(self.halves[1]),
        }


def split_half(result: DetectionResult, top_k: int = DEFAULT_TOP_K, seed: int = 0) -> SplitHalf:
    """Top-k on two disjoint, seeded halves of the examples (no recomputation) and their overlap."""
    n = len(result.per_example)
    if n < 2:
        raise ConfigError(f"split-half stability needs at least 2 examples, got {n}")
    order = list(range(n))
    random.Random(seed).shuffle(order)
    a, b = sorted(order[: n // 2]), sorted(order[n // 2 :])
    ra, rb = result.subset(a), result.subset(b)
    ha, hb = ra.headset(top_k), rb.headset(top_k)
    return SplitHalf(ha, hb, head_overlap(ha, hb), (tuple(ra.example_ids), tuple(rb.example_ids)))


def split_half_stability(
    model, examples: Iterable[Any], *, top_k: int = DEFAULT_TOP_K, seed: int = 0, **kwargs: Any
) -> SplitHalf:
    """Run `detect` on all examples, then compare the top-k of two disjoint halves."""
    return split_half(detect(model, examples, seed=seed, **kwargs), top_k, seed)


# =========================================================================== evaluation helpers


def _heads_list(heads: HeadsArg, spec) -> list[Head]:
    mask = requested_heads(spec, heads)
    bad = [head_label(*h) for h in map(tuple, torch.nonzero(mask).tolist()) if h[0] in set(sliding_layers(spec))]
    if bad:
        raise ConfigError(
            f"heads {', '.join(bad)} are in sliding-window layers: their query-chunk attention is not on "
            "absolute positions, so gold-document mass is not defined for them"
        )
    return [tuple(h) for h in torch.nonzero(mask).tolist()]


def gold_mass_per_head(
    model,
    examples: Iterable[Any],
    heads: HeadsArg = None,
    *,
    progress: bool = False,
    hooks: HooksArg = None,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """[L, H] mean (over examples) attention mass on the gold document from the query span,
    uncalibrated and unfiltered; -1 for heads not computed (sliding layers, outside heads=)."""
    from tqdm.auto import tqdm

    examples = check_examples(examples)
    mask = qrscore_heads(model.spec, heads)
    per = []
    for ex in tqdm(examples, desc="gold-document mass", unit="ex", disable=not progress):
        real, _ = example_query_attention(model, ex, mask, hooks, chunk_size, null=False)
        start, end = ex.gold_token_span
        per.append(real[..., start:end].sum(dim=-1).double().cpu())
    return mean_over_examples(per, mask)


def gold_attention_mass(model, examples: Iterable[Any], heads: HeadsArg, **kwargs: Any) -> float:
    """Mean attention mass the heads put on the gold document from the query span
    (uncalibrated; one context prefill per example), averaged over heads and examples."""
    if heads is None:
        raise ConfigError("gold_attention_mass needs a head set (heads=None would mean every head)")
    chosen = _heads_list(heads, model.spec)
    masses = gold_mass_per_head(model, examples, chosen, **kwargs)
    idx = torch.tensor(chosen, dtype=torch.long)
    return float(masses[idx[:, 0], idx[:, 1]].double().mean())


def random_head_sets(model, size: int, n_draws: int = 5, seed: int = 0) -> list[HeadSet]:
    """n_draws seeded random head sets of `size` (seeds seed .. seed+n_draws-1), avoiding
    sliding-window layers; on full-attention models these are `random_like`'s draws."""
    spec = model.spec
    if n_draws < 1:
        raise ConfigError(f"n_draws must be >= 1, got {n_draws}")
    banned = [(layer, h) for layer in sliding_layers(spec) for h in range(spec.n_heads)]
    return [
        HeadSet(
            random_heads(size, spec.n_layers, spec.n_heads, seed + i, exclude=banned or None),
            model=spec.name, n_layers=spec.n_layers, n_heads=spec.n_heads, n_kv_heads=spec.n_kv_heads,
            method="random", data=f"uniform draw of {size} heads", seed=seed + i,
        )
        for i in range(n_draws)
    ]


def random_baseline(
    model, examples: Iterable[Any], headset: HeadSet | Sequence[Head], n_draws: int = 5, seed: int = 0, **kwargs: Any
) -> float:
    """Mean gold-document mass of n_draws seeded random head sets of the same size as headset.

    All heads are measured in one pass per example, then averaged per draw.
    """
    size = len(list(headset))
    masses = gold_mass_per_head(model, examples, None, **kwargs)
    values = []
    for hs in random_head_sets(model, size, n_draws, seed):
        idx = hs.as_tensor()
        values.append(float(masses[idx[:, 0], idx[:, 1]].double().mean()))
    return math.fsum(values) / len(values)


__all__ = [
    "COPY_PASTE", "DEFAULT_TOP_K", "METHODS", "QRSCORE", "QRSCORE_NDCG",
    "DetectionInputError", "DetectionResult", "HeadOverlap", "SplitHalf",
    "absolute_top1", "check_doc_spans", "copy_paste_hits", "copy_paste_one", "copy_paste_score", "detect", "detect_qr_heads",
    "example_query_attention", "filtered_doc_scores", "gold_attention_mass", "gold_mass_per_head", "gold_rank",
    "head_overlap", "make_detection_data", "mean_over_examples", "mean_query_rows", "ndcg_at_k", "qrscore",
    "qrscore_example", "qrscore_heads", "qrscore_one", "query_attention", "random_baseline", "random_head_sets",
    "rank_heads", "requested_heads", "resolve_method", "sliding_layers", "split_half", "split_half_stability",
]

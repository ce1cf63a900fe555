"""The model passes of detection: query attention on a prefilled context, greedy copy-paste steps.

The context (every token before the query span) is prefilled ONCE through the SDPA twin
(`runtime.prefill`: no n x n score matrix); the real and the null query tokens then run
through the bridge on a read-only view of that cache (`FrozenCache`, via
`runtime.partial_step`), with `hook_pattern` hooks that reduce each layer's pattern
`[1, H, q, k]` at once to `[H, n_context]`. Full patterns are never kept.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from dysco_interp.detection.examples import prompt_ids
from dysco_interp.detection.methods import DEFAULT_MAX_NEW_TOKENS, DetectionInputError
from dysco_interp.detection.scores import absolute_top1, copy_paste_hits, mean_query_rows, qrscore_example
from dysco_interp.hooks import Hook, layer_of, pattern_name, sliding_layers

HooksArg = Sequence[Hook] | Callable[[Any], Sequence[Hook]] | None


def _hooks_for(hooks: HooksArg, example) -> list[Hook]:
    if hooks is None:
        return []
    return list(hooks(example) if callable(hooks) else hooks)


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
        layer = layer_of(hook)
        if pattern.shape[-1] != n_keys:
            raise RuntimeError(
                f"layer {layer} attends over {pattern.shape[-1]} keys, expected {n_keys} (context + query): "
                "the cache was ignored (transformers >= 5.24 renames the cache argument) or the layer is sliding-window"
            )
        rows[layer] = mean_query_rows(pattern, n_context)

    layers = sorted(set(layers))
    reads = [(pattern_name(layer), reader) for layer in layers]
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
        layer = layer_of(hook)
        width = pattern.shape[-1]
        # sliding layers see only the last `width` keys: right-align onto absolute positions
        if width != n_keys and not (layer in sliding and width < n_keys):
            raise RuntimeError(f"layer {layer} attends over {width} keys, expected {n_keys}: the cache was ignored")
        top1[layer] = absolute_top1(pattern, n_keys)

    reads = [(pattern_name(layer), reader) for layer in layers]
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

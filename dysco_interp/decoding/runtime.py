"""The KV-cache runtime every decoding method shares.

- `prefill`: fills an HF `DynamicCache` without ever materialising an n x n score
  matrix: chunked through the SDPA twin (fast, no hooks), or chunked through the
  bridge when hooks must see the prompt (eager, only chunk x n scores at a time).
- `step`: one forward of new token(s) through the bridge; writes the cache.
- `partial_step`: layers 0..stop_at_layer-1 through the bridge on a frozen view of
  the cache; nothing is written, so a later full step sees the cache unchanged.
"""

from __future__ import annotations

import copy
from typing import Iterable, Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache

from dysco_interp.hooks import Hook
from dysco_interp.models import LoadedModel

DEFAULT_CHUNK = 1024


class FrozenCache(DynamicCache):
    """A read-only view of a cache: attention sees cached + new keys, nothing is stored."""

    def __init__(self, base: Cache):
        Cache.__init__(self, layers=base.layers)

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        layer = self.layers[layer_idx]
        if not layer.is_initialized or layer.keys is None or layer.keys.numel() == 0:
            return key_states, value_states
        return (
            torch.cat([layer.keys, key_states], dim=-2),
            torch.cat([layer.values, value_states], dim=-2),
        )


def new_cache(model: LoadedModel) -> DynamicCache:
    return DynamicCache(config=model.hf_config)


def as_ids(model: LoadedModel, ids: torch.Tensor | Sequence[int]) -> torch.Tensor:
    """A [batch, seq] long tensor on the model's device."""
    t = torch.as_tensor(ids, dtype=torch.long)
    if t.ndim == 1:
        t = t.unsqueeze(0)
    if t.ndim != 2 or t.shape[1] == 0:
        raise ValueError(f"expected token ids of shape [seq] or [batch, seq], got {tuple(t.shape)}")
    return t.to(model.device)


def check_chunk_size(chunk_size: int) -> None:
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")


def chunk_or_default(chunk_size: int | None) -> int:
    return DEFAULT_CHUNK if chunk_size is None else chunk_size


def cache_length(cache: Cache) -> int:
    return cache.get_seq_length()


def clone_cache(cache: Cache) -> Cache:
    """An independent copy, so one prefill can branch into several decoding runs."""
    return copy.deepcopy(cache)


@torch.inference_mode()
def prefill(
    model: LoadedModel,
    input_ids: torch.Tensor | Sequence[int],
    chunk_size: int = DEFAULT_CHUNK,
    hooks: Iterable[Hook] = (),
    cache: Cache | None = None,
) -> tuple[Cache, torch.Tensor]:
    """Run the prompt into a cache; return (cache, float32 logits of the last position)."""
    ids = as_ids(model, input_ids)
    check_chunk_size(chunk_size)
    cache = new_cache(model) if cache is None else cache
    model.check_fits(cache_length(cache) + ids.shape[1])
    hooks = list(hooks)
    logits = torch.empty(0)
    for start in range(0, ids.shape[1], chunk_size):
        chunk = ids[:, start : start + chunk_size]
        if hooks:
            logits = model.bridge.run_with_hooks(
                chunk, past_key_values=cache, fwd_hooks=hooks, logits_to_keep=1
            )
        else:
            logits = model.prefill_model(
                input_ids=chunk, past_key_values=cache, use_cache=True, logits_to_keep=1
            ).logits
    return cache, logits[:, -1].float()


@torch.inference_mode()
def step(
    model: LoadedModel, cache: Cache, token_ids: torch.Tensor | Sequence[int], hooks: Iterable[Hook] = ()
) -> torch.Tensor:
    """Feed token(s) through the bridge, appending to the cache; float32 logits of the last one."""
    ids = as_ids(model, token_ids)
    model.check_fits(cache_length(cache) + ids.shape[1])
    logits = model.bridge.run_with_hooks(ids, past_key_values=cache, fwd_hooks=list(hooks))
    return logits[:, -1].float()


@torch.inference_mode()
def partial_step(
    model: LoadedModel,
    cache: Cache,
    token_ids: torch.Tensor | Sequence[int],
    stop_at_layer: int,
    hooks: Iterable[Hook] = (),
) -> torch.Tensor:
    """Run layers [0, stop_at_layer) without writing the cache; return the residual stream."""
    if not 1 <= stop_at_layer <= model.spec.n_layers:
        raise ValueError(f"stop_at_layer must be in [1, {model.spec.n_layers}], got {stop_at_layer}")
    ids = as_ids(model, token_ids)
    model.check_fits(cache_length(cache) + ids.shape[1])
    return model.bridge.run_with_hooks(
        ids, past_key_values=FrozenCache(cache), stop_at_layer=stop_at_layer, fwd_hooks=list(hooks)
    )

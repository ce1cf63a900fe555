"""The static backend's key/value cache: buffers of fixed capacity per layer, written in place.

Prefill appends each chunk after the keys before it; a decoding step writes the one slot a
long device tensor names, so a captured pass replays with the same buffers at every step.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

from dysco_interp.decoding.backends.decode_attention import GRANULE


def capacity_for(n_tokens: int) -> int:
    return -(-max(n_tokens, 1) // GRANULE) * GRANULE


class SlotCache(DynamicCache):
    """Key/value buffers `[B, kv_heads, capacity, head_dim]` per layer, written in place.

    Prefill appends chunks at each layer's length (the layers hold views of the buffers,
    so HF's mask sizes stay right); once `slot` is set, every update writes the slot that
    long tensor names and returns the whole buffers.
    """

    def __init__(self, n_layers: int, capacity: int):
        Cache.__init__(self, layers=[DynamicLayer() for _ in range(n_layers)])
        self.capacity = capacity
        self.buffers: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * n_layers
        self.slot: torch.Tensor | None = None

    def allocate(self, batch: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device_of: Callable[[int], torch.device]) -> None:
        """Every layer's buffers now, before any prefill temporaries: made between them, layer by
        layer, they would be cut out of the temporaries' freed blocks and leave the rest of those
        blocks stranded for as long as the cache lives."""
        for layer in range(len(self.buffers)):
            self._make(layer, (batch, kv_heads, head_dim), dtype, device_of(layer))

    def _make(self, layer: int, shape: tuple[int, int, int], dtype: torch.dtype, device: torch.device) -> None:
        """The layer's key and value buffers `[B, kv_heads, capacity, head_dim]`, unless it has them."""
        if self.buffers[layer] is None:
            size = (*shape[:2], self.capacity, shape[2])
            self.buffers[layer] = tuple(torch.zeros(size, dtype=dtype, device=device) for _ in range(2))

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        b, h, _, d = key_states.shape
        self._make(layer_idx, (b, h, d), key_states.dtype, key_states.device)
        keys, values = self.buffers[layer_idx]
        if self.slot is not None:
            slot = self.slot.to(keys.device)  # a split model's layers are on several devices
            keys.index_copy_(2, slot, key_states)
            values.index_copy_(2, slot, value_states)
            return keys, values
        layer = self.layers[layer_idx]
        start = layer.get_seq_length()
        end = start + key_states.shape[-2]
        if end > self.capacity:
            raise RuntimeError(f"the static cache holds {self.capacity} tokens, {end} were written")
        keys[:, :, start:end].copy_(key_states)
        values[:, :, start:end].copy_(value_states)
        layer.keys, layer.values = keys[:, :, :end], values[:, :, :end]
        layer.dtype, layer.device, layer.is_initialized = keys.dtype, keys.device, True
        return layer.keys, layer.values

    def resized(self, capacity: int, n_tokens: int) -> "SlotCache":
        """A copy of the first n_tokens in buffers of the given capacity."""
        out = SlotCache(len(self.layers), capacity)
        for i, pair in enumerate(self.buffers):
            if pair is None:
                continue
            keys, values = (t.new_zeros(*t.shape[:2], capacity, t.shape[-1]) for t in pair)
            keys[:, :, :n_tokens].copy_(pair[0][:, :, :n_tokens])
            values[:, :, :n_tokens].copy_(pair[1][:, :, :n_tokens])
            out.buffers[i] = (keys, values)
            layer = out.layers[i]
            layer.keys, layer.values = keys[:, :, :n_tokens], values[:, :, :n_tokens]
            layer.dtype, layer.device, layer.is_initialized = keys.dtype, keys.device, True
        return out

    def keys(self, layer: int) -> torch.Tensor:
        pair = self.buffers[layer]
        if pair is None:
            raise RuntimeError(f"layer {layer} of the static cache holds nothing yet")
        return pair[0]

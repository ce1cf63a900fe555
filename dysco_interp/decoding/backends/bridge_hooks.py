"""DySCO's interventions as plain TransformerLens hooks.

Each object is a callable `fn(tensor, hook)` plus a `hooks()` method giving the
`(hook_name, fn)` pairs to pass to `run_with_hooks(fwd_hooks=...)`, to
`bridge.hooks(...)` or to `runtime.step(..., hooks=...)`; they compose with any
other hooks on the same hook points (TransformerLens runs hooks on one point in
the order they were added, each seeing the previous one's output).

- `RelevanceReader` (hook_pattern of H*'s layers): keeps the chosen heads' last
  query row; `attention()` aggregates them onto absolute key positions.
- `BiasWriter` (hook_attn_scores of every layer): adds a float32 bias on absolute
  key positions, sliced to the keys each layer sees (sliding-window layers).
- `LogitScale` (hook_attn_scores of a plan scale's layers): scores / temperature, times the
  log-n factor (a pass's `plan.Scale`; UniAttnS's temperature).

Sliding-window layers (Gemma-3): at decode time their key axis holds only the last
`sliding_window` keys; full layers hold all of them. For the last query row both
cover the LAST keys of the sequence, so rows and biases are right-aligned to the
absolute length `n_keys` (cached + current tokens) that the decode loop announces.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping, Sequence

import torch

from dysco_interp.decoding import relevance
from dysco_interp.decoding.logit_scale import logn_of
from dysco_interp.decoding.plan import Scale
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet
from dysco_interp.hooks import Hook, head_label, head_out_of_range, is_sliding, layer_of, pattern_name, scores_name
from dysco_interp.models import ModelSpec


def _check_width(spec: ModelSpec, layer: int, width: int, n_keys: int, what: str) -> None:
    """A full layer must see every key; a sliding layer at most n_keys (its window's tail)."""
    ok = width <= n_keys if is_sliding(spec, layer) else width == n_keys
    if not ok:
        kind = "sliding-window" if is_sliding(spec, layer) else "full-attention"
        raise ValueError(
            f"{what}: {kind} layer {layer} sees {width} keys but the decode loop announced "
            f"{n_keys} (cached + current tokens); call set_length() with the right length "
            "(an ignored KV cache also shows up here)"
        )


class RelevanceReader:
    """Reads H*'s attention rows (last query row only) during a forward pass.

    Protocol for one forward: `set_length(n_keys)` (absolute number of keys the last
    query sees: cache length + tokens fed), run the forward with `hooks()`, then
    `attention()` -> float32 `[B, n_keys]`, the mean over H* of their rows; each
    sliding layer's row lands on the last positions (others 0). `rows` holds the
    raw per-layer rows `[B, h_l, k_l]` (float32) for analyses.

    `from_scores`: layers whose rows are read from hook_attn_scores instead, as the softmax of
    the scores their hooks have made so far (`score_hooks()`, placed among the other hooks where
    the scores are as the read should see them: a plan's keep reads every key, before its -inf).
    """

    def __init__(self, heads: HeadSet, spec: ModelSpec, from_scores: Iterable[int] = ()):
        for layer, head in heads:
            if head_out_of_range((layer, head), spec.n_layers, spec.n_heads):
                raise ConfigError(
                    f"head {head_label(layer, head)} is outside the model "
                    f"({spec.n_layers} layers x {spec.n_heads} heads)"
                )
        self.spec = spec
        self.heads_by_layer: dict[int, list[int]] = heads.by_layer()
        self._index = {layer: torch.tensor(hs, dtype=torch.long) for layer, hs in self.heads_by_layer.items()}
        self.n_keys: int | None = None
        self.rows: dict[int, torch.Tensor] = {}
        self.from_scores = frozenset(from_scores) & frozenset(self.heads_by_layer)

    @property
    def max_layer(self) -> int:
        return max(self.heads_by_layer)

    def hooks(self) -> list[Hook]:
        """The pattern hooks of the layers not read `from_scores`."""
        return [(pattern_name(layer), self) for layer in self.heads_by_layer if layer not in self.from_scores]

    def score_hooks(self) -> list[Hook]:
        """The score hooks of the `from_scores` layers."""
        return [(scores_name(layer), self.read_scores) for layer in sorted(self.from_scores)]

    def read_scores(self, scores: torch.Tensor, hook) -> None:
        """A `from_scores` layer's rows: the float32 softmax of its scores' last query row."""
        self(scores.float().softmax(dim=-1), hook)

    def set_length(self, n_keys: int) -> None:
        """Announce the absolute key count of the next forward and forget the last rows."""
        if n_keys < 1:
            raise ValueError(f"n_keys must be >= 1, got {n_keys}")
        self.n_keys = int(n_keys)
        self.rows = {}

    def __call__(self, pattern: torch.Tensor, hook) -> None:
        layer = layer_of(hook)
        if self.n_keys is None:
            raise RuntimeError("RelevanceReader: call set_length(n_keys) before each forward pass")
        _check_width(self.spec, layer, pattern.shape[-1], self.n_keys, "RelevanceReader")
        idx = self._index[layer]
        if idx.device != pattern.device:  # move once, not at every step
            idx = self._index[layer] = idx.to(pattern.device)
        # Only the chosen heads and the last query row: [B, h, k]; the pattern is untouched.
        self.rows[layer] = pattern[:, idx, -1, :].float()
        return None

    def attention(self, device: torch.device | str | None = None) -> torch.Tensor:
        """Mean of H*'s rows on absolute positions, float32 `[B, n_keys]` (sums to 1), on
        `device` (None: the shallowest QRHead layer's, which differs on a split model)."""
        missing = [layer for layer in self.heads_by_layer if layer not in self.rows]
        if missing:
            raise RuntimeError(
                f"RelevanceReader saw no pattern for layers {missing}: run at least up to layer "
                f"{self.max_layer} (stop_at_layer={self.max_layer + 1}) with its hooks"
            )
        if self.n_keys is None:
            raise RuntimeError("RelevanceReader: call set_length(n_keys) before each forward pass")
        layers = sorted(self.rows)
        return relevance.aggregate_heads([self.rows[layer] for layer in layers], self.n_keys, device=device)


class BiasWriter:
    """Adds a float32 bias on absolute key positions to the attention scores of some layers.

    `set_bias(bias)` with `[B or 1, 1, 1, n_keys]` (from `relevance.scaling_bias`), or one row
    per head `[B or 1, heads, 1, n_keys]`, or None to pass scores through untouched. Each layer
    gets the bias's last k entries, k being the width of its key axis (all keys on full layers, the window on sliding
    ones). `heads` (layer -> query heads) limits a layer to those heads; a layer it does not
    name gets every head. Scores are returned in float32 (a bf16 sum would round log(beta) away).
    """

    def __init__(self, spec: ModelSpec, layers: Iterable[int] | None = None,
                 heads: Mapping[int, Sequence[int]] | None = None):
        self.spec = spec
        self.layers = tuple(range(spec.n_layers) if layers is None else layers)
        self.heads = {layer: torch.tensor(list(hs), dtype=torch.long) for layer, hs in (heads or {}).items()}
        self.bias: torch.Tensor | None = None

    def hooks(self) -> list[Hook]:
        return [(scores_name(layer), self) for layer in self.layers]

    def set_bias(self, bias: torch.Tensor | None) -> None:
        if bias is not None and (bias.ndim != 4 or bias.shape[1] not in (1, self.spec.n_heads) or bias.shape[2] != 1):
            raise ValueError(f"bias must be [batch, 1 or n_heads, 1, n_keys], got {tuple(bias.shape)}")
        self.bias = None if bias is None else bias.float()

    def __call__(self, scores: torch.Tensor, hook) -> torch.Tensor:
        if self.bias is None:
            return scores
        layer = layer_of(hook)
        width, n_keys = scores.shape[-1], self.bias.shape[-1]
        _check_width(self.spec, layer, width, n_keys, "BiasWriter")
        bias = relevance.window_slice(self.bias, width).to(scores.device)
        heads = self.heads.get(layer)
        if heads is None:
            return scores.float() + bias
        out = scores.float()
        index = heads.to(scores.device)
        out[:, index] += bias[:, index] if bias.shape[1] > 1 else bias
        return out


class LogitScale:
    """A `plan.Scale` on the scores of its layers (and heads): `scores / temperature`, times the
    log-n factor of each query's key count.

    Shape-agnostic, so it works in prefill (through the hooked bridge) and decoding. Log-n needs
    each query's absolute position: `at(first)` announces the first one of the next forward (one
    prompt, no pads, as the bridge runs them); a sliding-window layer's key axis cannot tell it.
    """

    def __init__(self, spec: ModelSpec, scale: Scale):
        self.spec, self.scale = spec, scale
        self.chosen = {layer: torch.tensor(scale.heads_in(layer) or (), dtype=torch.long) for layer in scale.layers} \
            if scale.heads is not None else {}
        self.first: int | None = None

    def at(self, first: int) -> "LogitScale":
        """The absolute position of the next forward's first query."""
        self.first = first
        return self

    @classmethod
    def temperature(cls, spec: ModelSpec, tau: float) -> "LogitScale":
        """Every head of every layer at temperature `tau` (UniAttnS)."""
        return cls(spec, Scale(range(spec.n_layers), temperature=tau))

    def hooks(self) -> list[Hook]:
        return [(scores_name(layer), self) for layer in self.scale.layers]

    def __call__(self, scores: torch.Tensor, hook) -> torch.Tensor:
        scale = self.scale
        logn = None
        if scale.log_n is not None:
            if self.first is None:
                raise RuntimeError("LogitScale: announce the first query's position with at() before a log-n forward")
            counts = torch.arange(self.first + 1, self.first + scores.shape[-2] + 1, device=scores.device)
            logn = logn_of(scale, counts[None])
        chosen = self.chosen.get(layer_of(hook))
        if chosen is None:
            out = scores / scale.temperature if scale.temperature != 1.0 else scores
            if logn is not None:
                out = out * logn.to(scores.dtype)
        else:
            index = chosen.to(scores.device)
            part = scores[:, index] / scale.temperature
            if logn is not None:
                part = part * logn.to(scores.dtype)
            out = scores.clone()
            out[:, index] = part
        # Keep masked keys at the dtype's minimum: with a temperature below 1 they would overflow
        # to -inf, and a fully masked row (a left pad's query) would softmax to NaN.
        return out.clamp_min(torch.finfo(scores.dtype).min)


def AttentionTemperature(spec: ModelSpec, tau: float) -> LogitScale:  # noqa: N802 (the old class's name)
    """UniAttnS's temperature as a hook: deprecated, use `LogitScale.temperature(spec, tau)`."""
    import warnings

    warnings.warn("AttentionTemperature is deprecated and goes in the next release: use "
                  "LogitScale.temperature(spec, tau) or a plan.Scale", DeprecationWarning, stacklevel=2)
    if isinstance(tau, bool) or not (isinstance(tau, (int, float)) and math.isfinite(tau) and tau > 0):
        raise ConfigError(f"attention temperature tau must be a finite number > 0, got {tau!r}")
    return LogitScale.temperature(spec, tau)


__all__ = ["AttentionTemperature", "BiasWriter", "LogitScale", "RelevanceReader"]

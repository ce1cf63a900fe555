"""Analytic FLOPs of vanilla decoding and of DySCO's extra work (forward pass only).

Convention: a multiply-add is 2 FLOPs. Counted: the attention projections (Q, K, V, O),
the MLP matrices, attention over the KV cache (q.K and the weighted sum of V), and the
unembedding. Left out as small next to these: embedding lookup, norms, rotary
embeddings, activations, residual adds and the softmax of ordinary attention.

Prefill computes logits for its last position only (the full-vocabulary logits of a long
prompt are never needed). Decode step j (1-based) of a prompt of n tokens attends
n + j keys, its own included.

DySCO's extra work per decode step, as this package runs it:
- partial pass: full blocks 0..L* (L* = deepest QRHead layer) over the same cache,
  no final norm and no unembedding;
- relevance: q.K, softmax and the mean over the |H*| QRHeads, plus the momentum update.
  An eager backend reads these rows from the partial pass for free; a fused (flash)
  backend must recompute them, so this term is an upper bound (and tiny);
- selection: sorting the relevance vector (counted as n * ceil(log2 n) comparisons)
  and its cumulative sum;
- bias: adding log(beta) to every head's scores in every layer of the rescaled pass.
Warm-up steps (T_w context tokens and the generation-prompt tokens) are not counted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from dysco_interp.errors import ConfigError

SOFTMAX_OPS_PER_SCORE = 3  # subtract max / exp, sum, divide
MOMENTUM_OPS_PER_KEY = 3  # r = (a + d * r_prev) / (1 + d)


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
    return value


@dataclass(frozen=True)
class ModelShape:
    """The dimensions that set a decoder-only transformer's FLOPs."""

    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_mlp: int
    vocab: int
    mlp_matrices: int = 3  # gated MLP (gate, up, down); 2 for a plain two-matrix MLP
    name: str = ""

    def __post_init__(self):
        for f in ("n_layers", "d_model", "n_heads", "n_kv_heads", "d_head", "d_mlp", "vocab"):
            _positive_int(f, getattr(self, f))
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        if self.mlp_matrices not in (2, 3):
            raise ConfigError(f"mlp_matrices must be 2 or 3, got {self.mlp_matrices!r}")

    @classmethod
    def from_hf_config(cls, config: Any, name: str = "") -> ModelShape:
        """From a transformers config object or its config.json dict (Llama/Qwen/Gemma style)."""
        get: Callable[..., Any] = (config.get if isinstance(config, Mapping)
                                   else lambda k, d=None: getattr(config, k, d))
        try:
            n_heads = get("num_attention_heads")
            d_model = get("hidden_size")
            return cls(
                n_layers=get("num_hidden_layers"),
                d_model=d_model,
                n_heads=n_heads,
                n_kv_heads=get("num_key_value_heads") or n_heads,
                d_head=get("head_dim") or d_model // n_heads,
                d_mlp=get("intermediate_size"),
                vocab=get("vocab_size"),
                name=name,
            )
        except TypeError:
            raise ConfigError(f"model config of {name or 'the model'} lacks a size field") from None

    def as_dict(self) -> dict:
        return asdict(self)


def projection_flops(s: ModelShape) -> int:
    """Q, K, V and O projections for one token in one layer (GQA: K and V are n_kv_heads wide)."""
    return 2 * s.d_model * s.d_head * (2 * s.n_heads + 2 * s.n_kv_heads)


def mlp_flops(s: ModelShape) -> int:
    return 2 * s.mlp_matrices * s.d_model * s.d_mlp


def attention_flops(s: ModelShape, n_keys: int) -> int:
    """q.K and the weighted sum of V for one query token over n_keys keys, in one layer."""
    return 4 * s.n_heads * s.d_head * n_keys


def unembed_flops(s: ModelShape) -> int:
    return 2 * s.d_model * s.vocab


def layer_flops(s: ModelShape, n_keys: int) -> int:
    return projection_flops(s) + mlp_flops(s) + attention_flops(s, n_keys)


def decode_token_flops(s: ModelShape, n_keys: int) -> int:
    """One vanilla decode step whose token attends n_keys keys (its own included)."""
    _positive_int("n_keys", n_keys)
    return s.n_layers * layer_flops(s, n_keys) + unembed_flops(s)


def prefill_flops(s: ModelShape, n_tokens: int) -> int:
    """A causal forward over n_tokens (token i attends i keys), logits for the last only."""
    n = _positive_int("n_tokens", n_tokens)
    dense = n * (projection_flops(s) + mlp_flops(s))
    attn = 4 * s.n_heads * s.d_head * n * (n + 1) // 2
    return s.n_layers * (dense + attn) + unembed_flops(s)


def decode_flops(s: ModelShape, n_prompt: int, n_new: int) -> int:
    """n_new vanilla decode steps after an n_prompt-token prefill (closed form of the sum)."""
    n, m = _positive_int("n_prompt", n_prompt), _positive_int("n_new", n_new)
    keys = m * n + m * (m + 1) // 2  # sum of n + j for j = 1..m
    dense = m * (s.n_layers * (projection_flops(s) + mlp_flops(s)) + unembed_flops(s))
    return dense + s.n_layers * 4 * s.n_heads * s.d_head * keys


@dataclass(frozen=True)
class DyscoExtra:
    """DySCO's work beyond a vanilla step (or summed over steps), by part."""

    partial: int
    relevance: int
    selection: int
    bias: int

    @property
    def total(self) -> int:
        return self.partial + self.relevance + self.selection + self.bias

    def __add__(self, other: DyscoExtra) -> DyscoExtra:
        return DyscoExtra(self.partial + other.partial, self.relevance + other.relevance,
                          self.selection + other.selection, self.bias + other.bias)

    def as_dict(self) -> dict:
        return {**asdict(self), "total": self.total}


def _check_heads(s: ModelShape, deepest_layer: int, n_qr_heads: int) -> None:
    if isinstance(deepest_layer, bool) or not isinstance(deepest_layer, int) or not 0 <= deepest_layer < s.n_layers:
        raise ConfigError(f"deepest QRHead layer must be in 0..{s.n_layers - 1}, got {deepest_layer!r}")
    if isinstance(n_qr_heads, bool) or not isinstance(n_qr_heads, int) or not 1 <= n_qr_heads <= s.n_layers * s.n_heads:
        raise ConfigError(f"number of QRHeads must be in 1..{s.n_layers * s.n_heads}, got {n_qr_heads!r}")


def selection_ops(n_keys: int) -> int:
    """Sort of the relevance vector (n * ceil(log2 n) comparisons) plus its cumulative sum."""
    n = _positive_int("n_keys", n_keys)
    return n * (n - 1).bit_length() + n


def dysco_extra_token(s: ModelShape, n_keys: int, deepest_layer: int, n_qr_heads: int) -> DyscoExtra:
    """DySCO's extra work for one decode step over n_keys keys."""
    _positive_int("n_keys", n_keys)
    _check_heads(s, deepest_layer, n_qr_heads)
    return DyscoExtra(
        partial=(deepest_layer + 1) * layer_flops(s, n_keys),
        relevance=n_qr_heads * (2 * s.d_head + SOFTMAX_OPS_PER_SCORE + 1) * n_keys + MOMENTUM_OPS_PER_KEY * n_keys,
        selection=selection_ops(n_keys),
        bias=s.n_layers * s.n_heads * n_keys,
    )


def dysco_extra_flops(s: ModelShape, n_prompt: int, n_new: int, deepest_layer: int, n_qr_heads: int) -> DyscoExtra:
    """DySCO's extra work summed over n_new decode steps after an n_prompt-token prefill."""
    n, m = _positive_int("n_prompt", n_prompt), _positive_int("n_new", n_new)
    _check_heads(s, deepest_layer, n_qr_heads)
    keys = m * n + m * (m + 1) // 2
    per_key = dysco_extra_token(s, 1, deepest_layer, n_qr_heads)
    fixed = (deepest_layer + 1) * (projection_flops(s) + mlp_flops(s))
    per_key_partial = per_key.partial - fixed  # the attention part grows with the keys
    return DyscoExtra(
        partial=m * fixed + per_key_partial * keys,
        relevance=per_key.relevance * keys,
        selection=sum(selection_ops(n + j) for j in range(1, m + 1)),
        bias=per_key.bias * keys,
    )


def overhead(s: ModelShape, n_prompt: int, n_new: int, deepest_layer: int, n_qr_heads: int) -> dict:
    """Vanilla prefill and decode FLOPs, DySCO's extra, and the ratios a reader wants."""
    prefill = prefill_flops(s, n_prompt)
    decode = decode_flops(s, n_prompt, n_new)
    extra = dysco_extra_flops(s, n_prompt, n_new, deepest_layer, n_qr_heads)
    first, last = n_prompt + 1, n_prompt + n_new
    return {
        "n_prompt": n_prompt,
        "n_new": n_new,
        "deepest_layer": deepest_layer,
        "partial_layers": deepest_layer + 1,
        "n_qr_heads": n_qr_heads,
        "prefill_flops": prefill,
        "decode_flops": decode,
        "dysco_extra_flops": extra.as_dict(),
        "extra_per_token": extra.total / n_new,
        "decode_ratio": (decode + extra.total) / decode,
        "token_ratio_first": 1 + dysco_extra_token(s, first, deepest_layer, n_qr_heads).total
        / decode_token_flops(s, first),
        "token_ratio_last": 1 + dysco_extra_token(s, last, deepest_layer, n_qr_heads).total
        / decode_token_flops(s, last),
        "extra_share_of_total": extra.total / (prefill + decode),
    }

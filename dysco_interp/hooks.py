"""One vocabulary for hook points, layers and heads, in TransformerLens's conventions.

Hook names are TransformerLens's (`blocks.{layer}.attn.hook_pattern`, ...); heads are
`(layer, head)` pairs labelled `L{layer}H{head}`; per-head score tensors are
`[n_layers, n_heads]` with -1 where a head was not scored. Everything that names a hook,
reads a layer back from one, labels a head or asks which layers use a sliding window
goes through here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Head = tuple[int, int]
HookFn = Callable[..., Any]
Hook = tuple[str, HookFn]  # (hook point name, fn(tensor, hook)), as `run_with_hooks` takes them

NOT_SCORED = -1.0  # entry of a [n_layers, n_heads] score tensor for a head that was not scored


def act_name(layer: int, point: str) -> str:
    """`blocks.{layer}.{point}`, e.g. act_name(3, "attn.hook_pattern")."""
    return f"blocks.{layer}.{point}"


def pattern_name(layer: int) -> str:
    """The hook point of layer `layer`'s attention probabilities `[batch, heads, query, key]`."""
    return act_name(layer, "attn.hook_pattern")


def scores_name(layer: int) -> str:
    """The hook point of layer `layer`'s pre-softmax attention scores."""
    return act_name(layer, "attn.hook_attn_scores")


def layer_of(hook: Any) -> int:
    """The layer of a hook point, from its name ('blocks.L....') or a HookPoint with `.name`."""
    name = hook if isinstance(hook, str) else hook.name
    parts = name.split(".")
    if len(parts) < 2 or parts[0] != "blocks" or not parts[1].isdigit():
        raise ValueError(f"{name!r} is not a per-layer hook point ('blocks.<layer>. ...')")
    return int(parts[1])


def head_label(layer: int, head: int) -> str:
    """TransformerLens label of a head: 'L{layer}H{head}'."""
    return f"L{layer}H{head}"


def is_sliding(spec: Any, layer: int) -> bool:
    """Whether `layer` attends through a sliding window (Gemma-3 style); `spec` is a ModelSpec."""
    return spec.sliding_window is not None and spec.layer_types[layer] == "sliding_attention"


def sliding_layers(spec: Any) -> list[int]:
    """Layers with sliding-window attention; empty for full-attention models."""
    return [layer for layer in range(spec.n_layers) if is_sliding(spec, layer)]


def head_out_of_range(head: Head, n_layers: int, n_heads: int) -> bool:
    layer, index = head
    return not (0 <= layer < n_layers and 0 <= index < n_heads)

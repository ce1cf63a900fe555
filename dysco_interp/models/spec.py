"""`ModelSpec`: a model's geometry (layers, query and KV heads, widths, sliding-window
layers), its context length and its chat template, read from an HF config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PretrainedConfig


@dataclass(frozen=True)
class ModelSpec:
    """What analyses need to know about a model's geometry and prompt format."""

    name: str
    architecture: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_model: int
    context_length: int
    layer_types: tuple[str, ...]
    sliding_window: int | None
    chat_template: str | None

    @property
    def group_size(self) -> int:
        """Query heads per KV head (GQA): head h reads KV head h // group_size."""
        return self.n_heads // self.n_kv_heads

    @classmethod
    def from_hf_config(cls, name: str, config: PretrainedConfig, chat_template: str | None) -> ModelSpec:
        """The spec of an HF causal-LM config (GQA, head width and layer types default as HF does)."""
        n_heads = config.num_attention_heads
        d_model = config.hidden_size
        n_layers = config.num_hidden_layers
        layer_types = tuple(getattr(config, "layer_types", None) or ["full_attention"] * n_layers)
        return cls(
            name=name,
            architecture=(config.architectures or [type(config).__name__])[0],
            n_layers=n_layers,
            n_heads=n_heads,
            n_kv_heads=getattr(config, "num_key_value_heads", None) or n_heads,
            d_head=getattr(config, "head_dim", None) or d_model // n_heads,
            d_model=d_model,
            context_length=int(config.max_position_embeddings),
            layer_types=layer_types,
            sliding_window=getattr(config, "sliding_window", None)
            if "sliding_attention" in layer_types
            else None,
            chat_template=chat_template,
        )

"""Which prompt tokens belong to the chat template (never selected by DySCO).

A token is a template token when its characters touch no message content: BOS,
role headers, end-of-turn markers, a default system prompt the template adds, and
the generation prompt (assistant header, an empty `<think>\n\n</think>` block).
Message contents are located in the rendered text in order; a token that overlaps
a content span even partly (a BPE merge across the boundary) counts as content.
Generated tokens are never template tokens: `extend_mask` pads with False.

Contents are located by `dysco_interp.chat.content_spans` (exact with the tokenizer).
"""

from __future__ import annotations

import torch

from dysco_interp.chat import EncodedPrompt, Messages, content_spans


def template_positions(
    encoded: EncodedPrompt,
    messages: str | Messages,
    tokenizer=None,
    enable_thinking: bool | None = None,
) -> torch.Tensor:
    """Bool `[len(encoded)]`: True for chat-template tokens, False for content tokens."""
    spans = content_spans(encoded, messages, tokenizer, enable_thinking)
    offsets = torch.tensor(encoded.offsets, dtype=torch.long).reshape(-1, 2)
    template = torch.ones(len(encoded), dtype=torch.bool)
    for start, end in spans:  # one pass per message, vectorised over tokens
        if end > start:
            template &= ~((offsets[:, 0] < end) & (offsets[:, 1] > start))
    return template


def extend_mask(mask: torch.Tensor, n_keys: int) -> torch.Tensor:
    """Pad a prompt mask `[..., n_prompt]` with False up to n_keys (generated tokens)."""
    n_prompt = mask.shape[-1]
    if n_keys < n_prompt:
        raise ValueError(f"cannot extend a mask of {n_prompt} prompt positions to {n_keys}")
    return torch.nn.functional.pad(mask.to(torch.bool), (0, n_keys - n_prompt), value=False)

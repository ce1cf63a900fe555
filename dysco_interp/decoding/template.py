"""Which prompt tokens belong to the chat template (never selected by DySCO).

A token is a template token when its characters touch no message content: BOS,
role headers, end-of-turn markers, a default system prompt the template adds, and
the generation prompt (assistant header, an empty `<think>\n\n</think>` block).
Message contents are located in the rendered text in order; a token that overlaps
a content span even partly (a BPE merge across the boundary) counts as content.
Generated tokens are never template tokens: `extend_mask` pads with False.

Locating contents: with the tokenizer, the template is rendered once more with a
unique placeholder per message, which gives the exact template text before each
content (robust to contents that also occur in the template, e.g. a message
"user" or "You are a helpful assistant."). Without it, each content is searched
forward from the end of the previous one, which is exact unless a content also
appears in the template text just before it. Templates that trim contents
(`| trim`) are handled by also trying the stripped content.
"""

from __future__ import annotations

import torch

from dysco_interp.chat import EncodedPrompt, Messages, as_messages, render_chat

# Private-use code points: no template trims, escapes or tests for them.
_OPEN, _CLOSE = "\ue000", "\ue001"


def _variants(content: str) -> list[str]:
    """The content as a template may render it: verbatim, then trimmed forms."""
    out = [content]
    for v in (content.strip(), content.rstrip(), content.lstrip()):
        if v not in out:
            out.append(v)
    return out


def _spans_by_search(text: str, contents: list[str]) -> list[tuple[int, int]]:
    spans, cursor = [], 0
    for i, content in enumerate(contents):
        for variant in _variants(content):
            start = text.find(variant, cursor)
            if start >= 0:
                break
        else:
            raise ValueError(
                f"message {i}'s content was not found in the rendered prompt (after character "
                f"{cursor}); was the prompt encoded from these messages?"
            )
        spans.append((start, start + len(variant)))
        cursor = start + len(variant)
    return spans


def content_spans(
    encoded: EncodedPrompt,
    messages: str | Messages,
    tokenizer=None,
    enable_thinking: bool | None = None,
) -> list[tuple[int, int]]:
    """Character spans `[start, end)` of each message's content in `encoded.text`, in order.

    Pass the tokenizer (and the `enable_thinking` used to encode) for exact spans.
    """
    msgs = as_messages(messages)
    contents = [str(m.get("content", "")) for m in msgs]
    if tokenizer is not None:
        spans = _skeleton_spans(encoded.text, msgs, contents, tokenizer, enable_thinking)
        if spans is not None:
            return spans
    return _spans_by_search(encoded.text, contents)


def _skeleton_spans(
    text: str, msgs: Messages, contents: list[str], tokenizer, enable_thinking: bool | None
) -> list[tuple[int, int]] | None:
    marks = [f"{_OPEN}{i}{_CLOSE}" for i in range(len(msgs))]
    skeleton = render_chat(tokenizer, [dict(m, content=k) for m, k in zip(msgs, marks)], True, enable_thinking)
    # The template text between placeholders; every placeholder must appear once, in order.
    pieces, rest = [], skeleton
    for mark in marks:
        before, found, rest = rest.partition(mark)
        if not found:
            return None
        pieces.append(before)
    pieces.append(rest)
    spans, cursor = [], 0
    for piece, content in zip(pieces, contents):
        if not text.startswith(piece, cursor):
            return None
        cursor += len(piece)
        variant = next((v for v in _variants(content) if text.startswith(v, cursor)), None)
        if variant is None:
            return None
        spans.append((cursor, cursor + len(variant)))
        cursor += len(variant)
    if text[cursor:] != pieces[-1]:
        return None
    return spans


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

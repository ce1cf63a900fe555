"""Chat-template encoding with exact character offsets, and where each message's text lies.

Every prompt goes through `encode_chat`, so task spans (characters of the rendered
text) map onto exactly the token ids the model sees. `content_spans` is the one way to
find the message contents in a rendered chat (task spans, DySCO's template-token mask).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from functools import cached_property

Messages = list[dict[str, str]]
Span = tuple[int, int]

# Private-use code points: no template trims, escapes or tests for them.
_OPEN, _CLOSE = "\ue000", "\ue001"


def as_messages(prompt_or_messages: str | Messages) -> Messages:
    """A bare string becomes one user turn."""
    if isinstance(prompt_or_messages, str):
        return [{"role": "user", "content": prompt_or_messages}]
    if not prompt_or_messages:
        raise ValueError("empty message list")
    return list(prompt_or_messages)


def render_chat(
    tokenizer, messages: str | Messages, add_generation_prompt: bool = True, enable_thinking: bool | None = None
) -> str:
    """The prompt text the chat template produces (no tokenization)."""
    kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("tokenizer has no chat template; pass raw token ids instead")
    return tokenizer.apply_chat_template(
        as_messages(messages), add_generation_prompt=add_generation_prompt, tokenize=False, **kwargs
    )


@dataclass(frozen=True)
class EncodedPrompt:
    """Token ids of a rendered chat prompt, with per-token character offsets."""

    text: str
    input_ids: tuple[int, ...]
    offsets: tuple[tuple[int, int], ...]
    n_generation_prompt: int  # tokens added by add_generation_prompt (assistant header etc.)

    def __len__(self) -> int:
        return len(self.input_ids)

    def token_span(self, char_start: int, char_end: int) -> tuple[int, int]:
        """Half-open token range [start, end) covering characters [char_start, char_end)."""
        if not 0 <= char_start < char_end <= len(self.text):
            raise ValueError(f"character span ({char_start}, {char_end}) is outside the prompt")
        # first token ending after char_start; last token starting before char_end
        start = bisect.bisect_right(self._ends, char_start)
        end = bisect.bisect_left(self._starts, char_end)
        return start, end

    @cached_property
    def _starts(self) -> list[int]:
        return [a for a, _ in self.offsets]

    @cached_property
    def _ends(self) -> list[int]:
        return [b for _, b in self.offsets]


def encode_text(tokenizer, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Ids and offsets of already-rendered text; special tokens come from the text itself."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]


def encode_chat(tokenizer, messages: str | Messages, enable_thinking: bool | None = None) -> EncodedPrompt:
    """Encode with the chat template and `add_generation_prompt=True`."""
    text = render_chat(tokenizer, messages, True, enable_thinking)
    ids, offsets = encode_text(tokenizer, text)
    without = render_chat(tokenizer, messages, False, enable_thinking)
    if not text.startswith(without):
        raise ValueError("the chat template's generation prompt is not a suffix of the prompt")
    n_without = len(encode_text(tokenizer, without)[0])
    return EncodedPrompt(text, tuple(ids), tuple(offsets), len(ids) - n_without)


def count_chat_tokens(tokenizer, messages: str | Messages, enable_thinking: bool | None = None) -> int:
    """len(encode_chat(...)) for one render and one encode: what length searches measure."""
    return len(encode_text(tokenizer, render_chat(tokenizer, messages, True, enable_thinking))[0])


def content_spans(
    encoded: EncodedPrompt,
    messages: str | Messages,
    tokenizer=None,
    enable_thinking: bool | None = None,
) -> list[Span]:
    """Character spans `[start, end)` of each message's content in `encoded.text`, in order.

    With the tokenizer (and the `enable_thinking` used to encode), the template is rendered
    once more with a unique placeholder per message, which gives the exact template text
    before each content: robust to contents that also occur in the template (a message
    "user", or "You are a helpful assistant."). Without it, or when the placeholders do not
    come back in order, each content is searched forward from the end of the previous one,
    so repeated identical messages map to their own occurrences; that is exact unless a
    content also appears in the template text just before it. Templates that trim contents
    (`| trim`) are handled by also trying the trimmed content. ValueError when a content is
    not in the text.
    """
    msgs = as_messages(messages)
    contents = [str(m.get("content", "")) for m in msgs]
    if tokenizer is not None:
        spans = _skeleton_spans(encoded.text, msgs, contents, tokenizer, enable_thinking)
        if spans is not None:
            return spans
    return _spans_by_search(encoded.text, contents)


def _variants(content: str) -> list[str]:
    """The content as a template may render it: verbatim, then trimmed forms."""
    out = [content]
    for v in (content.strip(), content.rstrip(), content.lstrip()):
        if v not in out:
            out.append(v)
    return out


def _spans_by_search(text: str, contents: list[str]) -> list[Span]:
    spans, cursor = [], 0
    for i, content in enumerate(contents):
        for variant in _variants(content):
            start = text.find(variant, cursor)
            if start >= 0:
                break
        else:
            raise ValueError(
                f"message {i}'s content was not found in the rendered prompt (after character "
                f"{cursor}); was the prompt encoded from these messages, or does the chat template "
                "rewrite message contents?"
            )
        spans.append((start, start + len(variant)))
        cursor = start + len(variant)
    return spans


def _skeleton_spans(
    text: str, msgs: Messages, contents: list[str], tokenizer, enable_thinking: bool | None
) -> list[Span] | None:
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


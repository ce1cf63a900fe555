"""Chat-template encoding with exact character offsets.

Every prompt goes through `encode_chat`, so task spans (characters of the rendered
text) map onto exactly the token ids the model sees.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from functools import cached_property

Messages = list[dict[str, str]]


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

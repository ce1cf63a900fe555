"""Which prompt tokens belong to the chat template (never selected by DySCO), in three modes.

- "reference" (the default of the official DySCO code): tokens inside an occurrence of
  one of the token sequences that code lists per chat family, wherever they occur in the
  prompt: ChatML's `<|im_start|>ROLE\\n` and empty think block `<think>\\n\\n</think>\\n\\n`;
  Llama-3's `<|begin_of_text|>`, the system header, and the user and assistant headers
  each with its leading `<|eot_id|>`. The system prompt's text, ChatML's `<|im_end|>\\n`
  and Llama-3's first `<|eot_id|>`-less user header stay selectable. The sequences are data:
  `template_sequences.json` beside this file. For a tokenizer of no listed family
  (`chat_family` is None, e.g. Gemma-3), `reference_positions` returns None and
  `template_mask` falls back to "skeleton" with a `TemplateMaskingFallbackWarning`
  (shown once per model under Python's default warning filter).
- "skeleton": every token whose characters touch no message content: BOS, role headers,
  end-of-turn markers, a default system prompt the template adds, and the generation
  prompt. Message contents are located in the rendered text in order
  (`dysco_interp.chat.content_spans`, exact with the tokenizer); a token that overlaps a
  content span even partly (a BPE merge across the boundary) counts as content.
- "off": no token is masked.

Generated tokens are never template tokens: `extend_mask` pads with False.
"""

from __future__ import annotations

import json
import warnings
from functools import lru_cache
from importlib import resources
from typing import Any, cast

import torch

from dysco_interp.chat import EncodedPrompt, Messages, content_spans
from dysco_interp.checks import check_choice
from dysco_interp.decoding.choices import MASKING_MODES, TemplateMasking
from dysco_interp.errors import ConfigError


class TemplateMaskingFallbackWarning(UserWarning):
    """Mode "reference" met a chat template of no known family and used "skeleton" instead."""


@lru_cache(maxsize=1)
def _families() -> dict[str, dict[str, Any]]:
    text = resources.files("dysco_interp.decoding").joinpath("template_sequences.json").read_text(encoding="utf-8")
    return json.loads(text)["families"]


def chat_families() -> tuple[str, ...]:
    """The chat families whose template sequences are known, in the order they are tried."""
    return tuple(_families())


def template_sequences(family: str) -> tuple[str, ...]:
    """The token sequences (as text) that mode "reference" masks for a chat family."""
    if family not in _families():
        raise ConfigError(f"unknown chat family {family!r}; known: {', '.join(chat_families())}")
    return tuple(_families()[family]["sequences"])


def _is_one_token(tokenizer, text: str) -> bool:
    token_id = tokenizer.convert_tokens_to_ids(text)
    return isinstance(token_id, int) and token_id != tokenizer.unk_token_id


def chat_family(tokenizer) -> str | None:
    """The family (a key of `template_sequences.json`) the tokenizer's chat template belongs to.

    A family matches when each of its markers (e.g. `<|im_start|>` and `<|im_end|>` for
    ChatML) is a single token of the vocabulary and occurs in the chat template's source.
    Both are needed: a vocabulary may hold another family's special tokens unused. None
    for no tokenizer, no chat template, or a template of no listed family.
    """
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # several named templates: the one used by default
        template = template.get("default")
    if not isinstance(template, str):
        return None
    for name, family in _families().items():
        if all(marker in template and _is_one_token(tokenizer, marker) for marker in family["markers"]):
            return name
    return None


def sequence_positions(encoded: EncodedPrompt, sequences: tuple[str, ...] | list[str]) -> torch.Tensor:
    """Bool `[len(encoded)]`: True for tokens lying inside an occurrence of one of `sequences`.

    Matched on characters (`encoded.text` and `encoded.offsets`), so a BPE merge inside a
    sequence changes nothing. A token is masked when all its characters lie in occurrences;
    a token straddling an occurrence's edge and other text is not. A zero-width token is
    masked when the characters on both sides of it are.
    """
    text = encoded.text
    covered = torch.zeros(len(text) + 2, dtype=torch.bool)  # character i at index i + 1
    for sequence in sequences:
        start = text.find(sequence) if sequence else -1
        while start >= 0:
            covered[start + 1 : start + 1 + len(sequence)] = True
            start = text.find(sequence, start + 1)
    offsets = torch.tensor(encoded.offsets, dtype=torch.long).reshape(-1, 2)
    begin, end = offsets[:, 0], offsets[:, 1]
    count = torch.cat([torch.zeros(1, dtype=torch.long), covered.long().cumsum(0)])  # count[j] = covered[:j].sum()
    whole = (end > begin) & (count[end + 1] - count[begin + 1] == end - begin)
    zero_width = (end == begin) & covered[begin] & covered[begin + 1]
    return whole | zero_width


def reference_positions(encoded: EncodedPrompt, tokenizer) -> torch.Tensor | None:
    """Bool `[len(encoded)]`: the template tokens the official DySCO code never selects.

    True for tokens inside an occurrence of one of the family's sequences
    (`template_sequences(chat_family(tokenizer))`), anywhere in the prompt, message contents
    included (as the reference code, which matches token ids, would). Llama-3 lists its user
    header only with a leading `<|eot_id|>`, so a user header right after
    `<|begin_of_text|>` (no system turn) stays selectable: faithful to that code.

    Returns None when the tokenizer's template is of no listed family; `template_mask`
    then falls back to the "skeleton" mask.
    """
    family = chat_family(tokenizer)
    if family is None:
        return None
    return sequence_positions(encoded, template_sequences(family))


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


def check_masking_mode(mode: object) -> TemplateMasking:
    """The mode itself; ConfigError for anything but one of `MASKING_MODES`."""
    return cast(TemplateMasking, check_choice("template masking", mode, MASKING_MODES))


def template_mask(
    encoded: EncodedPrompt,
    messages: str | Messages,
    tokenizer=None,
    enable_thinking: bool | None = None,
    mode: TemplateMasking = "reference",
) -> torch.Tensor:
    """Bool `[len(encoded)]`: the prompt positions DySCO never selects, in the given mode.

    "reference": `reference_positions`; for a template of no listed family (or no
    tokenizer) it warns (`TemplateMaskingFallbackWarning`) and uses "skeleton".
    "skeleton": `template_positions`. "off": all False. ConfigError for another mode.
    """
    check_masking_mode(mode)
    if mode == "off":
        return torch.zeros(len(encoded), dtype=torch.bool)
    if mode == "reference":
        mask = reference_positions(encoded, tokenizer)
        if mask is not None:
            return mask
        warn_fallback(tokenizer, stacklevel=3)
    return template_positions(encoded, messages, tokenizer, enable_thinking)


def warn_fallback(tokenizer, stacklevel: int = 2) -> None:
    """The `TemplateMaskingFallbackWarning` for a template of no listed family (once per model name)."""
    name = getattr(tokenizer, "name_or_path", None) or type(tokenizer).__name__
    warnings.warn(
        f"the chat template of {name!r} is of no family DySCO's reference code lists "
        f"({', '.join(chat_families())}); template masking 'reference' falls back to 'skeleton' "
        "(every token outside the message contents)",
        TemplateMaskingFallbackWarning,
        stacklevel=stacklevel,
    )


def extend_mask(mask: torch.Tensor, n_keys: int) -> torch.Tensor:
    """Pad a prompt mask `[..., n_prompt]` with False up to n_keys (generated tokens)."""
    n_prompt = mask.shape[-1]
    if n_keys < n_prompt:
        raise ValueError(f"cannot extend a mask of {n_prompt} prompt positions to {n_keys}")
    return torch.nn.functional.pad(mask.to(torch.bool), (0, n_keys - n_prompt), value=False)

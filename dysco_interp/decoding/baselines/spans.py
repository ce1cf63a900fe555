"""Where a method's texts sit in a prompt: the tokens of given texts, of the last message, of its
lines or sentences. InstABoost, PASTA and QR-PASTA find what they boost or emphasise here.

Each helper takes one `PreparedPrompt` (`row`: its index in the batch, for errors) and the
method's name (for errors, which are one `ConfigError` line naming the prompt), and answers with
token positions of that prompt, before any left padding.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Literal

import torch

from dysco_interp.checks import brief
from dysco_interp.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Iterator

    from dysco_interp.decoding.prompts import PreparedPrompt, PromptBatch

Unit = Literal["line", "sentence"]
UNITS: tuple[Unit, ...] = ("line", "sentence")
# a sentence ends at . ! or ? (closing quotes and brackets kept with it) before white space
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+")


def text_rows(batch: PromptBatch, method: str, why: str) -> Iterator[tuple[int, PreparedPrompt, int]]:
    """(row, prepared prompt, left pad) of each prompt of `batch`; a ConfigError naming `method`
    and `why` it needs text (a batch of token ids has no characters to find anything by)."""
    if batch.prepared is None:
        raise ConfigError(f"method {method!r} {why}: decode text or chat prompts, not a batch of token ids")
    for row, (prepared, pad) in enumerate(zip(batch.prepared, batch.pads)):
        yield row, prepared, pad


def occurrences(prepared: PreparedPrompt, text: str, what: str, row: int, method: str) -> torch.Tensor:
    """Bool `[n_prompt]`: the tokens covering every occurrence of `text` in the rendered prompt;
    a ConfigError (`what`: the parameter's role in the words) when there is none."""
    found = torch.zeros(len(prepared.ids), dtype=torch.bool)
    at = prepared.text.find(text)
    if at < 0:
        raise ConfigError(f"{method}: the {what} text {brief(text)} is not in prompt #{row}")
    while at >= 0:
        start, end = prepared.encoded.token_span(at, at + len(text))
        found[start:end] = True
        at = prepared.text.find(text, at + len(text))
    if not found.any():
        raise ConfigError(f"{method}: the {what} text {brief(text)} covers no token of prompt #{row} "
                          "(a prompt given as token ids has no characters to find it by)")
    return found


def texts_keys(prepared: PreparedPrompt, texts: tuple[str, ...], what: str, row: int, method: str) -> torch.Tensor:
    """Bool `[n_prompt]`: every occurrence of each of `texts` (`occurrences`)."""
    keys = torch.zeros(len(prepared.ids), dtype=torch.bool)
    for text in texts:
        keys |= occurrences(prepared, text, what, row, method)
    return keys


def last_message(prepared: PreparedPrompt, row: int, method: str, instead: str) -> torch.Tensor:
    """Bool `[n_prompt]`: the content of the prompt's last message, the last run of tokens the
    chat template did not add; a prompt without the template is a ConfigError that says what
    to do `instead`."""
    if not prepared.chat:
        raise ConfigError(f"{method}: prompt #{row} has no chat template, hence no user message to {instead}")
    content = ~prepared.template("skeleton")
    where = content.nonzero().flatten()
    if where.numel() == 0:
        raise ConfigError(f"{method}: prompt #{row} has no message content")
    end = int(where[-1]) + 1
    before = (~content[:end]).nonzero().flatten()
    start = int(before[-1]) + 1 if before.numel() else 0
    keys = torch.zeros(len(prepared.ids), dtype=torch.bool)
    keys[start:end] = True
    return keys


def unit_texts(text: str, unit: Unit) -> list[tuple[int, int]]:
    """Character spans `[start, end)` of `text`'s non-blank lines or sentences, stripped of
    surrounding white space, in order. A sentence ends at '.', '!' or '?' followed by white
    space, and at every line break."""
    if unit not in UNITS:
        raise ValueError(f"unit is one of {', '.join(UNITS)}, not {unit!r}")
    pieces: list[tuple[int, int]] = []
    for line in re.finditer(r"[^\n]+", text):
        bounds = [(line.start(), line.end())]
        if unit == "sentence":
            cuts = [m.end() for m in _SENTENCE_END.finditer(line.group())]
            starts = [0, *cuts]
            ends = [*cuts, len(line.group())]
            bounds = [(line.start() + a, line.start() + b) for a, b in zip(starts, ends)]
        for a, b in bounds:
            piece = text[a:b]
            if piece.strip():
                lead = len(piece) - len(piece.lstrip())
                pieces.append((a + lead, a + len(piece.rstrip())))
    return pieces


def message_units(prepared: PreparedPrompt, unit: Unit, row: int, method: str) -> list[tuple[int, int]]:
    """Token spans `[start, end)` of the last message's lines or sentences (`unit_texts`), in
    order; a token that straddles two units belongs to both."""
    keys = last_message(prepared, row, method, "split into units")
    where = keys.nonzero().flatten()
    first, last = int(where[0]), int(where[-1])
    offsets = prepared.encoded.offsets
    begin, end = offsets[first][0], offsets[last][1]
    spans = []
    for a, b in unit_texts(prepared.text[begin:end], unit):
        start, stop = prepared.encoded.token_span(begin + a, begin + b)
        if start < stop:
            spans.append((start, stop))
    if not spans:
        raise ConfigError(f"{method}: the last message of prompt #{row} has no {unit} to choose")
    return spans

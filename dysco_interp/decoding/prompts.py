"""Prompts as the decode loop takes them: chat-encoded with their template tokens located, and
left-padded into one batch that shares the DySCO schedule."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import torch

from dysco_interp.chat import EncodedPrompt, Messages, as_messages, encode_chat
from dysco_interp.checks import typed
from dysco_interp.decoding.template import MASKING_MODES, TemplateMasking, reference_positions, template_positions
from dysco_interp.errors import ConfigError
from dysco_interp.models import LoadedModel

Schedule = Literal["reference", "paper"]
SCHEDULES: tuple[Schedule, ...] = get_args(Schedule)


@dataclass
class PreparedPrompt:
    encoded: EncodedPrompt
    masks: dict[TemplateMasking, torch.Tensor]  # masking mode -> bool [n_prompt]: the tokens it never selects
    reference_fallback: bool = False  # the template is of no family the reference lists: "reference" is "skeleton"

    @property
    def ids(self) -> tuple[int, ...]:
        return self.encoded.input_ids

    def template(self, mode: TemplateMasking = "reference") -> torch.Tensor:
        """Bool `[n_prompt]`: the chat-template tokens that masking `mode` never selects."""
        return self.masks[mode]


def prepare_prompt(
    model: LoadedModel, prompt: str | Messages | EncodedPrompt, enable_thinking: bool | None = None
) -> PreparedPrompt:
    """Chat-encode a prompt and find its template tokens."""
    if isinstance(prompt, EncodedPrompt):
        raise ConfigError("pass the prompt text or messages, so template tokens can be located")
    messages = as_messages(prompt)
    encoded = encode_chat(model.tokenizer, messages, enable_thinking)
    skeleton = template_positions(encoded, messages, model.tokenizer, enable_thinking)
    reference = reference_positions(encoded, model.tokenizer)
    # the fallback is announced when a method masks in "reference" mode (Stepper), not here
    masks: dict[TemplateMasking, torch.Tensor] = {
        "reference": skeleton if reference is None else reference, "skeleton": skeleton,
        "off": torch.zeros_like(skeleton)}
    return PreparedPrompt(encoded, masks, reference_fallback=reference is None)


def check_prompt(prompt, what: str = "prompt") -> None:
    """ConfigError unless `prompt` is non-empty text or a non-empty list of chat messages."""
    if prompt is None:
        raise ConfigError(f"{what} is None; pass the prompt text or a list of chat messages")
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ConfigError(f"{what} is empty")
        return
    if isinstance(prompt, EncodedPrompt):
        return  # prepare_prompt explains why it wants the text
    if not isinstance(prompt, (list, tuple)) or not prompt:
        raise ConfigError(f"{what} must be text or a non-empty list of chat messages, got {typed(prompt)}")
    for i, message in enumerate(prompt):
        if not (isinstance(message, Mapping) and isinstance(message.get("role"), str)
                and isinstance(message.get("content"), str)):
            raise ConfigError(f"{what}: message {i} must be a dict with string 'role' and 'content', "
                              f"got {typed(message)}")


def tail_length(n_prompt: int, n_gen: int, warmup: int) -> int:
    """Prompt tokens fed one at a time after the prefill (at least one token is prefilled)."""
    return min(warmup + n_gen, n_prompt - 1)


def biased_prompt_steps(tail: int, n_gen: int, schedule: Schedule) -> int:
    """How many of the `tail` prompt tokens fed one at a time get the method's full step; the
    ones before them are unbiased context warm-up. The official code biases the last context
    token too ("reference": n_gen + 1); the paper's text reads as the generation prompt only."""
    return min(tail, n_gen + 1 if schedule == "reference" else n_gen)


def pad_id(model: LoadedModel) -> int:
    tok = model.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    return int(pad if pad is not None else 0)


@dataclass
class PromptBatch:
    """Prompts left-padded into one batch; one prompt is a batch of one with no pads."""

    ids: torch.Tensor  # long [B, N]
    lengths: list[int]  # each row's prompt length (pads excluded)
    templates: dict[TemplateMasking, torch.Tensor]  # masking mode -> bool [B, N]: template tokens (False at pads)
    n_gen: int  # generation-prompt tokens, shared by every row
    prepared: list[PreparedPrompt] | None = None  # the encoded prompts, when the batch came from them

    @classmethod
    def of(cls, prepared: Sequence[PreparedPrompt], pad_token: int) -> "PromptBatch":
        if not prepared:
            raise ConfigError("no prompts to decode")
        n_gen = {p.encoded.n_generation_prompt for p in prepared}
        if len(n_gen) != 1:
            raise ConfigError("prompts decoded together must share the generation prompt (one chat template)")
        width = max(len(p.ids) for p in prepared)
        pads = [width - len(p.ids) for p in prepared]
        ids = torch.tensor([[pad_token] * k + list(p.ids) for p, k in zip(prepared, pads)], dtype=torch.long)
        templates = {mode: torch.stack([torch.nn.functional.pad(p.template(mode).to(torch.bool), (k, 0))
                                        for p, k in zip(prepared, pads)]) for mode in MASKING_MODES}
        return cls(ids, [len(p.ids) for p in prepared], templates, n_gen.pop(), list(prepared))

    @classmethod
    def from_ids(cls, ids: torch.Tensor) -> "PromptBatch":
        """Raw token ids `[B, N]` of equal length, with no chat template (benchmarks, analyses)."""
        if ids.ndim != 2 or ids.shape[1] == 0:
            raise ConfigError(f"expected token ids of shape [batch, seq], got {tuple(ids.shape)}")
        none = torch.zeros(ids.shape, dtype=torch.bool)
        return cls(ids.long(), [ids.shape[1]] * ids.shape[0], dict.fromkeys(MASKING_MODES, none), 0)

    @property
    def width(self) -> int:
        return self.ids.shape[1]

    @property
    def pads(self) -> list[int]:
        return [self.width - n for n in self.lengths]

    @property
    def valid(self) -> torch.Tensor | None:
        """bool [B, N]: False at pads; None when nothing is padded."""
        if not any(self.pads):
            return None
        return torch.arange(self.width)[None, :] >= torch.tensor(self.pads)[:, None]

    def n_prefix(self, warmup: int) -> int:
        """Columns prefilled; the rest are fed one at a time. Rows share the schedule, which
        equals each row's own unless a prompt is shorter than warmup + n_gen + 1 tokens."""
        return self.width - tail_length(min(self.lengths), self.n_gen, warmup)

    def never_selected(self, template_masking: TemplateMasking) -> torch.Tensor:
        """Pads, and the chat-template tokens of the masking mode."""
        valid = self.valid
        template = self.templates[template_masking]
        return template if valid is None else template | ~valid

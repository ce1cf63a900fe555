"""Prompts as the decode loop takes them: text and messages chat-encoded with their template
tokens located (or, with `chat=False`, tokenized as they are), token ids as given; and
left-padded into one batch that shares the DySCO schedule."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Union

import torch

from dysco_interp.chat import EncodedPrompt, Messages, as_messages, encode_chat, encode_text
from dysco_interp.checks import brief, check_bool, is_int, typed
from dysco_interp.decoding.choices import Schedule
from dysco_interp.decoding.template import MASKING_MODES, TemplateMasking, reference_positions, template_positions
from dysco_interp.errors import ConfigError
from dysco_interp.models import LoadedModel

Prompt = Union[str, Messages, Sequence[int], torch.Tensor]  # text, chat messages or token ids


@dataclass
class PreparedPrompt:
    encoded: EncodedPrompt  # for raw prompts: no generation prompt (n_generation_prompt 0)
    masks: dict[TemplateMasking, torch.Tensor]  # masking mode -> bool [n_prompt]: the tokens it never selects
    reference_fallback: bool = False  # the template is of no family the reference lists: "reference" is "skeleton"
    chat: bool = True  # rendered with the chat template (False: token ids, or text with chat=False)

    @property
    def ids(self) -> tuple[int, ...]:
        return self.encoded.input_ids

    @property
    def text(self) -> str:
        """The prompt as text: the rendered chat, the text as given (chat=False), or the ids decoded."""
        return self.encoded.text

    def template(self, mode: TemplateMasking = "reference") -> torch.Tensor:
        """Bool `[n_prompt]`: the chat-template tokens that masking `mode` never selects."""
        return self.masks[mode]


def prepare_prompt(
    model: LoadedModel, prompt: Prompt | EncodedPrompt, enable_thinking: bool | None = None, *, chat: bool = True
) -> PreparedPrompt:
    """Encode a prompt and find its template tokens.

    Text and chat messages get the model's chat template (`chat=True`); with `chat=False`,
    text is tokenized as `model.bridge.to_tokens(text)` does (BOS as that adds it). Token ids
    (a list of ints, a 1-D or `[1, N]` integer tensor) are used as given. Prompts without a
    template have no template tokens to mask and no generation prompt.
    """
    check_bool("chat", chat)
    if isinstance(prompt, EncodedPrompt):
        raise ConfigError("pass the prompt text or messages, so template tokens can be located")
    check_prompt(prompt)
    ids = token_ids(prompt)
    if ids is not None:
        return raw_prompt(model, ids)
    if not chat:
        if not isinstance(prompt, str):
            raise ConfigError("chat messages need the chat template: pass text with chat=False, or chat=True")
        return text_prompt(model, prompt)
    if getattr(model.tokenizer, "chat_template", None) is None:
        raise ConfigError(f"{model.spec.name} has no chat template: pass chat=False (the text as it is) "
                          "or token ids")
    messages = as_messages(prompt)  # type: ignore[arg-type]
    encoded = encode_chat(model.tokenizer, messages, enable_thinking)
    skeleton = template_positions(encoded, messages, model.tokenizer, enable_thinking)
    reference = reference_positions(encoded, model.tokenizer)
    # the fallback is announced when a method masks in "reference" mode (Stepper), not here
    masks: dict[TemplateMasking, torch.Tensor] = {
        "reference": skeleton if reference is None else reference, "skeleton": skeleton,
        "off": torch.zeros_like(skeleton)}
    return PreparedPrompt(encoded, masks, reference_fallback=reference is None)


def _untemplated(encoded: EncodedPrompt) -> PreparedPrompt:
    none = torch.zeros(len(encoded), dtype=torch.bool)
    return PreparedPrompt(encoded, dict.fromkeys(MASKING_MODES, none), chat=False)


def outside_vocab(model: LoadedModel, ids: Sequence[int]) -> list[int]:
    """The ids that name no token of the model's vocabulary."""
    return [t for t in ids if not 0 <= t < model.hf_config.vocab_size]


def raw_prompt(model: LoadedModel, ids: Sequence[int]) -> PreparedPrompt:
    """Token ids as given; ConfigError for an id outside the vocabulary."""
    vocab = model.hf_config.vocab_size
    bad = outside_vocab(model, ids)
    if bad:
        raise ConfigError(f"prompt token ids outside the vocabulary (0..{vocab - 1}): {brief(bad)}")
    text = model.tokenizer.decode(list(ids), skip_special_tokens=False)
    return _untemplated(EncodedPrompt(text, tuple(ids), ((0, 0),) * len(ids), 0))


def text_prompt(model: LoadedModel, text: str) -> PreparedPrompt:
    """Text without the chat template, tokenized as `to_tokens` does (its BOS, no truncation)."""
    ids = [int(t) for t in model.bridge.to_tokens(text, truncate=False, move_to_device=False)[0].tolist()]
    plain, offsets = encode_text(model.tokenizer, text)
    n_added = len(ids) - len(plain)
    if n_added < 0 or ids[n_added:] != plain:
        offsets = [(0, 0)] * len(ids)  # tokens that do not line up with the text: no character spans
    else:
        offsets = [(0, 0)] * n_added + offsets
    return _untemplated(EncodedPrompt(text, tuple(ids), tuple(offsets), 0))


def token_ids(prompt) -> list[int] | None:
    """The ids of a prompt given as token ids (a list of ints, a 1-D or `[1, N]` integer tensor
    or array); None for text and messages; ConfigError for ids of another shape or dtype."""
    if isinstance(prompt, torch.Tensor) or hasattr(prompt, "__array__"):
        t = torch.as_tensor(prompt)
        if t.dtype == torch.bool or t.is_floating_point() or t.is_complex():
            raise ConfigError(f"token ids must be an integer tensor, got dtype {t.dtype}")
        if t.ndim == 2 and t.shape[0] == 1:
            t = t[0]
        if t.ndim != 1:
            raise ConfigError(f"token ids must be of shape [N] or [1, N], got {tuple(t.shape)}; "
                              "for a batch use generate_batch")
        if t.numel() == 0:
            raise ConfigError("token ids are empty")
        return [int(x) for x in t.tolist()]
    if isinstance(prompt, (list, tuple)) and prompt and is_int(prompt[0]):
        if not all(is_int(t) for t in prompt):
            raise ConfigError(f"token ids must be integers, got {brief(list(prompt[:8]))}")
        return [int(t) for t in prompt]
    return None


def prompt_list(prompts) -> list:
    """The prompts of `generate_batch`: a list of prompts, or a `[B, N]` tensor of B prompts of
    N tokens each (nothing is taken for padding: prompts of different lengths go as a list)."""
    if isinstance(prompts, torch.Tensor) or hasattr(prompts, "__array__"):
        t = torch.as_tensor(prompts)
        if t.ndim != 2:
            raise ConfigError(f"a tensor of prompts must be [batch, tokens], got shape {tuple(t.shape)}; "
                              "for one prompt use generate")
        return list(t)
    if isinstance(prompts, (str, Mapping)) or prompts is None or not isinstance(prompts, Sequence):
        raise ConfigError(f"prompts must be a list of prompts, got {typed(prompts)}; for one prompt use "
                          "dysco_generate or compare_methods")
    if prompts and is_int(prompts[0]):
        raise ConfigError(f"prompts is one list of token ids ({brief(list(prompts[:8]))}); pass a list of "
                          "prompts ([ids]) or use generate")
    return list(prompts)


def check_prompt(prompt, what: str = "prompt") -> None:
    """ConfigError unless `prompt` is non-empty text, a non-empty list of chat messages or token ids."""
    if prompt is None:
        raise ConfigError(f"{what} is None; pass the prompt text, a list of chat messages or token ids")
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ConfigError(f"{what} is empty")
        return
    if isinstance(prompt, EncodedPrompt):
        return  # prepare_prompt explains why it wants the text
    try:
        if token_ids(prompt) is not None:
            return
    except ConfigError as e:
        raise ConfigError(f"{what}: {e}") from None
    if not isinstance(prompt, (list, tuple)) or not prompt:
        raise ConfigError(f"{what} must be text, a non-empty list of chat messages or token ids, got {typed(prompt)}")
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

"""PASTA's head profiling: each head steered alone, scored by the gold answers' teacher-forced log-probability.

PASTA (Zhang et al., 2024) chooses its heads per model and task: every head is steered on its
own on a few dev examples, and the heads that help most are kept. Here a head's score is the
mean, over the dev prompts, of the gain in the gold answer's mean log-probability per token
(teacher forced, the `tf_logprob` of an evaluation) when `pasta` steers that head alone, over
vanilla decoding's. `top_heads` writes the best as `pasta`'s `heads` parameter.

Why one pass per head. `pasta` is bias-only: it keeps no state across steps, and its bias is the
same tensor at every step. Teacher-forced decoding of it therefore equals one forward pass over
the prompt and the gold answer in which only the queries that decoding biases get the bias: the
last prompt tokens the schedule feeds with the method's full step (`prompts.biased_prompt_steps`,
with this config's warm-up and DySCO's "reference" schedule) and every fed gold token. Everything
before them is vanilla's, and shared: each batch of prompts is prefilled once up to its first
biased column, then each head runs that tail alone (the biased prompt tokens and the gold tokens
but the last), its logits at the gold positions scored. The result equals `evaluate(...,
teacher_forced=True)` of `pasta` with that one head, minus vanilla's, to float tolerance.

Cost: `n_layers * n_heads + 1` tail passes per batch of prompts (the one more is vanilla's), each
over `n_gen + 1 + len(gold) - 1` query tokens against the cached prompt, plus one prefill per
batch. On an 8B model with 36 x 32 heads that is 1153 short passes per batch: minutes on a GPU
for a few dozen dev prompts at 8K tokens, far less than decoding each head's run. `heads`
restricts the candidates (the rest stay NaN).

The passes run on the model's SDPA twin (the weights the `sdpa` backend uses) through an attention
function of their own: plain SDPA in every head but the profiled one, whose output is computed
again with the bias added to its mask. Sliding-window layers see the last keys of the bias, as
the backends' do.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from dysco_interp.checks import check_bool, check_int, check_number
from dysco_interp.decoding import relevance, runtime
from dysco_interp.decoding.arguments import forced_ids
from dysco_interp.decoding.backends.base import DecodeState
from dysco_interp.decoding.backends.sdpa import prefill_into, twin
from dysco_interp.decoding.baselines.pasta import Pasta
from dysco_interp.decoding.config import DecodingConfig
from dysco_interp.decoding.methods import method_for
from dysco_interp.decoding.prompts import Prompt, PromptBatch, biased_prompt_steps, pad_id, prepare_prompt
from dysco_interp.errors import ConfigError
from dysco_interp.hooks import head_label
from dysco_interp.models import LoadedModel
from dysco_interp.progress import tqdm

ATTN_IMPLEMENTATION = "pasta_profile"


@dataclass
class OneHead:
    """The bias of one profiling pass: float32 `[B, 1, 1, n_keys]` on absolute key positions, in
    one head of one layer."""

    layer: int
    head: int
    bias: torch.Tensor


def one_head_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                       pasta_head: OneHead | None = None, **kwargs):
    """SDPA attention; in the layer and head `pasta_head` names, with its bias on every query row."""
    out, _ = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                    **kwargs)
    if pasta_head is None or module.layer_idx != pasta_head.layer:
        return out, None
    head, groups = pasta_head.head, getattr(module, "num_key_value_groups", 1)
    n_queries, n_keys = query.shape[2], key.shape[2]
    if attention_mask is None:  # no pads: causal, the queries being the last keys
        keep = torch.ones(n_queries, n_keys, dtype=torch.bool, device=query.device).tril(n_keys - n_queries)
        attention_mask = keep[None, None]
    mask = attention_mask[:, :1]
    if mask.dtype == torch.bool:
        mask = torch.where(mask, 0.0, torch.finfo(query.dtype).min).to(query.dtype)
    bias = relevance.window_slice(pasta_head.bias, n_keys).to(device=query.device, dtype=query.dtype)
    kv = head // groups
    one = torch.nn.functional.scaled_dot_product_attention(
        query[:, head:head + 1], key[:, kv:kv + 1], value[:, kv:kv + 1], attn_mask=mask + bias,
        scale=scaling)
    out = out.clone()
    out[:, :, head] = one[:, 0]
    return out, None


AttentionInterface.register(ATTN_IMPLEMENTATION, one_head_attention)
AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)


def profile_heads(model: LoadedModel, prompts: Sequence[Prompt], golds: Sequence[str | Sequence[int]],
                  emphasize: Sequence[str] = (), alpha: float = 0.01, *,
                  heads: Sequence[tuple[int, int]] | None = None, batch_size: int = 8,
                  config: DecodingConfig | None = None, chat: bool = True, progress: bool = True) -> torch.Tensor:
    """Each head's PASTA profile (see the module docstring): float32 `[n_layers, n_heads]`, the
    mean over `prompts` of the gain in the gold answer's teacher-forced mean log-probability per
    token when `pasta` (`alpha`, `emphasize`) steers that head alone, over vanilla's.

    Args:
        model: the model, on any device.
        prompts: the dev prompts (text or chat messages), and `golds` their gold answers (text,
            encoded on its own after the prompt as teacher forcing encodes it, or token ids).
        emphasize: `pasta`'s texts to emphasise, the same for every prompt (none: each prompt's
            last message).
        alpha: `pasta`'s alpha.
        heads: the candidate `(layer, head)` pairs (None: every head); the others are NaN.
        batch_size: prompts per pass, left-padded as the `sdpa` backend pads them.
        config: the decoding settings whose schedule is profiled (its `warmup`,
            `enable_thinking`); None: `DecodingConfig()`'s.
        chat: prompts through the chat template (as `generate`'s `chat`).
        progress: a bar over the passes.
    """
    check_number("alpha", alpha, above=0, at_most=1)
    check_bool("chat", chat)
    check_int("batch_size", batch_size, minimum=1)
    if not prompts:
        raise ConfigError("no prompts to profile heads on")
    spec = model.spec
    candidates = [(layer, head) for layer in range(spec.n_layers) for head in range(spec.n_heads)] \
        if heads is None else sorted({(int(layer), int(head)) for layer, head in heads})
    outside = [head_label(*p) for p in candidates if not (0 <= p[0] < spec.n_layers and 0 <= p[1] < spec.n_heads)]
    if outside or not candidates:
        raise ConfigError(f"profile_heads: head {outside[0]} is outside the model ({spec.n_layers} layers x "
                          f"{spec.n_heads} heads)" if outside else "profile_heads: no candidate heads")
    base = DecodingConfig() if config is None else config
    # pasta's own start() builds the bias, so the profile steers exactly what the method does
    pasta = DecodingConfig(method=Pasta.name, warmup=base.warmup, enable_thinking=base.enable_thinking,
                           params={"alpha": alpha, "emphasize": list(emphasize), "heads": head_label(0, 0)})
    gold_ids = forced_ids(model, golds, len(prompts))
    gains = torch.zeros(len(candidates), dtype=torch.float64)
    batches = [range(i, min(i + batch_size, len(prompts))) for i in range(0, len(prompts), batch_size)]
    bar = tqdm(total=len(batches) * (len(candidates) + 1), desc="pasta profile", unit="pass", disable=not progress)
    with bar:
        for rows in batches:
            prepared = [prepare_prompt(model, prompts[i], base.enable_thinking, chat=chat) for i in rows]
            scores = _BatchProfile(model, PromptBatch.of(prepared, pad_id(model)), [gold_ids[i] for i in rows],
                                   pasta)
            vanilla = scores.logprobs(None)
            bar.update(1)
            for k, (layer, head) in enumerate(candidates):
                gains[k] += (scores.logprobs((layer, head)) - vanilla).sum()
                bar.update(1)
    out = torch.full((spec.n_layers, spec.n_heads), math.nan, dtype=torch.float32)
    for k, (layer, head) in enumerate(candidates):
        out[layer, head] = float(gains[k] / len(prompts))
    return out


class _BatchProfile:
    """One batch's shared prefill, and the tail pass that scores its gold answers under one head's bias."""

    def __init__(self, model: LoadedModel, batch: PromptBatch, golds: list[list[int]], config: DecodingConfig):
        self.model, self.golds = model, golds
        width, device = batch.width, model.device
        tail = width - batch.n_prefix(config.warmup)
        first = width - biased_prompt_steps(tail, batch.n_gen, config.parameter("schedule"))
        method = method_for(config, None, model.spec)
        method.start(model, batch)
        assert isinstance(method, Pasta) and method.values is not None
        self.n_gold = max(len(g) for g in golds)
        gold = torch.full((len(golds), self.n_gold - 1), pad_id(model), dtype=torch.long)
        gold_valid = torch.zeros(gold.shape, dtype=torch.bool)
        for row, g in enumerate(golds):
            gold[row, :len(g) - 1] = torch.tensor(g[:-1], dtype=torch.long)
            gold_valid[row, :len(g) - 1] = True
        self.bias = torch.nn.functional.pad(method.values, (0, self.n_gold - 1)).to(device)
        valid = batch.valid
        self.hf = twin(model, ATTN_IMPLEMENTATION)
        state = DecodeState(runtime.new_cache(model), 0)
        self.state = prefill_into(self.hf, model, state, batch.ids[:, :first], None if valid is None
                                  else valid[:, :first], runtime.DEFAULT_CHUNK)
        self.tail = torch.cat([batch.ids[:, first:], gold], dim=1).to(device)
        rows_valid = torch.ones(batch.ids.shape, dtype=torch.bool) if valid is None else valid
        self.valid = torch.cat([rows_valid, gold_valid], dim=1).to(device)
        self.first = first
        starts = self.valid.long().cumsum(-1) - 1  # each row counts from 0 at its first real token
        self.positions = starts.clamp_min(0)[:, first:]
        self.targets = torch.full((len(golds), self.n_gold), 0, dtype=torch.long)
        self.scored = torch.zeros(self.targets.shape, dtype=torch.bool)
        for row, g in enumerate(golds):
            self.targets[row, :len(g)] = torch.tensor(g, dtype=torch.long)
            self.scored[row, :len(g)] = True

    @torch.inference_mode()
    def logprobs(self, head: tuple[int, int] | None) -> torch.Tensor:
        """Float64 `[B]`: each gold answer's mean log-probability per token, with `head` steered
        (None: vanilla)."""
        control = None if head is None else OneHead(head[0], head[1], self.bias)
        cache = runtime.FrozenCache(self.state.cache)
        out = self.hf(input_ids=self.tail, past_key_values=cache, use_cache=True, attention_mask=self.valid,
                      position_ids=self.positions, logits_to_keep=self.n_gold, pasta_head=control)
        logp = torch.log_softmax(out.logits.float(), dim=-1).cpu()
        gold = logp.gather(-1, self.targets[..., None])[..., 0].double()
        return (gold * self.scored).sum(-1) / self.scored.sum(-1)


def top_heads(scores: torch.Tensor, n: int) -> str:
    """The `n` best heads of a profile (`[n_layers, n_heads]`, NaN: not profiled) as `pasta`'s
    `heads` parameter, best first: "L12H3 L10H0 ..."."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"top_heads takes n >= 1 heads, got {n!r}")
    if scores.ndim != 2:
        raise ConfigError(f"a head profile is [n_layers, n_heads], got {list(scores.shape)}")
    flat = scores.flatten().float()
    ranked = [int(i) for i in torch.argsort(flat.nan_to_num(nan=-math.inf), descending=True, stable=True)
              if not math.isnan(float(flat[i]))]
    n_heads = scores.shape[1]
    return " ".join(head_label(i // n_heads, i % n_heads) for i in ranked[:n])


__all__ = ["OneHead", "one_head_attention", "profile_heads", "top_heads"]

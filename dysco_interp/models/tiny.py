"""Tiny random models with real tokenizers, built in memory, for tests and examples.

Four styles mirror the architectures and chat templates that DySCO cares about:
Llama (Llama-3 headers), Qwen2 (ChatML), Qwen3 (ChatML with a think block) and
Gemma3 (turn markers, sliding-window layers). Nothing is downloaded.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from dysco_interp.errors import ModelNotFoundError
from dysco_interp.models.loaded import LoadedModel, from_hf
from dysco_interp.models.yarn import with_yarn

# Tiny models are named "tiny-<style>" wherever a model name is accepted.
TINY_PREFIX = "tiny-"

STYLES = ("llama", "qwen2", "qwen3", "gemma3")

_SPECIAL = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<bos>",
    "<eos>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<pad>",
]

_TEMPLATES = {
    "llama": (
        "{{ '<|begin_of_text|>' }}{% for m in messages %}"
        "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + m['content'] + '<|eot_id|>' }}"
        "{% endfor %}{% if add_generation_prompt %}"
        "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
    ),
    "qwen2": (
        "{% if messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    ),
    "qwen3": (
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
        "{% if enable_thinking is defined and enable_thinking is false %}"
        "{{ '<think>\n\n</think>\n\n' }}{% endif %}{% endif %}"
    ),
    "gemma3": (
        "{{ '<bos>' }}{% for m in messages %}"
        "{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
        "{{ '<start_of_turn>' + role + '\n' + m['content'] + '<end_of_turn>\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
    ),
}

# bos, eos, pad per style
_ROLES = {
    "llama": ("<|begin_of_text|>", "<|eot_id|>", "<|endoftext|>"),
    "qwen2": (None, "<|im_end|>", "<|endoftext|>"),
    "qwen3": (None, "<|im_end|>", "<|endoftext|>"),
    "gemma3": ("<bos>", "<end_of_turn>", "<pad>"),
}

_CORPUS_WORDS = (
    "you can travel from to by train bus plane ferry city is a lively quiet route please give "
    "the capital of france paris question answer document about what where when who which "
    "london berlin madrid rome vienna prague oslo lima quito cairo tokyo delhi sydney boston "
    "denver austin dallas seattle portland toronto montreal dublin lisbon athens warsaw riga "
    "system user assistant model helpful write short poem story about river mountain sea"
).split()


def _training_text() -> list[str]:
    # Deterministic pseudo-sentences so that BPE learns whole common words.
    gen = torch.Generator().manual_seed(1234)
    lines = []
    for _ in range(400):
        idx = torch.randint(len(_CORPUS_WORDS), (12,), generator=gen).tolist()
        lines.append(" ".join(_CORPUS_WORDS[i] for i in idx) + ".")
    lines += [" ".join(_CORPUS_WORDS)] * 20
    return lines


@lru_cache(maxsize=1)
def _base_tokenizer_json() -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=_SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_text(), trainer)
    return tok.to_str()


def tiny_tokenizer(style: str = "llama"):
    """A byte-level BPE tokenizer (about 600 tokens) with the style's chat template."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    _check_style(style)
    bos, eos, pad = _ROLES[style]
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_base_tokenizer_json()),
        bos_token=bos,
        eos_token=eos,
        pad_token=pad,
        chat_template=_TEMPLATES[style],
    )
    # TransformerLens otherwise tries to reload the tokenizer by name to add a BOS.
    tok.init_kwargs.update(name_or_path=TINY_PREFIX + style, add_bos_token=True)
    return tok


def _check_style(style: str) -> None:
    if style not in STYLES:
        names = ", ".join(TINY_PREFIX + s for s in STYLES)
        raise ModelNotFoundError(f"unknown tiny model {TINY_PREFIX + str(style)!r}; choose one of {names}")


def tiny_config(style: str, vocab_size: int, **overrides):
    """An HF config of the style: 4 layers, 4 query heads over 2 KV heads, d_model 64."""
    from transformers import Gemma3TextConfig, LlamaConfig, Qwen2Config, Qwen3Config

    _check_style(style)
    common = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=2048,
        initializer_range=0.2,  # peaked attention, varied greedy tokens
        tie_word_embeddings=True,
    )
    if style == "llama":
        cfg = LlamaConfig(**common, architectures=["LlamaForCausalLM"])
    elif style == "qwen2":
        cfg = Qwen2Config(**common, architectures=["Qwen2ForCausalLM"])
    elif style == "qwen3":
        cfg = Qwen3Config(**common, architectures=["Qwen3ForCausalLM"])
    else:
        cfg = Gemma3TextConfig(
            **common,
            architectures=["Gemma3ForCausalLM"],
            sliding_window=16,
            layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
            query_pre_attn_scalar=16,
        )
        # Gemma scales embeddings by sqrt(d_model): a smaller init keeps outputs varied
        cfg.initializer_range = 0.03
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


def tiny_hf_model(style: str = "llama", *, seed: int = 0, dtype: torch.dtype = torch.float32,
                  yarn_factor: float | None = None, **overrides):
    """The HF causal LM of `tiny_model` (random weights, seeded, SDPA attention) and its tokenizer,
    on the CPU: what `save_pretrained` writes to make a tiny model folder."""
    from transformers import AutoModelForCausalLM

    tokenizer = tiny_tokenizer(style)
    config = with_yarn(tiny_config(style, vocab_size=len(tokenizer), **overrides), yarn_factor)
    if style == "gemma3":
        # Token ids for the generation config, so EOS handling matches real Gemma models.
        config.bos_token_id = tokenizer.bos_token_id
    config.eos_token_id = tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        hf_model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=dtype)
    hf_model.generation_config.eos_token_id = tokenizer.eos_token_id
    hf_model.generation_config.pad_token_id = tokenizer.pad_token_id
    return hf_model, tokenizer


def tiny_model(
    style: str = "llama",
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device="cpu",
    yarn_factor: float | None = None,
    **overrides,
) -> LoadedModel:
    """A `LoadedModel` with random weights (seeded) and a tiny tokenizer of the style;
    `overrides` set config fields (e.g. max_position_embeddings)."""
    hf_model, tokenizer = tiny_hf_model(style, seed=seed, dtype=dtype, yarn_factor=yarn_factor, **overrides)
    hf_model.to(device)
    return from_hf(hf_model, tokenizer, TINY_PREFIX + style)

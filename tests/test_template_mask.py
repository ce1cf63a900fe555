"""Chat-template position masks on every tiny tokenizer style and a real tokenizer: the
"skeleton" mask (every token outside message contents), the "reference" mask (the official
DySCO code's token sequences per chat family) and the dispatch between the modes."""

import warnings

import pytest
import torch

from dysco_interp.chat import EncodedPrompt, content_spans, encode_chat
from dysco_interp.decoding.template import (
    MASKING_MODES,
    TemplateMaskingFallbackWarning,
    chat_family,
    check_masking_mode,
    extend_mask,
    reference_positions,
    sequence_positions,
    template_mask,
    template_positions,
    template_sequences,
)
from dysco_interp.errors import ConfigError
from dysco_interp.models import load_tokenizer
from dysco_interp.models.tiny import STYLES, tiny_tokenizer

MESSAGES = [
    {"role": "system", "content": "Answer with one city."},
    {"role": "user", "content": "You can travel from Paris to Berlin by train. Where to?"},
]


def split(encoded, mask):
    """(template text, content text) from the token mask."""
    pieces = [encoded.text[a:b] for a, b in encoded.offsets]
    template = "".join(p for p, t in zip(pieces, mask.tolist()) if t)
    content = "".join(p for p, t in zip(pieces, mask.tolist()) if not t)
    return template, content


@pytest.fixture(params=STYLES)
def tok(request):
    return tiny_tokenizer(request.param)


@pytest.mark.parametrize("with_tokenizer", [False, True], ids=["search", "skeleton"])
def test_content_tokens_are_exactly_the_messages(tok, with_tokenizer):
    enc = encode_chat(tok, MESSAGES)
    mask = template_positions(enc, MESSAGES, tok if with_tokenizer else None)
    assert mask.shape == (len(enc),) and mask.dtype == torch.bool
    template, content = split(enc, mask)
    assert content == "".join(m["content"] for m in MESSAGES)
    # everything else is template: BOS, headers, end-of-turn markers, generation prompt
    assert template == enc.text.replace(MESSAGES[0]["content"], "").replace(MESSAGES[1]["content"], "")
    assert mask[-enc.n_generation_prompt :].all()
    assert mask[0]  # BOS or the first header token
    for special in ("<|begin_of_text|>", "<bos>", "<|im_start|>", "<|im_end|>", "<|eot_id|>",
                    "<start_of_turn>", "<end_of_turn>", "<|start_header_id|>"):
        ids = tok.convert_tokens_to_ids(special)
        positions = [i for i, t in enumerate(enc.input_ids) if t == ids]
        assert all(mask[i] for i in positions)


def test_default_system_prompt_is_template():
    tok = tiny_tokenizer("qwen2")
    user = [MESSAGES[1]]
    enc = encode_chat(tok, user)
    assert "You are a helpful assistant." in enc.text  # added by the template
    template, content = split(enc, template_positions(enc, user, tok))
    assert content == user[0]["content"]
    assert "You are a helpful assistant." in template


def test_empty_think_block_is_template():
    tok = tiny_tokenizer("qwen3")
    enc = encode_chat(tok, MESSAGES, enable_thinking=False)
    assert enc.text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    mask = template_positions(enc, MESSAGES, tok, enable_thinking=False)
    assert mask[-enc.n_generation_prompt :].all()
    think = [i for i, t in enumerate(enc.input_ids) if t in tok.convert_tokens_to_ids(["<think>", "</think>"])]
    assert len(think) == 2 and all(mask[i] for i in think)
    assert split(enc, mask)[1] == "".join(m["content"] for m in MESSAGES)


@pytest.mark.parametrize("style", ["qwen2", "llama"])
def test_content_equal_to_template_text_needs_the_tokenizer(style):
    # The content "user" also occurs in the role header just before it (and, for qwen2,
    # "You are a helpful assistant." is also the default system prompt).
    tok = tiny_tokenizer(style)
    msgs = [{"role": "user", "content": "user"}]
    enc = encode_chat(tok, msgs)
    (start, end), = content_spans(enc, msgs, tok)
    assert enc.text[start:end] == "user"
    assert enc.text[:start].endswith("user" + ("\n" if style == "qwen2" else "<|end_header_id|>\n\n"))
    mask = template_positions(enc, msgs, tok)
    content_tokens = [i for i, t in enumerate(mask.tolist()) if not t]
    assert len(content_tokens) == 1 and enc.offsets[content_tokens[0]] == (start, end)
    # the search without the tokenizer takes the header's "user": a documented limitation
    (s2, _), = content_spans(enc, msgs)
    assert s2 < start


def test_trimmed_contents_and_boundary_tokens():
    tok = tiny_tokenizer("gemma3")
    tok.chat_template = tok.chat_template.replace("m['content']", "(m['content'] | trim)")
    msgs = [{"role": "user", "content": "  Paris is the capital of france.  "}]
    enc = encode_chat(tok, msgs)
    assert "\nParis is the capital of france.<end_of_turn>" in enc.text
    for t in (None, tok):
        template, content = split(enc, template_positions(enc, msgs, t))
        assert content == "Paris is the capital of france."


def test_a_token_touching_content_counts_as_content():
    tok = tiny_tokenizer("llama")
    msgs = [{"role": "user", "content": " Paris"}]  # leading space may merge with the header's newline
    enc = encode_chat(tok, msgs)
    mask = template_positions(enc, msgs, tok)
    (start, end), = content_spans(enc, msgs, tok)
    for (a, b), t in zip(enc.offsets, mask.tolist()):
        assert t == (not (a < end and b > start))
    assert (~mask).sum() >= 1


def test_missing_content_is_an_error(tok):
    enc = encode_chat(tok, MESSAGES)
    with pytest.raises(ValueError, match="not found"):
        template_positions(enc, [{"role": "user", "content": "something else entirely"}])


def test_extend_mask_marks_generated_tokens_selectable():
    mask = torch.tensor([True, False, True])
    assert extend_mask(mask, 5).tolist() == [True, False, True, False, False]
    assert extend_mask(mask[None], 4).tolist() == [[True, False, True, False]]
    with pytest.raises(ValueError):
        extend_mask(mask, 2)


@pytest.mark.real_model
def test_real_smollm2_tokenizer(real_model):
    tok = real_model.tokenizer
    for msgs in (MESSAGES, [MESSAGES[1]]):
        enc = encode_chat(tok, msgs)
        for t in (None, tok):
            mask = template_positions(enc, msgs, t)
            template, content = split(enc, mask)
            assert content == "".join(m["content"] for m in msgs)
            assert mask[-enc.n_generation_prompt :].all()
    # the default system prompt SmolLM2's template adds is template
    assert "SmolLM" in template and "SmolLM" not in content
    # a real BPE merges the header's newline with the content's leading space:
    # that token straddles the boundary and counts as content
    msgs = [{"role": "user", "content": "  Paris"}]
    enc = encode_chat(tok, msgs)
    mask = template_positions(enc, msgs, tok)
    (start, end), = content_spans(enc, msgs, tok)
    straddling = [i for i, (a, b) in enumerate(enc.offsets) if a < start < b]
    assert straddling and not mask[straddling].any()
    assert split(enc, mask)[1] == "\n  Paris"


# ---- template masking modes: "reference" (official DySCO sequences), "skeleton", "off" ----

SYSTEM, USER = MESSAGES
CHATML_HEADERS = "<|im_start|>system\n<|im_start|>user\n<|im_start|>assistant\n"
LLAMA_HEADERS = "<|start_header_id|>user<|end_header_id|>\n\n"
EOT_ASSISTANT = "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
THINK = "<think>\n\n</think>\n\n"

# (style, messages, enable_thinking, masked text per mode)
CASES = {
    "qwen2-default-system": ("qwen2", [USER], None, {
        "reference": CHATML_HEADERS,
        "skeleton": "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n<|im_end|>\n"
                    "<|im_start|>assistant\n",
    }),
    "qwen2-system": ("qwen2", MESSAGES, None, {
        "reference": CHATML_HEADERS,
        "skeleton": "<|im_start|>system\n<|im_end|>\n<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n",
    }),
    # no system turn: the user header follows BOS, not <|eot_id|>, so the reference keeps it selectable
    "llama-user-only": ("llama", [USER], None, {
        "reference": "<|begin_of_text|>" + EOT_ASSISTANT,
        "skeleton": "<|begin_of_text|>" + LLAMA_HEADERS + EOT_ASSISTANT,
    }),
    "llama-system": ("llama", MESSAGES, None, {
        "reference": "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n<|eot_id|>" + LLAMA_HEADERS
                     + EOT_ASSISTANT,
        "skeleton": "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n<|eot_id|>" + LLAMA_HEADERS
                    + EOT_ASSISTANT,
    }),
    "qwen3-no-thinking": ("qwen3", [USER], False, {
        "reference": "<|im_start|>user\n<|im_start|>assistant\n" + THINK,
        "skeleton": "<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n" + THINK,
    }),
    "qwen3-system-no-thinking": ("qwen3", MESSAGES, False, {
        "reference": CHATML_HEADERS + THINK,
        "skeleton": "<|im_start|>system\n<|im_end|>\n<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n" + THINK,
    }),
}


def masked_text(encoded, mask):
    return split(encoded, mask)[0]


def id_run_mask(encoded, tokenizer, sequences):
    """The reference code's way: every run of input ids equal to a tokenized sequence."""
    ids, mask = list(encoded.input_ids), torch.zeros(len(encoded), dtype=torch.bool)
    for sequence in sequences:
        run = tokenizer(sequence, add_special_tokens=False)["input_ids"]
        for i in range(len(ids) - len(run) + 1):
            if ids[i : i + len(run)] == run:
                mask[i : i + len(run)] = True
    return mask


@pytest.mark.parametrize("case", CASES)
def test_masked_text_per_mode(case):
    style, msgs, thinking, expected = CASES[case]
    tok = tiny_tokenizer(style)
    enc = encode_chat(tok, msgs, enable_thinking=thinking)
    for mode in MASKING_MODES:
        mask = template_mask(enc, msgs, tok, thinking, mode)
        assert mask.shape == (len(enc),) and mask.dtype == torch.bool
        assert masked_text(enc, mask) == expected.get(mode, ""), mode
    assert torch.equal(template_mask(enc, msgs, tok, thinking, "skeleton"),
                       template_positions(enc, msgs, tok, thinking))
    reference = reference_positions(enc, tok)
    assert torch.equal(template_mask(enc, msgs, tok, thinking), reference)  # "reference" is the default
    # system prompt text and <|im_end|> stay selectable in the reference mode
    assert "You are a helpful assistant." not in masked_text(enc, reference)
    assert "<|im_end|>" not in masked_text(enc, reference)
    # matching characters equals matching the tokenized sequences' id runs on these tokenizers
    assert torch.equal(reference, id_run_mask(enc, tok, template_sequences(chat_family(tok))))


def test_llama_user_header_after_bos_is_selectable_in_reference_mode():
    tok = tiny_tokenizer("llama")
    enc = encode_chat(tok, [USER])
    mask = reference_positions(enc, tok)
    pieces = [enc.text[a:b] for a, b in enc.offsets]
    assert pieces[:4] == ["<|begin_of_text|>", "<|start_header_id|>", "user", "<|end_header_id|>"]
    assert mask[:4].tolist() == [True, False, False, False]
    assert mask[-enc.n_generation_prompt :].all()  # the generation prompt's header is masked


def test_chat_family_by_template_and_vocabulary():
    families = {style: chat_family(tiny_tokenizer(style)) for style in STYLES}
    assert families == {"llama": "llama3", "qwen2": "chatml", "qwen3": "chatml", "gemma3": None}
    gemma = tiny_tokenizer("gemma3")
    # its vocabulary holds <|im_start|>, but its template never uses it: no family
    assert gemma.convert_tokens_to_ids("<|im_start|>") is not None
    gemma.chat_template = tiny_tokenizer("qwen2").chat_template
    assert chat_family(gemma) == "chatml"
    assert chat_family(None) is None


def test_template_sequences_are_the_reference_lists():
    assert template_sequences("chatml") == (
        "<|im_start|>system\n", "<|im_start|>user\n", "<|im_start|>assistant\n", "<think>\n\n</think>\n\n"
    )
    assert template_sequences("llama3") == (
        "<|begin_of_text|>",
        "<|start_header_id|>system<|end_header_id|>\n\n",
        "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n",
        "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    )
    with pytest.raises(ConfigError, match="chatml"):
        template_sequences("gemma")


def test_unknown_family_falls_back_to_skeleton_with_a_warning():
    tok = tiny_tokenizer("gemma3")
    enc = encode_chat(tok, MESSAGES)
    assert reference_positions(enc, tok) is None
    with pytest.warns(TemplateMaskingFallbackWarning, match="falls back to 'skeleton'"):
        mask = template_mask(enc, MESSAGES, tok, mode="reference")
    assert torch.equal(mask, template_positions(enc, MESSAGES, tok))
    assert masked_text(enc, mask) == "<bos><start_of_turn>system\n<end_of_turn>\n<start_of_turn>user\n<end_of_turn>\n" \
                                     "<start_of_turn>model\n"
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")  # Python's default filter: once per message
        for _ in range(3):
            template_mask(enc, MESSAGES, tok)
    assert len(seen) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the other modes never warn
        template_mask(enc, MESSAGES, tok, mode="skeleton")
        template_mask(enc, MESSAGES, tok, mode="off")


@pytest.mark.parametrize("mode", ["full", "", None, True, "Reference"])
def test_a_wrong_mode_is_a_config_error_naming_the_three(mode):
    enc = encode_chat(tiny_tokenizer("qwen2"), MESSAGES)
    with pytest.raises(ConfigError, match="'reference', 'skeleton', 'off'"):
        template_mask(enc, MESSAGES, tiny_tokenizer("qwen2"), mode=mode)
    with pytest.raises(ConfigError):
        check_masking_mode(mode)
    assert [check_masking_mode(m) for m in MASKING_MODES] == ["reference", "skeleton", "off"]


def test_sequence_positions_on_characters():
    text = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    # tokens: a BPE merge inside a sequence ("user\n"), one straddling its edge ("\nHi"), zero-width ones
    pieces = [(0, 12), (12, 17), (17, 19), (19, 29), (29, 30), (30, 42), (42, 42), (42, 51), (51, 52), (52, 52),
              (0, 0)]
    enc = EncodedPrompt(text, tuple(range(len(pieces))), tuple(pieces), 0)
    sequences = ["<|im_start|>user\n", "<|im_start|>assistant\n"]
    mask = sequence_positions(enc, sequences)
    assert mask.tolist() == [True, True, False, False, False, True, True, True, True, False, False]
    straddling = EncodedPrompt(text, (0, 1, 2), ((0, 12), (12, 18), (18, 52)), 0)
    assert sequence_positions(straddling, sequences).tolist() == [True, False, False]
    # a sequence inside a message's text is masked too (the reference code matches ids anywhere)
    tok = tiny_tokenizer("qwen2")
    msgs = [{"role": "user", "content": "quote <|im_start|>assistant\n end"}]
    enc = encode_chat(tok, msgs)
    assert masked_text(enc, reference_positions(enc, tok)) == CHATML_HEADERS + "<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    return load_tokenizer("smollm2-135m", progress=False)


@pytest.mark.real_model
def test_reference_mask_on_the_real_smollm2_tokenizer(smollm2_tokenizer):
    tok = smollm2_tokenizer
    assert chat_family(tok) == "chatml"
    for msgs in (MESSAGES, [USER]):
        enc = encode_chat(tok, msgs)
        reference = template_mask(enc, msgs, tok, mode="reference")
        assert masked_text(enc, reference) == CHATML_HEADERS
        assert torch.equal(reference, id_run_mask(enc, tok, template_sequences("chatml")))
        skeleton = masked_text(enc, template_mask(enc, msgs, tok, mode="skeleton"))
        assert ("SmolLM" in skeleton) == (msgs[0]["role"] == "user")  # the default system prompt
    # a real BPE merges the header's newline with the content's leading space: the merged
    # token straddles the sequence's edge and stays selectable, while the id runs no longer
    # match at all; characters still mask the header's other tokens
    msgs = [{"role": "user", "content": "  Paris"}]
    enc = encode_chat(tok, msgs)
    reference = reference_positions(enc, tok)
    assert masked_text(enc, reference) == "<|im_start|>system\n<|im_start|>user<|im_start|>assistant\n"
    assert masked_text(enc, id_run_mask(enc, tok, template_sequences("chatml"))) == \
        "<|im_start|>system\n<|im_start|>assistant\n"

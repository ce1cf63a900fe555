"""Chat-template position masks on every tiny tokenizer style and a real tokenizer."""


import pytest
import torch

from dysco_interp.chat import content_spans, encode_chat
from dysco_interp.decoding.template import extend_mask, template_positions
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

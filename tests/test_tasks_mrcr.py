"""MRCR-style multi-round co-reference: structure, spans, length, determinism, published grader."""

import difflib
import functools
import json

import pytest

from dysco_interp.chat import encode_chat
from dysco_interp.errors import ConfigError
from dysco_interp.models.tiny import STYLES, tiny_tokenizer
from dysco_interp.tasks import load_dataset, make_dataset, mrcr, save_dataset

# One tokenizer per style for the module: building one takes a moment.
tok = functools.cache(tiny_tokenizer)


@pytest.fixture(scope="module")
def ex():
    return mrcr.generate_example(tok("llama"), 4000, seed=0, index=1, n_needles=4)


@pytest.mark.parametrize("n_needles", mrcr.NEEDLE_COUNTS)
def test_structure(n_needles):
    x = mrcr.generate_example(tok("llama"), 5000, seed=1, n_needles=n_needles)
    roles = [m["role"] for m in x.messages]
    assert roles == ["user", "assistant"] * x.n_turns + ["user"]
    request = mrcr.FORMS[x.needle_form].format(topic=x.needle_topic)
    requests = [i for i, m in enumerate(x.messages[:-1]) if m["content"] == request]
    assert requests == x.needle_request_indices and len(requests) == n_needles
    assert x.needle_answer_indices == [i + 1 for i in requests]
    answers = [x.messages[i]["content"] for i in x.needle_answer_indices]
    assert len(set(answers)) == n_needles  # identical requests, different answers
    assert x.gold_message_index == x.needle_answer_indices[x.k - 1]
    assert x.answer == x.prefix + x.messages[x.gold_message_index]["content"]
    q = x.question
    assert q.startswith(
        f"Prepend {x.prefix} to the {mrcr.ordinal(x.k)} (1 indexed) {x.needle_form} about {x.needle_topic}."
    )
    assert len(x.prefix) == mrcr.PREFIX_LENGTH and x.prefix not in "".join(m["content"] for m in x.messages[:-1])


def test_distractor_turns_are_varied_but_alike(ex):
    users = [m["content"] for m in ex.messages[:-1:2]]
    answers = [m["content"] for m in ex.messages[1::2]]
    assert len(set(answers)) == len(answers)
    others = [u for u in users if u != mrcr.FORMS[ex.needle_form].format(topic=ex.needle_topic)]
    # some distractors share the needle's form or topic, so the request must be matched exactly
    assert any(ex.needle_topic in u or mrcr.FORMS[ex.needle_form].split("{")[0] in u for u in others)
    needles = [ex.messages[i]["content"] for i in ex.needle_answer_indices]
    ratios = [difflib.SequenceMatcher(None, a, b).ratio() for a in needles for b in needles if a is not b]
    assert max(ratios) < 0.9  # the answers to one request are not near-copies of each other


@pytest.mark.parametrize("style", STYLES)
def test_message_spans_are_exact(style):
    kwargs = {"enable_thinking": False} if style == "qwen3" else {}
    x = mrcr.generate_example(tok(style), 3000, seed=2, n_needles=2, **kwargs)
    enc = encode_chat(tok(style), x.messages, **kwargs)
    assert enc.text == x.prompt_text and len(enc) == x.n_tokens
    prev = 0
    for m, (a, b), (s, e) in zip(x.messages, x.message_char_spans, x.message_token_spans):
        assert x.prompt_text[a:b] == m["content"]
        assert tok(style).decode(enc.input_ids[s:e]).strip() == m["content"]
        assert s >= prev
        prev = e
    assert x.question_token_span == x.message_token_spans[-1]


@pytest.mark.parametrize("target", [2000, 6000, 12000])
def test_length_within_five_percent(target):
    x = mrcr.generate_example(tok("qwen2"), target, seed=3, index=target, n_needles=2)
    assert abs(x.n_tokens - target) <= 0.05 * target


def test_deterministic(ex, tmp_path):
    again = mrcr.generate_example(tok("llama"), 4000, seed=0, index=1, n_needles=4)
    other = mrcr.generate_example(tok("llama"), 4000, seed=1, index=1, n_needles=4)
    assert again.to_dict() == ex.to_dict()
    assert other.messages != ex.messages
    assert mrcr.MRCRExample.from_dict(json.loads(json.dumps(ex.to_dict()))) == ex
    path = save_dataset(tmp_path / "mrcr.jsonl", [ex])
    assert load_dataset(path) == [ex]


def test_fixed_request_and_k():
    x = mrcr.generate_example(tok("llama"), n_turns=12, n_needles=4, k=3, form="riddle", topic="otters")
    assert (x.needle_form, x.needle_topic, x.k, x.n_turns) == ("riddle", "otters", 3, 12)
    assert "the 3rd (1 indexed) riddle about otters" in x.question
    assert [mrcr.ordinal(k) for k in (1, 2, 3, 4, 11, 12, 13, 21, 22)] == [
        "1st",
        "2nd",
        "3rd",
        "4th",
        "11th",
        "12th",
        "13th",
        "21st",
        "22nd",
    ]


def test_grade_is_mrcrs():
    answer = "PFXhello world"
    assert mrcr.grade("PFXhello world", answer, "PFX") == 1.0
    assert mrcr.grade("hello world", answer, "PFX") == 0.0  # no prefix, no credit
    assert mrcr.grade(" PFXhello world", answer, "PFX") == 0.0
    assert mrcr.grade("PFXabcd", "PFXabce", "PFX") == pytest.approx(0.75)  # 2*3/8
    assert mrcr.grade("PFX", answer, "PFX") == 0.0
    expected = difflib.SequenceMatcher(None, "hello there", "hello world").ratio()
    assert mrcr.grade("PFXhello there", answer, "PFX") == pytest.approx(expected)


def test_gold_response_scores_one(ex):
    assert mrcr.score_response(ex.answer, ex) == {"score": 1.0, "has_prefix": 1.0}
    wrong = ex.prefix + ex.messages[[i for i in ex.needle_answer_indices if i != ex.gold_message_index][0]]["content"]
    assert mrcr.score_response(wrong, ex)["score"] < 1.0


def test_make_dataset():
    data = make_dataset("mrcr", tok("llama"), 3000, n=3, seed=0, n_needles=2)
    assert [x.index for x in data] == [0, 1, 2] and all(x.n_needles == 2 for x in data)


def test_bad_input_errors():
    t = tok("llama")
    with pytest.raises(ConfigError, match="too short for 8 needle turns"):
        mrcr.generate_example(t, 600, n_needles=8)
    with pytest.raises(ConfigError, match="n_needles"):
        mrcr.generate_example(t, 3000, n_needles=1)
    with pytest.raises(ConfigError, match="k must be"):
        mrcr.generate_example(t, 3000, n_needles=2, k=3)
    with pytest.raises(ConfigError, match="form"):
        mrcr.generate_example(t, 3000, form="sonnet")
    with pytest.raises(ConfigError, match="cannot hold"):
        mrcr.generate_example(t, n_turns=3, n_needles=4)
    with pytest.raises(ConfigError, match="exactly one"):
        mrcr.generate_example(t)

"""Needle QA (retrieval-head detection data): spans, null query, length, determinism, scorer."""

import functools
import json

import pytest

from dysco_interp.chat import encode_chat
from dysco_interp.errors import ConfigError
from dysco_interp.models.tiny import STYLES, tiny_tokenizer
from dysco_interp.tasks import load_dataset, make_dataset, save_dataset
from dysco_interp.tasks import needle_qa as nq

# One tokenizer per style for the module: building one takes a moment.
tok = functools.cache(tiny_tokenizer)


@pytest.fixture(scope="module")
def ex():
    return nq.generate_example(tok("llama"), 3000, seed=0, index=3)


@pytest.mark.parametrize("style", STYLES)
def test_spans_are_exact(style):
    kwargs = {"enable_thinking": False} if style == "qwen3" else {}
    x = nq.generate_example(tok(style), 2500, seed=1, index=0, **kwargs)
    enc = encode_chat(tok(style), x.prompt, **kwargs)
    assert enc.text == x.prompt_text and len(enc) == x.n_tokens
    decode = lambda span: tok(style).decode(enc.input_ids[span[0] : span[1]]).strip()  # noqa: E731
    for i, (doc, cs, ts) in enumerate(zip(x.documents, x.doc_char_spans, x.doc_token_spans)):
        line = f"Document [{i + 1}](Title: {doc['title']}) {doc['text']}"
        assert x.prompt_text[cs[0] : cs[1]] == line
        assert decode(ts) == line
    assert x.prompt_text[slice(*x.question_char_span)] == x.question
    assert decode(x.question_token_span) == x.question
    query = f"{nq.LATE_INSTRUCTION}\nQuestion: {x.question}"
    assert x.prompt_text[slice(*x.query_char_span)] == query
    assert decode(x.query_token_span) == query
    # the query comes after every document; the assistant header follows it to the prompt's end
    assert x.query_token_span[0] >= x.doc_token_spans[-1][1]
    assert x.query_with_header_token_span[1] == x.n_tokens
    assert x.n_tokens - x.query_token_span[1] >= x.n_generation_prompt > 0


def test_exactly_one_gold_document(ex):
    gold = ex.documents[ex.gold_index]
    assert gold["entity"] == ex.entity
    assert any(nq.normalize_answer(a) in nq.normalize_answer(gold["text"]) for a in ex.answers)
    for i, doc in enumerate(ex.documents):
        if i != ex.gold_index:
            assert ex.entity not in doc["text"] and ex.entity not in doc["title"]
    assert ex.entity in ex.question
    # distractors share the form: the same kinds of templates appear among them
    assert sum(d["kind"] == ex.kind for i, d in enumerate(ex.documents) if i != ex.gold_index) >= 1


def test_entities_are_invented_and_distinct():
    x = nq.generate_example(tok("llama"), 6000, seed=2)
    entities = [d["entity"] for d in x.documents]
    assert len(set(entities)) == len(entities)
    from dysco_interp.tasks.names import city_names

    real = {n.lower() for n in city_names()}
    assert not any(e.lower() in real for e in entities)


@pytest.mark.parametrize("style", STYLES)
def test_null_query_keeps_document_spans(style):
    kwargs = {"enable_thinking": False} if style == "qwen3" else {}
    x = nq.generate_example(tok(style), 2500, seed=4, **kwargs)
    n = nq.null_query(x, tok(style))
    assert n.is_null_query and n.question == nq.NULL_QUESTION and n.answers == []
    assert n.doc_char_spans == x.doc_char_spans and n.doc_token_spans == x.doc_token_spans
    assert n.documents == x.documents and n.gold_index == x.gold_index and n.entity == x.entity
    assert n.prompt_text[slice(*n.query_char_span)] == f"{nq.LATE_INSTRUCTION}\nQuestion: N/A"
    assert n.prompt_text[: x.doc_char_spans[-1][1]] == x.prompt_text[: x.doc_char_spans[-1][1]]
    with pytest.raises(ValueError):
        nq.score_answer("anything", n)


@pytest.mark.parametrize("target", [1500, 4000, 10000])
def test_length_within_five_percent(target):
    x = nq.generate_example(tok("gemma3"), target, seed=0, index=1)
    assert abs(x.n_tokens - target) <= 0.05 * target


def test_deterministic_and_prefix_stable():
    a = nq.generate_example(tok("llama"), 3000, seed=7, index=2)
    b = nq.generate_example(tok("llama"), 3000, seed=7, index=2)
    c = nq.generate_example(tok("llama"), 3000, seed=8, index=2)
    assert a.to_dict() == b.to_dict()
    assert a.question != c.question
    longer = nq.generate_example(tok("llama"), 6000, seed=7, index=2)
    assert longer.question == a.question and longer.answers == a.answers
    assert longer.n_docs > a.n_docs


def test_gold_position_and_n_docs():
    first = nq.generate_example(tok("llama"), n_docs=10, gold_position=0.0)
    last = nq.generate_example(tok("llama"), n_docs=10, gold_position=1.0)
    middle = nq.generate_example(tok("llama"), n_docs=11, gold_position=0.5)
    assert (first.gold_index, last.gold_index, middle.gold_index) == (0, 9, 5)
    assert first.n_docs == 10
    assert first.documents[0] == last.documents[9]  # the same gold document, moved


def test_json_roundtrip(ex, tmp_path):
    assert nq.NeedleQAExample.from_dict(json.loads(json.dumps(ex.to_dict()))) == ex
    null = nq.null_query(ex, tok("llama"))
    path = save_dataset(tmp_path / "qa.jsonl", [ex, null])
    assert load_dataset(path) == [ex, null]


def test_make_dataset():
    data = make_dataset("needle-qa", tok("llama"), 2000, n=4, seed=3)
    assert len({x.question for x in data}) == 4
    assert all(abs(x.n_tokens - 2000) <= 100 for x in data)


def test_scorer():
    assert nq.normalize_answer("  The Velmar  River! ") == "velmar river"
    assert nq.exact_match("The Velmar River.", ["Velmar River", "Velmar"]) == 1.0
    assert nq.exact_match("It is the Velmar River.", ["Velmar River"]) == 0.0
    assert nq.contains_answer("It is the Velmar River.", ["Velmar River"]) == 1.0
    assert nq.contains_answer("It was built in 18734.", ["1873"]) == 0.0  # whole words only
    assert nq.contains_answer("Population: 12,400 people", ["12,400"]) == 1.0
    assert nq.contains_answer("about 12400", ["12,400"]) == 1.0
    assert nq.contains_answer("", ["1873"]) == 0.0
    assert nq.score_answer("1873.", ["1873"]) == {"exact_match": 1.0, "contains": 1.0}
    assert nq.score_answer("In 1873.", ["1873"]) == {"exact_match": 0.0, "contains": 1.0}
    assert nq.score_answer("Probably 1874", ["1873"]) == {"exact_match": 0.0, "contains": 0.0}


def test_gold_document_answers_every_question_kind():
    # each kind's gold document states the answer of each of its questions
    seen = set()
    for index in range(40):
        x = nq.generate_example(tok("llama"), n_docs=3, seed=5, index=index)
        gold = nq.normalize_answer(x.documents[x.gold_index]["text"])
        assert nq.contains_answer(gold, x.answers) == 1.0
        seen.add((x.kind, x.attribute))
    assert len({k for k, _ in seen}) == len(nq.KINDS)


def test_bad_input_errors():
    t = tok("llama")
    with pytest.raises(ConfigError, match="too short"):
        nq.generate_example(t, 50)
    with pytest.raises(ConfigError, match="n_docs"):
        nq.generate_example(t, n_docs=0)
    with pytest.raises(ConfigError, match="exactly one"):
        nq.generate_example(t)
    with pytest.raises(ConfigError, match="kinds"):
        nq.generate_example(t, 2000, kinds=["planet"])
    with pytest.raises(ConfigError, match="gold_position"):
        nq.generate_example(t, 2000, gold_position=1.5)
    with pytest.raises(ConfigError, match="n must be"):
        make_dataset("needle_qa", t, 2000, n=-1)

"""Format-forced decoding: the format fed as the gold tokenisation gives it, the content the
method's own; equal to teacher forcing when everything is format and to free decoding when
everything is content, the same on every backend and in batches, and run from `evaluate`."""

import dataclasses
import json

import pytest
import torch

from dysco_interp.chat import encode_text
from dysco_interp.cli import main
from dysco_interp.decoding.config import DecodingConfig
from dysco_interp.decoding.format_forced import RowWalk, Run, boundary, content_cap, segment_runs
from dysco_interp.decoding.loop import generate_batch
from dysco_interp.decoding.methods import SelectionParams
from dysco_interp.decoding.prompts import prepare_prompt
from dysco_interp.errors import ConfigError, DataError
from dysco_interp.experiments.evaluate import evaluate, segments_of
from dysco_interp.heads import HeadSet
from dysco_interp.models.tiny import tiny_model
from dysco_interp.stores.store import StoreMismatchError, read_store
from dysco_interp.tasks import make_dataset
from dysco_interp.tasks.path_traversal import Edge, answer_segments, gold_completion
from dysco_interp.tasks.path_traversal.spec import PATH_TRAVERSAL

BACKENDS = ("bridge", "sdpa", "static")
PROMPTS = [
    "You can travel from Paris to Berlin by train. Rome is quiet. " * 4 + "Where can you travel from Paris?",
    "Oslo is a lively city. " * 3 + "Please give a route from Oslo to Lima.",
]
# a route in Path Traversal's answer format: cities are content, the rest is format
ROUTE = [("<Route>\nFrom ", False), ("Paris", True), (", take a train to ", False), ("Berlin", True),
         (".\nFrom ", False), ("Berlin", True), (", take a bus to ", False), ("Rome", True), (".\n</Route>", False)]


def heads_for(model, pairs=((1, 0), (2, 3), (1, 2))):
    s = model.spec
    return HeadSet(list(pairs), model=s.name, n_layers=s.n_layers, n_heads=s.n_heads, n_kv_heads=s.n_kv_heads)


def vanilla(n=80):
    return DecodingConfig(method="vanilla", max_new_tokens=n)


# ---- the pure segment logic, on a tokenizer of one character per token


def chars(text):
    return [ord(c) for c in text]


def text_of(ids):
    return "".join(chr(i) for i in ids)


def walk(runs, choices, budget=100, eos=(0,)):
    """A row's tokens and choices when the model's choice at step j is choices[j] (or "x" past them)."""
    row = RowWalk(runs, chars, text_of, budget, eos)
    j = 0
    while not row.done:
        row.step(choices[j] if j < len(choices) else ord("x"))
        j += 1
    return text_of(row.tokens), row.chosen, row.finished


def test_a_token_that_touches_content_is_content_and_runs_cover_the_answer():
    segments = [("From ", False), ("Paris", True), (", by ", False), ("Rome", True), (".", False)]
    text = "".join(t for t, _ in segments)
    # tokens "From", " Paris" (the space is format, "Paris" content), ",", " by", " ", "Rome."
    pieces = ["From", " Paris", ",", " by", " ", "Rome."]
    offsets, at = [], 0
    for p in pieces:
        offsets.append((at, at + len(p)))
        at += len(p)
    runs = segment_runs(list(range(len(pieces))), offsets, segments)
    assert [(r.ids, r.content) for r in runs] == [((0,), False), ((1,), True), ((2, 3, 4), False), ((5,), True)]
    assert "".join(r.text for r in runs) == text and runs[1].text == " Paris" and runs[2].text == ", by "


def test_boundary_reads_where_the_format_starts_in_the_models_token():
    assert boundary(".", ".\nFrom") == 0  # starts the format
    assert boundary(".\nFrom Rome", ".\nFrom") == 0  # covers it and goes on
    assert boundary("is.", ".\nFrom") == 2  # ends the city, then starts the format
    assert boundary("is", ".\nFrom") is None
    assert boundary(". ", ".\nFrom") is None  # "." then something the format does not hold


def test_a_row_walks_format_and_content():
    runs = [Run(tuple(chars("<R>")), False, "<R>"), Run(tuple(chars("ab")), True, "ab"),
            Run(tuple(chars(".\n")), False, ".\n"), Run(tuple(chars("cd")), True, "cd"),
            Run(tuple(chars("</R>")), False, "</R>")]
    F, T = False, True
    # the model writes the content and starts each format; the format's rest is forced
    assert walk(runs, chars("???ab.\ncd</")) == ("<R>ab.\ncd</R>", [F] * 3 + [T] * 3 + [F] + [T] * 3 + [F] * 3, F)
    # what the model chooses where the format is forced is ignored
    assert walk(runs, chars("!!!ab.\ncd</!!!"))[0] == "<R>ab.\ncd</R>"
    # a "." that the model does not follow with the format's "\n" was content
    assert walk(runs, chars("???a.b.\ncd</"))[0] == "<R>a.b.\ncd</R>"
    # other content, ended where the model starts the format
    assert walk(runs, chars("???zzz.\nq</"))[0] == "<R>zzz.\nq</R>"
    # a content run that never returns to the format ends at its cap, and the format goes on
    text, chosen, _ = walk(runs, chars("???") + chars("y" * 50))
    assert text.startswith("<R>" + "y" * content_cap(2) + ".\n") and chosen[3:3 + content_cap(2) + 2] \
        == [T] * content_cap(2) + [F, F]
    # end of sequence ends a content run (the whole format follows) or confirms a started format
    assert walk(runs, chars("???a") + [0] + chars("?cd</")) == ("<R>a.\ncd</R>", [F] * 3 + [T, F, F] + [T] * 3
                                                               + [F] * 3, F)
    assert walk(runs, chars("???ab.") + [0] + chars("cd</"))[0] == "<R>ab.\ncd</R>"
    # ... and the row only in its last run, as free decoding does
    assert walk(runs[:4], chars("???ab.\nc") + [0]) == ("<R>ab.\nc\0", [F] * 3 + [T] * 3 + [F] + [T] * 2, T)
    # the budget ends it anywhere
    assert walk(runs, chars("???ab."), budget=4)[0] == "<R>a"


def char_runs(segments):
    text = "".join(t for t, _ in segments)
    return segment_runs(chars(text), [(i, i + 1) for i in range(len(text))], segments), text


def test_a_model_that_writes_the_gold_content_gets_the_gold_text_whatever_the_names_hold():
    edges = [Edge("St. Louis", "Sault Ste. Marie", "bus"), Edge("Sault Ste. Marie", "St.", "plane"),
             Edge("St.", "Rome", "ferry")]
    runs, gold = char_runs(answer_segments(edges))
    # the model's tokens: each name, and the first character of the format after it (which its next
    # choice confirms); a "." inside a name is the name's
    expected = []
    for before, run in zip([None, *runs], runs):
        expected += [run.content or (before is not None and i == 0) for i in range(len(run.ids))]
    assert walk(runs, chars(gold), budget=1000) == (gold, expected, False)
    # a model that never writes the format gets it all the same, between names cut at their cap
    text = walk(runs, chars("~" * 1000), budget=1000)[0]
    at = 0
    for run in runs:
        if not run.content:
            at = text.index(run.text, at) + len(run.text)
    assert at == len(text) and text.count("~") == sum(content_cap(len(r.ids)) for r in runs if r.content)


def test_a_token_that_merges_content_and_format_is_kept_and_the_rest_forced():
    # a tokenizer with merged tokens "b." (id 1000) and "b.\n" (id 1001)
    pieces = {1000: "b.", 1001: "b.\n"}

    def decode(ids):
        return "".join(pieces.get(i, chr(i) if i < 1000 else "") for i in ids)

    runs = [Run(tuple(chars("ab")), True, "ab"), Run(tuple(chars(".\n")), False, ".\n"),
            Run(tuple(chars("c")), True, "c"), Run(tuple(chars("!")), False, "!")]
    for merged, choices, chosen in [(1000, ["\n"], [True, True, False, True, False]),
                                    (1001, [], [True, True, True, False])]:
        row = RowWalk(runs, chars, decode, 100, ())
        for choice in [ord("a"), merged, *map(ord, choices), ord("c"), ord("!")]:
            row.step(choice)
        assert row.done and decode(row.tokens) == "ab.\nc!" and row.tokens[1] == merged
        assert row.chosen == chosen  # the merged token is the model's; the format's rest and "!" are forced


def test_path_traversal_names_its_cities_as_content(route_data):
    _, data = route_data
    for inst in data:
        segments = PATH_TRAVERSAL.evaluation.segments(inst)
        assert "".join(t for t, _ in segments) == inst.completion == PATH_TRAVERSAL.evaluation.gold(inst)
        cities = [t for t, content in segments if content]
        route = [(e["src"], e["dst"]) for e in inst.answer_repr]
        assert cities == [c for pair in route for c in pair]
        # the means of transport is format
        assert all(f"take a {e['transit']} to " in t for e, (t, _) in zip(inst.answer_repr, segments[2::4]))
    assert "".join(t for t, _ in ROUTE) == gold_completion(
        "From Paris, take a train to Berlin.\nFrom Berlin, take a bus to Rome.")


# ---- the decode loop on the tiny models


def greedy_after(model, prompt_ids, ids):
    with torch.inference_mode():
        return int(model.bridge(torch.tensor([prompt_ids + ids]))[0, -1].argmax())


def model_led_answer(model, prompt, n_content=3):
    """An answer of forced format pieces (which the model would not write) and content that is the
    model's own greedy continuation from one plain forward pass each; each format piece starts with
    the model's own next two tokens, so the model itself ends each content piece and starts the
    format."""
    prompt_ids = list(prepare_prompt(model, prompt).ids)
    formats = ["Route: from", " by ferry to", " then stop."]
    segments = [(formats[0], False)]
    ids = encode_text(model.tokenizer, formats[0])[0]
    for fmt in formats[1:]:
        content = []
        for _ in range(n_content):
            content.append(greedy_after(model, prompt_ids, ids + content))
        nxt = greedy_after(model, prompt_ids, ids + content)
        after = greedy_after(model, prompt_ids, ids + content + [nxt])
        piece = model.tokenizer.decode([nxt, after]) + fmt
        segments += [(model.tokenizer.decode(content), True), (piece, False)]
        ids += content + encode_text(model.tokenizer, piece)[0]
    return segments, ids


# prompts and content lengths whose model-led answers tokenise back to the tokens they were made of
@pytest.mark.parametrize("style, src, dst, n_content", [("llama", "Rome", "Berlin", 2), ("qwen2", "Paris", "Oslo", 3)])
def test_where_the_model_writes_the_gold_content_the_output_is_the_gold_answer(tiny_of, style, src, dst, n_content):
    model = tiny_of(style)
    prompt = f"You can travel from {src} to {dst} by train. " * 3 + f"Where can you travel from {src}?"
    segments, ids = model_led_answer(model, prompt, n_content)
    gold = "".join(t for t, _ in segments)
    assert encode_text(model.tokenizer, gold)[0] == ids  # the construction's tokens are the gold's
    free = generate_batch(model, [prompt], {"v": vanilla(len(ids))})["v"][0]
    assert not free.text.startswith(segments[0][0])  # the format is nothing the model writes
    for backend in BACKENDS:
        out = generate_batch(model, [prompt], {"v": vanilla()}, format_forced=[segments], backend=backend)["v"][0]
        assert out.tokens == ids and out.text == gold, backend
        # the model's: its content tokens and, after each, the token that starts the format
        assert sum(out.chosen) == 2 * (n_content + 1) and not out.finished


@pytest.mark.parametrize("style", ["llama", "qwen2"])
def test_all_format_is_teacher_forcing_and_all_content_is_free_decoding(tiny_of, style):
    model = tiny_of(style)
    heads = heads_for(model)
    configs = {"vanilla": vanilla(),
               "dysco": DecodingConfig(params=SelectionParams(beta=3.0, select_p=0.7), max_new_tokens=80)}
    gold = "".join(t for t, _ in ROUTE)
    for backend in BACKENDS:
        forced = generate_batch(model, PROMPTS[:1], configs, heads, forced=[gold], backend=backend)
        formatted = generate_batch(model, PROMPTS[:1], configs, heads, format_forced=[[(gold, False)]],
                                   backend=backend)
        free = generate_batch(model, PROMPTS[:1], configs, heads, backend=backend)
        contented = generate_batch(model, PROMPTS[:1], configs, heads, format_forced=[[(gold, True)]],
                                   backend=backend)
        for name in configs:
            f, ff = forced[name][0], formatted[name][0]
            assert ff.tokens == f.tokens and ff.text == gold and not any(ff.chosen), (backend, name)
            assert [s.token for s in ff.trace.steps] == [s.token for s in f.trace.steps]
            fr, fc = free[name][0], contented[name][0]
            assert fc.tokens == fr.tokens and fc.finished == fr.finished and all(fc.chosen), (backend, name)
            assert [s.token for s in fc.trace.steps] == [s.token for s in fr.trace.steps]


def test_content_tokens_are_the_models_argmax_and_format_tokens_the_golds(tiny_of):
    model = tiny_of("qwen2")
    out = generate_batch(model, PROMPTS[:1], {"v": vanilla(200)}, format_forced=[ROUTE])["v"][0]
    # teacher-force the output itself: where the model chose, its argmax is the token written
    check = generate_batch(model, PROMPTS[:1], {"v": vanilla(200)}, forced=[out.tokens])["v"][0]
    assert out.chosen and any(out.chosen) and not all(out.chosen)
    assert [a for a, c in zip(check.forced.argmax, out.chosen) if c] == [t for t, c in zip(out.tokens, out.chosen)
                                                                           if c]
    # the forced tokens are the format's gold tokens, in order, and the text holds every format piece
    ids, offsets = encode_text(model.tokenizer, "".join(t for t, _ in ROUTE))
    runs = segment_runs(ids, offsets, ROUTE)
    assert [t for t, c in zip(out.tokens, out.chosen) if not c] == [i for r in runs if not r.content for i in r.ids]
    at = 0
    for text, content in ROUTE:  # each format piece, in order (index raises where one is missing)
        if not content:
            at = out.text.index(text, at) + len(text)
    assert out.text.startswith("<Route>\nFrom") and out.text.endswith(".\n</Route>")
    free = generate_batch(model, PROMPTS[:1], {"v": vanilla(200)})["v"][0]
    assert free.text != out.text


def test_backends_agree_a_batch_is_its_rows_and_dysco_runs(tiny_of):
    model = tiny_of("qwen2")
    heads = heads_for(model)
    configs = {"dysco": DecodingConfig(params=SelectionParams(beta=3.0, select_p=0.7), max_new_tokens=200),
               "vanilla": vanilla(200)}
    other = [(t.replace("Paris", "Oslo").replace("Rome", "Lima"), c) for t, c in ROUTE]
    answers = [ROUTE, other]
    singles = [generate_batch(model, [p], configs, heads, format_forced=[a], backend="bridge")
               for p, a in zip(PROMPTS, answers)]
    for backend in ("sdpa", "static"):
        batch = generate_batch(model, PROMPTS, configs, heads, format_forced=answers, backend=backend)
        for i in range(len(PROMPTS)):
            for name in configs:
                got, ref = batch[name][i], singles[i][name][0]
                assert got.tokens == ref.tokens and got.chosen == ref.chosen, (backend, name, i)
    for i in range(len(PROMPTS)):
        dysco, plain = singles[i]["dysco"][0], singles[i]["vanilla"][0]
        assert dysco.trace.heads and any(s.n_selected for s in dysco.trace.decode_steps())
        assert dysco.text.startswith("<Route>\nFrom ") and dysco.text.endswith(".\n</Route>")
        assert dysco.tokens != plain.tokens


def test_format_forcing_is_checked(tiny_llama):
    for segments, match in [([ROUTE, ROUTE], "2 segmented answers for 1 prompts"), ("x", "one answer's segments"),
                            ([[("a", "yes")]], r"\(text, is_content\) pairs"), ([[("", True)]], "no text"),
                            ([[]], r"\(text, is_content\) pairs")]:
        with pytest.raises(ConfigError, match=match):
            generate_batch(tiny_llama, PROMPTS[:1], {"v": vanilla()}, format_forced=segments)
    with pytest.raises(ConfigError, match="exclude each other"):
        generate_batch(tiny_llama, PROMPTS[:1], {"v": vanilla()}, forced=["a"], format_forced=[ROUTE])


# ---- evaluate


@pytest.fixture(scope="module")
def route_data():
    # LongProc's prompt alone is ~1.9K tiny-tokenizer tokens: give the model room for the answer
    model = tiny_model("qwen2", max_position_embeddings=4096)
    return model, make_dataset("path_traversal", model.tokenizer, 1950, n=2, seed=3, progress=False)


def test_format_forced_evaluation_scores_the_text_freely_and_keeps_its_store_apart(route_data, tmp_path):
    model, data = route_data
    heads = heads_for(model)
    methods = {"vanilla": vanilla(600), "dysco": DecodingConfig(max_new_tokens=600, params={"k_fraction": 0.02})}
    out = tmp_path / "ff.jsonl"
    run = evaluate(model, "tiny-qwen2", "path_traversal", data, methods, heads, out, progress=False,
                   backend="sdpa", batch_size=2, format_forced=True)
    assert len(run.new) == 4
    header = json.loads(out.read_text().splitlines()[0])
    assert header["settings"]["decoding"] == "format-forced"
    for record in run.records:
        inst = next(x for x in data if x.id == record["id"])
        assert record["decoding"] == "format-forced" and 0 < record["n_chosen"]
        # the tags are forced, so the route is always found; the cities are the model's
        assert record["extraction_rate"] == 1.0 and record["output"].startswith("<Route>\nFrom ")
        assert {"accuracy", "partial_accuracy", "step_accuracy"} <= set(record) and "tf_step_accuracy" not in record
        first = inst.answer_repr[0]
        assert f", take a {first['transit']} to " in record["output"]
    # a store of free decoding is never resumed with format-forced results, nor the reverse
    with pytest.raises(StoreMismatchError, match="decoding"):
        evaluate(model, "tiny-qwen2", "path_traversal", data, methods, heads, out, progress=False, backend="sdpa")
    free = tmp_path / "free.jsonl"
    evaluate(model, "tiny-qwen2", "path_traversal", data[:1], {"vanilla": vanilla(8)}, None, free, progress=False)
    with pytest.raises(StoreMismatchError, match="decoding"):
        evaluate(model, "tiny-qwen2", "path_traversal", data[:1], {"vanilla": vanilla(8)}, None, free,
                 progress=False, format_forced=True)
    with pytest.raises(ConfigError, match="exclude each other"):
        evaluate(model, "tiny-qwen2", "path_traversal", data, methods, heads, tmp_path / "x.jsonl", progress=False,
                 teacher_forced=True, format_forced=True)


def test_cli_format_forced_runs_and_is_refused_in_one_line(data_dir, tmp_path, capsys, error_line, monkeypatch):
    out = tmp_path / "ff.jsonl"
    argv = ["evaluate", "--model", "tiny-llama", "--data", str(data_dir), "--methods", "vanilla", "--out", str(out),
            "--max-new-tokens", "12", "--format-forced"]
    assert main(argv) == 0
    assert "step_accuracy" in capsys.readouterr().out
    records = read_store(out).records
    assert [r["decoding"] for r in records] == ["format-forced"] and records[0]["output"].startswith("<Route>")
    import dysco_interp.models as models

    monkeypatch.setattr(models, "load_model", lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded")))
    # both modes, a task that names no segments, the store of another mode: one line, before the model loads
    for extra, words in [(["--teacher-forced"], "exclude each other"), (["--task", "needle_qa"], "names no format"),
                         ([], None)]:
        args = [a for a in argv if a != "--format-forced" or words is not None] + extra
        assert main(args) == 2
        line = error_line(capsys.readouterr().err)
        assert (words or "decoding") in line


def test_segments_that_do_not_join_to_the_gold_answer_are_refused(route_data):
    _, data = route_data
    evaluation = PATH_TRAVERSAL.evaluation
    assert segments_of(evaluation, data[0]) == evaluation.segments(data[0])
    broken = dataclasses.replace(evaluation, segments=lambda x: evaluation.segments(x)[1:])
    with pytest.raises(DataError, match="do not join to its gold answer"):
        segments_of(broken, data[0])

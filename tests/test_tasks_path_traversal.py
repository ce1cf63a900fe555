"""Path Traversal generator, spans, scorers, LongProc compatibility, registry and make-data CLI."""

import argparse
import functools
import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from dysco_interp.chat import encode_chat
from dysco_interp.cli.make_data import add_make_data_parser
from dysco_interp.errors import ConfigError
from dysco_interp.models.tiny import STYLES, tiny_tokenizer
from dysco_interp.tasks import get_task, load_dataset, make_dataset, save_dataset
from dysco_interp.tasks import path_traversal as pt
from dysco_interp.tasks.lengths import parse_length, parse_lengths
from dysco_interp.tasks.names import city_names
from dysco_interp.tasks.path_traversal.spec import parse_hops

DATA = Path(__file__).parent / "data" / "longproc_excerpt.json"
# The graphs of all 200 LongProc instances (tests/data/README.md says what was kept and why).
GRAPHS = Path(__file__).parent / "data" / "longproc_path_traversal_0.5k_graphs.json.gz"

# One tokenizer per style for the module: building one takes a moment.
tok = functools.cache(tiny_tokenizer)


@pytest.fixture(scope="module")
def excerpt():
    return json.loads(DATA.read_text())


@pytest.fixture(scope="module")
def inst():
    return pt.generate_instance(tok("llama"), 4000, seed=1, hops=6)


# ------------------------------------------------------------------ graph


@pytest.mark.parametrize("topology", pt.TOPOLOGIES)
def test_every_city_has_at_most_one_outgoing_edge(topology):
    for index in range(20):
        g = pt.generate_graph(80, seed=3, index=index, hops=(4, 12, 30), topology=topology)
        srcs = [e.src for e in g.edges]
        assert len(srcs) == len(set(srcs)) == 80
        cities = set(srcs) | {e.dst for e in g.edges}
        assert len(cities) == 81  # every city but the destination has exactly one outgoing edge
        assert g.dest not in srcs
        assert all(e.src != e.dst for e in g.edges)
        # the gold route is the unique walk from start to destination
        assert pt.follow_route(g.edges, g.start, g.dest) == list(g.route)


def test_merge_topology_distractors_flow_into_the_route():
    merged = 0
    for index in range(20):
        g = pt.generate_graph(60, seed=0, index=index, hops=4)
        on_route = {g.edges[i].src for i in g.route} | {g.dest}
        nxt = {e.src: e.dst for e in g.edges}
        for e in g.edges:
            city, steps = e.src, 0
            while city in nxt and steps <= len(g.edges):  # no cycles: every chain ends at the destination
                city, steps = nxt[city], steps + 1
            assert city == g.dest
        distractors = [e for e in g.edges if e.src not in on_route]
        merged += sum(e.dst in on_route for e in distractors)
    assert merged > 0


def test_route_is_fixed_across_lengths():
    short = pt.generate_graph(10, seed=5, index=2, hops=4)
    long = pt.generate_graph(300, seed=5, index=2, hops=4)
    assert [e.to_dict() for e in short.steps] == [e.to_dict() for e in long.steps]
    assert len(long.edges) == 300


def test_graph_statistics_match_longproc(excerpt):
    ref = excerpt["reference_statistics"]
    graphs = [pt.generate_graph(49, seed=11, index=i, hops=pt.LONGPROC_HOPS) for i in range(300)]
    ours = pt.graph_statistics(g.longproc_record() for g in graphs)
    assert ours["n_edges"] == ref["n_edges"] == 49
    assert ours["max_out_degree"] == ref["max_out_degree"] == 1
    assert abs(ours["n_hops"] - ref["n_hops"]) < 1.5
    assert abs(ours["distractor_into_route"] - ref["distractor_into_route"]) < 0.05
    assert abs(ours["distractor_depth_2"] - ref["distractor_depth_2"]) < 0.05
    assert abs(ours["dest_in_degree"] - ref["dest_in_degree"]) < 0.15
    assert abs(ours["max_in_degree"] - ref["max_in_degree"]) < 0.3
    assert abs(ours["start_has_no_incoming"] - ref["start_has_no_incoming"]) < 0.1
    assert abs(ours["gold_position"] - ref["gold_position"]) < 0.05
    assert ours["distractor_in_cycle"] == 0.0  # "merge" never closes a cycle


def test_graph_statistics_discriminate():
    # A generator whose distractors never touch the route must fail the comparison above.
    g = pt.generate_graph(49, seed=0, index=0, hops=24)
    route = {g.edges[i].src for i in g.route} | {g.dest}
    spare = [e.src for e in g.edges if e.src not in route]
    edges = [g.edges[i] for i in g.route] + [
        pt.Edge(s, spare[(k + 1) % len(spare)], "bus") for k, s in enumerate(spare)
    ]
    bad = pt.RouteGraph(tuple(edges), tuple(range(len(g.route))))
    stats = pt.graph_statistics([bad.longproc_record()])
    assert stats["distractor_into_route"] == 0.0 and stats["distractor_in_cycle"] == 1.0


def test_stored_reference_statistics_are_those_of_the_full_file(excerpt):
    graphs = json.loads(gzip.decompress(GRAPHS.read_bytes()))
    assert "princeton-pli/LongProc" in graphs["source"] and "Apache" in graphs["license"]
    records = graphs["instances"]
    assert len(records) == excerpt["reference_statistics"]["n_records"] == 200
    # the same release as the excerpt: its instances are the first ones, field for field
    for index, rec in zip(excerpt["indices"], excerpt["instances"]):
        assert records[index] == {k: rec[k] for k in graphs["fields"]}
    assert pt.graph_statistics(records) == pytest.approx(excerpt["reference_statistics"])


# ------------------------------------------------------------------ spans and length


@pytest.mark.parametrize("style", STYLES)
def test_edge_spans_are_exact(style):
    kwargs = {"enable_thinking": False} if style == "qwen3" else {}
    x = pt.generate_instance(tok(style), 3500, seed=2, hops=5, **kwargs)
    enc = encode_chat(tok(style), x.prompt, **kwargs)
    assert enc.text == x.prompt_text and len(enc) == x.n_tokens
    lines = x.context_nl.split("\n")[1:]
    assert len(lines) == x.n_edges == len(x.edge_char_spans) == len(x.edge_token_spans)
    prev_end = 0
    for line, (a, b), (s, e) in zip(lines, x.edge_char_spans, x.edge_token_spans):
        assert x.prompt_text[a:b] == line
        assert tok(style).decode(enc.input_ids[s:e]).strip() == line
        # tight: dropping the first or last token loses part of the line
        assert tok(style).decode(enc.input_ids[s + 1 : e]).strip() != line
        assert tok(style).decode(enc.input_ids[s : e - 1]).strip() != line
        assert s >= prev_end
        prev_end = e
    for step, k in zip(x.answer_repr, x.gold_edge_indices):
        assert x.context_repr[k] == step


def test_gold_answer_and_step_positions(inst):
    t = tok("llama")
    assert inst.n_hops == 6
    assert inst.completion == f"<Route>\n{inst.answer_nl}\n</Route>"
    tf = pt.teacher_forced_inputs(inst, t)
    assert tf.prompt_len == inst.n_tokens
    assert len(tf.input_ids) == inst.n_tokens + inst.completion_n_tokens
    names = [t.decode(ids).strip() for ids in tf.step_target_ids]
    assert names == [step["dst"] for step in inst.answer_repr]
    for (a, b), step in zip(inst.step_char_spans, inst.answer_repr):
        assert inst.completion[a:b] == step["dst"]
    # the token before each city name ends with " to" (the model predicts the name from there)
    for p in tf.first_token_positions:
        assert t.decode(tf.input_ids[p - 1 : p + 1]).strip().endswith("to")


@pytest.mark.parametrize("target", [2500, 4000, 9000])
def test_length_within_five_percent(target):
    x = pt.generate_instance(tok("qwen2"), target, seed=0, index=target % 7)
    assert abs(x.n_tokens - target) <= 0.05 * target
    assert x.n_tokens == len(encode_chat(tok("qwen2"), x.prompt))


def test_deterministic_for_a_seed():
    a = pt.generate_instance(tok("llama"), 3000, seed=4, index=1)
    b = pt.generate_instance(tok("llama"), 3000, seed=4, index=1)
    c = pt.generate_instance(tok("llama"), 3000, seed=5, index=1)
    assert a.to_dict() == b.to_dict()
    assert a.context_repr != c.context_repr


def test_json_roundtrip(inst, tmp_path):
    again = pt.PathTraversalInstance.from_dict(json.loads(json.dumps(inst.to_dict())))
    assert again == inst
    path = save_dataset(tmp_path / "pt.jsonl", [inst, inst])
    assert load_dataset(path) == [inst, inst]


def test_enough_city_names_for_32k_prompts():
    names = city_names()
    assert len(names) > 5000 and len(set(names)) == len(names)
    assert all(" to " not in f" {n} " and " by " not in f" {n} " for n in names)


# ------------------------------------------------------------------ scorers


GOLD = "\n".join(
    [
        "From Lille, take a ferry to Abingdon.",
        "From Abingdon, take a bus to Augsburg.",
        "From Augsburg, take a plane to Lecce.",
        "From Lecce, take a plane to Vladivostok.",
    ]
)
G = GOLD.split("\n")


def route(lines):
    return "Sure.\n<Route>\n" + "\n".join(lines) + "\n</Route>\nDone."


def test_scorer_exact_match():
    s = pt.score_route(route(G), GOLD)
    assert (s.accuracy, s.partial_accuracy, s.step_accuracy, s.extraction_rate) == (1, 1, 1, 1)
    assert s.first_error_step is None and s.n_correct_steps == 4
    assert pt.score_route("<Route>  \n" + GOLD + "\n\n  </Route>", GOLD).accuracy == 1.0


def test_scorer_missing_tags():
    for text in (GOLD, "<Route>\n" + GOLD, GOLD + "\n</Route>", ""):
        s = pt.score_route(text, GOLD)
        assert (s.accuracy, s.partial_accuracy, s.step_accuracy, s.extraction_rate) == (0, 0, 0, 0)
        assert pt.longproc_metrics(text, GOLD) == {"accuracy": 0.0, "partial_accuracy": 0.0, "extraction_rate": 0.0}


def test_longproc_partial_accuracy_credits_the_first_wrong_line():
    wrong3 = G[:2] + ["From Augsburg, take a bus to Lecce."] + G[3:]
    s = pt.score_route(route(wrong3), GOLD)
    assert s.accuracy == 0.0
    assert s.partial_accuracy == 3 / 4  # LongProc: (index 2 + 1) / 4
    assert s.step_accuracy == 2 / 4  # corrected: two steps right before the error
    assert s.first_error_step == 2
    wrong1 = ["From Lille, take a bus to Abingdon."] + G[1:]
    s = pt.score_route(route(wrong1), GOLD)
    assert (s.partial_accuracy, s.step_accuracy, s.first_error_step) == (1 / 4, 0.0, 0)


def test_scorer_short_and_long_predictions():
    s = pt.score_route(route(G[:2]), GOLD)  # stops early, both lines right
    assert (s.accuracy, s.partial_accuracy, s.step_accuracy) == (0.0, 2 / 4, 2 / 4)
    s = pt.score_route(route(G + ["From Vladivostok, take a bus to Lille."]), GOLD)  # one line too many
    assert (s.accuracy, s.partial_accuracy, s.step_accuracy, s.first_error_step) == (0.0, 1.0, 1.0, None)
    s = pt.score_route("</Route> then <Route>", GOLD)  # LongProc slices to an empty string
    assert s.extraction_rate == 1.0 and s.parsed == ""
    assert (s.partial_accuracy, s.step_accuracy) == (1 / 4, 0.0)


def test_teacher_forced_step_accuracy(inst):
    tf = pt.teacher_forced_inputs(inst, tok("llama"))
    ids = np.array(tf.input_ids)
    perfect = np.append(ids[1:], 0)  # what a model that always predicts the next gold token outputs
    s = pt.teacher_forced_step_accuracy(perfect, tf)
    assert s.accuracy == 1.0 and s.first_error_step is None and len(s.correct) == inst.n_hops
    assert pt.teacher_forced_step_accuracy(perfect, tf, mode="first_token").accuracy == 1.0
    # logits (one-hot) instead of ids, as a torch tensor with a batch axis
    import torch

    logits = torch.nn.functional.one_hot(torch.tensor(perfect), num_classes=int(ids.max()) + 2).float()[None]
    assert pt.teacher_forced_step_accuracy(logits, tf).accuracy == 1.0
    # break step 2 at its last name token: "name" mode sees it, "first_token" only if it is the first
    spoiled = perfect.copy()
    positions = tf.step_predict_positions[2]
    spoiled[positions[-1]] = ids[positions[-1] + 1] + 1
    s = pt.teacher_forced_step_accuracy(spoiled, tf)
    assert s.correct[2] is False and s.first_error_step == 2 and s.accuracy == (inst.n_hops - 1) / inst.n_hops
    assert pt.teacher_forced_step_accuracy(spoiled, tf, mode="first_token").correct[2] is (len(positions) > 1)
    # predictions at the target positions only
    only = [perfect[p] for ps in tf.step_predict_positions for p in ps]
    assert pt.teacher_forced_step_accuracy(only, tf).accuracy == 1.0
    with pytest.raises(ConfigError):
        pt.teacher_forced_step_accuracy(perfect[:10], tf)
    with pytest.raises(ConfigError):
        pt.teacher_forced_step_accuracy(perfect, tf, mode="all")


def test_forced_step_scores_keep_each_step_and_sum_up_to_the_means(inst):
    tf = pt.teacher_forced_inputs(inst, tok("llama"))
    start = tf.prompt_len - 1
    answer = list(tf.input_ids[tf.prompt_len:])
    argmax = list(answer)
    spoiled = tf.step_predict_positions[1][0] - start
    argmax[spoiled] += 1  # step 1's first name token is not the argmax
    logprob = [-0.1 * (j % 7) for j in range(len(answer))]
    margin = [0.5 + j for j in range(len(answer))]
    s = pt.forced_step_scores(argmax, logprob, tf, margin)
    assert s["tf_step_correct"] == [k != 1 for k in range(inst.n_hops)]
    assert s["tf_step_accuracy"] == sum(s["tf_step_correct"]) / inst.n_hops
    assert s["tf_city_logprob"] == pytest.approx(sum(s["tf_step_city_logprob"]) / inst.n_hops)
    assert s["tf_step_margin"][1] == margin[spoiled]
    # a decode cut before the last step: that step is wrong, and has neither log p nor margin
    cut = tf.step_predict_positions[-1][0] - start
    s = pt.forced_step_scores(argmax[:cut], logprob[:cut], tf, margin[:cut])
    assert s["tf_step_correct"][-1] is False
    assert s["tf_step_city_logprob"][-1] is None and s["tf_step_margin"][-1] is None
    assert pt.forced_step_scores(argmax, logprob, tf)["tf_step_margin"] == [None] * inst.n_hops  # no margins


def test_teacher_forced_inputs_refuse_another_tokenizer(inst):
    other = tiny_tokenizer("llama")
    other.add_tokens([" is a lively city"])  # same vocabulary otherwise, different ids for the prompt
    with pytest.raises(ConfigError, match="another tokenizer"):
        pt.teacher_forced_inputs(inst, other)
    assert inst.tokenizer == "tiny-llama"


# ------------------------------------------------------------------ LongProc reference excerpt


def test_excerpt_is_attributed(excerpt):
    assert "princeton-pli/LongProc" in excerpt["source"]
    assert "path_traversal_0.5k.json" in excerpt["source"]
    assert "Apache" in excerpt["license"]
    assert len(excerpt["instances"]) == 5


def test_reference_gold_answers_score_one(excerpt):
    for rec in excerpt["instances"]:
        lp = pt.longproc_metrics(pt.gold_completion(rec["answer_nl"]), rec["answer_nl"])
        assert lp == {"accuracy": 1.0, "partial_accuracy": 1.0, "extraction_rate": 1.0}
        s = pt.score_route(pt.gold_completion(rec["answer_nl"]), rec["answer_nl"])
        assert (s.accuracy, s.partial_accuracy, s.step_accuracy, s.extraction_rate) == (1, 1, 1, 1)


def test_reference_format_is_reproduced(excerpt):
    for rec in excerpt["instances"]:
        edges = [pt.Edge.from_dict(e) for e in rec["context_repr"]]
        steps = [pt.Edge.from_dict(e) for e in rec["answer_repr"]]
        assert rec["problem_description"] == pt.PROBLEM_DESCRIPTION
        assert pt.format_context(edges)[0] == rec["context_nl"]
        assert pt.format_answer(steps) == rec["answer_nl"]
        assert (
            pt.QUESTION_TEMPLATE.format(src=rec["question_repr"][0], dst=rec["question_repr"][1]) == rec["question_nl"]
        )


@pytest.mark.parametrize("style", ["llama", "qwen2"])
def test_reference_prompt_carries_every_edge_line(excerpt, style):
    for i, rec in enumerate(excerpt["instances"]):
        x = pt.from_longproc(rec, tok(style), id=f"longproc-{i}")
        lines = rec["context_nl"].split("\n")[1:]
        assert x.edge_lines == lines
        assert all(line in x.prompt for line in lines)
        assert x.prompt.startswith("[TASK]\n") and x.prompt.endswith("Mark the route with <Route> and </Route> tags.")
        assert f"Now find the route from {rec['question_repr'][0]} to {rec['question_repr'][1]} based on" in x.prompt
        assert x.longproc_record() == rec
        assert pt.score_route(x.completion, x).accuracy == 1.0
        ids = encode_chat(tok(style), x.prompt).input_ids
        for line, (s, e) in zip(lines, x.edge_token_spans):
            assert tok(style).decode(ids[s:e]).strip() == line


def test_from_longproc_rejects_inconsistent_records(excerpt):
    rec = dict(excerpt["instances"][0])
    rec["answer_repr"] = rec["answer_repr"][:-1]
    with pytest.raises(ValueError):
        pt.from_longproc(rec, tok("llama"))


# ------------------------------------------------------------------ bad input


def test_bad_input_errors():
    t = tok("llama")
    with pytest.raises(ConfigError, match="too short for a 4-hop route"):
        pt.generate_instance(t, 500, hops=4)
    with pytest.raises(ConfigError, match="city names"):
        pt.generate_graph(len(city_names()) + 5, hops=4)
    with pytest.raises(ConfigError, match="names"):
        pt.generate_instance(t, 50_000_000)
    with pytest.raises(ConfigError, match="fewer than"):
        pt.generate_graph(3, hops=4)
    with pytest.raises(ConfigError, match="hops"):
        pt.generate_graph(10, hops=0)
    with pytest.raises(ConfigError, match="topology"):
        pt.generate_graph(10, topology="ring")
    with pytest.raises(ConfigError, match="exactly one"):
        pt.generate_instance(t)
    with pytest.raises(ConfigError, match="exactly one"):
        pt.generate_instance(t, 3000, n_edges=40)
    with pytest.raises(ConfigError, match="tolerance"):
        pt.generate_instance(t, 3000, tolerance=0)


def test_registry_errors():
    t = tok("llama")
    with pytest.raises(ConfigError, match="unknown task 'path_travesal'.*path_traversal"):
        make_dataset("path_travesal", t, 3000)
    with pytest.raises(ValueError):  # ConfigError is a ValueError
        get_task("sudoku")
    with pytest.raises(ConfigError, match="n must be a positive integer"):
        make_dataset("path_traversal", t, 3000, n=0)
    with pytest.raises(ConfigError, match="no option"):
        make_dataset("path_traversal", t, 3000, n_needles=2)
    assert get_task("path-traversal").name == "path_traversal"


def test_make_dataset_indices_differ():
    data = make_dataset("path-traversal", tok("llama"), 3000, n=3, seed=9, hops=[3, 5])
    assert [x.index for x in data] == [0, 1, 2]
    assert len({x.question_nl for x in data}) == 3
    assert all(x.n_hops in (3, 5) for x in data)


# ------------------------------------------------------------------ CLI


def test_parse_lengths_and_hops():
    assert parse_lengths("1k, 2K,0.5k,1500") == [1024, 2048, 512, 1500]
    assert parse_length("32K") == 32768
    assert parse_hops("4") == 4 and parse_hops("24,29") == [24, 29] and parse_hops("3-5") == [3, 4, 5]
    for bad in ("", "abc", "-1k"):
        with pytest.raises(ConfigError):
            parse_lengths(bad)
    with pytest.raises(ConfigError):
        parse_hops("5-3")


def test_make_data_cli(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    add_make_data_parser(parser.add_subparsers())
    args = parser.parse_args(
        [
            "make-data",
            "path_traversal",
            "--model",
            "tiny-llama",
            "--lengths",
            "3000,4k",
            "--n",
            "2",
            "--seed",
            "1",
            "--hops",
            "3",
            "--yarn",  # tiny models have a 2048-token context; these lengths need it extended
            "4",
            "--out",
            str(tmp_path),
        ]
    )
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "tokens reached" in out and "hops" in out and "edges" in out
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["path_traversal_3000.jsonl", "path_traversal_4k.jsonl"]
    data = load_dataset(tmp_path / "path_traversal_4k.jsonl")
    assert len(data) == 2 and all(abs(x.n_tokens - 4096) <= 0.05 * 4096 and x.n_hops == 3 for x in data)
    bad = parser.parse_args(["make-data", "mrcr", "--hops", "3", "--model", "tiny-llama", "--out", str(tmp_path)])
    with pytest.raises(ConfigError, match="--hops applies to task 'path_traversal'"):
        bad.func(bad)

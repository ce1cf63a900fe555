"""Retrieval-head detection: hand-computed scoring math, planted heads on tiny models,
calibration, copy-paste score, resumable runs, split-half stability, bad input."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from dysco_interp import detection as D
from dysco_interp.chat import encode_text
from dysco_interp.decoding import runtime
from dysco_interp.detection import passes
from dysco_interp.errors import ConfigError, NoSignalError
from dysco_interp.heads import HeadFileError, HeadSet, random_like
from dysco_interp.hooks import sliding_layers
from dysco_interp.models.tiny import tiny_tokenizer
from dysco_interp.tasks import needle_qa as nq

# --------------------------------------------------------------------------- helpers


_EXAMPLES: dict = {}


def examples(style: str = "llama", n: int = 3, n_docs: int = 6) -> list:
    key = (style, n, n_docs)
    if key not in _EXAMPLES:
        tok = tiny_tokenizer(style)
        _EXAMPLES[key] = [nq.generate_example(tok, n_docs=n_docs, seed=0, index=i) for i in range(n)]
    return _EXAMPLES[key]


def plant(real_and_null=(), real_only=(), bias: float = 30.0):
    """Hooks (per example) that make the given heads attend to the gold document.

    real_and_null heads do it for the real and the null query alike (query-independent
    reading); real_only heads only when the real question is asked.
    """

    def hooks_for(example):
        start, end = example.gold_token_span
        heads = list(real_and_null) + ([] if example.is_null_query else list(real_only))
        out = []
        for layer, head in heads:

            def add(scores, hook, head=head):
                scores = scores.clone()
                scores[:, head, :, start:end] += bias
                return scores

            out.append((f"blocks.{layer}.attn.hook_attn_scores", add))
        return out

    return hooks_for


# --------------------------------------------------------------------------- pure math


def test_mean_query_rows_by_hand():
    p = torch.zeros(1, 2, 2, 5)
    p[0, 0, 0] = torch.tensor([0.5, 0.5, 0.0, 0.0, 0.0])
    p[0, 0, 1] = torch.tensor([0.1, 0.3, 0.2, 0.0, 0.4])
    p[0, 1, :, 4] = 1.0
    got = D.mean_query_rows(p, 3)
    assert torch.allclose(got, torch.tensor([[0.3, 0.4, 0.1], [0.0, 0.0, 0.0]]))


def test_filter_zeroes_tokens_below_mean_minus_two_sigma():
    # layer 0: doc A = nine 1s and one -10: mean -0.1, sample std 3.4785, threshold -7.057:
    # the -10 goes, the sum is 9 (not -1). doc B has no outlier (sum 1). doc C has one token.
    # layer 1: doc A all equal (std 0): kept, sum 1.0.
    x = torch.zeros(2, 1, 15)
    x[0, 0, :10] = torch.tensor([1.0] * 9 + [-10.0])
    x[0, 0, 10:14] = torch.tensor([0.5, 0.25, 0.25, 0.0])
    x[0, 0, 14] = 0.3
    x[1, 0, :10] = 0.1
    x[1, 0, 10:14] = torch.tensor([-5.0, 0.0, 0.0, 0.0])  # 4 tokens: max z is 1.5 < 2, kept
    got = D.filtered_doc_scores(x, [(0, 10), (10, 14), (14, 15)])
    assert got.shape == (2, 1, 3)
    assert torch.allclose(got[0, 0], torch.tensor([9.0, 1.0, 0.3]))
    assert torch.allclose(got[1, 0], torch.tensor([1.0, -5.0, 0.0]))


def test_filter_matches_a_plain_loop():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 40, generator=g) ** 3  # heavy tails: some tokens get filtered
    spans = [(2, 9), (9, 21), (25, 26), (30, 40)]
    got = D.filtered_doc_scores(x, spans)
    n_filtered = 0
    for layer in range(3):
        for head in range(4):
            for d, (s, e) in enumerate(spans):
                v = x[layer, head, s:e]
                std = v.std() if len(v) > 1 else torch.tensor(0.0)
                keep = v >= v.mean() - 2 * std
                n_filtered += int((~keep).sum())
                assert math.isclose(float(got[layer, head, d]), float((v * keep).sum()), rel_tol=1e-5, abs_tol=1e-6)
    assert n_filtered > 0


def test_ndcg_at_10_by_hand():
    scores = torch.tensor([0.1, 0.5, 0.3])
    assert D.ndcg_at_k(scores, 1).item() == pytest.approx(1.0)
    assert D.ndcg_at_k(scores, 2).item() == pytest.approx(1 / math.log2(3))  # 0.6309
    assert D.ndcg_at_k(scores, 0).item() == pytest.approx(0.5)  # rank 3: 1/log2(4)
    # ties count against the gold document
    assert D.ndcg_at_k(torch.tensor([0.2, 0.2, 0.1]), 0).item() == pytest.approx(1 / math.log2(3))
    assert D.ndcg_at_k(torch.zeros(4), 2).item() == pytest.approx(1 / math.log2(5))
    ranked = torch.arange(12, 0, -1).float()  # doc i has rank i + 1
    assert D.ndcg_at_k(ranked, 9).item() == pytest.approx(1 / math.log2(11))  # 0.2891
    assert D.ndcg_at_k(ranked, 10).item() == 0.0  # rank 11 > 10
    # vectorised over leading dims
    batch = torch.tensor([[[0.1, 0.5, 0.3], [0.9, 0.5, 0.3]]])
    assert torch.allclose(D.ndcg_at_k(batch, 1), torch.tensor([[1.0, 1 / math.log2(3)]], dtype=torch.float64))


def test_calibration_subtracts_the_null_query():
    spans = [(0, 4), (4, 8)]
    null = torch.rand(2, 3, 8, generator=torch.Generator().manual_seed(1)) / 8
    mass, ndcg = D.qrscore_example(null.clone(), null, spans, gold_index=1)
    assert torch.equal(mass, torch.zeros(2, 3))  # reading what it reads anyway scores 0
    real = null.clone()
    real[1, 2, 4:8] += 0.05  # one head reads the gold document more under the real query
    mass, ndcg = D.qrscore_example(real, null, spans, gold_index=1)
    assert mass[1, 2].item() == pytest.approx(0.2)
    assert mass.abs().sum().item() == pytest.approx(0.2)
    assert ndcg[1, 2].item() == 1.0


def test_copy_paste_hits_by_hand():
    prompt = torch.tensor([5, 6, 7, 8, 9, 7])
    needle = (1, 4)  # tokens 6 7 8
    top1 = torch.tensor([[2, 5, 1, 9], [3, 2, 0, 2]])
    got = D.copy_paste_hits(top1, 7, prompt, needle)
    # in needle and same token: (0,0) pos 2, (1,1) pos 2, (1,3) pos 2; pos 5 holds 7 but is outside;
    # pos 1 holds 6; pos 9 is a generated token; pos 3 holds 8
    expect = torch.tensor([[1 / 3, 0, 0, 0], [0, 1 / 3, 0, 1 / 3]], dtype=torch.float64)
    assert torch.allclose(got, expect)
    with pytest.raises(D.DetectionInputError):
        D.copy_paste_hits(top1, 7, prompt, (4, 9))


def test_absolute_top1_right_aligns_sliding_windows():
    p = torch.zeros(1, 2, 1, 4)
    p[0, 0, 0, 1] = 1.0
    p[0, 1, 0, 3] = 1.0
    assert D.absolute_top1(p, 4).tolist() == [1, 3]  # full layer: key axis is absolute
    assert D.absolute_top1(p, 10).tolist() == [7, 9]  # window of the last 4 of 10 keys
    with pytest.raises(ValueError):
        D.absolute_top1(p, 3)


def test_rank_heads_orders_scored_heads_and_keeps_ties_stable():
    scores = torch.tensor([[0.2, -1.0, 0.5], [0.5, 0.1, 0.9]])
    scored = torch.tensor([[True, False, True], [True, True, True]])
    assert D.rank_heads(scores, scored) == [
        ((1, 2), pytest.approx(0.9)), ((0, 2), 0.5), ((1, 0), 0.5), ((0, 0), pytest.approx(0.2)),
        ((1, 1), pytest.approx(0.1)),
    ]


def test_head_overlap():
    ov = D.head_overlap([(0, 1), (2, 3), (4, 5)], HeadSet([(2, 3), (4, 5), (6, 7)]))
    assert (ov.count, ov.jaccard, ov.shared) == (2, 0.5, ((2, 3), (4, 5)))


def test_bad_doc_spans_are_errors():
    with pytest.raises(D.DetectionInputError, match="inside the context"):
        D.filtered_doc_scores(torch.zeros(1, 1, 5), [(0, 3), (3, 7)])
    with pytest.raises(D.DetectionInputError, match="overlap"):
        D.filtered_doc_scores(torch.zeros(1, 1, 9), [(0, 5), (3, 7)])


# --------------------------------------------------------------------------- on tiny models


def test_query_pass_equals_a_full_forward(tiny_llama):
    """One context prefill + the query on a frozen cache = the full prompt's pattern rows."""
    ex = examples()[0]
    mask = torch.ones(4, 4, dtype=torch.bool)
    real, _ = D.example_query_attention(tiny_llama, ex, mask, null=False)
    ids = encode_text(tiny_llama.tokenizer, ex.prompt_text)[0]
    q0 = ex.query_token_span[0]
    full = {}

    def grab(p, hook):
        full[int(hook.name.split(".")[1])] = p[0, :, q0:, :q0].mean(dim=1)

    with torch.inference_mode():
        tiny_llama.bridge.run_with_hooks(
            torch.tensor([ids]), fwd_hooks=[(f"blocks.{i}.attn.hook_pattern", grab) for i in range(4)]
        )
    assert real.shape == (4, 4, q0)
    assert torch.allclose(real, torch.stack([full[i] for i in range(4)]), atol=1e-5)


def test_frozen_cache_serves_both_queries(tiny_llama):
    ex = examples()[0]
    ids = encode_text(tiny_llama.tokenizer, ex.prompt_text)[0]
    q0 = ex.query_token_span[0]
    cache, _ = runtime.prefill(tiny_llama, ids[:q0])
    a = D.query_attention(tiny_llama, cache, ids[q0:], q0, [0, 3])
    b = D.query_attention(tiny_llama, cache, ids[q0:], q0, [0, 3])
    assert runtime.cache_length(cache) == q0 and torch.equal(a, b)
    assert torch.equal(a[1:3], torch.zeros_like(a[1:3]))  # unhooked layers stay 0


def test_scores_shape_and_heads_restriction(tiny):
    exs = examples(tiny.spec.name.removeprefix("tiny-"), n=1, n_docs=3)
    full = D.qrscore(tiny, exs, progress=False)
    assert full.scores.shape == (4, 4) and full.scores.dtype == torch.float32
    sliding = sliding_layers(tiny.spec)
    for layer in range(4):
        if layer in sliding:
            assert (full.scores[layer] == -1).all() and not full.scored[layer].any()
        else:
            assert full.scored[layer].all()
    if tiny.spec.name == "tiny-gemma3":
        assert sliding == [0, 1, 3] and "unscored_sliding_layers" in full.extra
    keep = [(2, 1), (2, 3)]
    part = D.qrscore(tiny, exs, heads=keep, progress=False)
    as_dict = D.qrscore(tiny, exs, heads={2: [1, 3]}, progress=False)
    assert torch.equal(part.scores, as_dict.scores)
    expect = torch.full((4, 4), -1.0)
    for h in keep:
        expect[h] = full.scores[h]
    assert torch.allclose(part.scores, expect, atol=1e-6)


def test_gemma3_heads_only_in_sliding_layers_are_an_error(tiny_of):
    with pytest.raises(ConfigError, match="sliding-window"):
        D.qrscore(tiny_of("gemma3"), examples("gemma3", 1, 3), heads=[(0, 1)], progress=False)


@pytest.mark.parametrize("method", ["qrscore", "qrscore-ndcg"])
def test_planted_head_is_found(tiny_llama, method):
    planted = (2, 1)
    res = D.qrscore(tiny_llama, examples(), method=method, hooks=plant(real_only=[planted]), progress=False)
    ranking = res.ranking()
    assert ranking[0][0] == planted
    if method == "qrscore":
        assert ranking[0][1] > 0.8 and ranking[1][1] < 0.2  # calibrated mass on the gold doc
    else:
        assert ranking[0][1] == pytest.approx(1.0) and ranking[1][1] < 0.9
    hs = res.headset(4)
    assert hs.heads[0] == planted and hs.method == method and hs.n_examples == 3
    assert list(hs.scores) == sorted(hs.scores, reverse=True)


def test_calibration_cancels_query_independent_reading(tiny_llama):
    always, asked = (2, 1), (1, 3)
    hooks = plant(real_and_null=[always], real_only=[asked])
    res = D.qrscore(tiny_llama, examples(), hooks=hooks, progress=False)
    # both heads put nearly all their attention on the gold document under the real query...
    raw = D.gold_mass_per_head(tiny_llama, examples(), hooks=hooks)
    assert raw[always] > 0.95 and raw[asked] > 0.95
    # ...but only the one that does so because of the question keeps a calibrated score
    assert res.scores[asked] > 0.8
    assert abs(res.scores[always]) < 0.1
    assert res.ranking()[0][0] == asked


def test_copy_paste_planted_head(tiny_llama):
    exs = examples(n=2, n_docs=3)
    layer, head, offset, steps = 3, 2, 5, 4

    def hooks_for(example):
        ids = encode_text(tiny_llama.tokenizer, example.prompt_text)[0]
        start = example.gold_token_span[0] + offset
        target = ids[start : start + steps]  # copy 4 consecutive needle tokens
        state = {"step": 0}

        def attend(scores, hook):  # top-1 of the planted head: the needle token being copied
            scores = scores.clone()
            scores[:, head, -1, start + state["step"]] += 50.0
            return scores

        def force(logits, hook):  # and the model outputs exactly that token
            logits = logits.clone()
            logits[:, -1, target[state["step"]]] += 1e4
            state["step"] += 1
            return logits

        return [(f"blocks.{layer}.attn.hook_attn_scores", attend), ("unembed.hook_out", force)]

    res = D.copy_paste_score(tiny_llama, exs, hooks=hooks_for, max_new_tokens=steps, progress=False)
    lengths = [e.gold_token_span[1] - e.gold_token_span[0] for e in exs]
    expect = sum(steps / n for n in lengths) / len(exs)
    assert res.scores[layer, head].item() == pytest.approx(expect, rel=1e-6)
    assert res.ranking()[0][0] == (layer, head) and res.ranking()[1][1] < expect / 2
    assert res.method == "copy-paste" and res.scored.all()
    hs = res.headset(2)
    assert hs.method == "copy-paste" and hs.heads[0] == (layer, head)
    assert all(len(t) > 0 for t in res.extra["generated"].values())


def test_copy_paste_scores_every_layer_on_gemma3(tiny_of):
    res = D.copy_paste_score(tiny_of("gemma3"), examples("gemma3", 1, 3), max_new_tokens=2, progress=False)
    assert res.scored.all() and (res.scores >= 0).all()


# --------------------------------------------------------------------------- resumable runs


def test_resume_after_a_kill_gives_the_same_result(tiny_llama, tmp_path, monkeypatch):
    exs = examples(n=4, n_docs=3)
    whole = D.qrscore(tiny_llama, exs, progress=False)
    real_one = D.qrscore_one
    calls = []

    def dies_after_two(model, ex, *args, **kwargs):
        if len(calls) == 2:
            raise KeyboardInterrupt  # the run is killed while the third example runs
        calls.append(ex.id)
        return real_one(model, ex, *args, **kwargs)

    monkeypatch.setattr(passes, "qrscore_one", dies_after_two)
    with pytest.raises(KeyboardInterrupt):
        D.qrscore(tiny_llama, exs, progress=False, store=tmp_path)
    store = tmp_path / "qrscore.jsonl"
    lines = store.read_text().splitlines()
    assert len(lines) == 3 and json.loads(lines[0])["kind"] == "dysco-interp-store"
    assert [json.loads(x)["id"] for x in lines[1:]] == [e.id for e in exs[:2]]
    # a kill during a write leaves half a line: it is dropped, not an error
    with open(store, "a") as f:
        f.write('{"id": "needle_qa-s0-2-3d", "mass": [[0.1, ')

    def counting(model, ex, *args, **kwargs):
        calls.append(ex.id)
        return real_one(model, ex, *args, **kwargs)

    calls.clear()
    monkeypatch.setattr(passes, "qrscore_one", counting)
    resumed = D.qrscore(tiny_llama, exs, progress=False, store=tmp_path)
    assert calls == [e.id for e in exs[2:]]  # finished examples are not recomputed
    assert torch.equal(resumed.scores, whole.scores)
    # the other qrscore method reuses the same records without any model pass
    calls.clear()
    ndcg = D.qrscore(tiny_llama, exs, method="qrscore-ndcg", progress=False, store=tmp_path)
    assert calls == []
    assert torch.equal(ndcg.scores, D.qrscore(tiny_llama, exs, method="qrscore-ndcg", progress=False).scores)
    # other settings in the same folder are refused, not mixed
    with pytest.raises(ConfigError, match="other settings"):
        D.qrscore(tiny_llama, exs, heads=[(0, 0)], progress=False, store=tmp_path)


def test_the_store_matches_examples_by_content_not_id(tiny_llama, tmp_path, monkeypatch):
    tok = tiny_llama.tokenizer
    first = [nq.generate_example(tok, n_docs=3, seed=0, index=i, gold_position=0.0) for i in range(2)]
    moved = [nq.generate_example(tok, n_docs=3, seed=0, index=i, gold_position=1.0) for i in range(2)]
    assert [e.id for e in first] == [e.id for e in moved] and first != moved  # same ids, other data
    D.qrscore(tiny_llama, first, progress=False, store=tmp_path)
    real_one, calls = D.qrscore_one, []

    def counting(model, ex, *args, **kwargs):
        calls.append(ex.id)
        return real_one(model, ex, *args, **kwargs)

    monkeypatch.setattr(passes, "qrscore_one", counting)
    resumed = D.qrscore(tiny_llama, moved, progress=False, store=tmp_path)
    assert calls == [e.id for e in moved], "stale scores of other data were reused"
    assert torch.equal(resumed.scores, D.qrscore(tiny_llama, moved, progress=False).scores)
    header = json.loads((tmp_path / "qrscore.jsonl").read_text().splitlines()[0])
    assert header["settings"]["weights"] == tiny_llama.weights_id


def test_corrupt_store_line_is_an_error(tiny_llama, tmp_path):
    exs = examples(n=1, n_docs=3)
    D.qrscore(tiny_llama, exs, progress=False, store=tmp_path)
    path = tmp_path / "qrscore.jsonl"
    path.write_text(path.read_text() + "not json\n")
    with pytest.raises(ConfigError, match="line 3"):
        D.qrscore(tiny_llama, exs, progress=False, store=tmp_path)


# --------------------------------------------------------------------------- stability and evaluation


def test_split_half_finds_the_planted_head_in_both_halves(tiny_llama):
    res = D.qrscore(tiny_llama, examples(n=4, n_docs=3), hooks=plant(real_only=[(3, 0)]), progress=False)
    sh = D.split_half(res, top_k=1, seed=0)
    assert sh.first.heads == sh.second.heads == ((3, 0),)
    assert (sh.overlap.count, sh.overlap.jaccard) == (1, 1.0)
    assert set(sh.halves[0]).isdisjoint(sh.halves[1]) and len(sh.halves[0]) == len(sh.halves[1]) == 2
    # halves aggregate their own examples only
    assert torch.allclose(res.subset([0, 1]).scores, D.mean_over_examples(res.per_example[:2], res.scored))
    with pytest.raises(ConfigError, match="at least 2"):
        D.split_half(res.subset([0]))


def test_gold_mass_and_random_baseline(tiny_llama):
    exs = examples(n=2, n_docs=3)
    hooks = plant(real_and_null=[(1, 2)])
    masses = D.gold_mass_per_head(tiny_llama, exs, hooks=hooks)
    assert masses.shape == (4, 4) and ((masses >= 0) & (masses <= 1)).all()
    assert D.gold_attention_mass(tiny_llama, exs, [(1, 2)], hooks=hooks) == pytest.approx(masses[1, 2].item(), abs=1e-6)
    hs = HeadSet([(1, 2), (0, 0)], n_layers=4, n_heads=4)
    got = D.gold_attention_mass(tiny_llama, exs, hs, hooks=hooks)
    assert got == pytest.approx((masses[1, 2] + masses[0, 0]).item() / 2, abs=1e-6)
    base = D.random_baseline(tiny_llama, exs, hs, n_draws=5, seed=0, hooks=hooks)
    draws = [random_like(hs, tiny_llama.spec, seed=i) for i in range(5)]
    assert [d.heads for d in draws] == [d.heads for d in D.random_head_sets(tiny_llama, 2, 5, 0)]
    expect = sum(float(masses[d.as_tensor()[:, 0], d.as_tensor()[:, 1]].mean()) for d in draws) / 5
    assert base == pytest.approx(expect, abs=1e-6)


def test_random_head_sets_avoid_sliding_layers(tiny_of):
    for hs in D.random_head_sets(tiny_of("gemma3"), 4, n_draws=5, seed=3):
        assert all(layer == 2 for layer, _ in hs)


# --------------------------------------------------------------------------- bad input


def test_bad_input_is_a_clear_error(tiny_llama, tiny_of):
    ex = examples(n=1, n_docs=3)[0]
    with pytest.raises(D.DetectionInputError, match="empty"):
        D.qrscore(tiny_llama, [], progress=False)
    outside = dataclasses.replace(ex, query_token_span=(ex.n_tokens + 3, ex.n_tokens + 9))
    with pytest.raises(D.DetectionInputError, match="outside the prompt"):
        D.qrscore(tiny_llama, [outside], progress=False)
    with pytest.raises(D.DetectionInputError, match="duplicate"):
        D.qrscore(tiny_llama, [ex, ex], progress=False)
    with pytest.raises(D.DetectionInputError, match="null-query"):
        D.qrscore(tiny_llama, [nq.null_query(ex, tiny_llama.tokenizer)], progress=False)
    with pytest.raises(D.DetectionInputError, match="another chat template"):
        D.qrscore(tiny_of("gemma3"), [ex], progress=False)  # made with another tokenizer/template
    with pytest.raises(ConfigError, match="outside the model"):
        D.qrscore(tiny_llama, [ex], heads=[(4, 0)], progress=False)
    with pytest.raises(ConfigError, match="unknown detection method"):
        D.detect(tiny_llama, [ex], method="qr-score")
    res = D.qrscore(tiny_llama, [ex], progress=False)
    with pytest.raises(ConfigError, match="top_k=17 is larger than the 16 scored heads"):
        res.headset(17)
    with pytest.raises(ConfigError, match="n and length"):
        D.detect_qr_heads(tiny_llama)


def test_detect_qr_heads_generates_data_and_records_provenance(tiny_llama):
    scores, hs = D.detect_qr_heads(tiny_llama, n=2, length=700, seed=5, top_k=3, progress=False, command="test")
    assert scores.shape == (4, 4) and len(hs) == 3
    assert (hs.model, hs.n_layers, hs.n_heads, hs.n_kv_heads) == ("tiny-llama", 4, 4, 2)
    assert (hs.method, hs.n_examples, hs.seed, hs.command) == ("qrscore", 2, 5, "test")
    assert "needle_qa: 2 examples" in hs.data and "seed 5" in hs.data
    assert hs.scores[0] == pytest.approx(float(scores.max()))
    assert len(hs.extra["score_matrix"]) == 4 and hs.extra["n_scored_heads"] == 16
    assert HeadSet.from_dict(json.loads(json.dumps(hs.to_dict()))) == hs


# --------------------------------------------------------------------------- CLI


def _cli(argv):
    import argparse

    from dysco_interp.cli.detect_heads import add_detect_parser

    parser = argparse.ArgumentParser()
    add_detect_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_writes_head_file_table_and_heatmaps(tmp_path, capsys):
    out = tmp_path / "heads.json"
    argv = ["detect-heads", "--model", "tiny-llama", "--n", "2", "--length", "700", "--n-heads", "4",
            "--out", str(out), "--split-half", "--resume-dir", str(tmp_path / "runs"), "--no-progress"]
    assert _cli(argv) == 0
    printed = capsys.readouterr().out
    assert "rank  label" in printed and "split-half" in printed
    hs = HeadSet.from_json(out)
    assert len(hs) == 4 and hs.model == "tiny-llama" and hs.method == "qrscore" and hs.n_examples == 2
    assert hs.extra["split_half"]["top_k"] == 4
    first_row = printed.split("rank  label")[1].splitlines()[1].split()
    assert first_row[:4] == ["1", hs.labels()[0], str(hs.heads[0][0]), str(hs.heads[0][1])]
    assert (tmp_path / "heads_heatmap.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "plotly" in (tmp_path / "heads_heatmap.html").read_text()
    assert (tmp_path / "runs" / "qrscore.jsonl").exists()


def test_cli_bad_input_fails_before_loading_a_model(tmp_path, capsys):
    bad = Path(__file__).parent / "data" / "heads" / "bad" / "wrong_type.json"
    base = ["detect-heads", "--model", "no-such-model", "--out", str(tmp_path / "h.json")]
    with pytest.raises(HeadFileError, match="wrong_type.json"):
        _cli(base + ["--compare", str(bad)])
    broken = tmp_path / "broken.json"
    broken.write_text('[["3-1", 0.5], ["3-')
    with pytest.raises(HeadFileError, match="not valid JSON"):
        _cli(base + ["--compare", str(broken)])
    with pytest.raises(SystemExit):  # an argparse type: refused while the command line is read
        _cli(base + ["--n-heads", "0"])
    assert "argument --n-heads: must be an integer >= 1, got 0" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=".json"):
        _cli(["detect-heads", "--out", str(tmp_path / "h.txt")])
    with pytest.raises(ConfigError, match="--n-heads 17 is larger than the 16 heads"):
        _cli(["detect-heads", "--model", "tiny-llama", "--n-heads", "17", "--out", str(tmp_path / "h.json")])


def test_cli_reads_a_saved_dataset_and_runs_copy_paste(tmp_path):
    from dysco_interp.tasks import save_dataset

    data = save_dataset(tmp_path / "nq.jsonl", examples(n=2, n_docs=3))
    out = tmp_path / "cp.json"
    argv = ["detect-heads", "--model", "tiny-llama", "--data", str(data), "--method", "copy",
            "--max-new-tokens", "2", "--n-heads", "3", "--out", str(out), "--no-progress"]
    # a random tiny model never copies from the gold document: every score is 0, and ranking
    # zeros would list L0H0, L0H1, L0H2 as "top heads" (detect_cli.informative_top)
    with pytest.raises(NoSignalError, match="every copy-paste score is zero on 2 example"):
        _cli(argv)
    assert not out.exists()


def test_the_shipping_check_reports_what_the_head_file_needs(tiny_llama, tmp_path):
    from dysco_interp.detection.shipping import detect_and_check, layer_placement, score_matrix

    data = D.make_detection_data(tiny_llama, 3, 400, seed=0)
    heldout = D.make_detection_data(tiny_llama, 2, 400, seed=1000)
    heads, report = detect_and_check(tiny_llama, data, heldout, top_k=4, seed=0, store=tmp_path, command="cmd",
                                     length=400)
    assert len(heads) == 4 and report["heads"] == heads.labels()
    assert report["detection"]["n"] == 3 and report["heldout"]["seed"] == 1000
    assert len(report["heldout"]["random_draws"]) == 5
    assert sum(report["layers"]["histogram"].values()) == 4
    # the heatmap reads back the score matrix the head file carries, -1 where nothing was scored
    path = heads.to_json(tmp_path / "h.json")
    scores, scored = score_matrix(HeadSet.from_json(path))
    assert scores.shape == (4, 4) and bool(scored.all())
    assert layer_placement([(0, 0), (3, 1)], 4) == {"histogram": {"0": 1, "3": 1}, "relative_depth_mean": 0.5,
                                                   "relative_depth_range": [0.125, 0.875]}

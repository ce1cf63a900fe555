"""Teacher-forced decoding through the method's own steps: equal to one-pass teacher forcing
under vanilla, the same on every backend and in batches, and scored per task."""

import json

import pytest
import torch

from dysco_interp.decoding.config import DecodingConfig
from dysco_interp.decoding.loop import generate_batch
from dysco_interp.decoding.methods import SelectionParams
from dysco_interp.decoding.prompts import prepare_prompt
from dysco_interp.errors import ConfigError
from dysco_interp.experiments.evaluate import evaluate
from dysco_interp.heads import HeadSet
from dysco_interp.models.tiny import tiny_model
from dysco_interp.stores.store import StoreMismatchError
from dysco_interp.tasks import make_dataset
from dysco_interp.tasks.path_traversal import teacher_forced_inputs, teacher_forced_step_accuracy

PROMPTS = [
    "You can travel from Paris to Berlin by train. Rome is quiet. " * 4 + "Where can you travel from Paris?",
    "Oslo is a lively city. " * 3 + "Please give a route from Oslo to Lima.",
]
ANSWERS = ["You can travel from Paris to Berlin by train.", "From Oslo you can travel to Lima by plane, then to Quito."]


def heads_for(model, pairs=((1, 0), (2, 3), (1, 2))):
    s = model.spec
    return HeadSet(list(pairs), model=s.name, n_layers=s.n_layers, n_heads=s.n_heads, n_kv_heads=s.n_kv_heads)


def one_pass(model, prompt, answer):
    """argmax and gold log-probabilities from one uncached forward over prompt + answer."""
    prompt_ids = list(prepare_prompt(model, prompt).ids)
    answer_ids = model.tokenizer(answer, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt_ids + answer_ids])
    with torch.inference_mode():
        logits = model.bridge(ids)[0, len(prompt_ids) - 1 : -1].float()
    logp = torch.log_softmax(logits, -1)
    gold = torch.tensor(answer_ids)
    return answer_ids, logp.argmax(-1).tolist(), logp.gather(-1, gold[:, None])[:, 0].tolist()


def one_pass_top2(model, prompt, answer) -> torch.Tensor:
    """The two largest log-probabilities at each answer position, from one plain forward pass."""
    prompt_ids = list(prepare_prompt(model, prompt).ids)
    answer_ids = model.tokenizer(answer, add_special_tokens=False)["input_ids"]
    with torch.inference_mode():
        logits = model.bridge(torch.tensor([prompt_ids + answer_ids]))[0, len(prompt_ids) - 1 : -1].float()
    return torch.log_softmax(logits, -1).topk(2, dim=-1).values


@pytest.mark.parametrize("style", ["llama", "qwen2"])
@pytest.mark.parametrize("backend", ["bridge", "sdpa"])
def test_vanilla_forced_equals_one_pass_teacher_forcing(tiny_of, style, backend):
    model = tiny_of(style)
    out = generate_batch(model, PROMPTS[:1], {"v": DecodingConfig(method="vanilla", max_new_tokens=64)},
                         forced=ANSWERS[:1], backend=backend)["v"][0]
    gold, argmax, logprob = one_pass(model, PROMPTS[0], ANSWERS[0])
    assert out.tokens == gold and out.forced is not None
    assert out.forced.argmax == argmax
    torch.testing.assert_close(torch.tensor(out.forced.logprob), torch.tensor(logprob), atol=2e-4, rtol=0)
    assert len(set(argmax)) > 1  # not a degenerate model
    summary = out.forced.summary(out.tokens)
    assert summary["n_forced"] == len(gold)
    assert summary["tf_token_accuracy"] == sum(a == g for a, g in zip(argmax, gold)) / len(gold)
    assert summary["tf_token_correct"] == [a == g for a, g in zip(argmax, gold)]
    # the margin is the gap between the model's first and second choice at each gold position
    top = one_pass_top2(model, PROMPTS[0], ANSWERS[0])
    torch.testing.assert_close(torch.tensor(out.forced.margin), top[:, 0] - top[:, 1], atol=2e-4, rtol=0)
    assert min(out.forced.margin) >= 0


def test_forced_dysco_is_the_same_on_every_backend_and_in_a_batch(tiny_of):
    model = tiny_of("qwen2")
    heads = heads_for(model)
    configs = {"dysco": DecodingConfig(params=SelectionParams(beta=3.0, select_p=0.7), max_new_tokens=64),
               "beta1": DecodingConfig(params={"beta": 1.0}, max_new_tokens=64),
               "vanilla": DecodingConfig(method="vanilla", max_new_tokens=64)}
    runs = {b: generate_batch(model, PROMPTS, configs, heads, forced=ANSWERS, backend=b)
            for b in ("sdpa", "static")}
    singles = [generate_batch(model, [p], configs, heads, forced=[a], backend="bridge")
               for p, a in zip(PROMPTS, ANSWERS)]
    for i in range(len(PROMPTS)):
        for name in configs:
            ref = singles[i][name][0].forced
            for backend, run in runs.items():
                got = run[name][i].forced
                assert got.argmax == ref.argmax, (backend, name, i)
                torch.testing.assert_close(torch.tensor(got.logprob), torch.tensor(ref.logprob), atol=5e-4, rtol=0)
        # beta 1 is vanilla; a strong beta changes the predictions' probabilities
        assert singles[i]["beta1"][0].forced.argmax == singles[i]["vanilla"][0].forced.argmax
        assert singles[i]["dysco"][0].forced.logprob != singles[i]["vanilla"][0].forced.logprob
    # the rows of a batch stop at their own answer's length
    assert [len(r.forced.argmax) for r in runs["sdpa"]["dysco"]] == [len(s["dysco"][0].tokens) for s in singles]
    steps = [s for s in singles[1]["dysco"][0].trace.steps if s.phase == "decode"]
    assert len(steps) == len(singles[1]["dysco"][0].tokens) - 1  # the last gold token is never fed


def test_forced_answers_are_checked_and_capped(tiny_of):
    model = tiny_of("llama")
    vanilla = {"v": DecodingConfig(method="vanilla", max_new_tokens=3)}
    capped = generate_batch(model, PROMPTS[:1], vanilla, forced=ANSWERS[:1])["v"][0]
    assert len(capped.tokens) == len(capped.forced.argmax) == 3
    for forced, match in [(ANSWERS, "2 forced answers for 1 prompts"), ([""], "empty"),
                          ([[1, 10**9]], "outside the vocabulary"), ("Paris", "one gold answer per prompt"),
                          ([[1.5]], "text or a list of token ids")]:
        with pytest.raises(ConfigError, match=match):
            generate_batch(model, PROMPTS[:1], vanilla, forced=forced)


@pytest.fixture(scope="module")
def route_model_and_data():
    # LongProc's prompt alone is ~1.9K tiny-tokenizer tokens: give the model room for the answer
    model = tiny_model("qwen2", max_position_embeddings=4096)
    data = make_dataset("path_traversal", model.tokenizer, 1950, n=2, seed=3, progress=False)
    return model, data


def test_teacher_forced_evaluation_scores_route_steps_and_keeps_stores_apart(route_model_and_data, tmp_path):
    model, data = route_model_and_data
    heads = heads_for(model)
    methods = {"vanilla": DecodingConfig(method="vanilla", max_new_tokens=400),
               "dysco": DecodingConfig(max_new_tokens=400, params={"k_fraction": 0.02})}
    out = tmp_path / "tf.jsonl"
    run = evaluate(model, "tiny-qwen2", "path_traversal", data, methods, heads, out, progress=False,
                   backend="sdpa", batch_size=2, teacher_forced=True, keep_trace=True)
    assert len(run.new) == 4
    header = json.loads(out.read_text().splitlines()[0])
    assert "teacher_forced" in json.dumps(header)
    for record in run.records:
        inst = next(x for x in data if x.id == record["id"])
        inputs = teacher_forced_inputs(inst, model.tokenizer)
        assert record["n_forced"] == len(inputs.input_ids) - inputs.prompt_len
        predicted = [-1] * (inputs.prompt_len - 1) + record["forced"]["argmax"] + [-1]
        assert record["tf_step_accuracy"] == teacher_forced_step_accuracy(predicted, inputs).accuracy
        assert record["tf_city_logprob"] < 0 and "output" not in record and "argmax_text" in record
        if record["method"] == "dysco":  # the cap: 2% of the prompt
            caps = {s["n_selected"] for s in record["trace"]["steps"] if s["n_selected"] is not None}
            assert caps and max(caps) <= -(-inst.n_tokens * 2 // 100)
    # a store of free decoding is never resumed with teacher-forced results, nor the reverse
    with pytest.raises(StoreMismatchError, match="teacher_forced"):
        evaluate(model, "tiny-qwen2", "path_traversal", data, methods, heads, out, progress=False, backend="sdpa")

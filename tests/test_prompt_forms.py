"""Prompts in the forms TransformerLens users write: token ids as lists, 1-D and [1, N]
tensors (used as given), [B, N] tensors for a batch, text with or without the chat template,
and the prompt text kept on the result."""

import json

import numpy as np
import pytest
import torch

from dysco_interp.cli import main
from dysco_interp.decoding.config import DecodingConfig
from dysco_interp.decoding.loop import compare_methods, dysco_generate, generate, generate_batch
from dysco_interp.decoding.results import GenerationResult
from dysco_interp.errors import ConfigError

TEXT = "you can travel from paris to berlin by train. where can you travel from paris?"
HEADS = [(1, 0), (2, 3)]


def test_token_ids_in_every_form_are_used_as_given(tiny_llama):
    model = tiny_llama
    ids = model.bridge.to_tokens(TEXT)  # [1, N] long, BOS first
    as_list = ids[0].tolist()
    results = [generate(model, form, method="dysco", heads=HEADS, params={"beta": 3.0}, max_new_tokens=4)
               for form in (ids, ids[0], as_list, ids.to(torch.int32), ids[0].numpy(), tuple(as_list))]
    for r in results:
        assert r.prompt_ids == as_list and r.tokens == results[0].tokens and r.method == "dysco"
        assert r.prompt_text == model.tokenizer.decode(as_list)
    by_config = generate(model, ids, DecodingConfig(params={"beta": 3.0}, max_new_tokens=4), heads=HEADS)
    assert by_config.tokens == results[0].tokens
    assert dysco_generate(model, as_list, HEADS, DecodingConfig(params={"beta": 3.0}, max_new_tokens=4)).tokens == \
        by_config.tokens
    # no template: the last prompt token gets the method's step (n_gen 0), the rest warm up or prefill
    assert [s.phase for s in by_config.trace.steps].count("intervention-warmup") == 1


def test_a_batch_tensor_is_b_prompts_of_n_tokens(tiny_llama):
    model = tiny_llama
    ids = torch.stack([model.bridge.to_tokens(TEXT)[0][:12], model.bridge.to_tokens(TEXT)[0][-12:]])
    config = {"dysco": DecodingConfig(max_new_tokens=3)}
    together = generate_batch(model, ids, config, HEADS, backend="sdpa")["dysco"]
    as_rows = generate_batch(model, [ids[0], ids[1].tolist()], config, HEADS, backend="sdpa")["dysco"]
    alone = [compare_methods(model, row, config, HEADS)["dysco"] for row in ids]
    assert [r.prompt_ids for r in together] == ids.tolist()
    assert [r.tokens for r in together] == [r.tokens for r in as_rows] == [r.tokens for r in alone]


@pytest.mark.parametrize("style", ["llama", "qwen2", "gemma3"])
def test_chat_false_tokenizes_as_to_tokens_and_chat_true_keeps_the_template(tiny_of, style):
    model = tiny_of(style)
    raw = generate(model, TEXT, chat=False, max_new_tokens=2)
    assert raw.prompt_ids == model.bridge.to_tokens(TEXT)[0].tolist()
    assert raw.prompt_text == TEXT
    chat = generate(model, TEXT, max_new_tokens=2)
    assert chat.prompt_text != TEXT and TEXT in chat.prompt_text
    assert model.tokenizer.apply_chat_template([{"role": "user", "content": TEXT}], add_generation_prompt=True,
                                               tokenize=False) == chat.prompt_text
    assert model.tokenizer(chat.prompt_text, add_special_tokens=False)["input_ids"] == chat.prompt_ids


def test_prompt_text_round_trips_and_old_results_still_load(tiny_llama):
    result = generate(tiny_llama, TEXT, max_new_tokens=2)
    d = result.to_dict()
    assert d["prompt_text"] == result.prompt_text and "<|start_header_id|>user" in d["prompt_text"]
    assert GenerationResult.from_dict(json.loads(json.dumps(d))) == result
    del d["prompt_text"]
    assert GenerationResult.from_dict(d).prompt_text is None


@pytest.mark.parametrize("prompt, named", [
    (torch.ones(2, 5, dtype=torch.long), r"prompt: token ids must be of shape \[N\] or \[1, N\], got \(2, 5\)"),
    (torch.ones(1, 1, 5, dtype=torch.long), r"got \(1, 1, 5\)"),
    (torch.ones(5), "token ids must be an integer tensor, got dtype torch.float32"),
    (torch.ones(5, dtype=torch.bool), "dtype torch.bool"),
    (torch.ones(0, dtype=torch.long), "token ids are empty"),
    ([1, 2.5], r"token ids must be integers, got \[1, 2.5\]"),
    ([1, 10**9], "outside the vocabulary"),
    ([-1, 3], "outside the vocabulary"),
])
def test_wrong_ids_are_one_line_config_errors(tiny_llama, prompt, named):
    with pytest.raises(ConfigError, match=named) as err:
        generate(tiny_llama, prompt, max_new_tokens=2)
    assert "\n" not in str(err.value)


def test_wrong_batches_and_flags_are_config_errors(tiny_llama):
    config = {"v": DecodingConfig(method="vanilla", max_new_tokens=2)}
    with pytest.raises(ConfigError, match=r"prompts is one list of token ids .* pass a list of prompts \(\[ids\]\)"):
        generate_batch(tiny_llama, [1, 2, 3], config)
    with pytest.raises(ConfigError, match=r"a tensor of prompts must be \[batch, tokens\], got shape \(3,\)"):
        generate_batch(tiny_llama, torch.tensor([1, 2, 3]), config)
    with pytest.raises(ConfigError, match="prompt #1: token ids must be an integer tensor"):
        generate_batch(tiny_llama, [[1, 2], torch.ones(2)], config)
    with pytest.raises(ConfigError, match="chat messages need the chat template"):
        generate(tiny_llama, [{"role": "user", "content": "hi"}], chat=False, max_new_tokens=2)
    with pytest.raises(ConfigError, match="chat must be"):
        generate(tiny_llama, "hi", chat="no", max_new_tokens=2)
    assert generate(tiny_llama, np.array([[5, 6, 7]]), max_new_tokens=2).prompt_ids == [5, 6, 7]


def test_cli_no_chat_feeds_the_prompt_as_it_is(capsys):
    argv = ["generate", "--model", "tiny-llama", "--prompt", "hello there", "--max-new-tokens", "2", "--json"]
    assert main(argv + ["--no-chat"]) == 0
    assert json.loads(capsys.readouterr().out)["prompt_text"] == "hello there"
    assert main(argv) == 0
    assert "<|start_header_id|>user" in json.loads(capsys.readouterr().out)["prompt_text"]
    assert main(["generate", "--help"]) == 0
    assert "--no-chat feed the prompt as it is" in " ".join(capsys.readouterr().out.split())

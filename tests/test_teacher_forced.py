"""Teacher-forced predictions through the runtime equal a plain full forward."""

import torch

from dysco_interp.analysis.teacher_forced import answer_argmax, path_traversal_step_accuracy
from dysco_interp.models.tiny import tiny_model
from dysco_interp.tasks import make_dataset
from dysco_interp.tasks.path_traversal import teacher_forced_inputs


def test_matches_a_full_forward_and_scores_steps():
    # LongProc's prompt alone is ~1.9K tiny-tokenizer tokens: give the model room for the answer
    tiny_llama = tiny_model("llama", max_position_embeddings=4096)
    inst = make_dataset("path_traversal", tiny_llama.tokenizer, 1950, n=1, seed=3, progress=False)[0]
    inputs = teacher_forced_inputs(inst, tiny_llama.tokenizer)
    ours = answer_argmax(tiny_llama, inputs.input_ids, inputs.prompt_len, chunk_size=256)
    with torch.inference_mode():
        full = tiny_llama.bridge(torch.tensor([inputs.input_ids])).argmax(-1)[0].tolist()
    assert ours[inputs.prompt_len - 1 :] == full[inputs.prompt_len - 1 :]
    assert all(x == -1 for x in ours[: inputs.prompt_len - 1])
    score = path_traversal_step_accuracy(tiny_llama, inst)
    assert len(score.correct) == inst.n_hops
    # a model that copies the gold answer perfectly would score 1: check the scorer on the gold itself
    perfect = list(inputs.input_ids[1:]) + [0]
    from dysco_interp.tasks.path_traversal import teacher_forced_step_accuracy

    assert teacher_forced_step_accuracy(perfect, inputs).accuracy == 1.0

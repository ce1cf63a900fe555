"""Teacher-forced next-step predictions: the prompt plus the gold answer in one pass.

The prompt goes through the runtime's prefill (no n x n scores); the gold answer then
runs as one chunk on that cache, and only its positions' logits are kept.
"""

from __future__ import annotations

import torch

from dysco_interp.decoding import runtime
from dysco_interp.models import LoadedModel
from dysco_interp.tasks.path_traversal import (
    PathTraversalInstance,
    TeacherForcedScore,
    teacher_forced_inputs,
    teacher_forced_step_accuracy,
)


@torch.inference_mode()
def answer_argmax(model: LoadedModel, input_ids, prompt_len: int, chunk_size: int = runtime.DEFAULT_CHUNK) -> list[int]:
    """Argmax next token at every position (-1 before the prompt's last token)."""
    ids = runtime.as_ids(model, input_ids)
    model.check_fits(ids.shape[1])
    cache, _ = runtime.prefill(model, ids[:, : prompt_len - 1], chunk_size=chunk_size)
    tail = ids[:, prompt_len - 1 :]
    logits = model.prefill_model(input_ids=tail, past_key_values=cache, use_cache=True).logits
    return [-1] * (prompt_len - 1) + logits[0].argmax(-1).tolist()


def path_traversal_step_accuracy(
    model: LoadedModel, instance: PathTraversalInstance, mode: str = "name"
) -> TeacherForcedScore:
    """Per-step teacher-forced accuracy of the destination cities of the gold route."""
    inputs = teacher_forced_inputs(instance, model.tokenizer)
    return teacher_forced_step_accuracy(answer_argmax(model, inputs.input_ids, inputs.prompt_len), inputs, mode)

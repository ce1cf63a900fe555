"""Teacher forcing on Path Traversal: one forward pass over prompt + gold answer, scored per step."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from dysco_interp.chat import Span, encode_text
from dysco_interp.errors import ConfigError
from dysco_interp.tasks.base import check_same_tokenizer
from dysco_interp.tasks.path_traversal.instance import PathTraversalInstance


@dataclass(frozen=True)
class TeacherForcedInputs:
    """Prompt ids + gold answer ids, and where each step's destination city is predicted.

    `step_token_spans[k]` are the positions of step k's city-name tokens; the logits at
    position p predict the token at p + 1, so the name's tokens are predicted at
    `step_predict_positions[k]` = span shifted by one.
    """

    input_ids: tuple[int, ...]
    prompt_len: int
    step_token_spans: tuple[Span, ...]

    @property
    def step_target_ids(self) -> list[list[int]]:
        return [list(self.input_ids[a:b]) for a, b in self.step_token_spans]

    @property
    def step_predict_positions(self) -> list[list[int]]:
        return [list(range(a - 1, b - 1)) for a, b in self.step_token_spans]

    @property
    def first_token_positions(self) -> list[int]:
        """Position whose logits predict each step's first city-name token."""
        return [a - 1 for a, _ in self.step_token_spans]


def teacher_forced_inputs(instance: PathTraversalInstance, tokenizer) -> TeacherForcedInputs:
    """Ids for one teacher-forced forward pass; checks the tokenizer matches the instance."""
    prompt_ids, _ = encode_text(tokenizer, instance.prompt_text)
    check_same_tokenizer(instance, len(prompt_ids))
    comp_ids, _ = encode_text(tokenizer, instance.completion)
    return TeacherForcedInputs(
        tuple(prompt_ids) + tuple(comp_ids), len(prompt_ids), tuple((a, b) for a, b in instance.step_token_spans)
    )


@dataclass(frozen=True)
class TeacherForcedScore:
    correct: tuple[bool, ...]  # per gold step
    accuracy: float
    first_error_step: int | None

    def to_dict(self) -> dict:
        return asdict(self)


def teacher_forced_step_accuracy(predicted, inputs: TeacherForcedInputs, mode: str = "name") -> TeacherForcedScore:
    """Per-step accuracy from one teacher-forced pass.

    `predicted`: argmax next-token ids (1-D) or logits (2-D, [positions, vocab]), either for
    every position of `inputs.input_ids` or only for the positions in
    `inputs.step_predict_positions` flattened in step order (mode "name") /
    `inputs.first_token_positions` (mode "first_token").
    mode "name": a step is right when every token of the city name is the argmax (what greedy
    decoding would write given the gold prefix); "first_token": only the first token.
    """
    if mode not in ("name", "first_token"):
        raise ConfigError(f"unknown mode {mode!r}; use 'name' or 'first_token'")
    ids = _as_argmax_list(predicted)
    per_step = inputs.step_predict_positions if mode == "name" else [[p] for p in inputs.first_token_positions]
    targets = inputs.step_target_ids if mode == "name" else [t[:1] for t in inputs.step_target_ids]
    n_needed = sum(len(p) for p in per_step)
    if len(ids) == len(inputs.input_ids):
        lookup = lambda step, j: ids[per_step[step][j]]  # noqa: E731
    elif len(ids) == n_needed:
        starts = [0]
        for p in per_step:
            starts.append(starts[-1] + len(p))
        lookup = lambda step, j: ids[starts[step] + j]  # noqa: E731
    else:
        raise ConfigError(
            f"predictions cover {len(ids)} positions; expected {len(inputs.input_ids)} (every position) "
            f"or {n_needed} (the target positions of mode {mode!r})"
        )
    correct = tuple(all(int(lookup(k, j)) == int(t) for j, t in enumerate(targets[k])) for k in range(len(per_step)))
    first = next((k for k, ok in enumerate(correct) if not ok), None)
    return TeacherForcedScore(correct, sum(correct) / max(1, len(correct)), first)


def _as_argmax_list(predicted) -> list[int]:
    if hasattr(predicted, "detach"):  # torch tensor
        predicted = predicted.detach().cpu().numpy()
    arr = np.asarray(predicted)
    if arr.ndim == 3 and arr.shape[0] == 1:  # a batch of one
        arr = arr[0]
    if arr.ndim == 2:
        arr = arr.argmax(-1)
    if arr.ndim != 1:
        raise ConfigError(f"predictions must be 1-D ids or 2-D logits, got shape {arr.shape}")
    return arr.tolist()


def forced_step_scores(argmax: list[int], logprob: list[float], inputs: TeacherForcedInputs,
                       margin: list[float] | None = None) -> dict[str, Any]:
    """Per-step scores of a teacher-forced decode of the gold route (`argmax[j]`, `logprob[j]`
    and `margin[j]` at the j-th completion token): step accuracy as `teacher_forced_step_accuracy`
    (mode "name"), and the mean over steps of the city name's summed log-probability. Steps past
    a truncated decode count as wrong and are left out of the log-probability. Per step too
    (what `analysis.step_classes` pairs): whether it is right, the city's log-probability, and
    the margin of the model's own choice at the city's first token (None past a truncation)."""
    start = inputs.prompt_len - 1  # the position whose logits predict the first completion token
    full = [-1] * start + list(argmax) + [-1] * (len(inputs.input_ids) - start - len(argmax))
    score = teacher_forced_step_accuracy(full[: len(inputs.input_ids)], inputs)
    reached = [bool(positions) and positions[-1] - start < len(logprob) for positions in inputs.step_predict_positions]
    per_step = [round(sum(logprob[p - start] for p in positions), 6) if ok else None
                for positions, ok in zip(inputs.step_predict_positions, reached)]
    city = [c for c in per_step if c is not None]
    margins = margin or []
    first = [positions[0] - start if positions else None for positions in inputs.step_predict_positions]
    return {"tf_step_accuracy": score.accuracy, "tf_city_logprob": sum(city) / len(city) if city else None,
            "tf_steps": len(score.correct), "tf_step_correct": list(score.correct), "tf_step_city_logprob": per_step,
            "tf_step_margin": [margins[j] if j is not None and j < len(margins) else None for j in first]}

"""Detection examples: needle-QA examples checked for scoring, their prompt ids, their description."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dysco_interp.detection.methods import DetectionInputError
from dysco_interp.detection.scores import check_doc_spans


def _as_example(x: Any):
    from dysco_interp.tasks.needle_qa import NeedleQAExample

    if isinstance(x, NeedleQAExample):
        ex = x
    elif isinstance(x, Mapping):
        ex = NeedleQAExample.from_dict(dict(x))
    else:
        raise DetectionInputError(f"expected needle-QA examples (NeedleQAExample or dict), got {type(x).__name__}")
    if ex.is_null_query:
        raise DetectionInputError(f"example {ex.id!r} is a null-query example; pass the real ones")
    return ex


def check_examples(examples: Iterable[Any]) -> list:
    """Examples as NeedleQAExample, non-empty, with unique ids (the store keys on them)."""
    if examples is None:
        raise DetectionInputError("no detection examples given")
    out = [_as_example(x) for x in examples]
    if not out:
        raise DetectionInputError("no detection examples: the data set is empty")
    seen: set[str] = set()
    for ex in out:
        if ex.id in seen:
            raise DetectionInputError(f"duplicate example id {ex.id!r}: ids key the resumable store")
        seen.add(ex.id)
    return out


def prompt_ids(model, example) -> list[int]:
    """The example's prompt ids, checked against its recorded length and spans."""
    from dysco_interp.chat import encode_text, render_chat

    # Spans index the example's rendering: this model's template and tokenizer must reproduce it.
    if render_chat(model.tokenizer, example.prompt, True, example.enable_thinking) != example.prompt_text:
        raise DetectionInputError(
            f"example {example.id!r} was rendered with another chat template (made for {example.tokenizer!r}); "
            "regenerate the data for this model"
        )
    ids = encode_text(model.tokenizer, example.prompt_text)[0]
    if len(ids) != example.n_tokens:
        raise DetectionInputError(
            f"example {example.id!r} has {example.n_tokens} tokens in its record but {len(ids)} with this "
            f"model's tokenizer (made for {example.tokenizer!r}); regenerate the data for this model"
        )
    q0, q1 = example.query_token_span
    if not 0 < q0 < q1 <= len(ids):
        raise DetectionInputError(
            f"example {example.id!r}: query span {tuple(example.query_token_span)} is outside the prompt "
            f"of {len(ids)} tokens (or leaves no context before it)"
        )
    check_doc_spans(example.doc_token_spans, q0)
    if not 0 <= example.gold_index < len(example.doc_token_spans):
        raise DetectionInputError(
            f"example {example.id!r}: gold index {example.gold_index} is not one of its "
            f"{len(example.doc_token_spans)} documents"
        )
    return ids


def describe_examples(examples: Sequence[Any]) -> str:
    """A one-line description of detection data for provenance."""
    lengths = [ex.n_tokens for ex in examples]
    seeds = sorted({ex.seed for ex in examples if ex.seed is not None})
    targets = sorted({ex.target_tokens for ex in examples if ex.target_tokens})
    tasks = sorted({ex.task for ex in examples})
    parts = [
        f"{'+'.join(tasks)}: {len(examples)} examples",
        f"{min(lengths)}-{max(lengths)} tokens" + (f" (target {', '.join(map(str, targets))})" if targets else ""),
    ]
    if seeds:
        parts.append(f"seed {', '.join(map(str, seeds))}")
    return ", ".join(parts)

"""Needle-QA scoring: SQuAD-style normalised exact match and containment."""

from __future__ import annotations

import re
import string
from collections.abc import Sequence

from dysco_interp.tasks.needle_qa.instance import NeedleQAExample


def normalize_answer(text: str) -> str:
    """Lower case, no punctuation, no articles, single spaces (SQuAD / NQ evaluation)."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(prediction: str, answers: Sequence[str]) -> float:
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(a) for a in answers))


def contains_answer(prediction: str, answers: Sequence[str]) -> float:
    """1.0 when a normalised gold answer occurs in the normalised prediction (whole words)."""
    pred = f" {normalize_answer(prediction)} "
    return float(any(normalize_answer(a) and f" {normalize_answer(a)} " in pred for a in answers))


def score_answer(prediction: str, example: NeedleQAExample | Sequence[str]) -> dict[str, float]:
    answers = example.answers if isinstance(example, NeedleQAExample) else list(example)
    if not answers:
        raise ValueError("no gold answers (a null-query example is for calibration, not scoring)")
    return {"exact_match": exact_match(prediction, answers), "contains": contains_answer(prediction, answers)}

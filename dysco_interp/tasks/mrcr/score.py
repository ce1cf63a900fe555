"""MRCR's published grade: 0 without the random prefix, else a SequenceMatcher ratio without it."""

from __future__ import annotations

import difflib

from dysco_interp.tasks.mrcr.instance import MRCRExample


def grade(response: str, answer: str, prefix: str) -> float:
    """MRCR's published score: 0 without the prefix, else SequenceMatcher ratio without it."""
    if not response.startswith(prefix):
        return 0.0
    response = response[len(prefix) :]
    answer = answer[len(prefix) :] if answer.startswith(prefix) else answer
    return float(difflib.SequenceMatcher(None, response, answer).ratio())


def score_response(response: str, example: MRCRExample) -> dict[str, float]:
    return {
        "score": grade(response, example.answer, example.prefix),
        "has_prefix": float(response.startswith(example.prefix)),
    }

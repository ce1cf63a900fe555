"""MRCR-style multi-round co-reference: find the k-th of several identical requests.

Modelled on OpenAI's MRCR: a long chat of user requests ("write a short poem about
tapirs", "write a blog post about lanterns", ...) and assistant answers. One request (the
needle) occurs 2, 4 or 8 times with a different answer each time; the final user turn asks
to "Prepend <random string> to the k-th (1 indexed) poem about tapirs". The expected
response is the random string followed by the k-th answer to that request.

- `answers`: requests, answers from templates and `words.json`, the final question.
- `instance`: `MRCRExample`, the rendered chat with the span of every message.
- `generate`: examples of a target prompt length, fixed by the seed.
- `score`: MRCR's published grade (0 unless the response starts with the random string;
  otherwise difflib.SequenceMatcher ratio between response and answer, string removed).
"""

from dysco_interp.tasks.mrcr.answers import (
    ADJ,
    FEELINGS,
    FINAL_TEMPLATE,
    FORMS,
    NOUNS,
    PEOPLE,
    PLACES,
    PREFIX_LENGTH,
    PREPS,
    TIMES,
    TOPICS,
    VERBS,
    final_question,
    ordinal,
    random_prefix,
    write_answer,
)
from dysco_interp.tasks.mrcr.generate import NEEDLE_COUNTS, generate_example
from dysco_interp.tasks.mrcr.instance import TASK, MRCRExample, build_example, chat_messages
from dysco_interp.tasks.mrcr.score import grade, score_response

__all__ = [
    "ADJ",
    "FEELINGS",
    "FINAL_TEMPLATE",
    "FORMS",
    "NEEDLE_COUNTS",
    "NOUNS",
    "PEOPLE",
    "PLACES",
    "PREFIX_LENGTH",
    "PREPS",
    "TASK",
    "TIMES",
    "TOPICS",
    "VERBS",
    "MRCRExample",
    "build_example",
    "chat_messages",
    "final_question",
    "generate_example",
    "grade",
    "ordinal",
    "random_prefix",
    "score_response",
    "write_answer",
]

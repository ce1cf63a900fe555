"""Multi-document QA about invented entities, for QRScore retrieval-head detection.

Each example is shaped like Natural Questions in the multi-document setting that QRHead
uses: an instruction, N documents "Document [i](Title: ...) text", then a late instruction
and the question. Documents describe INVENTED entities (people, companies, towns, bridges,
species, books; names built by `names.InventedNames`), so the model can only answer from
the context. Exactly one document (the gold one) is about the entity the question names;
the distractors come from the same templates with other entities and values, half of them
of the gold entity's kind. The number of documents is chosen to hit a target token length.

Spans recorded in the rendered chat (characters and tokens): every document, the question,
and the query span = late instruction + question (the assistant header after it comes from
the chat template's generation prompt, `n_generation_prompt` tokens). `null_query` gives
the same example with the question replaced by "N/A" and identical document spans, which
QRScore uses for calibration. Scoring: SQuAD-style normalised exact match and containment.

- `documents`: one template per entity kind, word lists in `words.json`.
- `instance`: `NeedleQAExample`, the prompt format, `null_query`.
- `generate`: examples of a target prompt length, fixed by the seed.
- `score`: exact match and containment.
"""

from dysco_interp.tasks.needle_qa.documents import (
    ADJECTIVES,
    DIETS,
    FIELDS,
    GENRES,
    HABITATS,
    KINDS,
    MONTHS,
    PRODUCTS,
    PROFESSIONS,
    Document,
    Fact,
)
from dysco_interp.tasks.needle_qa.generate import generate_example
from dysco_interp.tasks.needle_qa.instance import (
    DOC_TEMPLATE,
    INSTRUCTION,
    LATE_INSTRUCTION,
    NULL_QUESTION,
    QUESTION_TEMPLATE,
    TASK,
    NeedleQAExample,
    build_example,
    format_prompt,
    null_query,
)
from dysco_interp.tasks.needle_qa.score import contains_answer, exact_match, normalize_answer, score_answer

__all__ = [
    "ADJECTIVES",
    "DIETS",
    "DOC_TEMPLATE",
    "FIELDS",
    "GENRES",
    "HABITATS",
    "INSTRUCTION",
    "KINDS",
    "LATE_INSTRUCTION",
    "MONTHS",
    "NULL_QUESTION",
    "PRODUCTS",
    "PROFESSIONS",
    "QUESTION_TEMPLATE",
    "TASK",
    "Document",
    "Fact",
    "NeedleQAExample",
    "build_example",
    "contains_answer",
    "exact_match",
    "format_prompt",
    "generate_example",
    "normalize_answer",
    "null_query",
    "score_answer",
]

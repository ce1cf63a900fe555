"""A needle-QA example: the documents and question rendered with the chat template, with every span.

The user message is shaped like Natural Questions in QRHead's multi-document setting: an
instruction, N documents "Document [i](Title: ...) text", a late instruction and the question.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from dysco_interp.chat import Span, content_spans, encode_chat
from dysco_interp.tasks.base import SpanRecord, prompt_fields, token_spans
from dysco_interp.tasks.needle_qa.documents import Document

TASK = "needle_qa"
NULL_QUESTION = "N/A"
INSTRUCTION = (
    "Write a high-quality answer for the given question using only the provided search results "
    "(some of which might be irrelevant)."
)
DOC_TEMPLATE = "Document [{i}](Title: {title}) {text}"
LATE_INSTRUCTION = "Answer the question using only the documents above. Reply with a short answer only."
QUESTION_TEMPLATE = "Question: {question}"


@dataclass
class NeedleQAExample(SpanRecord):
    """One detection example. Spans are half-open; characters index `prompt_text`."""

    id: str
    question: str
    answers: list[str]
    kind: str
    attribute: str
    entity: str
    documents: list[dict]
    gold_index: int
    prompt: str
    prompt_text: str
    n_tokens: int
    n_generation_prompt: int
    doc_char_spans: list[Span]
    doc_token_spans: list[Span]
    question_char_span: Span
    question_token_span: Span
    query_char_span: Span  # late instruction + question
    query_token_span: Span
    is_null_query: bool = False
    task: str = TASK
    seed: int | None = None
    index: int | None = None
    target_tokens: int | None = None
    tokenizer: str | None = None
    enable_thinking: bool | None = None
    extra: dict = field(default_factory=dict)

    SPAN_LIST_FIELDS = ("doc_char_spans", "doc_token_spans")
    SPAN_FIELDS = ("question_char_span", "question_token_span", "query_char_span", "query_token_span")

    @property
    def n_docs(self) -> int:
        return len(self.documents)

    def problem(self) -> str | None:
        if not self.answers and not self.is_null_query:
            return "'answers' is empty: only a null-query example (for calibration) has no gold answer"
        if not 0 <= self.gold_index < self.n_docs:
            return f"'gold_index' {self.gold_index} is not one of its {self.n_docs} documents"
        if not len(self.doc_char_spans) == len(self.doc_token_spans) == self.n_docs:
            return f"it has {self.n_docs} documents but {len(self.doc_token_spans)} document spans"
        return None

    @property
    def gold_char_span(self) -> Span:
        return self.doc_char_spans[self.gold_index]

    @property
    def gold_token_span(self) -> Span:
        return self.doc_token_spans[self.gold_index]

    @property
    def query_with_header_token_span(self) -> Span:
        """Late instruction + question + the template's assistant header (to the prompt's end)."""
        return (self.query_token_span[0], self.n_tokens)


def format_prompt(documents: Sequence[Document], question: str) -> tuple[str, list[Span], Span, Span]:
    """User message, and spans (in it) of each document, the question and the query."""
    parts, spans = [INSTRUCTION, "\n\n"], []
    pos = len(INSTRUCTION) + 2
    for i, doc in enumerate(documents):
        line = DOC_TEMPLATE.format(i=i + 1, title=doc.title, text=doc.text)
        if i:
            parts.append("\n")
            pos += 1
        parts.append(line)
        spans.append((pos, pos + len(line)))
        pos += len(line)
    parts.append("\n\n")
    pos += 2
    query_start = pos
    q_line = QUESTION_TEMPLATE.format(question=question)
    parts += [LATE_INSTRUCTION, "\n", q_line]
    q_start = pos + len(LATE_INSTRUCTION) + 1 + len(QUESTION_TEMPLATE.split("{")[0])
    end = pos + len(LATE_INSTRUCTION) + 1 + len(q_line)
    return "".join(parts), spans, (q_start, end), (query_start, end)


def build_example(
    documents: Sequence[Document],
    gold_index: int,
    question: str,
    answers: Sequence[str],
    attribute: str,
    tokenizer,
    *,
    id: str = "",
    enable_thinking: bool | None = None,
    is_null_query: bool = False,
    **meta,
) -> NeedleQAExample:
    """Render the documents and question with the chat template, recording every span."""
    prompt, doc_spans, q_span, query_span = format_prompt(documents, question)
    enc = encode_chat(tokenizer, prompt, enable_thinking=enable_thinking)
    ((base, _),) = content_spans(enc, prompt, tokenizer, enable_thinking)
    shift = lambda s: (base + s[0], base + s[1])  # noqa: E731
    doc_chars = [shift(s) for s in doc_spans]
    q_chars, query_chars = shift(q_span), shift(query_span)
    return NeedleQAExample(
        id=id,
        question=question,
        answers=list(answers),
        kind=documents[gold_index].kind,
        attribute=attribute,
        entity=documents[gold_index].entity,
        documents=[d.to_dict() for d in documents],
        gold_index=gold_index,
        prompt=prompt,
        doc_char_spans=doc_chars,
        doc_token_spans=token_spans(enc, doc_chars),
        question_char_span=q_chars,
        question_token_span=enc.token_span(*q_chars),
        query_char_span=query_chars,
        query_token_span=enc.token_span(*query_chars),
        is_null_query=is_null_query,
        **prompt_fields(enc, tokenizer, enable_thinking),
        **meta,
    )


def null_query(example: NeedleQAExample, tokenizer) -> NeedleQAExample:
    """The same example with the question replaced by "N/A"; document spans stay identical."""
    docs = [Document(**d) for d in example.documents]
    null = build_example(
        docs,
        example.gold_index,
        NULL_QUESTION,
        [],
        example.attribute,
        tokenizer,
        id=f"{example.id}-null",
        enable_thinking=example.enable_thinking,
        is_null_query=True,
        seed=example.seed,
        index=example.index,
        target_tokens=example.target_tokens,
        extra=dict(example.extra),
    )
    if null.doc_token_spans != example.doc_token_spans or null.doc_char_spans != example.doc_char_spans:
        raise ValueError(
            "the null query changed the documents' token spans (the tokenizer merges across the "
            "question boundary); QRScore calibration would compare different positions"
        )
    return replace(null, entity=example.entity, kind=example.kind)

"""An MRCR example: the rendered chat of requests and answers, with the span of every message."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from dysco_interp.chat import Messages, Span, content_spans, encode_chat
from dysco_interp.tasks.base import SpanRecord, prompt_fields, token_spans
from dysco_interp.tasks.mrcr.answers import final_question

TASK = "mrcr"


@dataclass
class MRCRExample(SpanRecord):
    """A multi-turn chat; spans are half-open, characters index `prompt_text`.

    `messages[i]` has role and content; `message_char_spans[i]` / `message_token_spans[i]`
    cover its content. `needle_answer_indices` are the message indices of the assistant
    answers to the repeated request, in order; the gold one is `gold_message_index`.
    """

    id: str
    messages: list[dict]
    needle_form: str
    needle_topic: str
    n_needles: int
    k: int  # 1-indexed needle asked for
    prefix: str
    answer: str  # prefix + the gold assistant answer: the expected response
    gold_message_index: int
    needle_request_indices: list[int]
    needle_answer_indices: list[int]
    prompt_text: str
    n_tokens: int
    n_generation_prompt: int
    message_char_spans: list[Span]
    message_token_spans: list[Span]
    task: str = TASK
    seed: int | None = None
    index: int | None = None
    target_tokens: int | None = None
    tokenizer: str | None = None
    enable_thinking: bool | None = None
    extra: dict = field(default_factory=dict)

    SPAN_LIST_FIELDS = ("message_char_spans", "message_token_spans")

    def problem(self) -> str | None:
        n = len(self.messages)
        if not len(self.message_char_spans) == len(self.message_token_spans) == n:
            return f"it has {n} messages but {len(self.message_token_spans)} message spans"
        if not 0 <= self.gold_message_index < n:
            return f"'gold_message_index' {self.gold_message_index} is not one of its {n} messages"
        return None

    @property
    def n_turns(self) -> int:
        """User-assistant exchanges before the final question."""
        return (len(self.messages) - 1) // 2

    @property
    def question(self) -> str:
        return self.messages[-1]["content"]

    @property
    def question_token_span(self) -> Span:
        return self.message_token_spans[-1]

    @property
    def gold_token_span(self) -> Span:
        return self.message_token_spans[self.gold_message_index]


def chat_messages(turns: Sequence[tuple[str, str]], question: str) -> Messages:
    """A user message per request, an assistant message per answer, then the final question."""
    messages = []
    for request, answer in turns:
        messages += [{"role": "user", "content": request}, {"role": "assistant", "content": answer}]
    messages.append({"role": "user", "content": question})
    return messages


def build_example(
    turns: Sequence[tuple[str, str]],
    needle_turns: Sequence[int],
    needle_form: str,
    needle_topic: str,
    k: int,
    prefix: str,
    tokenizer,
    *,
    id: str = "",
    enable_thinking: bool | None = None,
    **meta,
) -> MRCRExample:
    """Render (request, answer) turns plus the final question, recording every span."""
    messages = chat_messages(turns, final_question(prefix, k, needle_form, needle_topic))
    enc = encode_chat(tokenizer, messages, enable_thinking=enable_thinking)
    char_spans = content_spans(enc, messages, tokenizer, enable_thinking)
    answer_indices = [2 * t + 1 for t in needle_turns]
    gold = answer_indices[k - 1]
    return MRCRExample(
        id=id,
        messages=messages,
        needle_form=needle_form,
        needle_topic=needle_topic,
        n_needles=len(needle_turns),
        k=k,
        prefix=prefix,
        answer=prefix + messages[gold]["content"],
        gold_message_index=gold,
        needle_request_indices=[2 * t for t in needle_turns],
        needle_answer_indices=answer_indices,
        message_char_spans=char_spans,
        message_token_spans=token_spans(enc, char_spans),
        **prompt_fields(enc, tokenizer, enable_thinking),
        **meta,
    )

"""Needle-QA examples of a target prompt length: the gold document among seeded distractors."""

from __future__ import annotations

from collections.abc import Sequence

from dysco_interp.chat import count_chat_tokens
from dysco_interp.errors import ConfigError
from dysco_interp.tasks.base import (
    DEFAULT_TOLERANCE,
    LengthSearch,
    check_positive,
    check_tolerance,
    fit_count_and_variant,
    instance_rng,
    provenance,
)
from dysco_interp.tasks.names import InventedNames
from dysco_interp.tasks.needle_qa.documents import KINDS, Fact
from dysco_interp.tasks.needle_qa.instance import TASK, NeedleQAExample, build_example, format_prompt

# (facts, filler sentences) of the last distractor for length variants 1, 2, ...
_VARIANT_SHAPES = [(f, k) for k in range(4) for f in (1, 2, 3)]


def _documents(seed: int, index: int, count: int, kinds: Sequence[str], variant: int = 0) -> list[Fact]:
    """Gold fact first, then count - 1 distractors; prefix-stable in count for a seed.

    variant > 0 redraws only the last distractor, with 1-3 facts and 0-3 filler sentences:
    one document is a coarse unit of length, and a shorter or longer last one lands the
    prompt within the tolerance.
    """
    rng = instance_rng(TASK, seed, index, "docs")
    names = InventedNames(rng)
    gold_kind = rng.choice(list(kinds))
    facts = [KINDS[gold_kind](rng, names)]
    for i in range(count - 1):
        shape = None
        if variant and i == count - 2:
            rng = instance_rng(TASK, seed, index, "last doc", count, variant)
            names = InventedNames(rng, taken=names)
            shape = _VARIANT_SHAPES[(variant - 1) % len(_VARIANT_SHAPES)]
        # Half the distractors share the gold kind: same templates, other entities and values.
        kind = gold_kind if rng.random() < 0.5 else rng.choice(list(kinds))
        facts.append(KINDS[kind](rng, names, shape))
    return facts


def generate_example(
    tokenizer,
    target_tokens: int | None = None,
    *,
    seed: int = 0,
    index: int = 0,
    n_docs: int | None = None,
    gold_position: float | None = None,
    kinds: Sequence[str] | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    enable_thinking: bool | None = None,
) -> NeedleQAExample:
    """One example with target_tokens (±tolerance) prompt tokens, or exactly n_docs documents.

    gold_position: relative depth of the gold document in [0, 1] (0 = first); None draws it.
    The gold document, the question and the first distractors depend only on (seed, index).
    """
    if (target_tokens is None) == (n_docs is None):
        raise ConfigError("give exactly one of target_tokens and n_docs")
    check_tolerance(tolerance)
    kinds = tuple(kinds) if kinds is not None else tuple(KINDS)
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise ConfigError(f"unknown entity kinds {unknown}; choose from {', '.join(KINDS)}")
    if gold_position is not None and not 0 <= gold_position <= 1:
        raise ConfigError(f"gold_position must be in [0, 1], got {gold_position}")
    attribute_draw = instance_rng(TASK, seed, index, "question").random()
    position_draw = instance_rng(TASK, seed, index, "position").random()
    meta = provenance(TASK, seed, index, target_tokens, n_docs, "d")

    def arrange(count: int, variant: int = 0):
        facts = _documents(seed, index, count, kinds, variant)
        gold = facts[0]
        if gold_position is None:  # uniform over the count slots
            gold_index = min(count - 1, int(position_draw * count))
        else:
            gold_index = round(gold_position * (count - 1))
        docs = [f.document for f in facts[1:]]
        docs.insert(gold_index, gold.document)
        attrs = sorted(gold.questions)
        attribute = attrs[int(attribute_draw * len(attrs))]
        return docs, gold_index, attribute, *gold.questions[attribute]

    def build(count: int, variant: int = 0) -> NeedleQAExample:
        docs, gold_index, attribute, question, answers = arrange(count, variant)
        return build_example(
            docs,
            gold_index,
            question,
            answers,
            attribute,
            tokenizer,
            enable_thinking=enable_thinking,
            extra={"last_doc_variant": variant} if variant else {},
            **meta,
        )

    if n_docs is not None:
        return build(check_positive("n_docs", n_docs))
    target = check_positive("target_tokens", target_tokens)

    def n_tokens(count: int, variant: int) -> int:
        docs, _, _, question, _ = arrange(count, variant)
        return count_chat_tokens(tokenizer, format_prompt(docs, question)[0], enable_thinking)

    overhead, per_doc = _length_model(tokenizer, seed, index, kinds, enable_thinking)
    search = LengthSearch(
        target,
        tolerance,
        overhead=overhead,
        tokens_per_unit=per_doc,
        min_count=1,
        max_count=100_000,
        too_short=lambda got: (
            f"target length {target} tokens is too short: one document with the instructions "
            f"already takes {got} tokens"
        ),
    )
    return build(*fit_count_and_variant(n_tokens, search, n_variants=len(_VARIANT_SHAPES)))


def _length_model(
    tokenizer, seed: int, index: int, kinds: Sequence[str], enable_thinking: bool | None
) -> tuple[float, float]:
    """Prompt tokens with no documents (extrapolated from 1 and 16), and mean tokens per document."""
    facts = _documents(seed, index, 16, kinds)
    docs = [f.document for f in facts]
    overhead = count_chat_tokens(tokenizer, format_prompt(docs[:1], "What is it?")[0], enable_thinking)
    full = count_chat_tokens(tokenizer, format_prompt(docs, "What is it?")[0], enable_thinking)
    per_doc = (full - overhead) / 15
    return overhead - per_doc, per_doc

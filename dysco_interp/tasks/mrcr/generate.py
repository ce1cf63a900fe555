"""MRCR examples of a target prompt length: needle turns at seeded places among filler turns."""

from __future__ import annotations

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
from dysco_interp.tasks.mrcr.answers import FORMS, TOPICS, final_question, random_prefix, write_answer
from dysco_interp.tasks.mrcr.instance import TASK, MRCRExample, build_example, chat_messages

NEEDLE_COUNTS = (2, 4, 8)  # how often MRCR repeats the needle request


def _turns(seed: int, index: int, n_fillers: int, n_needles: int, form: str, topic: str, variant: int = 0):
    """Needle answers and filler turns; prefix-stable in n_fillers for a seed.

    variant > 0 redraws only the last filler turn: one turn is a coarse unit of length, and
    trying a few variants of the last one lands the prompt within the tolerance.
    """
    needle_rng = instance_rng(TASK, seed, index, "needles")
    request = FORMS[form].format(topic=topic)
    needles = [(request, write_answer(needle_rng, form, topic)) for _ in range(n_needles)]
    rng = instance_rng(TASK, seed, index, "fillers", form, topic)
    fillers = []
    for i in range(n_fillers):
        if variant and i == n_fillers - 1:
            rng = instance_rng(TASK, seed, index, "last filler", n_fillers, variant)
        # Distractors share the needle's form or topic about half the time.
        r = rng.random()
        f = form if r < 0.25 else rng.choice([x for x in FORMS if x != form])
        t = topic if 0.25 <= r < 0.5 else rng.choice([x for x in TOPICS if x != topic])
        fillers.append((FORMS[f].format(topic=t), write_answer(rng, f, t)))
    return needles, fillers


def _interleave(needles, fillers, position_draws) -> tuple[list[tuple[str, str]], list[int]]:
    total = len(needles) + len(fillers)
    slots = sorted({min(total - 1, int(d * total)) for d in position_draws})
    # Collisions (two draws in one slot) are resolved by taking the next free slots.
    free = [i for i in range(total) if i not in slots]
    while len(slots) < len(needles):
        slots.append(free.pop(0))
    slots.sort()
    needle_slots = set(slots)
    turns, it_n, it_f = [], iter(needles), iter(fillers)
    for i in range(total):
        turns.append(next(it_n) if i in needle_slots else next(it_f))
    return turns, slots


def generate_example(
    tokenizer,
    target_tokens: int | None = None,
    *,
    seed: int = 0,
    index: int = 0,
    n_needles: int = 4,
    n_turns: int | None = None,
    k: int | None = None,
    form: str | None = None,
    topic: str | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    enable_thinking: bool | None = None,
) -> MRCRExample:
    """One example with target_tokens (±tolerance) prompt tokens, or exactly n_turns exchanges.

    n_needles: how many times the request repeats (MRCR uses 2, 4 and 8); k: which one the
    final question asks for (1-indexed; drawn when None); form/topic: the repeated request
    (drawn when None).
    """
    if (target_tokens is None) == (n_turns is None):
        raise ConfigError("give exactly one of target_tokens and n_turns")
    check_tolerance(tolerance)
    check_positive("n_needles", n_needles)
    if n_needles < 2:
        raise ConfigError(f"n_needles must be at least 2 (MRCR uses 2, 4 or 8), got {n_needles}")
    rng = instance_rng(TASK, seed, index, "setup")
    form = form if form is not None else rng.choice(sorted(FORMS))
    topic = topic if topic is not None else rng.choice(TOPICS)
    if form not in FORMS:
        raise ConfigError(f"unknown form {form!r}; choose one of {', '.join(FORMS)}")
    k = k if k is not None else rng.randint(1, n_needles)
    if not isinstance(k, int) or not 1 <= k <= n_needles:
        raise ConfigError(f"k must be between 1 and n_needles={n_needles}, got {k!r}")
    prefix = random_prefix(rng)
    position_draws = [rng.random() for _ in range(n_needles)]
    meta = provenance(TASK, seed, index, target_tokens, n_turns, "x")

    def arrange(n_fillers: int, variant: int = 0):
        needles, fillers = _turns(seed, index, n_fillers, n_needles, form, topic, variant)
        return _interleave(needles, fillers, position_draws)

    def build(n_fillers: int, variant: int = 0) -> MRCRExample:
        turns, slots = arrange(n_fillers, variant)
        return build_example(
            turns,
            slots,
            form,
            topic,
            k,
            prefix,
            tokenizer,
            enable_thinking=enable_thinking,
            extra={"last_filler_variant": variant} if variant else {},
            **meta,
        )

    if n_turns is not None:
        check_positive("n_turns", n_turns)
        if n_turns < n_needles:
            raise ConfigError(f"n_turns={n_turns} cannot hold {n_needles} needle turns")
        return build(n_turns - n_needles)
    target = check_positive("target_tokens", target_tokens)

    def n_tokens(n_fillers: int, variant: int) -> int:
        turns, _ = arrange(n_fillers, variant)
        messages = chat_messages(turns, final_question(prefix, k, form, topic))
        return count_chat_tokens(tokenizer, messages, enable_thinking)

    zero = n_tokens(0, 0)
    per_turn = max(1.0, (n_tokens(8, 0) - zero) / 8)
    search = LengthSearch(
        target,
        tolerance,
        overhead=zero,
        tokens_per_unit=per_turn,
        min_count=0,
        max_count=200_000,
        too_short=lambda got: (
            f"target length {target} tokens is too short for {n_needles} needle turns: the chat "
            f"with no filler turns already has {got} tokens; ask for at least {got} tokens or fewer needles"
        ),
    )
    return build(*fit_count_and_variant(n_tokens, search))

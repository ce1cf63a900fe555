"""MRCR-style multi-round co-reference: find the k-th of several identical requests.

Modelled on OpenAI's MRCR: a long chat of user requests ("write a short poem about
tapirs", "write a blog post about lanterns", ...) and assistant answers. One request (the
needle) occurs 2, 4 or 8 times with a different answer each time; the final user turn asks
to "Prepend <random string> to the k-th (1 indexed) poem about tapirs". The expected
response is the random string followed by the k-th answer to that request.

Filler and needle answers are generated here from templates and the word lists below (no
external corpus): every answer of one form draws from the same grammar, so the turns are
similar in style and differ only in content, and the needle's answers are as alike as
the distractors. Scoring is MRCR's published grade: 0 unless the response starts with the
random string; otherwise difflib.SequenceMatcher ratio between response and answer, both
with the string removed.
"""

from __future__ import annotations

import difflib
import re
import string
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from dysco_interp.chat import encode_chat, encode_text, render_chat
from dysco_interp.errors import ConfigError
from dysco_interp.tasks.common import (
    DEFAULT_TOLERANCE,
    Span,
    as_spans,
    check_positive,
    check_tolerance,
    fit_count,
    instance_rng,
    locate_contents,
    refine_with_variants,
    token_spans,
    tokenizer_name,
)

TASK = "mrcr"
NEEDLE_COUNTS = (2, 4, 8)
PREFIX_LENGTH = 10
FINAL_TEMPLATE = (
    "Prepend {prefix} to the {ordinal} (1 indexed) {form} about {topic}. "
    "Do not include any other text in your response."
)

# form -> request wording; the final question names the form as the key says.
FORMS = {
    "poem": "write a short poem about {topic}",
    "story": "write a very short story about {topic}",
    "riddle": "write a riddle about {topic}",
    "essay": "write a short essay about {topic}",
    "letter": "write a formal letter about {topic}",
    "blog post": "write a blog post about {topic}",
    "social media post": "write a social media post about {topic}",
    "speech": "write a short speech about {topic}",
}
TOPICS = (
    "tapirs",
    "lighthouses",
    "glaciers",
    "old clocks",
    "paper boats",
    "foxes",
    "violins",
    "bicycles",
    "comets",
    "harbours",
    "owls",
    "bridges",
    "orchards",
    "night trains",
    "kites",
    "lanterns",
    "deserts",
    "beehives",
    "typewriters",
    "windmills",
    "otters",
    "volcanoes",
    "libraries",
    "snowfalls",
    "fireflies",
    "canals",
    "chess players",
    "marathons",
    "telescopes",
    "lemons",
    "mountain huts",
    "whales",
    "balloons",
    "ferries",
    "gardens",
    "bakeries",
    "storms",
    "tortoises",
    "maps",
    "train stations",
    "umbrellas",
    "islands",
    "sunflowers",
    "robots",
    "caves",
    "pianos",
    "rivers",
    "markets",
)
ADJ = (
    "silver",
    "quiet",
    "restless",
    "golden",
    "patient",
    "bright",
    "weathered",
    "tender",
    "hollow",
    "distant",
    "gentle",
    "stubborn",
    "humble",
    "ancient",
    "shining",
    "salted",
    "drowsy",
    "wild",
    "careful",
    "forgotten",
    "crimson",
    "pale",
    "steady",
    "crooked",
    "luminous",
    "wandering",
    "brave",
    "velvet",
    "tired",
    "secret",
    "amber",
    "frozen",
    "windy",
    "lonely",
    "cheerful",
    "solemn",
)
NOUNS = (
    "river",
    "lantern",
    "window",
    "harbour",
    "meadow",
    "sparrow",
    "doorway",
    "mountain",
    "candle",
    "letter",
    "orchard",
    "lamp",
    "shadow",
    "bell",
    "garden",
    "ladder",
    "thread",
    "pebble",
    "tide",
    "cloud",
    "anchor",
    "field",
    "chimney",
    "kettle",
    "road",
    "forest",
    "valley",
    "mirror",
    "island",
    "coat",
    "feather",
    "stone",
    "bridge",
    "song",
    "morning",
    "evening",
)
VERBS = (  # plural present tense, to agree with plural topics
    "wander",
    "linger",
    "gather",
    "tremble",
    "drift",
    "glimmer",
    "whisper",
    "wait",
    "shine",
    "rest",
    "hum",
    "sway",
    "climb",
    "turn",
    "sleep",
    "listen",
    "dream",
    "travel",
    "echo",
    "gleam",
)
PREPS = ("beneath", "beside", "across", "beyond", "along", "above", "around", "toward", "within")
TIMES = (
    "at dawn",
    "at dusk",
    "in winter",
    "after the rain",
    "by moonlight",
    "in early spring",
    "on Sunday mornings",
    "before the storm",
    "at midnight",
    "in late autumn",
)
PEOPLE = (
    "Mara",
    "Tobias",
    "Ines",
    "Oskar",
    "Leila",
    "Jonah",
    "Priya",
    "Anselm",
    "Greta",
    "Milo",
    "Sofia",
    "Rafael",
    "Hana",
    "Emil",
    "Nadia",
    "Felix",
    "Clara",
    "Idris",
    "Vera",
    "Luca",
)
PLACES = (
    "a harbour town",
    "the northern hills",
    "an old market square",
    "a village by the sea",
    "a crowded city",
    "the edge of the forest",
    "a quiet valley",
    "a mountain pass",
    "a river island",
)
FEELINGS = ("wonder", "patience", "curiosity", "gratitude", "hope", "calm", "joy", "nostalgia", "courage")


def _cap(s: str) -> str:
    return s[0].upper() + s[1:]


def _fill(rng, template: str, topic: str) -> str:
    # Each slot draws independently, so two answers to one request rarely share a line.
    return template.format(
        topic=topic,
        Topic=_cap(topic),
        adj=rng.choice(ADJ),
        adj2=rng.choice(ADJ),
        noun=rng.choice(NOUNS),
        noun2=rng.choice(NOUNS),
        verb=rng.choice(VERBS),
        verb2=rng.choice(VERBS),
        prep=rng.choice(PREPS),
        time=rng.choice(TIMES),
        person=rng.choice(PEOPLE),
        person2=rng.choice(PEOPLE),
        place=rng.choice(PLACES),
        feeling=rng.choice(FEELINGS),
        n=rng.randint(2, 40),
    )


_POEM_LINES = (
    "{Topic} {verb} {prep} the {adj} {noun},",
    "where {adj} {noun}s {verb} {time}.",
    "I watched the {noun} {prep} the {adj2} {noun2},",
    "and {topic} {verb2} like a {adj} {noun}.",
    "O {topic}, {adj} and {adj2},",
    "the {noun} remembers {topic} {time};",
    "no {adj} {noun} can hold them long,",
    "they {verb} and {verb2} {prep} the {noun2}.",
    "A {adj} hush falls on the {noun},",
    "and all the {noun2}s {verb} {time}.",
    "Say what the {adj} {noun} knows of {topic}:",
    "a little {feeling}, a {adj2} {noun2}.",
)
_STORY_SENTENCES = (
    "{person} had never thought much about {topic} until the {adj} {noun} appeared {time}.",
    "In {place}, everyone knew that {topic} {verb} {prep} the {noun}.",
    "{person} asked {person2} whether the {adj} {noun} would still be there {time}.",
    "Nobody expected {topic} to {verb} so close to the {adj2} {noun2}.",
    "It took {n} days before {person2} understood what the {noun} meant.",
    "By the end, {person} felt only {feeling} and a {adj} sort of relief.",
    "The {noun} was {adj}, and the {noun2} beyond it was {adj2}.",
    "{person2} wrote the whole story down on the back of a {adj} {noun}.",
)
_RIDDLE_LINES = (
    "I {verb} {prep} the {adj} {noun} but never leave the {noun2}.",
    "You will find me {time}, {adj} and {adj2}.",
    "I have a {noun} but no {noun2}, a voice but no {adj} song.",
    "Some say I am {adj}; others call me a {adj2} {noun}.",
    "I am seen in {place} and heard {prep} the {noun}.",
)
_ESSAY_SENTENCES = (
    "Few subjects reward attention as well as {topic}.",
    "At first glance, {topic} seem {adj}, yet a closer look reveals a {adj2} complexity.",
    "Historians of {place} describe {topic} as a source of {feeling}.",
    "The relationship between {topic} and the {noun} is older than most people assume.",
    "In at least {n} documented cases, {topic} changed how a community thought about the {noun2}.",
    "Critics argue that our fascination with {topic} is {adj}; supporters answer that it teaches {feeling}.",
    "Ultimately, {topic} remind us that the {adj} {noun} and the {adj2} {noun2} belong together.",
    "Any fair account must also mention the {adj} {noun}s that {verb} {prep} them.",
)
_LETTER_SENTENCES = (
    "I am writing to you regarding {topic} in {place}.",
    "As you may know, the {adj} {noun} near the {noun2} has drawn attention to {topic}.",
    "I would be grateful if you could consider a {adj2} approach to the matter.",
    "We have observed {n} instances in which {topic} {verb} {prep} the {noun}.",
    "I trust that this request will be received with {feeling}.",
    "Please do not hesitate to contact me should you require further details.",
)
_POST_SENTENCES = (
    "Can we talk about {topic} for a second?",
    "Saw the most {adj} {noun} today {time} and could only think of {topic}.",
    "Hot take: {topic} are the most {adj} part of {place}.",
    "{n} reasons to love {topic}, thread below.",
    "Feeling pure {feeling} right now.",
    "If you know, you know: {topic} {verb} {prep} the {noun}.",
)
_SPEECH_SENTENCES = (
    "Friends, we are gathered {time} to speak about {topic}.",
    "For {n} years, {topic} have shaped the {adj} {noun} of {place}.",
    "Let us remember the {adj2} {noun2} and the {feeling} it gave us.",
    "Some will say that {topic} are merely {adj}; I say they are our {noun}.",
    "So let us leave here with {feeling}, and with {topic} in our hearts.",
)


def _lines(rng, pool: Sequence[str], k: int, topic: str) -> list[str]:
    return [_fill(rng, t, topic) for t in rng.sample(pool, k)]


_A_BEFORE_VOWEL = re.compile(r"\b([Aa]) (?=[aeiouAEIOU])")


def _stanza(lines: list[str]) -> str:
    # Capitalised first line, a full stop at the end: the lines are drawn in any order.
    text = "\n".join(lines)
    return _cap(text).rstrip(",;:") + ("" if text.endswith((".", "?", "!")) else ".")


def write_answer(rng, form: str, topic: str) -> str:
    """An assistant answer of the given form about the topic, from the templates above."""
    return _A_BEFORE_VOWEL.sub(r"\1n ", _draft(rng, form, topic))


def _draft(rng, form: str, topic: str) -> str:
    if form == "poem":
        stanzas = [_stanza(_lines(rng, _POEM_LINES, 4, topic)) for _ in range(rng.randint(2, 3))]
        return "\n\n".join(stanzas)
    if form == "story":
        return " ".join(_lines(rng, _STORY_SENTENCES, rng.randint(4, 6), topic))
    if form == "riddle":
        return "\n".join(_lines(rng, _RIDDLE_LINES, rng.randint(3, 4), topic)) + "\nWhat am I?"
    if form == "essay":
        return "\n\n".join(" ".join(_lines(rng, _ESSAY_SENTENCES, 3, topic)) for _ in range(2))
    if form == "letter":
        body = " ".join(_lines(rng, _LETTER_SENTENCES, rng.randint(3, 5), topic))
        return f"Dear {rng.choice(PEOPLE)},\n\n{body}\n\nSincerely,\n{rng.choice(PEOPLE)}"
    if form in ("blog post", "social media post"):
        k = rng.randint(3, 5) if form == "blog post" else rng.randint(2, 3)
        tag = "#" + topic.replace(" ", "")
        text = " ".join(_lines(rng, _POST_SENTENCES, k, topic))
        if form == "blog post":
            text = f"{_cap(topic)}: a few thoughts\n\n" + text + " " + " ".join(_lines(rng, _ESSAY_SENTENCES, 2, topic))
        return f"{text} {tag}"
    if form == "speech":
        return " ".join(_lines(rng, _SPEECH_SENTENCES, rng.randint(3, 5), topic))
    raise ConfigError(f"unknown form {form!r}; choose one of {', '.join(FORMS)}")


def ordinal(k: int) -> str:
    suffix = "th" if 10 <= k % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(k % 10, "th")
    return f"{k}{suffix}"


def final_question(prefix: str, k: int, form: str, topic: str) -> str:
    return FINAL_TEMPLATE.format(prefix=prefix, ordinal=ordinal(k), form=form, topic=topic)


def random_prefix(rng, length: int = PREFIX_LENGTH) -> str:
    return "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(length))


# ---------------------------------------------------------------------------- example


@dataclass
class MRCRExample:
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

    def to_dict(self) -> dict:
        d = asdict(self)
        for k in ("message_char_spans", "message_token_spans"):
            d[k] = [list(s) for s in d[k]]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> MRCRExample:
        d = dict(d)
        for k in ("message_char_spans", "message_token_spans"):
            d[k] = as_spans(d[k])
        return cls(**d)


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
    messages = []
    for request, answer in turns:
        messages += [{"role": "user", "content": request}, {"role": "assistant", "content": answer}]
    question = final_question(prefix, k, needle_form, needle_topic)
    messages.append({"role": "user", "content": question})
    enc = encode_chat(tokenizer, messages, enable_thinking=enable_thinking)
    char_spans = locate_contents(enc.text, [m["content"] for m in messages])
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
        prompt_text=enc.text,
        n_tokens=len(enc),
        n_generation_prompt=enc.n_generation_prompt,
        message_char_spans=char_spans,
        message_token_spans=token_spans(enc, char_spans),
        tokenizer=tokenizer_name(tokenizer),
        enable_thinking=enable_thinking,
        **meta,
    )


# ---------------------------------------------------------------------------- generator


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
    iid = f"{TASK}-s{seed}-{index}" + (f"-{target_tokens}t" if target_tokens else f"-{n_turns}x")
    meta = dict(seed=seed, index=index, target_tokens=target_tokens)

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
            id=iid,
            enable_thinking=enable_thinking,
            extra={"last_filler_variant": variant} if variant else {},
            **meta,
        )

    if n_turns is not None:
        check_positive("n_turns", n_turns)
        if n_turns < n_needles:
            raise ConfigError(f"n_turns={n_turns} cannot hold {n_needles} needle turns")
        return build(n_turns - n_needles)
    check_positive("target_tokens", target_tokens)

    def measured(n_fillers: int, variant: int = 0):
        turns, _ = arrange(n_fillers, variant)
        messages = [{"role": r, "content": c} for req, ans in turns for r, c in (("user", req), ("assistant", ans))]
        messages.append({"role": "user", "content": final_question(prefix, k, form, topic)})
        return (n_fillers, variant), len(
            encode_text(tokenizer, render_chat(tokenizer, messages, True, enable_thinking))[0]
        )

    zero = measured(0)[1]
    per_turn = max(1.0, (measured(8)[1] - zero) / 8)
    best = fit_count(
        measured,
        lambda trial: trial[1],
        target_tokens,
        tolerance,
        first_guess=round((target_tokens - zero) / per_turn),
        tokens_per_unit=per_turn,
        min_count=0,
        max_count=200_000,
        too_short=lambda got: (
            f"target length {target_tokens} tokens is too short for {n_needles} needle turns: the chat "
            f"with no filler turns already has {got} tokens; ask for at least {got} tokens or fewer needles"
        ),
        too_long=lambda got: f"target length {target_tokens} tokens is beyond what this generator supports",
        strict=False,
    )
    best = refine_with_variants(measured, best, best[0][0], target_tokens, tolerance)
    return build(*best[0])


# ---------------------------------------------------------------------------- scoring


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

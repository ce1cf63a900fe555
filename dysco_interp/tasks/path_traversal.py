"""Path Traversal in LongProc's format, scaled to a target prompt length, with exact spans.

The task (Ye et al. 2025, LongProc; used by the DySCO paper): a list of one-way edges
"X is a lively city. You can travel from X to Y by T." and a question "route from A to B".
Every city has at most one outgoing edge, so the route is unique; the model must chain
edge look-ups and write one line per step inside <Route> ... </Route>.

Graph shape, measured on LongProc's 200 released instances (all have 50 cities, 49 edges,
routes of 24/29/34/39 hops): every non-destination city has exactly one outgoing edge, and
each distractor city points to a city drawn uniformly from all others, so about 68% of
distractor edges point straight into a route city and the rest form chains that merge into
the route a few hops later (LongProc also has rare distractor cycles). `topology="merge"`
(default) draws the same way but never closes a cycle, so every distractor chain merges into
the route; `topology="longproc"` draws without that check.

The prompt is LongProc's `USER_PROMPT` for path traversal (princeton-pli/LongProc,
data/path_traversal/prompts.yaml, Apache License 2.0), reproduced verbatim. Scorers follow
LongProc's published `eval_path_traversal`, including its partial-accuracy credit for the
first wrong line; `step_accuracy` is the corrected variant without that credit.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

from dysco_interp.chat import EncodedPrompt, encode_chat, encode_text, render_chat
from dysco_interp.errors import ConfigError
from dysco_interp.tasks.common import (
    DEFAULT_TOLERANCE,
    Span,
    as_spans,
    check_same_tokenizer,
    check_positive,
    check_tolerance,
    fit_count,
    instance_rng,
    locate_contents,
    token_spans,
    tokenizer_name,
)
from dysco_interp.tasks.names import city_names

TASK = "path_traversal"
TRANSIT_METHODS = ("bus", "train", "plane", "ferry")
TOPOLOGIES = ("merge", "longproc")
DEFAULT_HOPS = 4  # the DySCO paper's analyses: 5 cities, 4 edges
LONGPROC_HOPS = (24, 29, 34, 39)  # route lengths in LongProc's released path_traversal_0.5k
NAME_POOL = 5000  # most populous names used at every length, so route names are not easier

PROBLEM_DESCRIPTION = (
    "In a hypothetical world, there are a number of cities. Each city has a one-way connection to "
    "only one other city via a specific transit method. The details of the cities are as follows:\n"
)
EDGE_TEMPLATE = "{src} is a lively city. You can travel from {src} to {dst} by {transit}."
STEP_TEMPLATE = "From {src}, take a {transit} to {dst}."
QUESTION_TEMPLATE = "Please give a route from {src} to {dst}."
ROUTE_OPEN, ROUTE_CLOSE = "<Route>", "</Route>"

# LongProc's USER_PROMPT (data/path_traversal/prompts.yaml, Apache-2.0), verbatim.
USER_PROMPT = """[TASK]
In a completely hypothetical world, there are a number of cities. Each city has a one-way connection to only one other city via a specific transit method (bus, train, plane, or ferry). Your task is to provide a route from a city to another city. You should follow the specific instruction provided later and output the route following the format provided in the instruction.


[IMPORTANT NOTES]
- All connections are one-way. If city A is connected to city B, you can travel from A to B, but not the other way around.
- Because each city is connected to only one other city, so there's only one possible route. To find the route, you can simply start from the starting city, identify the next city it's connected to, and repeat the process until you reach the destination city.
- Please follow the exact format specified below when outputting the route.


[OUTPUT FORMAT]
Please mark the route with <Route> and </Route> tags. The route should be in the following format, where one line is one step of the route:
<Route>
From <CITY_NAME>, take a <TRANSIT_METHOD> to <CITY_NAME>.
...
From <CITY_NAME>, take a <TRANSIT_METHOD> to <CITY_NAME>.
</Route>


[EXAMPLE]
In a hypothetical world, there are a number of cities. Each city has a one-way connection to only one other city via a specific transit method. The details of the cities are as follows:
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
- All connections are one-way. You can solve the problem by iteratively finding the next city to travel to until you reach the destination city.
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


@dataclass(frozen=True)
class RouteGraph:
    """Edges in context order and the indices of the gold edges in travel order."""

    edges: tuple[Edge, ...]
    route: tuple[int, ...]

    @property
    def start(self) -> str:
        return self.edges[self.route[0]].src

    @property
    def dest(self) -> str:
        return self.edges[self.route[-1]].dst

    @property
    def steps(self) -> list[Edge]:
        return [self.edges[i] for i in self.route]

    def longproc_record(self) -> dict:
        """The graph in LongProc's data schema (what path_traversal_*.json holds)."""
        return {
            "problem_description": PROBLEM_DESCRIPTION,
            "context_repr": [e.to_dict() for e in self.edges],
            "question_repr": [self.start, self.dest],
            "answer_repr": [e.to_dict() for e in self.steps],
            "context_nl": format_context(self.edges)[0],
            "question_nl": QUESTION_TEMPLATE.format(src=self.start, dst=self.dest),
            "answer_nl": format_answer(self.steps),
        }


# ---------------------------------------------------------------------------- graph


def sample_graph(rng, cities: Sequence[str], n_hops: int, topology: str = "merge", route_transits=None) -> RouteGraph:
    """A graph on `cities` (distinct); the first n_hops + 1 of them form the gold route.

    Every city but the destination gets exactly one outgoing edge; each distractor city's
    edge goes to a city drawn uniformly from all others (see the module docstring).
    """
    if topology not in TOPOLOGIES:
        raise ConfigError(f"unknown topology {topology!r}; choose one of {', '.join(TOPOLOGIES)}")
    n = len(cities)
    if len(set(cities)) != n:
        raise ConfigError("city names must be distinct")
    if n_hops < 1 or n < n_hops + 1:
        raise ConfigError(f"a {n_hops}-hop route needs at least {n_hops + 1} cities, got {n}")
    transits = (
        list(route_transits) if route_transits is not None else [rng.choice(TRANSIT_METHODS) for _ in range(n_hops)]
    )
    nxt = {cities[i]: cities[i + 1] for i in range(n_hops)}
    edges = [Edge(cities[i], cities[i + 1], transits[i]) for i in range(n_hops)]
    for src in cities[n_hops + 1 :]:
        while True:
            dst = cities[rng.randrange(n)]
            if dst == src:
                continue
            if topology == "merge":
                # Reject a city whose chain leads back to src: that edge would close a cycle.
                end = dst
                while end in nxt:
                    end = nxt[end]
                if end == src:
                    continue
            break
        nxt[src] = dst
        edges.append(Edge(src, dst, rng.choice(TRANSIT_METHODS)))
    order = list(range(len(edges)))
    rng.shuffle(order)
    position = {old: new for new, old in enumerate(order)}
    return RouteGraph(tuple(edges[i] for i in order), tuple(position[i] for i in range(n_hops)))


def follow_route(edges: Sequence[Edge], start: str, dest: str) -> list[int]:
    """Indices of the edges from start to dest (raises if the graph has no such unique route)."""
    out = {}
    for i, e in enumerate(edges):
        if e.src in out:
            raise ValueError(f"city {e.src!r} has more than one outgoing edge")
        out[e.src] = i
    route, city = [], start
    while city != dest:
        if city not in out or len(route) > len(edges):
            raise ValueError(f"no route from {start!r} to {dest!r}")
        route.append(out[city])
        city = edges[out[city]].dst
    return route


def graph_statistics(records: Iterable[dict]) -> dict[str, float]:
    """Shape statistics of LongProc-schema records (`context_repr`, `answer_repr`).

    Used to compare our generator with LongProc's released data.
    """
    stats: dict[str, list[float]] = {
        k: []
        for k in (
            "n_edges",
            "n_hops",
            "max_out_degree",
            "max_in_degree",
            "distractor_into_route",
            "start_has_no_incoming",
            "dest_in_degree",
            "distractor_depth_2",
            "distractor_in_cycle",
            "gold_position",
        )
    }
    for rec in records:
        edges = [Edge.from_dict(e) for e in rec["context_repr"]]
        answer = [Edge.from_dict(e) for e in rec["answer_repr"]]
        route = [a.src for a in answer] + [answer[-1].dst]
        on_route = {c: i for i, c in enumerate(route)}
        nxt: dict[str, str] = {}
        out_deg: dict[str, int] = {}
        in_deg: dict[str, int] = {}
        for e in edges:
            nxt[e.src] = e.dst
            out_deg[e.src] = out_deg.get(e.src, 0) + 1
            in_deg[e.dst] = in_deg.get(e.dst, 0) + 1
        distractors = [e for e in edges if e.src not in on_route]
        depths = []
        for e in distractors:
            city, k = e.src, 0
            while city is not None and city not in on_route and k <= len(edges):
                city, k = nxt.get(city), k + 1
            depths.append(k if city in on_route else -1)
        nd = max(1, len(distractors))
        index = {e: i for i, e in enumerate(edges)}
        stats["n_edges"].append(len(edges))
        stats["n_hops"].append(len(answer))
        stats["max_out_degree"].append(max(out_deg.values()))
        stats["max_in_degree"].append(max(in_deg.values()))
        stats["distractor_into_route"].append(sum(e.dst in on_route for e in distractors) / nd)
        stats["start_has_no_incoming"].append(float(in_deg.get(route[0], 0) == 0))
        stats["dest_in_degree"].append(in_deg.get(route[-1], 0))
        stats["distractor_depth_2"].append(depths.count(2) / nd)
        stats["distractor_in_cycle"].append(depths.count(-1) / nd)
        stats["gold_position"].append(sum(index[a] for a in answer) / len(answer) / len(edges))
    if not stats["n_edges"]:
        raise ValueError("no records")
    out = {k: sum(v) / len(v) for k, v in stats.items()}
    out["max_out_degree"] = max(stats["max_out_degree"])
    out["n_records"] = len(stats["n_edges"])
    return out


# ---------------------------------------------------------------------------- text


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


_CONTEXT_OFFSET = USER_PROMPT.index("{city_context}")  # no placeholder comes before it


def gold_completion(answer_nl: str) -> str:
    """The gold assistant output: the route inside the tags, as the prompt's example shows."""
    return f"{ROUTE_OPEN}\n{answer_nl}\n{ROUTE_CLOSE}"


# ---------------------------------------------------------------------------- instance


@dataclass
class PathTraversalInstance:
    """One prompt in LongProc's schema plus the spans analyses need.

    Spans are half-open. Character spans index `prompt_text` (the rendered chat, generation
    prompt included); token spans index the ids `encode_chat` gives for it. `step_token_spans`
    index the concatenation prompt ids + ids of `completion` (the gold answer), one span per
    step: the destination city name written in that step.
    """

    id: str
    problem_description: str
    context_repr: list[dict]
    question_repr: list[str]
    answer_repr: list[dict]
    context_nl: str
    question_nl: str
    answer_nl: str
    prompt: str
    prompt_text: str
    n_tokens: int
    n_generation_prompt: int
    edge_char_spans: list[Span]
    edge_token_spans: list[Span]
    gold_edge_indices: list[int]
    completion: str
    completion_n_tokens: int
    step_char_spans: list[Span]  # in `completion`
    step_token_spans: list[Span]  # in prompt ids + completion ids
    task: str = TASK
    seed: int | None = None
    index: int | None = None
    target_tokens: int | None = None
    topology: str | None = None
    tokenizer: str | None = None
    enable_thinking: bool | None = None
    source: str = "dysco_interp"
    extra: dict = field(default_factory=dict)

    @property
    def n_hops(self) -> int:
        return len(self.answer_repr)

    @property
    def n_edges(self) -> int:
        return len(self.context_repr)

    @property
    def edges(self) -> list[Edge]:
        return [Edge.from_dict(e) for e in self.context_repr]

    @property
    def edge_lines(self) -> list[str]:
        return [self.prompt_text[a:b] for a, b in self.edge_char_spans]

    @property
    def reference_output(self) -> str:
        """What LongProc's evaluator compares against (its `reference_output`)."""
        return self.answer_nl

    def to_dict(self) -> dict:
        d = asdict(self)
        for key in ("edge_char_spans", "edge_token_spans", "step_char_spans", "step_token_spans"):
            d[key] = [list(s) for s in d[key]]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> PathTraversalInstance:
        d = dict(d)
        for key in ("edge_char_spans", "edge_token_spans", "step_char_spans", "step_token_spans"):
            d[key] = as_spans(d[key])
        return cls(**d)

    def longproc_record(self) -> dict:
        """The instance in LongProc's data schema (what path_traversal_*.json holds)."""
        keys = (
            "problem_description",
            "context_repr",
            "question_repr",
            "answer_repr",
            "context_nl",
            "question_nl",
            "answer_nl",
        )
        return {k: getattr(self, k) for k in keys}


def build_instance(
    graph: RouteGraph,
    tokenizer,
    *,
    id: str = "",
    enable_thinking: bool | None = None,
    **meta,
) -> PathTraversalInstance:
    """Render a graph with LongProc's prompt and the chat template, recording every span."""
    record = graph.longproc_record()
    context_nl, line_spans = format_context(graph.edges)
    prompt = format_prompt(context_nl, graph.start, graph.dest)
    enc = encode_chat(tokenizer, prompt, enable_thinking=enable_thinking)
    ((user_start, _),) = locate_contents(enc.text, [prompt])
    base = user_start + _CONTEXT_OFFSET
    char_spans = [(base + a, base + b) for a, b in line_spans]
    completion = gold_completion(record["answer_nl"])
    step_chars, comp_spans, n_comp = _step_spans(tokenizer, completion, graph.steps)
    return PathTraversalInstance(
        id=id,
        **record,
        prompt=prompt,
        prompt_text=enc.text,
        n_tokens=len(enc),
        n_generation_prompt=enc.n_generation_prompt,
        edge_char_spans=char_spans,
        edge_token_spans=token_spans(enc, char_spans),
        gold_edge_indices=list(graph.route),
        completion=completion,
        completion_n_tokens=n_comp,
        step_char_spans=step_chars,
        step_token_spans=[(a + len(enc), b + len(enc)) for a, b in comp_spans],
        tokenizer=tokenizer_name(tokenizer),
        enable_thinking=enable_thinking,
        **meta,
    )


def _step_spans(tokenizer, completion: str, steps: Sequence[Edge]) -> tuple[list[Span], list[Span], int]:
    """Character spans (in the completion) of each step's destination city, and their tokens."""
    ids, offsets = encode_text(tokenizer, completion)
    enc = EncodedPrompt(completion, tuple(ids), tuple(offsets), 0)
    chars, pos = [], len(ROUTE_OPEN) + 1
    for e in steps:
        line = e.step
        start = pos + line.rindex(f" to {e.dst}.") + len(" to ")
        chars.append((start, start + len(e.dst)))
        pos += len(line) + 1
    return chars, token_spans(enc, chars), len(ids)


def from_longproc(
    record: dict, tokenizer, *, id: str = "", enable_thinking: bool | None = None
) -> PathTraversalInstance:
    """Our instance (spans included) for one record of LongProc's released data."""
    edges = tuple(Edge.from_dict(e) for e in record["context_repr"])
    start, dest = record["question_repr"]
    route = follow_route(edges, start, dest)
    if [edges[i].to_dict() for i in route] != [dict(e) for e in record["answer_repr"]]:
        raise ValueError("the record's answer_repr is not the route its context_repr implies")
    if format_context(edges)[0] != record["context_nl"]:
        raise ValueError("the record's context_nl differs from LongProc's edge format")
    return build_instance(
        RouteGraph(edges, tuple(route)), tokenizer, id=id, enable_thinking=enable_thinking, source="longproc"
    )


# ---------------------------------------------------------------------------- generator


def _resolve_hops(hops: int | Sequence[int], rng) -> int:
    if isinstance(hops, int) and not isinstance(hops, bool):
        return check_positive("hops", hops)
    choices = list(hops)
    if not choices:
        raise ConfigError("hops: give a positive integer or a non-empty list of them")
    return check_positive("hops", rng.choice([check_positive("hops", h) for h in choices]))


def _sample_cities(rng, pool: Sequence[str], exclude: set[str], n: int) -> list[str]:
    # Sampling indices (not a filtered copy of the pool) keeps a 32K instance fast.
    chosen, seen = [], set(exclude)
    while len(chosen) < n:
        name = pool[rng.randrange(len(pool))]
        if name not in seen:
            seen.add(name)
            chosen.append(name)
    return chosen


def resolve_hops(hops: int | Sequence[int], seed: int = 0, index: int = 0) -> int:
    """The route length of instance `index`: `hops` itself, or a seeded draw from a list."""
    return _resolve_hops(hops, instance_rng(TASK, seed, index, "hops"))


def generate_graph(
    n_edges: int, *, seed: int = 0, index: int = 0, hops: int | Sequence[int] = DEFAULT_HOPS, topology: str = "merge"
) -> RouteGraph:
    """The graph of instance `index` with n_edges edges (no tokenizer needed).

    The route (cities and transits) depends only on (seed, index, hops), so the same
    question recurs at every size with more or fewer distractor edges around it.
    """
    if topology not in TOPOLOGIES:
        raise ConfigError(f"unknown topology {topology!r}; choose one of {', '.join(TOPOLOGIES)}")
    names = city_names()
    n_hops = resolve_hops(hops, seed, index)
    check_positive("n_edges", n_edges)
    if n_edges < n_hops:
        raise ConfigError(f"n_edges={n_edges} is fewer than the {n_hops} edges of the route")
    if n_edges + 1 > len(names):
        raise ConfigError(
            f"{n_edges} edges need {n_edges + 1} distinct cities; only {len(names)} distinct city names are available"
        )
    base_pool = names[:NAME_POOL]
    route_rng = instance_rng(TASK, seed, index, "route", n_hops)
    route_cities = route_rng.sample(base_pool, n_hops + 1)
    route_transits = [route_rng.choice(TRANSIT_METHODS) for _ in range(n_hops)]
    # Distractor names come in a fixed order, so one more edge adds one name: the token
    # count then grows smoothly with n_edges and the length search settles quickly.
    pool = names if n_edges + 1 > NAME_POOL else base_pool
    name_rng = instance_rng(TASK, seed, index, "names", n_hops, len(pool))
    cities = route_cities + _sample_cities(name_rng, pool, set(route_cities), n_edges - n_hops)
    rng = instance_rng(TASK, seed, index, "graph", n_hops, n_edges, topology)
    return sample_graph(rng, cities, n_hops, topology, route_transits)


def generate_instance(
    tokenizer,
    target_tokens: int | None = None,
    *,
    seed: int = 0,
    index: int = 0,
    hops: int | Sequence[int] = DEFAULT_HOPS,
    n_edges: int | None = None,
    topology: str = "merge",
    tolerance: float = DEFAULT_TOLERANCE,
    enable_thinking: bool | None = None,
) -> PathTraversalInstance:
    """One instance whose chat-encoded prompt has target_tokens (±tolerance) tokens.

    Give `n_edges` instead of `target_tokens` for a fixed graph size (LongProc: 49 edges,
    hops in (24, 29, 34, 39)). See `generate_graph` for what the seed fixes.
    """
    if (target_tokens is None) == (n_edges is None):
        raise ConfigError("give exactly one of target_tokens and n_edges")
    check_tolerance(tolerance)
    n_hops = resolve_hops(hops, seed, index)
    meta = dict(seed=seed, index=index, target_tokens=target_tokens, topology=topology)
    iid = f"{TASK}-s{seed}-{index}" + (f"-{target_tokens}t" if target_tokens else f"-{n_edges}e")

    def graph_for(count: int) -> RouteGraph:
        return generate_graph(count, seed=seed, index=index, hops=n_hops, topology=topology)

    def build(graph: RouteGraph) -> PathTraversalInstance:
        return build_instance(graph, tokenizer, id=iid, enable_thinking=enable_thinking, **meta)

    def measured(count: int) -> tuple[RouteGraph, int]:
        # One plain encode per trial; spans are computed once, for the chosen graph.
        graph = graph_for(count)
        prompt = format_prompt(format_context(graph.edges)[0], graph.start, graph.dest)
        return graph, len(encode_text(tokenizer, render_chat(tokenizer, prompt, True, enable_thinking))[0])

    if n_edges is not None:
        return build(graph_for(n_edges))
    if topology not in TOPOLOGIES:
        raise ConfigError(f"unknown topology {topology!r}; choose one of {', '.join(TOPOLOGIES)}")
    check_positive("target_tokens", target_tokens)
    names = city_names()
    base_pool = names[:NAME_POOL]
    max_count = len(names) - 1
    overhead, per_line = _length_model(tokenizer, base_pool, enable_thinking)
    estimate = round((target_tokens - overhead) / per_line)
    if estimate > 1.2 * max_count:  # fail before building a graph of every name
        raise ConfigError(
            f"target length {target_tokens} tokens needs about {estimate} edges, more than the "
            f"{len(names)} distinct city names available allow; ask for a shorter prompt"
        )
    graph, _ = fit_count(
        measured,
        lambda trial: trial[1],
        target_tokens,
        tolerance,
        first_guess=estimate,
        tokens_per_unit=per_line,
        min_count=n_hops,
        max_count=max_count,
        too_short=lambda got: (
            f"target length {target_tokens} tokens is too short for a {n_hops}-hop route: with no "
            f"distractor edges the prompt already has {got} tokens; ask for at least {got} tokens "
            "or fewer hops"
        ),
        too_long=lambda got: (
            f"target length {target_tokens} tokens needs more cities than the {len(names)} distinct "
            f"names available (reached {got} tokens with all of them); ask for a shorter prompt"
        ),
    )
    return build(graph)


def _length_model(tokenizer, pool: Sequence[str], enable_thinking) -> tuple[int, float]:
    """Prompt tokens without edges, and mean tokens per edge line, from a small sample."""
    import random

    rng = random.Random(0)
    overhead = len(encode_chat(tokenizer, format_prompt(PROBLEM_DESCRIPTION, pool[0], pool[1]), enable_thinking))
    sample = rng.sample(list(pool), 65)
    lines = "\n".join(Edge(a, b, rng.choice(TRANSIT_METHODS)).line for a, b in zip(sample, sample[1:]))
    per_line = (len(encode_text(tokenizer, lines)[0]) + 1) / 64
    return overhead, per_line


# ---------------------------------------------------------------------------- scoring


def extract_route(response: str) -> str | None:
    """Text between the first '<Route>' and the first '</Route>', stripped (LongProc's parser).

    None when either tag is missing. As in LongProc, a closing tag before the opening one
    yields an empty string.
    """
    start = response.find(ROUTE_OPEN)
    end = response.find(ROUTE_CLOSE)
    if start == -1 or end == -1:
        return None
    return response[start + len(ROUTE_OPEN) : end].strip()


def longproc_metrics(prediction: str, reference: str) -> dict[str, float]:
    """LongProc's published path-traversal metrics: accuracy, partial_accuracy, extraction_rate.

    partial_accuracy is (index of the first wrong line + 1) / gold lines: it credits the first
    wrong line. When no line differs over the shorter of the two lists it is
    min(pred lines, gold lines) / gold lines.
    """
    parsed = extract_route(prediction)
    if parsed is None:
        return {"accuracy": 0.0, "partial_accuracy": 0.0, "extraction_rate": 0.0}
    gold = reference.strip()
    if parsed == gold:
        return {"accuracy": 1.0, "partial_accuracy": 1.0, "extraction_rate": 1.0}
    gold_lines, pred_lines = gold.split("\n"), parsed.split("\n")
    n_compared = min(len(gold_lines), len(pred_lines))
    first_wrong = next((i for i in range(n_compared) if gold_lines[i] != pred_lines[i]), n_compared - 1)
    return {"accuracy": 0.0, "partial_accuracy": (first_wrong + 1) / len(gold_lines), "extraction_rate": 1.0}


@dataclass(frozen=True)
class RouteScore:
    accuracy: float  # exact route (LongProc)
    partial_accuracy: float  # LongProc, with its +1 credit
    step_accuracy: float  # gold steps right before the first error / gold steps
    extraction_rate: float  # 1.0 when both tags were found
    n_correct_steps: int
    first_error_step: int | None  # 0-based gold step of the first error; None if all gold steps right
    parsed: str | None

    def to_dict(self) -> dict:
        return asdict(self)


def score_route(prediction: str, reference: str | PathTraversalInstance) -> RouteScore:
    """All route metrics for one model output against the gold answer (text or instance)."""
    gold_text = reference.answer_nl if isinstance(reference, PathTraversalInstance) else reference
    lp = longproc_metrics(prediction, gold_text)
    parsed = extract_route(prediction)
    gold_lines = gold_text.strip().split("\n")
    if parsed is None:
        n_ok = 0
    else:
        pred_lines = parsed.split("\n")
        n_ok = 0
        while n_ok < min(len(gold_lines), len(pred_lines)) and gold_lines[n_ok] == pred_lines[n_ok]:
            n_ok += 1
    return RouteScore(
        accuracy=lp["accuracy"],
        partial_accuracy=lp["partial_accuracy"],
        step_accuracy=n_ok / len(gold_lines),
        extraction_rate=lp["extraction_rate"],
        n_correct_steps=n_ok,
        first_error_step=None if n_ok == len(gold_lines) else n_ok,
        parsed=parsed,
    )


# ---------------------------------------------------------------------------- teacher forcing


@dataclass(frozen=True)
class TeacherForcedInputs:
    """Prompt ids + gold answer ids, and where each step's destination city is predicted.

    `step_token_spans[k]` are the positions of step k's city-name tokens; the logits at
    position p predict the token at p + 1, so the name's tokens are predicted at
    `step_predict_positions[k]` = span shifted by one.
    """

    input_ids: tuple[int, ...]
    prompt_len: int
    step_token_spans: tuple[Span, ...]

    @property
    def step_target_ids(self) -> list[list[int]]:
        return [list(self.input_ids[a:b]) for a, b in self.step_token_spans]

    @property
    def step_predict_positions(self) -> list[list[int]]:
        return [list(range(a - 1, b - 1)) for a, b in self.step_token_spans]

    @property
    def first_token_positions(self) -> list[int]:
        """Position whose logits predict each step's first city-name token."""
        return [a - 1 for a, _ in self.step_token_spans]


def teacher_forced_inputs(instance: PathTraversalInstance, tokenizer) -> TeacherForcedInputs:
    """Ids for one teacher-forced forward pass; checks the tokenizer matches the instance."""
    prompt_ids, _ = encode_text(tokenizer, instance.prompt_text)
    check_same_tokenizer(instance, len(prompt_ids))
    comp_ids, _ = encode_text(tokenizer, instance.completion)
    return TeacherForcedInputs(
        tuple(prompt_ids) + tuple(comp_ids), len(prompt_ids), tuple(tuple(s) for s in instance.step_token_spans)
    )


@dataclass(frozen=True)
class TeacherForcedScore:
    correct: tuple[bool, ...]  # per gold step
    accuracy: float
    first_error_step: int | None

    def to_dict(self) -> dict:
        return asdict(self)


def teacher_forced_step_accuracy(predicted, inputs: TeacherForcedInputs, mode: str = "name") -> TeacherForcedScore:
    """Per-step accuracy from one teacher-forced pass.

    `predicted`: argmax next-token ids (1-D) or logits (2-D, [positions, vocab]), either for
    every position of `inputs.input_ids` or only for the positions in
    `inputs.step_predict_positions` flattened in step order (mode "name") /
    `inputs.first_token_positions` (mode "first_token").
    mode "name": a step is right when every token of the city name is the argmax (what greedy
    decoding would write given the gold prefix); "first_token": only the first token.
    """
    if mode not in ("name", "first_token"):
        raise ConfigError(f"unknown mode {mode!r}; use 'name' or 'first_token'")
    ids = _as_argmax_list(predicted)
    per_step = inputs.step_predict_positions if mode == "name" else [[p] for p in inputs.first_token_positions]
    targets = inputs.step_target_ids if mode == "name" else [t[:1] for t in inputs.step_target_ids]
    n_needed = sum(len(p) for p in per_step)
    if len(ids) == len(inputs.input_ids):
        lookup = lambda step, j: ids[per_step[step][j]]  # noqa: E731
    elif len(ids) == n_needed:
        starts = [0]
        for p in per_step:
            starts.append(starts[-1] + len(p))
        lookup = lambda step, j: ids[starts[step] + j]  # noqa: E731
    else:
        raise ConfigError(
            f"predictions cover {len(ids)} positions; expected {len(inputs.input_ids)} (every position) "
            f"or {n_needed} (the target positions of mode {mode!r})"
        )
    correct = tuple(all(int(lookup(k, j)) == int(t) for j, t in enumerate(targets[k])) for k in range(len(per_step)))
    first = next((k for k, ok in enumerate(correct) if not ok), None)
    return TeacherForcedScore(correct, sum(correct) / max(1, len(correct)), first)


def _as_argmax_list(predicted) -> list[int]:
    if hasattr(predicted, "detach"):  # torch tensor
        predicted = predicted.detach().cpu().numpy()
    import numpy as np

    arr = np.asarray(predicted)
    if arr.ndim == 3 and arr.shape[0] == 1:  # a batch of one
        arr = arr[0]
    if arr.ndim == 2:
        arr = arr.argmax(-1)
    if arr.ndim != 1:
        raise ConfigError(f"predictions must be 1-D ids or 2-D logits, got shape {arr.shape}")
    return arr.tolist()

"""The route graph: one-way edges around a unique route, sampled as LongProc's are.

Graph shape, measured on LongProc's 200 released instances (all have 50 cities, 49 edges,
routes of 24/29/34/39 hops): every non-destination city has exactly one outgoing edge, and
each distractor city points to a city drawn uniformly from all others, so about 68% of
distractor edges point straight into a route city and the rest form chains that merge into
the route a few hops later (LongProc also has rare distractor cycles). `topology="merge"`
(default) draws the same way but never closes a cycle, so every distractor chain merges into
the route; `topology="longproc"` draws without that check.

`graph_statistics` measures these shapes on LongProc-schema records.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from dysco_interp.errors import ConfigError
from dysco_interp.tasks.path_traversal.longproc import (
    PROBLEM_DESCRIPTION,
    QUESTION_TEMPLATE,
    TRANSIT_METHODS,
    Edge,
    format_answer,
    format_context,
)

TOPOLOGIES = ("merge", "longproc")


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
    out: dict[str, int] = {}
    for i, e in enumerate(edges):
        if e.src in out:
            raise ValueError(f"city {e.src!r} has more than one outgoing edge")
        out[e.src] = i
    route: list[int] = []
    city = start
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
            city: str | None = e.src
            k = 0
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

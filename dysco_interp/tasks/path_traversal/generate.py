"""Path Traversal instances of a target prompt length: the seed fixes the route, distractor edges fill the rest."""

from __future__ import annotations

import random
from collections.abc import Sequence

from dysco_interp.chat import count_chat_tokens, encode_text
from dysco_interp.errors import ConfigError
from dysco_interp.tasks.base import (
    DEFAULT_TOLERANCE,
    LengthSearch,
    check_positive,
    check_tolerance,
    fit_count,
    instance_rng,
    provenance,
)
from dysco_interp.tasks.names import city_names
from dysco_interp.tasks.path_traversal.graph import TOPOLOGIES, RouteGraph, sample_graph
from dysco_interp.tasks.path_traversal.instance import TASK, PathTraversalInstance, build_instance
from dysco_interp.tasks.path_traversal.longproc import (
    PROBLEM_DESCRIPTION,
    TRANSIT_METHODS,
    Edge,
    format_context,
    format_prompt,
)

DEFAULT_HOPS = 4  # the DySCO paper's analyses: 5 cities, 4 edges
LONGPROC_HOPS = (24, 29, 34, 39)  # route lengths in LongProc's released path_traversal_0.5k
NAME_POOL = 5000  # most populous names used at every length, so route names are not easier


def _sample_cities(rng, pool: Sequence[str], exclude: set[str], n: int) -> list[str]:
    # Sampling indices (not a filtered copy of the pool) keeps a 32K instance fast.
    chosen: list[str] = []
    seen = set(exclude)
    while len(chosen) < n:
        name = pool[rng.randrange(len(pool))]
        if name not in seen:
            seen.add(name)
            chosen.append(name)
    return chosen


def resolve_hops(hops: int | Sequence[int], seed: int = 0, index: int = 0) -> int:
    """The route length of instance `index`: `hops` itself, or a seeded draw from a list."""
    if isinstance(hops, int):
        return check_positive("hops", hops)
    choices = list(hops)
    if not choices:
        raise ConfigError("hops: give a positive integer or a non-empty list of them")
    rng = instance_rng(TASK, seed, index, "hops")
    return check_positive("hops", rng.choice([check_positive("hops", h) for h in choices]))


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
    meta = provenance(TASK, seed, index, target_tokens, n_edges, "e")

    def graph_for(count: int) -> RouteGraph:
        return generate_graph(count, seed=seed, index=index, hops=n_hops, topology=topology)

    def build(graph: RouteGraph) -> PathTraversalInstance:
        return build_instance(graph, tokenizer, enable_thinking=enable_thinking, topology=topology, **meta)

    def measured(count: int) -> tuple[RouteGraph, int]:
        # One plain encode per trial; spans are computed once, for the chosen graph.
        graph = graph_for(count)
        prompt = format_prompt(format_context(graph.edges)[0], graph.start, graph.dest)
        return graph, count_chat_tokens(tokenizer, prompt, enable_thinking)

    if n_edges is not None:
        return build(graph_for(n_edges))
    if topology not in TOPOLOGIES:
        raise ConfigError(f"unknown topology {topology!r}; choose one of {', '.join(TOPOLOGIES)}")
    target = check_positive("target_tokens", target_tokens)
    names = city_names()
    overhead, per_line = _length_model(tokenizer, names[:NAME_POOL], enable_thinking)
    search = LengthSearch(
        target,
        tolerance,
        overhead=overhead,
        tokens_per_unit=per_line,
        min_count=n_hops,
        max_count=len(names) - 1,
        too_short=lambda got: (
            f"target length {target} tokens is too short for a {n_hops}-hop route: with no "
            f"distractor edges the prompt already has {got} tokens; ask for at least {got} tokens "
            "or fewer hops"
        ),
        too_long=lambda got: (
            f"target length {target} tokens needs more cities than the {len(names)} distinct "
            f"names available (reached {got} tokens with all of them); ask for a shorter prompt"
        ),
    )
    if search.first_guess > 1.2 * search.max_count:  # fail before building a graph of every name
        raise ConfigError(
            f"target length {target} tokens needs about {search.first_guess} edges, more than the "
            f"{len(names)} distinct city names available allow; ask for a shorter prompt"
        )
    graph, _ = fit_count(measured, lambda trial: trial[1], search)
    return build(graph)


def _length_model(tokenizer, pool: Sequence[str], enable_thinking: bool | None) -> tuple[int, float]:
    """Prompt tokens without edges, and mean tokens per edge line, from a small sample."""
    rng = random.Random(0)
    overhead = count_chat_tokens(tokenizer, format_prompt(PROBLEM_DESCRIPTION, pool[0], pool[1]), enable_thinking)
    sample = rng.sample(list(pool), 65)
    lines = "\n".join(Edge(a, b, rng.choice(TRANSIT_METHODS)).line for a, b in zip(sample, sample[1:]))
    per_line = (len(encode_text(tokenizer, lines)[0]) + 1) / 64
    return overhead, per_line

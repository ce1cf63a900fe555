"""One Path Traversal instance, route step by route step, under teacher forcing: where the QRHeads
and all heads look, what DySCO selected, and what each method predicted for the step's city.

Pure: it reads an `AttentionReplay` of the gold route (its rows are the positions that predict
each gold token) and the teacher-forced results of the methods; nothing here runs a model.
A step is read at the position that predicts its destination city's first token, the one the
paper's Figure 3 reads.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

import torch

from dysco_interp.analysis.replay import AttentionReplay
from dysco_interp.analysis.step_classes import share_in_span
from dysco_interp.decoding.results import ForcedScores, GenerationResult
from dysco_interp.errors import ConfigError
from dysco_interp.tasks.path_traversal import PathTraversalInstance, TeacherForcedInputs


@dataclass(frozen=True)
class StepMechanism:
    """One route step: attention on its gold edge, DySCO's selection, each method's prediction."""

    step: int  # 0-based route step
    edge: str  # the gold edge's name ("Paris → Berlin")
    city: str  # the destination city's text as fed
    qr_mass: float  # mean QRHead attention on the gold edge line
    qr_rank: int  # the gold edge's rank among the edges by that attention (1 = most attended)
    all_mass: float  # the same over every head of every layer
    all_rank: int
    outside_edges: float  # QRHead attention that falls on no edge line (instructions, template, answer so far)
    selected: float | None  # share of the gold edge's tokens DySCO selected (None: no selection there)
    logprob: dict[str, float]  # method -> log-probability of the whole city name (summed over its tokens)
    correct: dict[str, bool]  # method -> every token of the city name is the argmax
    # how concentrated the QRHeads' attention over the edges is: the most attended edge's share of
    # the edge mass, and the entropy of that distribution over log(number of edges) (0: one edge, 1: flat)
    qr_top_share: float | None = None  # None: no QRHead attention on any edge
    qr_entropy: float | None = None
    # method -> how sure it was of its own first choice at the city's first token (the gap between its
    # first and second log-probability; absent for results saved before margins were kept)
    margin: dict[str, float] = field(default_factory=dict)
    # DySCO's selection at the step (from its trace): how many keys, the relevance mass they hold,
    # and the share of them that lies in the gold edge line (None: no selection, or no trace)
    n_selected: int | None = None
    selected_mass: float | None = None
    gold_selected_share: float | None = None
    # method -> the edge whose destination its argmax names (the city's first token; None where the
    # token starts no destination, or starts several), and that edge's rank under the QRHeads
    picks: dict[str, str | None] = field(default_factory=dict)
    pick_ranks: dict[str, int | None] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def concentration(masses: torch.Tensor) -> tuple[float | None, float | None]:
    """(top share, normalised entropy) of non-negative masses over n >= 2 items; None for no mass."""
    total = float(masses.sum())
    if total <= 0 or masses.numel() < 2:
        return None, None
    p = masses.double() / total
    entropy = -float((p[p > 0] * p[p > 0].log()).sum()) / math.log(masses.numel())
    return float(p.max()), entropy


def destination_tokens(instance: PathTraversalInstance, tokenizer) -> dict[int, set[int]]:
    """First token of each edge's destination as the answer writes it (" City") -> those edges.

    The answer names a city after a space, and the tokenizer splits words before a space
    alone, so the first token does not depend on the words before it."""
    out: dict[int, set[int]] = {}
    for i, edge in enumerate(instance.edges):
        ids = tokenizer.encode(" " + edge.dst, add_special_tokens=False)
        if ids:
            out.setdefault(ids[0], set()).add(i)
    return out


def picked_edge(token: int, by_token: Mapping[int, set[int]], instance: PathTraversalInstance,
                ranks: torch.Tensor) -> int | None:
    """The edge a predicted first token names: of the edges into the one city it starts, the
    best ranked; None when it starts no destination or the destinations of several cities."""
    edges = by_token.get(token, set())
    if len({instance.edges[i].dst for i in edges}) != 1:
        return None
    return min(edges, key=lambda i: (int(ranks[i]), i))


def selection_at(trace, position: int) -> tuple[int | None, float | None, list[int] | None]:
    """(keys selected, their relevance mass, their positions) at the trace step fed at `position`."""
    step = next((s for s in (trace.steps if trace is not None else []) if s.position == position), None)
    if step is None:
        return None, None, None
    return step.n_selected, step.nucleus_mass, step.selected


def _ranks(values: torch.Tensor) -> torch.Tensor:
    # each item's rank, ties counting against it (as `_rank`)
    return (values[None, :] >= values[:, None]).sum(dim=1)


def _rank(values: torch.Tensor, index: int) -> int:
    # ties count against the gold edge, as `ranking.in_top_fraction` does
    return int((values >= values[index]).sum())


def step_mechanisms(
    replay: AttentionReplay, inputs: TeacherForcedInputs, forced: Mapping[str, GenerationResult],
    tokenizer, instance: PathTraversalInstance | None = None, selection: GenerationResult | None = None,
) -> list[StepMechanism]:
    """Per route step of the gold route.

    `replay`: `replay_path_traversal` of a teacher-forced DySCO result (its tokens are the gold
    answer, its selection DySCO's at each step). `forced`: method -> that method's
    teacher-forced result on the same instance and gold answer. With `instance`, each method's
    pick (the edge its argmax names) and its rank; with `selection` (the DySCO result replayed),
    the size and mass of its selection and the gold edge's share of it.
    """
    start = inputs.prompt_len - 1  # the position whose logits predict the first answer token
    if replay.query_positions[:1] != [start]:
        raise ConfigError("the replay is not of this instance's teacher-forced gold answer")
    scores: dict[str, ForcedScores] = {}
    for name, res in forced.items():
        if res.forced is None:
            raise ConfigError(f"{name}: not a teacher-forced result")
        scores[name] = res.forced
    if replay.gold is None:
        raise ConfigError("the replay has no gold edges (use replay_path_traversal)")
    n_scored = min(len(f.argmax) for f in scores.values())
    by_token = destination_tokens(instance, tokenizer) if instance is not None else {}
    out = []
    for k, positions in enumerate(inputs.step_predict_positions):
        at = [p - start for p in positions]  # answer tokens of the city name; at[0] is the replay row
        if at[0] >= len(replay) or at[-1] >= n_scored:
            break  # the forced answer was cut by the token budget
        gold = replay.gold[at[0]]
        if gold is None:
            raise ConfigError(f"route step {k}: the replay has no gold edge at answer token {at[0]}")
        targets = inputs.step_target_ids[k]
        chosen = None if replay.selected is None else float(replay.selected[at[0], gold])
        top_share, entropy = concentration(replay.qr_heads[at[0]])
        n_selected, mass, keys = selection_at(selection.trace if selection is not None else None,
                                                   replay.query_positions[at[0]])
        share = share_in_span(keys, replay.spans[gold]) if keys is not None and n_selected else None
        picks: dict[str, str | None] = {}
        pick_ranks: dict[str, int | None] = {}
        if instance is not None:
            ranks = _ranks(replay.qr_heads[at[0]])
            for name, f in scores.items():
                edge = picked_edge(f.argmax[at[0]], by_token, instance, ranks)
                picks[name] = None if edge is None else replay.names[edge]
                pick_ranks[name] = None if edge is None else int(ranks[edge])
        out.append(StepMechanism(
            step=k,
            edge=replay.names[gold],
            city=tokenizer.decode(targets),
            qr_mass=float(replay.qr_heads[at[0], gold]),
            qr_rank=_rank(replay.qr_heads[at[0]], gold),
            all_mass=float(replay.all_heads[at[0], gold]),
            all_rank=_rank(replay.all_heads[at[0]], gold),
            outside_edges=replay.outside_spans("qr_heads", at[0]),
            selected=None if chosen is None or math.isnan(chosen) else chosen,
            logprob={name: sum(f.logprob[i] for i in at) for name, f in scores.items()},
            correct={name: all(f.argmax[i] == t for i, t in zip(at, targets)) for name, f in scores.items()},
            qr_top_share=top_share,
            qr_entropy=entropy,
            margin={name: f.margin[at[0]] for name, f in scores.items() if len(f.margin) > at[0]},
            n_selected=n_selected, selected_mass=mass, gold_selected_share=share, picks=picks, pick_ranks=pick_ranks,
        ))
    return out


def step_totals(steps: list[StepMechanism]) -> dict[str, dict[str, float]]:
    """method -> {"step_accuracy", "city_logprob"} over the steps (means)."""
    if not steps:
        return {}
    return {name: {"step_accuracy": sum(s.correct[name] for s in steps) / len(steps),
                   "city_logprob": sum(s.logprob[name] for s in steps) / len(steps)}
            for name in steps[0].logprob}


__all__ = ["StepMechanism", "destination_tokens", "picked_edge", "selection_at", "step_mechanisms", "step_totals"]

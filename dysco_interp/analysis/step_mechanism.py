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
from dysco_interp.decoding.results import ForcedScores, GenerationResult
from dysco_interp.errors import ConfigError
from dysco_interp.tasks.path_traversal import TeacherForcedInputs


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


def _rank(values: torch.Tensor, index: int) -> int:
    # ties count against the gold edge, as `ranking.in_top_fraction` does
    return int((values >= values[index]).sum())


def step_mechanisms(
    replay: AttentionReplay, inputs: TeacherForcedInputs, forced: Mapping[str, GenerationResult],
    tokenizer,
) -> list[StepMechanism]:
    """Per route step of the gold route.

    `replay`: `replay_path_traversal` of a teacher-forced DySCO result (its tokens are the gold
    answer, its selection DySCO's at each step). `forced`: method -> that method's
    teacher-forced result on the same instance and gold answer.
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
        ))
    return out


def step_totals(steps: list[StepMechanism]) -> dict[str, dict[str, float]]:
    """method -> {"step_accuracy", "city_logprob"} over the steps (means)."""
    if not steps:
        return {}
    return {name: {"step_accuracy": sum(s.correct[name] for s in steps) / len(steps),
                   "city_logprob": sum(s.logprob[name] for s in steps) / len(steps)}
            for name in steps[0].logprob}


__all__ = ["StepMechanism", "step_mechanisms", "step_totals"]

"""The gate's threshold, chosen on the dev split by a rule fixed before any test run (pure:
step-account records in, a choice out).

The gate (`dysco-gated`) scales a decoding step only when DySCO's selected keys hold at least
`min_mass` of the QRHeads' relevance. Its rule, written down before the test split ran:

- On each dev route step, simulate the gate at threshold t: it takes DySCO's prediction where
  DySCO's selection held a mass >= t, and vanilla's elsewhere (teacher forced, both runs
  decoded the same gold prefix; the simulation ignores what a step changes in the cache for
  later steps, which the real gate's test run includes).
- Score t by the mean over the model's dev cells (one per length) of the mean per-instance
  step accuracy of that simulation.
- Choose the best t of `GRID`; ties go to the smaller t (the gate closer to plain DySCO). t = 0
  is plain DySCO: a choice of 0 says that no gate helped on the dev split.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from dysco_interp.errors import ConfigError

GRID = tuple(round(0.05 * i, 2) for i in range(20))  # 0, 0.05, ..., 0.95
RULE = ("the threshold on the selected keys' relevance mass, from 0 to 0.95 in steps of 0.05, whose simulated gate "
        "(DySCO's prediction at steps with at least that mass, vanilla's elsewhere) has the highest mean over the "
        "model's dev lengths of the per-instance teacher-forced step accuracy; ties: the smaller threshold")


def simulated(step: Mapping, threshold: float, base: str = "vanilla", steered: str = "dysco") -> bool:
    """Whether the gate at `threshold` gets this step right, by the rule above."""
    mass = step.get("selected_mass")
    use = steered if mass is None or mass >= threshold else base
    return bool(step["correct"][use])


def gate_scores(records: Iterable[Mapping], grid: Sequence[float] = GRID) -> dict[float, float]:
    """threshold -> mean over the records' lengths of the mean per-instance simulated step accuracy."""
    cells: dict[object, list[list[Mapping]]] = defaultdict(list)
    for r in records:
        if r["steps"]:
            cells[r["length"]].append(r["steps"])
    if not cells:
        raise ConfigError("no dev route steps to choose the gate from: run the dev split first")

    def score(t: float) -> float:
        per_cell = [sum(sum(simulated(s, t) for s in steps) / len(steps) for steps in inst) / len(inst)
                    for inst in cells.values()]
        return sum(per_cell) / len(per_cell)

    return {t: score(t) for t in grid}


def choose_gate(records: Sequence[Mapping], model: str) -> dict:
    """The chosen threshold for `model`, with every candidate's score and the rule."""
    mine = [r for r in records if r["model"] == model]
    scores = gate_scores(mine)
    best = max(scores, key=lambda t: (round(scores[t], 12), -t))
    return {"model": model, "min_mass": best, "rule": RULE,
            "scores": {f"{t:g}": round(v, 6) for t, v in scores.items()},
            "dev_lengths": sorted({r["length"] for r in mine}), "dev_instances": len(mine),
            "helps_on_dev": scores[best] > scores[0.0]}


__all__ = ["GRID", "RULE", "choose_gate", "gate_scores", "simulated"]

"""What a head set was detected on, and whether a test set shares it.

A task instance is fixed by (task, seed, index): a Needle QA instance's gold document and
question depend on nothing else, whatever its length. Heads picked on some instances and then
tested on the same ones are not tested on held-out data, so a head set keeps, per task and data
seed, the indices and target lengths it was detected on (`DetectionData`), and `shared_with`
names the test instances that are among them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dysco_interp.heads.values import nonneg_int, positive_int, require


@dataclass(frozen=True)
class DetectionData:
    """The instances of one task and data seed that a head set was detected on."""

    task: str
    seed: int
    indices: tuple[int, ...]
    lengths: tuple[int, ...]  # the instances' target lengths in tokens

    @property
    def n(self) -> int:
        return len(self.indices)

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.task, "seed": self.seed, "n": self.n, "lengths": list(self.lengths),
                "indices": list(self.indices)}

    @classmethod
    def from_dict(cls, d: Any, where: str = "detected_on") -> "DetectionData":
        """Checked; HeadSetError naming `where` for anything else."""
        require(isinstance(d, Mapping), f"{where} must be an object, got {type(d).__name__}")
        unknown = set(d) - {"task", "seed", "n", "lengths", "indices"}
        require(not unknown, f"{where} has unknown field(s) {sorted(map(str, unknown))}")
        require(isinstance(d.get("task"), str) and bool(d.get("task")), f"{where}.task must be a task name")
        for key in ("indices", "lengths"):
            require(isinstance(d.get(key), list), f"{where}.{key} must be a list of integers")
        indices = tuple(sorted({nonneg_int(i, f"{where}.indices") for i in d["indices"]}))
        lengths = tuple(sorted({positive_int(n, f"{where}.lengths") for n in d["lengths"]}))
        require(d.get("n", len(indices)) == len(indices), f"{where}.n disagrees with its {len(indices)} indices")
        return cls(d["task"], nonneg_int(d.get("seed"), f"{where}.seed"), indices, lengths)

    def describe(self) -> str:
        """In words, e.g. `needle_qa seed 0, indices 0-31 at 2048 tokens`."""
        lengths = ", ".join(map(str, self.lengths))
        return f"{self.task} seed {self.seed}, indices {ranges(self.indices)}" + (f" at {lengths} tokens" if lengths
                                                                                  else "")


def ranges(indices: Sequence[int]) -> str:
    """0,1,2,3,7 as "0-3, 7"."""
    parts: list[str] = []
    for i in sorted(indices):
        if parts and i == int(parts[-1].rsplit("-", 1)[-1]) + 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{i}"
        else:
            parts.append(str(i))
    return ", ".join(parts)


def detection_data(examples: Iterable[Any]) -> tuple[DetectionData, ...]:
    """Per (task, seed), the examples' indices and target lengths. Examples without a seed or an
    index (hand-made ones) cannot be matched against a test set and are left out."""
    groups: dict[tuple[str, int], tuple[set[int], set[int]]] = {}
    for ex in examples:
        seed, index = getattr(ex, "seed", None), getattr(ex, "index", None)
        if seed is None or index is None:
            continue
        indices, lengths = groups.setdefault((ex.task, seed), (set(), set()))
        indices.add(index)
        if getattr(ex, "target_tokens", None):
            lengths.add(ex.target_tokens)
    return tuple(DetectionData(task, seed, tuple(sorted(ix)), tuple(sorted(ls)))
                 for (task, seed), (ix, ls) in sorted(groups.items()))


def shared_with(detected: Sequence[DetectionData], instances: Iterable[Any]) -> list[tuple[DetectionData, int]]:
    """Each detection set that test instances share, with how many of them are among its instances."""
    by_key: dict[tuple[str, int | None], DetectionData] = {(d.task, d.seed): d for d in detected}
    counts: dict[tuple[str, int | None], int] = {}
    for inst in instances:
        d = by_key.get((inst.task, getattr(inst, "seed", None)))
        if d is not None and getattr(inst, "index", None) in d.indices:
            counts[(d.task, d.seed)] = counts.get((d.task, d.seed), 0) + 1
    return [(by_key[key], n) for key, n in sorted(counts.items())]


def leakage_line(detected: Sequence[DetectionData], instances: Sequence[Any]) -> str | None:
    """One line saying which test instances the heads were detected on, or None when none were."""
    shared = shared_with(detected, instances)
    if not shared:
        return None
    what = "; ".join(f"{n} of {len(instances)} are {d.describe()}" for d, n in shared)
    return (f"the QRHeads were detected on some of these test instances ({what}): their results are not "
            "held out; make test data with another --seed")

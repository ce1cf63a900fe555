"""`TaskSpec`: everything the package needs to know of one task, in one frozen object.

Each task package defines its spec in its own `spec.py`, and `tasks.registry` lists them;
`make_dataset` and `load_dataset`, `make-data` (its flags), `evaluate` (prompts, gold answers,
scores) and the result tables (metrics, labels) read the spec instead of naming tasks. A new
task is its package plus `register_task(spec)`.

Nothing here imports torch: the command line builds its parser from the registry.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dysco_interp.chat import Messages, Span
from dysco_interp.tasks.base import SpanRecord

if TYPE_CHECKING:
    from dysco_interp.decoding.results import GenerationResult


def no_forced_scores(result: GenerationResult, instance: Any, tokenizer: Any) -> Mapping[str, float | None]:
    return {}


def always_scorable(instance: Any) -> str | None:
    return None


def no_gold_steps(instance: Any, n: int) -> None:
    return None


@dataclass(frozen=True)
class Evaluation:
    """How `evaluate` prompts, traces and scores the task's instances, freely decoded or teacher-forced.

    Each callable takes an instance of the task (its own dataclass)."""

    prompt: Callable[[Any], str | Messages]
    # named token spans a kept trace measures the relevance mass of
    spans: Callable[[Any], dict[str, Span] | None]
    score: Callable[[str, Any], Mapping[str, float]]  # (generated text, instance) -> the record's scores
    gold: Callable[[Any], str]  # the answer teacher forcing feeds (encoded on its own, after the prompt)
    # task-specific scores of a teacher-forced result (beyond `ForcedScores.summary`): (result, instance, tokenizer)
    score_forced: Callable[[GenerationResult, Any, Any], Mapping[str, float | None]] = no_forced_scores
    unscorable: Callable[[Any], str | None] = always_scorable  # why an instance cannot be scored, or None
    # (instance, n) -> for each of the first n teacher-forced steps a record scores (route steps where it
    # scores those, else gold tokens), the position whose decoding step predicted it and the name of its
    # gold span among `spans`; None when the task marks no gold span
    gold_steps: Callable[[Any, int], list[tuple[int, str]] | None] = no_gold_steps
    # the gold answer as consecutive (text, is_content) pieces whose texts join to `gold`: format-forced
    # decoding forces the format and lets the model write the content; None: the task names none
    segments: Callable[[Any], list[tuple[str, bool]]] | None = None


@dataclass(frozen=True)
class TableMetric:
    """A record field the result tables report for the task."""

    field: str
    label: str  # its column title ("accuracy (exact)")
    axis: str  # what follows the task's title on the robustness figure's axis ("accuracy")
    compared: bool = False  # also shown as a paired difference to a reference method, and drawn


@dataclass(frozen=True)
class TaskMetrics:
    """The score fields of the task's records that tables and choices read."""

    free: tuple[str, ...]  # `evaluate`'s table of freely decoded results, in column order
    forced: tuple[str, ...]  # `evaluate`'s table under teacher forcing
    primary: str  # the free metric a configuration is judged by (the budget study's choice)
    primary_forced: str  # the same under teacher forcing
    tables: tuple[TableMetric, ...] = ()  # the paper tables' columns (`analysis.result_tables`)
    # the free metric that is 1 when the answer block was found in the output: where it is 0 the
    # other free scores are 0 for want of an answer to read, and `evaluate` says so
    extraction: str | None = None

    @property
    def table_fields(self) -> tuple[str, ...]:
        return tuple(m.field for m in self.tables)

    @property
    def compared(self) -> tuple[str, ...]:
        return tuple(m.field for m in self.tables if m.compared)

    @property
    def scores(self) -> tuple[str, ...]:
        """Every score field of the task's records, free and teacher-forced."""
        return self.free + self.forced

    @staticmethod
    def bounds(field: str) -> tuple[float, float]:
        """The values a score field can take: a log-probability (a `*logprob` field) is at most 0;
        every other score is a share (of instances, steps or tokens right), in [0, 1]."""
        return (-math.inf, 0.0) if field.endswith("logprob") else (0.0, 1.0)


@dataclass(frozen=True)
class DataFlag:
    """An option `make-data` takes for this task alone: `FLAG VALUE` passes VALUE to the
    generator as keyword `option`; given for another task, it is refused."""

    flag: str  # "--needles"
    option: str  # the generator's keyword: "n_needles"
    help: str
    # an argparse type (`argtypes`): bad text is refused while the command line is parsed
    type: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None

    @property
    def dest(self) -> str:
        """The attribute argparse stores the value under."""
        return self.flag.removeprefix("--").replace("-", "_")


@dataclass(frozen=True)
class TaskSpec:
    """One task: its name, how its instances are made, stored, evaluated and reported."""

    name: str  # the `task` field of its instances and records
    title: str  # how tables and figures name it ("Path Traversal")
    generate: Callable[..., SpanRecord]  # (tokenizer, target_tokens, *, seed, index, **options) -> instance
    instance_type: type[SpanRecord]
    options: tuple[str, ...]  # keyword options `generate` accepts besides seed and index
    # What the make-data table shows for one instance; it takes `instance_type`, which a
    # Callable type cannot say without making TaskSpec generic in it.
    summary: Callable[[Any], dict[str, int]]
    evaluation: Evaluation
    metrics: TaskMetrics
    flags: tuple[DataFlag, ...] = ()  # make-data's options for this task
    aliases: tuple[str, ...] = ()  # other names `get_task` accepts
    # The texts of the task's instruction that every instance's prompt holds, for the methods that
    # emphasise an instruction (InstABoost, PASTA); none: the prompt's last message is the instruction.
    instruction: tuple[str, ...] = ()


__all__ = ["DataFlag", "Evaluation", "TableMetric", "TaskMetrics", "TaskSpec", "always_scorable", "no_forced_scores",
           "no_gold_steps"]

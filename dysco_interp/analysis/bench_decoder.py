"""How the decode-step benchmark drives decoding: the steps it times and `BenchDecoder`, the one
place that prefills and steps, through the public backend, `PromptBatch.from_ids` and `Stepper` API.
A step is timed waiting for its own records (`waited`) or run ahead as the decode loop runs it on a
GPU (`StepsAhead`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence

import torch

from dysco_interp.decoding.backends import BackendSpec, DecodeState
from dysco_interp.decoding.config import DecodingConfig
from dysco_interp.decoding.loop import Stepper
from dysco_interp.decoding.methods import register_method
from dysco_interp.decoding.plan import PassPlan, Read
from dysco_interp.decoding.prompts import PromptBatch
from dysco_interp.decoding.steering import SteeringMethod
from dysco_interp.decoding.stepper import HostRead, PendingRecords
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet
from dysco_interp.models import LoadedModel

METHODS = ("vanilla", "dysco")

Step = Callable[[torch.Tensor], object]  # feeds one token per row
# queues one step of one token per row: its logits, and its records to read (None: it keeps none)
Queue = Callable[[torch.Tensor], tuple[torch.Tensor, PendingRecords | None]]


def waited(queue: Queue) -> Step:
    """A step that waits for its own records, as a loop that does not run ahead takes it."""
    def step(token: torch.Tensor) -> None:
        records = queue(token)[1]
        if records is not None:
            records.records()

    return step


class StepsAhead:
    """Steps as a decode loop that runs ahead takes them (`loop._free`): each step is queued and
    its token chosen on the device before the host reads the last step's token and records, so
    the device does not wait for the host between steps. `flush()` reads the last step's."""

    def __init__(self, queue: Queue):
        self.queue = queue
        self.last: tuple[HostRead, PendingRecords | None] | None = None

    def __call__(self, token: torch.Tensor) -> None:
        logits, records = self.queue(token)
        chosen = HostRead(logits.argmax(-1))
        self.flush()
        self.last = (chosen, records)

    def flush(self) -> None:
        if self.last is not None:
            chosen, records = self.last
            chosen.values()
            if records is not None:
                records.records()
        self.last = None


class UserDysco(SteeringMethod):
    """DySCO's math written as a researcher's `SteeringMethod` (every default kept): what the
    user-method path costs against the built-in DySCO."""

    name = "bench-user-dysco"
    description = "DySCO's math as a user-defined SteeringMethod (the benchmark's user path)"


def check_step_labels(labels: Iterable[str]) -> None:
    """A ConfigError for a label of a timed method that names one of the benchmark's own steps
    (vanilla, DySCO, "user", "dysco_read<N>"), whose timings it would silently replace."""
    for label in labels:
        if label in (*METHODS, "user") or label.startswith("dysco_read"):
            raise ConfigError(f"{label!r} is one of the benchmark's own steps: time the method under a label "
                              f"of its own, e.g. {label}:mine")


def extra_steps(config: DecodingConfig, model: LoadedModel, user_method: bool, read_heads: int,
                seed: int = 0, methods: Sequence[DecodingConfig] | Mapping[str, DecodingConfig] = (),
                ) -> dict[str, tuple[DecodingConfig, Read | None]]:
    """The steps timed beside vanilla and DySCO: DySCO as a user method ("user"), DySCO reading
    `read_heads` more seeded random heads' rows at every step ("dysco_read<N>"), and each of
    `methods` (any registered method, under its name, or under its label where `methods` maps
    labels to configs: one method at two settings)."""
    if not isinstance(methods, Mapping):
        names = [c.method for c in methods]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ConfigError(f"{twice[0]} is timed twice under one name: give each setting a label")
        methods = {c.method: c for c in methods}
    check_step_labels(methods)
    extra: dict[str, tuple[DecodingConfig, Read | None]] = {label: (c, None) for label, c in methods.items()}
    if user_method:
        register_method(UserDysco)
        extra["user"] = (config.replace(method=UserDysco.name), None)
    if read_heads:
        spec = model.spec
        every = [(layer, head) for layer in range(spec.n_layers) for head in range(spec.n_heads)]
        chosen = torch.randperm(len(every), generator=torch.Generator().manual_seed(seed))[:read_heads]
        extra[f"dysco_read{read_heads}"] = (config, Read([every[i] for i in chosen.tolist()], returns="rows"))
    return extra


def timed_steps(extra: Iterable[str], versus: str | None = None) -> list[str]:
    """The steps timed beside vanilla and DySCO: the `extra` ones, then, given another backend
    `versus`, each of those steps on it ("<backend>_<step>")."""
    extra = list(extra)
    other = [] if versus is None else [f"{versus}_{m}" for m in (*METHODS, *extra)]
    return [*extra, *other]


class BenchDecoder:
    """A plain prefill, then a vanilla step and a DySCO step (`config.method`) that each advance
    their own copy of the prefilled context; the only code of the benchmark that drives decoding,
    through the public backend, `PromptBatch.from_ids` and `Stepper` API."""

    def __init__(self, model: LoadedModel, heads: HeadSet, config: DecodingConfig, backend: BackendSpec | str,
                 extra: dict[str, tuple[DecodingConfig, Read | None]] | None = None,
                 versus: BackendSpec | str | None = None):
        self.model, self.heads, self.config = model, heads, config
        self.backend = BackendSpec.of(backend)
        self.plain = self.backend.make(model)
        # name -> (config, read-out): more steps timed in the same run, on DySCO's context
        self.extra = extra or {}
        # another backend whose steps (vanilla, DySCO, the extra ones) are timed beside these, step by step
        self.versus = None if versus is None else BenchDecoder(model, heads, config, versus, self.extra)
        self.versus_prefix: DecodeState | None = None

    @property
    def timed(self) -> list[str]:
        return timed_steps(self.extra, None if self.versus is None else self.versus.backend.name)

    def grows_by(self, steps_each: int) -> int:
        """How many keys the shared context gains when DySCO and each extra method take
        `steps_each` steps (vanilla steps on its own copy)."""
        return (1 + len(self.extra)) * steps_each

    def prefill(self, context: torch.Tensor, reserve: int) -> DecodeState:
        """`context` `[B, n]` with room for `reserve` more tokens (the other backend's own prefill too)."""
        if self.versus is not None:
            self.versus_prefix = self.versus.prefill(context, reserve)
        return self.plain.prefill(context.to(self.model.device), None, reserve=reserve)

    def steps(self, context: torch.Tensor | PromptBatch, prefix: DecodeState, steps_each: int) -> dict[str, Queue]:
        """vanilla on a clone of `prefix`, DySCO on `prefix` itself, its relevance uniform over
        the context as if warmed up, each to take `steps_each` steps. `context`: token ids, or the
        prompts whose ids were prefilled (for methods that find spans in the prompts' text)."""
        vanilla = prefix.clone()
        prompts = context if isinstance(context, PromptBatch) else PromptBatch.from_ids(context)
        batch, n_context = prompts.ids.shape

        # every method's keys must fit what the shared context grows to, not only its own steps
        room = self.grows_by(steps_each)

        def stepper(config: DecodingConfig, read: Read | None = None) -> Stepper:
            config = config.replace(max_new_tokens=max(config.max_new_tokens, room))
            made = Stepper(self.backend.make(self.model), config, prompts, heads=self.heads, read=read)
            if made.selector is not None:  # a method that keeps relevance, as if warmed up
                made.relevance = torch.full((batch, n_context), 1.0 / n_context, device=self.model.device)
            return made

        plain = PassPlan()

        def vanilla_step(tok: torch.Tensor) -> tuple[torch.Tensor, None]:
            logits = self.plain.run(vanilla, tok, plain).logits
            assert logits is not None
            return logits, None

        steps: dict[str, Queue] = {"vanilla": vanilla_step,
                                   "dysco": functools.partial(stepper(self.config).launch, prefix)}
        # the extra steps share DySCO's context (a copy each would not fit at 100K): each step of
        # each adds a key, a few dozen over a run, nothing at these lengths
        for name, (config, read) in self.extra.items():
            steps[name] = functools.partial(stepper(config, read).launch, prefix)
        if self.versus is not None:
            assert self.versus_prefix is not None
            other = self.versus.steps(context, self.versus_prefix, steps_each)
            steps.update({f"{self.versus.backend.name}_{m}": step for m, step in other.items()})
        return steps

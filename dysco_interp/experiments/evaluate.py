"""Evaluate decoding methods on a task dataset, one stored record per (instance, method).

Methods that keep prefill attention share one prefill per instance (or batch of instances).
Records go to a `ResultStore` keyed by method name and instance content, under a header with
the model, its weights, the dtype, the device type, the task and the backend; each record also
carries the config fields its method uses (sampling included), its head set and the instance
hash. A killed run resumes without redoing finished items, and a rerun with other settings is
refused instead of handing back stale results.

Under torchrun (or any initialised process group) the instances still missing are shared out
between the ranks, each writing a shard that rank 0 folds into the store at the end, in the
order one process would have written it (`dysco_interp.distributed`).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Mapping, Sequence

import torch

from dysco_interp.checks import check_bool, is_int, typed
from dysco_interp.decoding.backends import BackendSpec
from dysco_interp.decoding.config import DecodingConfig
from dysco_interp.decoding.format_forced import BOTH_FORCED, FORMAT_FORCED
from dysco_interp.decoding.loop import iter_methods
from dysco_interp.decoding.methods import with_later_options
from dysco_interp.decoding.prompts import prepare_prompt
from dysco_interp.decoding.results import GenerationResult
from dysco_interp.distributed import Shard, current_world, gather, note_world, sharded_store
from dysco_interp.errors import ConfigError, DataError, LeakageWarning
from dysco_interp.heads import HeadSet
from dysco_interp.heads.detected_on import leakage_line
from dysco_interp.models import LoadedModel, dtype_name
from dysco_interp.progress import tqdm
from dysco_interp.stores.provenance import provenance
from dysco_interp.stores.store import (
    ResultStore,
    StoreMismatchError,
    canonical_json,
    check_not_busy,
    content_hash,
    differences,
    open_store,
    read_resumable,
    shard_paths,
    sibling_paths,
)
from dysco_interp.tasks.base import check_same_tokenizer
from dysco_interp.tasks.registry import TASKS
from dysco_interp.tasks.spec import Evaluation, TaskSpec


def method_settings(config: DecodingConfig, heads: HeadSet | None) -> dict:
    """Everything a method's outputs depend on besides the store's settings: the config fields
    it uses (sampling included) and, for head-based methods, the head set's content."""
    settings = config.used_fields()
    settings.pop("enable_thinking")  # the instances' own switch: part of their content
    used = heads if config.uses_heads else None
    settings["heads"] = None if used is None else [list(h) for h in used.heads]
    return json.loads(canonical_json(settings))


def store_settings(model_name: str, task: str, backend: BackendSpec | str, dtype: torch.dtype,
                   device: torch.device, weights: str | None = None, teacher_forced: bool = False,
                   decode_attention: str | None = None, format_forced: bool = False) -> dict:
    """What every record of an evaluation store shares: the model and its weights, the numeric
    format, the device type, the task, the backend (`BackendSpec.store_settings`), and whether
    decoding was teacher-forced or format-forced. Without `weights` (before the model is loaded)
    the rest, for `precheck`. `decode_attention` goes with a backend's name."""
    settings = {"model": model_name, "dtype": dtype_name(dtype), "device": device.type, "task": task,
                **BackendSpec.of(backend, decode_attention=decode_attention).store_settings()}
    # only when set, so stores made before the options existed stay resumable
    if teacher_forced:
        settings["teacher_forced"] = True
    if format_forced:
        settings["decoding"] = FORMAT_FORCED
    return settings if weights is None else {**settings, "weights": weights}


def check_modes(task: str, teacher_forced: bool, format_forced: bool) -> None:
    """ConfigError for both forcing modes at once, or format forcing on a task that names no
    format and content segments in its answers (before anything is loaded or decoded)."""
    check_bool("teacher_forced", teacher_forced)
    check_bool("format_forced", format_forced)
    if teacher_forced and format_forced:
        raise ConfigError(f"{BOTH_FORCED}: choose one")
    if format_forced and evaluated_task(task).evaluation.segments is None:
        named = ", ".join(name for name, spec in TASKS.items() if spec.evaluation.segments is not None)
        raise ConfigError(f"task {task!r} names no format and content segments in its answers: format forcing "
                          f"runs only on tasks that do ({named})")


def instance_id(instance) -> str:
    """An instance's identity is its content: data made with other options never shares it."""
    return content_hash(instance.to_dict())


def evaluated_task(task: str) -> TaskSpec:
    """The spec of a registered task, by its exact name (the store records it); ConfigError otherwise."""
    spec = TASKS.get(task)
    if spec is None:
        raise ConfigError(f"no evaluation for task {task!r}; choose one of {', '.join(TASKS)}")
    return spec


def check_task(task: str, instances: Sequence) -> None:
    """ConfigError unless every instance belongs to `task` and can be scored (before anything is decoded)."""
    spec = evaluated_task(task)
    for inst in instances:
        if not isinstance(inst, spec.instance_type):
            found = getattr(inst, "task", type(inst).__name__)
            raise ConfigError(f"the data holds {found} instances, not {task}; pass the matching --task")
        why = spec.evaluation.unscorable(inst)
        if why:
            raise ConfigError(f"instance {inst.id!r}: {why}")


KEY = ("method", "instance")
NEW_STORE_HINT = "write to another file, or let it start a new one (--if-settings-differ new)"


def check_methods(path: str | Path, records: Iterable[dict], wanted: Mapping[str, dict], ignore=()) -> None:
    """StoreMismatchError when a method name is stored with other settings than it has now
    (the fields in `ignore` are not compared)."""
    seen: set[str] = set()
    for record in records:
        method = record.get("method")
        if not isinstance(method, str) or method not in wanted or method in seen:
            continue
        seen.add(method)
        stored = {k: v for k, v in with_later_options((record.get("settings") or {}).get("method") or {}).items()
                  if k not in ignore}
        now = {k: v for k, v in wanted[method].items() if k not in ignore}
        if stored != now:
            raise StoreMismatchError(f"{path} holds {method!r} results computed with other settings "
                                     f"({'; '.join(differences(stored, now))}); {NEW_STORE_HINT}")


def record_problem(record: Mapping, metrics: Iterable[str] = ()) -> str | None:
    """What makes a stored record unusable to a resumed run, or None: its key fields (method,
    instance hash) missing or not strings, `settings` or `settings.method` not objects, a
    `length` that is no integer, a metric among `metrics` that is no number."""
    for field in KEY:
        if field not in record:
            return f"has no {field!r} field"
        if not isinstance(record[field], str):
            return f"{field!r} must be a string, got {typed(record[field])}"
    settings = record.get("settings")
    if settings is not None and not isinstance(settings, dict):
        return f"'settings' must be an object, got {typed(settings)}"
    method = (settings or {}).get("method")
    if method is not None and not isinstance(method, dict):
        return f"'settings.method' must be an object, got {typed(method)}"
    length = record.get("length")
    if length is not None and not is_int(length):
        return f"'length' must be an integer or null, got {typed(length)}"
    for metric in metrics:
        value = record.get(metric)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            return f"{metric!r} must be a number or null, got {typed(value)}"
    return None


def check_records(path: str | Path, records: Iterable[Mapping], metrics: Iterable[str] = ()) -> None:
    """DataError naming the first record of the store at `path` that `record_problem` refuses."""
    metrics = tuple(metrics)
    for number, record in enumerate(records, 1):
        problem = record_problem(record, metrics)
        if problem:
            joint = " " if problem.startswith("has ") else ": "
            raise DataError(f"{path}: record {number}{joint}{problem}; the store is damaged: remove that record, "
                            "or write to another file")


def task_metrics(task: str) -> tuple[str, ...]:
    """Every metric the task's records may carry, freely decoded or teacher-forced."""
    spec = TASKS.get(task)
    return () if spec is None else (*spec.metrics.free, *spec.metrics.forced)


def check_store_files(path: str | Path, task: str, if_differs: str = "error", busy: bool = True) -> None:
    """DataError for a malformed record in a file that opening the store at `path` reads (the
    store and its shards, and with if_differs="new" each sibling store it may move on to);
    with `busy`, StoreBusyError for such a store another writer holds."""
    candidates = [Path(path)]
    if if_differs == "new":
        candidates = []
        for sibling in sibling_paths(path):
            candidates.append(sibling)
            if not sibling.exists():
                break
    for store in candidates:
        if busy:
            check_not_busy(store)
        # a killed data-parallel run's shards join the store when it is opened: check them with it
        for file in (store, *shard_paths(store)):
            contents = read_resumable(file)
            if contents is not None:
                check_records(file, contents.records, task_metrics(task))


def check_traces(path: str | Path, records: Iterable[Mapping], methods: Iterable[str],
                 instances: Iterable[str]) -> None:
    """StoreMismatchError when a run that keeps traces would hand back a stored record of its
    methods x instances that has none (written without keep_trace)."""
    wanted = {(m, h) for m in methods for h in instances}
    lacking = sum(1 for r in records if (r.get("method"), r.get("instance")) in wanted and "trace" not in r)
    if lacking:
        raise StoreMismatchError(f"{path} holds {lacking} record(s) of this run stored without a trace (written "
                                 f"without --keep-trace), which --keep-trace would hand back as they are; "
                                 f"{NEW_STORE_HINT}")


def precheck(path: str | Path, known: Mapping[str, object], methods: Mapping[str, dict],
             traces_for: Iterable[str] | None = None, busy: bool = True) -> None:
    """Before a model is loaded: refuse a store another writer holds (with `busy`), a path that is
    no store, a malformed record, or a store whose settings differ in what is already known
    (`known`: the store settings but the weights id, which needs the model; `methods`: method
    settings, compared without their head sets, which need it too); with `traces_for` (the hashes
    of instances whose traces are kept), a stored record of them without a trace."""
    instances = None if traces_for is None else list(traces_for)
    if busy:
        check_not_busy(path)
    # a killed data-parallel run's shards join the store when it is opened: check them with it
    for file in (Path(path), *shard_paths(path)):
        contents = read_resumable(file)
        if contents is None:
            continue
        check_records(file, contents.records, task_metrics(str(known.get("task"))))
        # settings written only when set (teacher_forced, decoding, decode_attention) count when absent
        theirs = {k: v for k, v in (contents.settings or {}).items() if k != "weights"}
        if theirs != dict(known):
            raise StoreMismatchError(f"{file} holds results computed with other settings "
                                     f"({'; '.join(differences(theirs, known))}); {NEW_STORE_HINT}")
        check_methods(file, contents.records, methods, ignore=("heads",))
        if instances is not None:
            check_traces(file, contents.records, methods, instances)


def warn_leakage(heads: HeadSet | None, instances: Sequence, methods: Mapping[str, DecodingConfig]) -> None:
    """A LeakageWarning when a method steers with heads detected on some of these instances."""
    if heads is None or not any(c.uses_heads for c in methods.values()):
        return
    line = leakage_line(heads.detected_on, instances)
    if line is not None:
        warnings.warn(line, LeakageWarning, stacklevel=3)


def decode_instances(model: LoadedModel, evaluation: Evaluation, batch: Sequence,
                     methods: Mapping[str, DecodingConfig], heads: HeadSet | None, keep_trace: bool,
                     backend: BackendSpec, teacher_forced: bool = False, format_forced: bool = False):
    """Decode instances together under each method (teacher-forced on their gold answers,
    format-forced on their answers' segments, or freely): yields (name, config as run, results)
    as each method finishes."""
    thinking = {inst.enable_thinking for inst in batch}
    if len(thinking) != 1:
        raise ConfigError("instances decoded together must share enable_thinking")
    thinking = thinking.pop()
    prompts = [evaluation.prompt(inst) for inst in batch]
    prepared = [prepare_prompt(model, p, thinking) for p in prompts]
    for inst, prep in zip(batch, prepared):
        check_same_tokenizer(inst, len(prep.ids))
    configs = {m: c.replace(enable_thinking=thinking) for m, c in methods.items()}
    # span masses cost a host copy of the relevance every step: only for traces that are kept
    spans = [evaluation.spans(inst) for inst in batch] if keep_trace else None
    forced = [evaluation.gold(inst) for inst in batch] if teacher_forced else None
    segments = [segments_of(evaluation, inst) for inst in batch] if format_forced else None
    for method, rows in iter_methods(model, prompts, configs, heads, spans=spans, prepared=prepared, backend=backend,
                                     forced=forced, format_forced=segments):
        yield method, configs[method], rows


def segments_of(evaluation: Evaluation, instance) -> list[tuple[str, bool]]:
    """The instance's answer segments; a task whose segments do not join to its gold answer is a bug."""
    assert evaluation.segments is not None
    segments = evaluation.segments(instance)
    if "".join(text for text, _ in segments) != evaluation.gold(instance):
        raise DataError(f"instance {instance.id!r}: its answer's segments do not join to its gold answer")
    return segments


def mean_selected(res: GenerationResult) -> float | None:
    """Keys boosted per step, averaged over the steps that selected (None for methods that never do)."""
    counts = [s.n_selected for s in (res.trace.steps if res.trace else []) if s.n_selected is not None]
    return round(sum(counts) / len(counts), 2) if counts else None


def scores_of(evaluation: Evaluation, res: GenerationResult, inst, tokenizer) -> dict:
    """A result's task scores: of its text when decoded freely, of its gold tokens when forced."""
    if res.forced is None:
        return dict(evaluation.score(res.text, inst))
    return {**res.forced.summary(res.tokens), **evaluation.score_forced(res, inst, tokenizer)}


@dataclass
class EvaluationRun:
    """The records of the requested instances x methods, which of them are new, and the store."""

    records: list[dict]
    new: list[dict]
    path: Path


def open_results(
    path: str | Path,
    model: LoadedModel,
    model_name: str,
    task: str,
    methods: Mapping[str, dict],
    backend: BackendSpec | str = "bridge",
    if_differs: str = "error",
    teacher_forced: bool = False,
    order: Callable[[Mapping], Any] | None = None,
    traces_for: Iterable[str] | None = None,
    format_forced: bool = False,
) -> ResultStore:
    """The evaluation store at `path` (or a sibling with if_differs="new") for these settings;
    `methods` maps each method name to its `method_settings`. Shards a killed data-parallel run
    left beside the store are folded into it first (sorted by `order`), then checked with it.
    With `traces_for` (instance hashes), a store holding their records without traces differs."""
    settings = store_settings(model_name, task, backend, model.dtype, model.device, model.weights_id, teacher_forced,
                              format_forced=format_forced)
    instances = None if traces_for is None else list(traces_for)
    check_store_files(path, task, if_differs)

    def check(store: ResultStore) -> None:
        store.fold_shards(order)
        check_methods(store.path, store.records(), methods)
        if instances is not None:
            check_traces(store.path, store.records(), methods, instances)

    return open_store(path, KEY, settings, purpose="evaluate", if_differs=if_differs, check=check)


def evaluate(
    model: LoadedModel,
    model_name: str,
    task: str,
    instances: Iterable,
    methods: Mapping[str, DecodingConfig],
    heads: HeadSet | None,
    out: str | Path,
    *,
    keep_trace: bool = False,
    progress: bool = True,
    backend: BackendSpec | str = "bridge",
    batch_size: int = 1,
    if_differs: Literal["error", "new"] = "error",
    teacher_forced: bool = False,
    decode_attention: str | None = None,
    command: str | None = None,
    format_forced: bool = False,
) -> EvaluationRun:
    """Run every method on every instance not yet in the store at `out`.

    Records are keyed by method name and instance content, and carry the full settings; the
    store refuses other settings (if_differs="error") or moves to a sibling file ("new").
    The records of each method are stored as soon as that method has finished a batch.
    When a process group is initialised (torchrun), call it on every rank with the same
    arguments: each rank decodes its share of the missing instances, rank 0 folds the shards
    into the store, and every rank returns the same records (`dysco_interp.distributed`).

    Args:
        model: the loaded model.
        model_name: the name the store records (the alias it was loaded by).
        task: a registered task's name (`tasks.registry.TASKS`).
        instances: the task's instances (`make_dataset` or `load_dataset`).
        methods: name -> method and parameters.
        heads: the QRHeads for the DySCO methods (None when no method uses heads).
        out: the JSONL result store.
        keep_trace: store each record's per-step trace.
        progress: show a progress bar (rank 0 only, for its share, under torchrun).
        backend: a `BackendSpec`, or its name: "bridge", "sdpa" or "static".
        batch_size: instances decoded together (sdpa and static only).
        if_differs: "error" refuses a store with other settings; "new" writes to the first sibling
            store that is new or holds these settings.
        teacher_forced: feed each instance's gold answer through the method's steps and score
            the model's predictions of it (at most `max_new_tokens` gold tokens); a store holds
            either teacher-forced or free results, never both.
        format_forced: force each answer's format (its tags and template; on Path Traversal the
            means of transport too) and let the method write its content (the cities), then score
            the text with the task's free scores (`decoding.format_forced`; tasks whose spec names
            `segments`); a store holds one decoding mode. Not with `teacher_forced`.
        decode_attention: with a backend's name, the static backend's decoding attention, "sdpa"
            (fused, the default) or "float32" (bitwise repeatable on a GPU, so reruns and
            data-parallel shards give identical records); a store holds one of them.
        command: the command line that ran this, kept with the machine and start time in each
            new record's `run` (`stores.provenance`).

    Returns:
        An `EvaluationRun`: the records of the requested instances x methods, the new ones (made by
        any rank), the path.
    """
    if isinstance(out, ResultStore):
        raise ConfigError("evaluate takes the results path, not an open store: it opens the store "
                          "with the settings of this run")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    instances = list(instances)
    check_task(task, instances)
    check_modes(task, teacher_forced, format_forced)
    warn_leakage(heads, instances, methods)
    evaluation = TASKS[task].evaluation
    ids = [instance_id(inst) for inst in instances]
    wanted = {m: method_settings(c, heads) for m, c in methods.items()}
    if decode_attention is not None:
        warnings.warn("evaluate(decode_attention=) is deprecated and goes in the next release: pass "
                      "backend=BackendSpec('static', decode_attention=...)", DeprecationWarning, stacklevel=2)
    spec = BackendSpec.of(backend, decode_attention=decode_attention)
    world = current_world()
    order = grid_order(ids, methods)
    run = provenance(model.device, command)

    def key(instance_hash, method):
        return {"method": method, "instance": instance_hash}

    def open_main() -> ResultStore:
        return open_results(out, model, model_name, task, wanted, spec, if_differs, teacher_forced, order,
                            traces_for=ids if keep_trace else None, format_forced=format_forced)

    def decode_missing(todo: list[tuple[Any, str]], done: ResultStore | Shard, sink: ResultStore) -> list[dict]:
        """Decode the (instance, hash) pairs in `todo` under each method not `done` yet into `sink`."""
        shared = dict(sink.settings or {})
        new: list[dict] = []
        # one tick per (instance, method): with few instances a bar of instances would sit at 0 for the run
        with tqdm(total=len(todo) * len(methods), desc=f"{task}{note_world(world)}", unit="run",
                  disable=not progress or not world.is_main) as bar:
            for start in range(0, len(todo), batch_size):
                batch = todo[start : start + batch_size]
                pending = {m: c for m, c in methods.items() if any(key(h, m) not in done for _, h in batch)}
                bar.update(len(batch) * (len(methods) - len(pending)))  # what an earlier run stored
                names, where = list(pending), f"instances {start + 1}-{start + len(batch)}"
                if names:
                    bar.set_postfix_str(f"{names[0]}, {where}")
                # each method's records are stored as soon as it finishes, so a kill loses at most one
                for method, config, rows in decode_instances(model, evaluation, [inst for inst, _ in batch], pending,
                                                             heads, keep_trace, spec, teacher_forced,
                                                             format_forced):
                    for (inst, h), res in zip(batch, rows):
                        if key(h, method) in done:
                            continue
                        record = {
                            "model": model_name, "task": task, "length": inst.target_tokens, "method": method,
                            "index": inst.index, "id": inst.id, "instance": h,
                            "n_tokens": inst.n_tokens,
                            # forced: what greedy would write at each gold position, for reading
                            **({"output": res.text} if res.forced is None else
                               {"argmax_text": model.tokenizer.decode(res.forced.argmax)}),
                            # format-forced: the format was fed, the content the method's own
                            **({"decoding": FORMAT_FORCED, "n_chosen": sum(res.chosen)} if res.chosen is not None
                               else {}),
                            "finished": res.finished,
                            **scores_of(evaluation, res, inst, model.tokenizer),
                            "mean_selected": mean_selected(res),
                            "timings": res.timings.as_dict(),
                            # `config` is what the tables group by; `settings` is everything that made the record
                            "config": config.record_fields(),
                            # the method's own parameters by their Python names: what its run key
                            # derives from (`analysis.method_key`); `config` keeps the flat form older
                            # records have
                            "params": None if config.params is None else config.params.as_dict(),
                            "backend": spec.name,
                            "settings": {**shared, "method": wanted[method]},
                            "run": run,
                        }
                        if keep_trace and res.trace is not None:
                            record["trace"] = res.trace.to_dict()
                        if keep_trace and res.forced is not None:
                            record["forced"] = res.forced.to_dict()
                        sink.append(record)
                        new.append(record)
                    bar.update(len(batch))
                    following = names[names.index(method) + 1:]  # the methods decode in this order
                    if following:
                        bar.set_postfix_str(f"{following[0]}, {where}")
        return new

    if world.size == 1:
        with open_main() as store:
            todo = [(inst, h) for inst, h in zip(instances, ids) if any(key(h, m) not in store for m in methods)]
            new = decode_missing(todo, store, store)
            records = [store.get(key(h, m)) for h in dict.fromkeys(ids) for m in methods]
            return EvaluationRun(records, new, store.path)
    # data-parallel (see dysco_interp.distributed): this rank's share of what the store lacks, into its shard
    settings = store_settings(model_name, task, spec, model.dtype, model.device, model.weights_id, teacher_forced,
                              format_forced=format_forced)
    with sharded_store(world, open_main, lambda p: ResultStore(p, KEY, settings, purpose="evaluate"), order) as shard:
        by_hash = dict(zip(ids, instances))  # an instance listed twice is decoded once
        todo = [(by_hash[h], h) for h in dict.fromkeys(ids) if any(key(h, m) not in shard for m in methods)]
        new = decode_missing(world.share(todo), shard, shard.store)
    made = {(m, h) for rank_new in gather(world, [[r["method"], r["instance"]] for r in new]) for m, h in rank_new}
    store = ResultStore(shard.path, KEY, readonly=True)
    records = [store.get(key(h, m)) for h in dict.fromkeys(ids) for m in methods]
    return EvaluationRun(records, [r for r in records if (r["method"], r["instance"]) in made], shard.path)


def grid_order(ids: Sequence[str], methods: Iterable[str]) -> Callable[[Mapping], int]:
    """The sort key of records in the order one process writes them: instance by instance, the
    methods in the order given; records of other instances or methods last."""
    names = list(methods)
    grid = [(m, h) for h in dict.fromkeys(ids) for m in names]
    position: dict[tuple[Any, Any], int] = {item: i for i, item in enumerate(grid)}
    return lambda record: position.get((record.get("method"), record.get("instance")), len(position))

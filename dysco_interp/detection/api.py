"""The detection API: `detect`, `qrscore`, `copy_paste_score` and `detect_qr_heads`.

Resumable runs: with `store=DIR`, each finished example is appended (flushed, fsynced)
as one JSON line to DIR/<family>.jsonl, an `stores.store.ResultStore` whose header
holds the model, its weights, the scored heads and the method's parameters; a re-run skips
examples whose content is already there (never matched on ids alone); a truncated last
line (a killed run) is dropped. Nothing on disk is pickled.

Under torchrun (any initialised process group) the examples missing from the store are shared
out between the ranks, each writing a shard of the store that rank 0 folds in at the end, and
every rank gets back every example's scores through torch.distributed's object collectives
(`dysco_interp.distributed`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from dysco_interp.detection import passes
from dysco_interp.detection.examples import check_examples, describe_examples
from dysco_interp.detection.methods import (
    COPY_PASTE,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_TOP_K,
    FILTER_SIGMAS,
    NDCG_K,
    QRSCORE,
    QRSCORE_NDCG,
    resolve_method,
)
from dysco_interp.detection.passes import HooksArg
from dysco_interp.detection.result import DetectionResult, matrix_from_json, matrix_to_json
from dysco_interp.detection.scores import mean_over_examples
from dysco_interp.detection.selection import HeadsArg, qrscore_heads, requested_heads
from dysco_interp.distributed import current_world, gather, note_world, sharded_store
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet
from dysco_interp.heads.detected_on import detection_data
from dysco_interp.hooks import sliding_layers
from dysco_interp.models import dtype_name
from dysco_interp.stores.store import (
    ResultStore,
    StoreMismatchError,
    content_hash,
    differences,
    read_resumable,
    shard_paths,
)

_EXTRA_QR = {
    "query_span": "late instruction + question + assistant header (to the prompt end)",
    "calibration": 'minus the same attention with the null query "N/A"',
    "doc_filter": "per document and head: tokens below mean - 2 std zeroed, rest summed",
    "aggregate": "mean over examples",
}


def _family(method: str) -> str:
    return COPY_PASTE if method == COPY_PASTE else QRSCORE


def _params(method: str, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS) -> dict[str, Any]:
    """The method's parameters that its stored scores depend on."""
    if method == COPY_PASTE:
        return {"max_new_tokens": max_new_tokens, "needle": "gold document"}
    return {"ndcg_k": NDCG_K, "filter_sigmas": FILTER_SIGMAS}


def _store_file(store: str | os.PathLike, method: str) -> Path:
    return Path(store) / f"{_family(method)}.jsonl"


def _check_stored(path: Path, settings: dict[str, Any]) -> None:
    """StoreMismatchError when the store at `path` (or a shard a killed run left beside it) holds
    scores of other settings in the fields `settings` names; fields it does not name are not
    compared, so what needs the model can be left out before the model loads."""
    for file in (path, *shard_paths(path)):
        contents = read_resumable(file)
        if contents is None:
            continue
        if contents.purpose != "detect":
            raise StoreMismatchError(f"{file} is a {contents.purpose!r} store, not one of detection scores; "
                                     "score into another folder")
        stored = contents.settings or {}
        theirs = {k: stored[k] for k in settings if k in stored}
        if theirs != settings:
            raise StoreMismatchError(
                f"{file} holds detection scores computed with other settings "
                f"({'; '.join(differences(theirs, settings))}); score into another folder, or remove {file}"
            )


def check_store(
    store: str | os.PathLike,
    method: str = QRSCORE,
    *,
    model: str,
    dtype: str,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
) -> None:
    """Before the model loads: refuse a `store` folder for `detect(..., store=)` whose store for
    `method` is no detection store, or holds scores computed with another model name, dtype
    (as `dtype_name` writes it) or method parameters. The weights and the heads are compared
    when the model is loaded."""
    method = resolve_method(method)
    _check_stored(_store_file(store, method), {"family": _family(method), "model": model, "dtype": dtype,
                                               "params": _params(method, max_new_tokens)})


def _run(
    model,
    examples: Sequence[Any],
    method: str,
    mask: torch.Tensor,
    compute: Callable[[Any], dict[str, Any]],
    params: dict[str, Any],
    progress: bool,
    store: str | os.PathLike | None,
) -> tuple[list[torch.Tensor], list[dict[str, Any]]]:
    """Per-example score matrices for `method`, resuming from and appending to the store.

    Under torchrun (an initialised process group) each rank scores its share of the examples the
    store lacks, into its own shard (`dysco_interp.distributed`), and every rank gets every
    example's record back, so each ends with what one process would have computed.
    """
    from dysco_interp.progress import tqdm

    spec = model.spec
    key = "copy" if method == COPY_PASTE else ("ndcg" if method == QRSCORE_NDCG else "mass")
    # an example is known by its content, so data made with other options never reuses a score
    keys = {ex.id: {"example": content_hash(ex.to_dict())} for ex in examples}
    order = {keys[ex.id]["example"]: i for i, ex in enumerate(examples)}
    path = settings = None
    if store is not None:
        family = _family(method)
        settings = {
            "family": family, "model": spec.name, "weights": model.weights_id,
            "dtype": dtype_name(model.dtype), "n_layers": spec.n_layers, "n_heads": spec.n_heads,
            "scored_heads": [list(h) for h in torch.nonzero(mask).tolist()], "params": params,
        }
        path = _store_file(store, method)

    def open_store(where: Path) -> ResultStore:
        return ResultStore(where, key_fields=("example",), settings=settings, purpose="detect")

    def in_order(record: dict) -> int:
        return order.get(str(record.get("example")), len(order))

    def open_main() -> ResultStore:
        assert path is not None and settings is not None
        _check_stored(path, settings)  # with a detection store's words, before the generic check
        db = open_store(path)
        try:
            db.fold_shards(in_order)
        except BaseException:
            db.close()
            raise
        return db

    def score(todo: Sequence[Any], done: set[str], sink: ResultStore | None, total: int) -> list[dict]:
        """The records of the examples in `todo` not `done` yet, each appended to `sink` when it is made."""
        unique: dict[str, Any] = {}  # examples of the same content are scored once
        for ex in todo:
            if keys[ex.id]["example"] not in done:
                unique.setdefault(keys[ex.id]["example"], ex)
        todo = list(unique.values())
        bar = tqdm(total=total, initial=total - len(todo), desc=f"{method} {spec.name}{note_world(world)}",
                   unit="ex", disable=not progress or not world.is_main)
        made = []
        try:
            for ex in todo:
                rec = {**keys[ex.id], "id": ex.id, "n_tokens": ex.n_tokens}
                for k, v in compute(ex).items():
                    rec[k] = matrix_to_json(v, mask) if isinstance(v, torch.Tensor) else v
                if sink is not None:
                    sink.append(rec)
                made.append(rec)
                bar.update(1)
        finally:
            bar.close()
        return made

    world = current_world()
    stored: dict[str, dict] = {}
    if world.size == 1:
        db = open_main() if path is not None else None
        try:
            stored = {} if db is None else {r["example"]: r for r in db.records()}
            made = score(examples, set(stored), db, len(examples))
        finally:
            if db is not None:
                db.close()
    elif path is None:
        share = world.share(examples)
        made = [r for part in gather(world, score(share, set(), None, len(share))) for r in part]
    else:
        with sharded_store(world, open_main, open_store, in_order) as shard:
            stored = {r["example"]: r for r in shard.done.values()}
            todo = world.share([ex for ex in examples if keys[ex.id]["example"] not in stored])
            mine = score(todo, set(), shard.store, len(todo))
        made = [r for part in gather(world, mine) for r in part]
    by_hash = {**stored, **{r["example"]: r for r in made}}
    records = [by_hash[keys[ex.id]["example"]] for ex in examples]
    return [matrix_from_json(rec[key]) for rec in records], records


def qrscore(
    model,
    examples: Iterable[Any],
    *,
    method: str = QRSCORE,
    heads: HeadsArg = None,
    progress: bool = True,
    store: str | os.PathLike | None = None,
    hooks: HooksArg = None,
    chunk_size: int | None = None,
    seed: int | None = None,
    data: str | None = None,
) -> DetectionResult:
    """QRScore of every (requested, full-attention) head, mean over examples.

    method: "qrscore" (calibrated, filtered attention mass on the gold document) or
    "qrscore-ndcg" (NDCG@10 of the gold document). heads: restrict scoring (TL style).
    store: a directory for a resumable JSONL record per finished example (both methods
    share it). hooks: extra TransformerLens hooks for the query passes (a list, or a
    callable example -> list; the null-query example has `is_null_query=True`); the
    context prefill runs on the SDPA twin and sees no hooks.
    """
    method = resolve_method(method)
    if method == COPY_PASTE:
        raise ConfigError("qrscore() computes qrscore or qrscore-ndcg; use copy_paste_score() for copy-paste")
    examples = check_examples(examples)
    mask = qrscore_heads(model.spec, heads)
    per, _ = _run(
        model, examples, method, mask,
        lambda ex: passes.qrscore_one(model, ex, mask, hooks, chunk_size),
        _params(method), progress, store,
    )
    extra: dict[str, Any] = dict(_EXTRA_QR)
    if sliding_layers(model.spec):
        extra["unscored_sliding_layers"] = sliding_layers(model.spec)
    return _result(model, examples, method, mask, per, data, seed, extra)


def copy_paste_score(
    model,
    examples: Iterable[Any],
    *,
    heads: HeadsArg = None,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    progress: bool = True,
    store: str | os.PathLike | None = None,
    hooks: HooksArg = None,
    chunk_size: int | None = None,
    seed: int | None = None,
    data: str | None = None,
) -> DetectionResult:
    """Wu et al.'s retrieval score (needle = gold document), mean over examples."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    examples = check_examples(examples)
    mask = requested_heads(model.spec, heads)
    per, records = _run(
        model, examples, COPY_PASTE, mask,
        lambda ex: passes.copy_paste_one(model, ex, mask, max_new_tokens, hooks, chunk_size),
        _params(COPY_PASTE, max_new_tokens), progress, store,
    )
    extra = {
        "needle": "gold document token span",
        "decoding": f"greedy, up to {max_new_tokens} tokens",
        "aggregate": "mean over examples",
        "generated": {r["id"]: model.tokenizer.decode(r["generated"]) for r in records},
    }
    return _result(model, examples, COPY_PASTE, mask, per, data, seed, extra)


def _result(model, examples, method, mask, per, data, seed, extra) -> DetectionResult:
    spec = model.spec
    if seed is None:
        seeds = {ex.seed for ex in examples}
        seed = seeds.pop() if len(seeds) == 1 else None
    return DetectionResult(
        scores=mean_over_examples(per, mask),
        scored=mask.clone(),
        per_example=per,
        example_ids=[ex.id for ex in examples],
        method=method,
        model=spec.name,
        n_layers=spec.n_layers,
        n_heads=spec.n_heads,
        n_kv_heads=spec.n_kv_heads,
        data=data or describe_examples(examples),
        seed=seed,
        extra=extra,
        detected_on=detection_data(examples),
    )


def make_detection_data(model, n: int, length: int, seed: int = 0, progress: bool = False) -> list:
    """n needle-QA examples of about `length` tokens for the model's tokenizer."""
    from dysco_interp.tasks import make_dataset

    return make_dataset("needle_qa", model.tokenizer, target_tokens=length, n=n, seed=seed, progress=progress)


def detect(
    model,
    examples: Iterable[Any] | None = None,
    *,
    n: int | None = None,
    length: int | None = None,
    seed: int = 0,
    method: str = QRSCORE,
    heads: HeadsArg = None,
    progress: bool = True,
    store: str | os.PathLike | None = None,
    hooks: HooksArg = None,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    chunk_size: int | None = None,
) -> DetectionResult:
    """Any method on given examples, or on n generated needle-QA examples of `length` tokens."""
    method = resolve_method(method)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {seed!r}")
    if examples is None:
        if n is None or length is None:
            raise ConfigError("pass examples, or n and length to generate needle-QA detection data")
        examples = make_detection_data(model, n, length, seed, progress)
    if method == COPY_PASTE:
        return copy_paste_score(
            model, examples, heads=heads, max_new_tokens=max_new_tokens, progress=progress, store=store,
            hooks=hooks, chunk_size=chunk_size, seed=seed,
        )
    return qrscore(
        model, examples, method=method, heads=heads, progress=progress, store=store, hooks=hooks,
        chunk_size=chunk_size, seed=seed,
    )


def detect_qr_heads(
    model,
    examples: Iterable[Any] | None = None,
    *,
    n: int | None = None,
    length: int | None = None,
    seed: int = 0,
    top_k: int = DEFAULT_TOP_K,
    method: str = QRSCORE,
    command: str | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, HeadSet]:
    """Find query-focused retrieval heads (QRHeads) with QRScore.

    Args:
        model: the loaded model.
        examples: detection examples (None: synthetic needle-QA examples made from n, length, seed).
        n: how many synthetic examples to make when `examples` is None.
        length: their prompt length in tokens.
        seed: their seed.
        top_k: how many heads the returned set keeps.
        method: "qrscore", "qrscore-ndcg" or "copy-paste" (the copy-paste retrieval score).
        command: the command line recorded in the head set's provenance.
        **kwargs: passed to `detect` (heads, resume_dir, progress, ...).

    Returns:
        (scores `[n_layers, n_heads]` with -1 for heads not scored, the HeadSet of the top_k).
    """
    result = detect(model, examples, n=n, length=length, seed=seed, method=method, **kwargs)
    return result.scores, result.headset(top_k, command=command)

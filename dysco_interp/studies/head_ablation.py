"""Causal test of a head set: mean-ablate its heads' attention outputs, measure what a task loses.

The hook point is `blocks.{layer}.attn.hook_z`: on the TransformerLens 4.3 bridge it is an
alias of `blocks.{layer}.attn.o.hook_in`, the per-head attention output before W_O,
`[batch, position, n_query_heads, d_head]` (under GQA every query head has its own z).
A head's mean is a dataset mean: its z averaged over every prompt position of every prompt
of one (task, length) set of instances, from unablated passes. Mean-ablation replaces the
listed heads' z by that mean at every position, prompt and answer alike.

Scoring is teacher forced, batch 1, one pass per (instance, head set): the prompt runs through
the bridge in chunks (chunk x n scores at a time, logits of its last position only), then the
gold answer on that cache, keeping logits for the answer positions only. Unablated passes take
the same path, so a drop is never a difference between attention implementations.
- Path Traversal: per-step accuracy, every token of the city name the argmax (mode "name").
- Needle QA: the gold answer `answers[0]`, encoded after the prompt text; right when every
  answer token is the argmax; also the answer tokens' mean log-probability.

`ablation_summary` sums the records up (paired bootstrap CIs); `viz.ablation_figure` draws them.
"""

from __future__ import annotations

import base64
import json
import lzma
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dysco_interp.atomic import atomic_write_bytes
from dysco_interp.chat import encode_text
from dysco_interp.decoding import runtime
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet, load_heads
from dysco_interp.hooks import Head, Hook, act_name, head_label, head_out_of_range, layer_of
from dysco_interp.models import LoadedModel, dtype_name
from dysco_interp.progress import tqdm
from dysco_interp.stores.format import MAX_DECOMPRESSED
from dysco_interp.stores.store import ResultStore
from dysco_interp.studies.ablation_summary import BASELINE, METRICS, random_name
from dysco_interp.tasks import load_dataset, make_dataset
from dysco_interp.tasks.base import check_same_tokenizer
from dysco_interp.tasks.lengths import length_label
from dysco_interp.tasks.path_traversal import teacher_forced_inputs, teacher_forced_step_accuracy

Z_POINT = "attn.hook_z"  # = attn.o.hook_in on the bridge
MEANS_KIND = "dysco-interp/head-output-means"


def z_name(layer: int) -> str:
    """The hook point of layer `layer`'s per-head attention outputs (before W_O)."""
    return act_name(layer, Z_POINT)


# ---------------------------------------------------------------------------- head means


class HeadOutputMeans:
    """Running sum of every head's z over the positions its reader hooks see (batch 1).

    Attach `hooks()` to the prompt passes only, so the mean covers prompt positions only.
    """

    def __init__(self, n_layers: int, n_heads: int, d_head: int):
        self.sums = torch.zeros(n_layers, n_heads, d_head, dtype=torch.float64)
        self.counts = torch.zeros(n_layers, dtype=torch.long)

    @classmethod
    def for_model(cls, model: LoadedModel) -> HeadOutputMeans:
        spec = model.spec
        return cls(spec.n_layers, spec.n_heads, spec.d_head)

    def add(self, layer: int, z: torch.Tensor) -> None:
        if z.ndim != 4 or tuple(z.shape[2:]) != tuple(self.sums.shape[1:]):
            raise ValueError(f"expected z of shape [batch, pos, {self.sums.shape[1]}, {self.sums.shape[2]}], "
                             f"got {tuple(z.shape)}")
        if self.sums.device != z.device:  # sum where z lives: no device sync per layer and chunk
            self.sums = self.sums.to(z.device)
        self.sums[layer] += z.detach().double().sum(dim=(0, 1))
        self.counts[layer] += z.shape[0] * z.shape[1]

    def hooks(self) -> list[Hook]:
        def read(z: torch.Tensor, hook) -> None:
            self.add(layer_of(hook), z)

        return [(z_name(layer), read) for layer in range(self.sums.shape[0])]

    @property
    def n_positions(self) -> int:
        if not bool((self.counts == self.counts[0]).all()):
            raise ValueError(f"layers saw different numbers of positions: {self.counts.tolist()}")
        return int(self.counts[0])

    def mean(self) -> torch.Tensor:
        """float32 `[n_layers, n_heads, d_head]`."""
        if self.n_positions == 0:
            raise ValueError("no positions seen yet: run prompts with hooks() attached")
        return (self.sums / self.n_positions).float().cpu()


@torch.inference_mode()
def bridge_prefill(model: LoadedModel, ids: torch.Tensor, hooks: Iterable[Hook] = (),
                   chunk_size: int = runtime.DEFAULT_CHUNK):
    """Prompt into a cache through the bridge in chunks, with or without hooks: (cache, logits
    `[1, vocab]` of its last position). `runtime.prefill` takes the SDPA twin when there are no
    hooks; here the unablated pass must take the ablated passes' path."""
    if chunk_size < 1:
        raise ConfigError(f"chunk_size must be >= 1, got {chunk_size}")
    model.check_fits(ids.shape[1])
    cache, hooks = runtime.new_cache(model), list(hooks)
    logits = torch.empty(0)
    for start in range(0, ids.shape[1], chunk_size):
        logits = model.bridge.run_with_hooks(ids[:, start:start + chunk_size], past_key_values=cache,
                                             fwd_hooks=hooks, logits_to_keep=1)
    return cache, logits[:, -1]


@torch.inference_mode()
def head_output_means(model: LoadedModel, prompts: Iterable[Sequence[int]], chunk_size: int = runtime.DEFAULT_CHUNK,
                      progress: bool = False) -> torch.Tensor:
    """Every head's z averaged over all prompt tokens of all prompts: float32 `[L, H, d_head]`."""
    acc = HeadOutputMeans.for_model(model)
    for ids in tqdm(list(prompts), desc="head means", unit="prompt", disable=not progress):
        bridge_prefill(model, runtime.as_ids(model, ids), acc.hooks(), chunk_size)
    return acc.mean()


def mean_ablation_hooks(model: LoadedModel, heads: Iterable[Head], means: torch.Tensor) -> list[Hook]:
    """Forward hooks replacing each listed head's z by its mean at every position.

    Plain `(hook_name, fn)` pairs for `run_with_hooks` / `bridge.hooks(fwd_hooks=...)`; one hook
    per layer that holds a listed head. No heads, no hooks.
    """
    spec = model.spec
    if tuple(means.shape) != (spec.n_layers, spec.n_heads, spec.d_head):
        raise ConfigError(f"means have shape {tuple(means.shape)}; the model needs "
                          f"[{spec.n_layers}, {spec.n_heads}, {spec.d_head}]")
    by_layer: dict[int, list[int]] = {}
    for layer, head in heads:
        if head_out_of_range((layer, head), spec.n_layers, spec.n_heads):
            raise ConfigError(f"head {head_label(layer, head)} is outside the model's "
                              f"{spec.n_layers} layers x {spec.n_heads} heads")
        by_layer.setdefault(layer, []).append(head)
    hooks = []
    for layer, idx in sorted(by_layer.items()):
        mask = torch.zeros(spec.n_heads, 1, dtype=torch.bool, device=model.device)
        mask[idx] = True
        layer_means = means[layer].to(model.device)

        def ablate(z: torch.Tensor, hook, mask=mask, layer_means=layer_means) -> torch.Tensor:
            return torch.where(mask, layer_means.to(z.dtype), z)

        hooks.append((z_name(layer), ablate))
    return hooks


# ---------------------------------------------------------------------------- teacher-forced scoring


@torch.inference_mode()
def answer_logits(model: LoadedModel, input_ids: Sequence[int], prompt_len: int, hooks: Iterable[Hook] = (),
                  prompt_hooks: Iterable[Hook] = (), chunk_size: int = runtime.DEFAULT_CHUNK) -> torch.Tensor:
    """float32 logits `[len - prompt_len, vocab]` of the positions predicting the answer tokens
    (`prompt_len - 1` to `len - 2`), under `hooks`; `prompt_hooks` see the prompt pass only."""
    ids = runtime.as_ids(model, input_ids)
    if not 0 < prompt_len < ids.shape[1]:
        raise ConfigError(f"prompt_len must leave an answer: {prompt_len} of {ids.shape[1]} tokens")
    model.check_fits(ids.shape[1])
    hooks = list(hooks)
    cache, last = bridge_prefill(model, ids[:, :prompt_len], [*hooks, *prompt_hooks], chunk_size)
    parts = [last.float()]
    if ids.shape[1] - prompt_len > 1:  # the last answer token predicts nothing scored
        tail = model.bridge.run_with_hooks(ids[:, prompt_len:-1], past_key_values=cache, fwd_hooks=hooks,
                                           logits_to_keep=0)
        parts.append(tail[0].float())
    return torch.cat(parts)


def needle_qa_inputs(example, tokenizer) -> tuple[list[int], int]:
    """(prompt ids + ids of the gold answer `answers[0]`, prompt length)."""
    if not getattr(example, "answers", None):
        raise ConfigError(f"needle-QA example {example.id!r} has no gold answer")
    prompt_ids, _ = encode_text(tokenizer, example.prompt_text)
    check_same_tokenizer(example, len(prompt_ids))
    answer_ids, _ = encode_text(tokenizer, example.answers[0])
    return prompt_ids + answer_ids, len(prompt_ids)


def score_instance(model: LoadedModel, instance, hooks: Iterable[Hook] = (), prompt_hooks: Iterable[Hook] = (),
                   chunk_size: int = runtime.DEFAULT_CHUNK) -> dict[str, Any]:
    """Teacher-forced metrics of one Path Traversal or needle-QA instance under `hooks`:
    {"accuracy": ..., ["logprob": ...], "detail": {...}}."""
    tok = model.tokenizer
    if instance.task == "path_traversal":
        inputs = teacher_forced_inputs(instance, tok)
        logits = answer_logits(model, inputs.input_ids, inputs.prompt_len, hooks, prompt_hooks, chunk_size)
        predicted = [-1] * (inputs.prompt_len - 1) + logits.argmax(-1).tolist() + [-1]
        score = teacher_forced_step_accuracy(predicted, inputs, "name")
        return {"accuracy": score.accuracy, "detail": {"correct": [bool(c) for c in score.correct]}}
    if instance.task == "needle_qa":
        ids, n_prompt = needle_qa_inputs(instance, tok)
        logits = answer_logits(model, ids, n_prompt, hooks, prompt_hooks, chunk_size)
        gold = torch.tensor(ids[n_prompt:], device=logits.device)
        logprobs = logits.log_softmax(-1).gather(1, gold[:, None])[:, 0]
        hits = (logits.argmax(-1) == gold).tolist()
        return {"accuracy": float(all(hits)), "logprob": float(logprobs.mean()),
                "detail": {"answer_tokens": len(hits), "token_correct": [bool(h) for h in hits]}}
    raise ConfigError(f"no ablation scorer for task {instance.task!r}; use path_traversal or needle_qa")


# ---------------------------------------------------------------------------- the study


def instance_set(tokenizer, task: str, length: int, n: int, seed: int, data_dir: str | None) -> list:
    """Instances 0..n-1 of one task, length and seed: read DATA_DIR/<task>_<length>.jsonl, or generated."""
    if data_dir is None:
        return make_dataset(task, tokenizer, length, n=n, seed=seed, progress=True)
    path = Path(data_dir) / f"{task}_{length_label(length)}.jsonl"
    if not path.exists():
        raise ConfigError(f"no {path}; make it with `dysco-interp make-data {task} --lengths {length_label(length)} "
                          f"--n {n} --seed {seed} --out {data_dir}`")
    by_index = {x.index: x for x in load_dataset(path) if x.target_tokens == length and x.seed == seed}
    missing = [i for i in range(n) if i not in by_index]
    if missing:
        raise ConfigError(f"{path}: no {length}-token instances with seed {seed} and index {missing[:5]}")
    return [by_index[i] for i in range(n)]


def study_instances(tokenizer, tasks: Sequence[str], lengths: Sequence[int], n: int, seeds: Mapping[str, int],
                    data_dir: str | None) -> dict[str, list]:
    """{task: instances 0..n-1 of every length}, with each task's data seed."""
    return {t: [x for length in lengths for x in instance_set(tokenizer, t, length, n, seeds[t], data_dir)]
            for t in tasks}


def report_head_set(model: LoadedModel, source: str | Path, method: str = "copy-paste") -> HeadSet:
    """A head set from a detection report (`figures/heads/<model>_report.json`, its
    "copy_paste" heads) or any head file `load_heads` reads."""
    path = Path(source)
    obj = json.loads(path.read_text(encoding="utf-8")) if path.suffix == ".json" and path.is_file() else None
    if not (isinstance(obj, dict) and "copy_paste" in obj and "geometry" in obj):
        return load_heads(source, spec=model.spec)
    spec = model.spec
    if obj.get("model") != spec.name:
        raise ConfigError(f"{path} reports on {obj.get('model')!r}, not {spec.name!r}")
    return HeadSet(load_heads(",".join(obj["copy_paste"]["heads"]), spec=spec).heads, model=spec.name,
                   n_layers=spec.n_layers, n_heads=spec.n_heads, n_kv_heads=spec.n_kv_heads, method=method,
                   data=f"{path.name}: copy_paste.heads")


def copy_paste_heads(model: LoadedModel, source: str, report_dir: str | Path) -> HeadSet | None:
    """The copy-paste comparison set: "report" (REPORT_DIR/<model>_report.json, written by
    analyses/ship_heads.py), "detect" (the copy-paste score's top 16 on 32 needle-QA examples of
    2K tokens, seed 0, as the reports were made), "none", or a report or head file."""
    if source == "none":
        return None
    if source == "detect":
        from dysco_interp.detection import detect_qr_heads

        return detect_qr_heads(model, n=32, length=2048, seed=0, top_k=16, method="copy-paste")[1]
    path = Path(report_dir) / f"{model.spec.name}_report.json" if source == "report" else Path(source)
    if source == "report" and not path.is_file():
        raise ConfigError(f"no detection report {path}; pass a head file, 'detect' or 'none'")
    return report_head_set(model, path if source == "report" else source)


def study_head_sets(qrheads: HeadSet, randoms: Sequence[HeadSet], copy_paste: HeadSet | None) -> dict[str, HeadSet]:
    """The study's named sets: "qrheads", "random#<seed>" per draw, "copy_paste"."""
    sets = {"qrheads": qrheads, **{random_name(r.seed if r.seed is not None else i): r for i, r in enumerate(randoms)}}
    return sets if copy_paste is None else {**sets, "copy_paste": copy_paste}


def store_settings(model: LoadedModel, model_name: str, head_sets: Mapping[str, Iterable[Head]],
                   chunk_size: int = runtime.DEFAULT_CHUNK) -> dict:
    """What every record of a store shares; reopening it with other settings is an error (the
    chunk size moves logits by float rounding: one run, one chunk size)."""
    return {"analysis": "causal_ablation", "model": model_name, "dtype": dtype_name(model.dtype),
            "chunk_size": chunk_size,
            "hook": f"blocks.L.{Z_POINT} (per-head z before W_O)",
            "ablation": "z := mean of z over every prompt position of the (task, length) instances, at every position",
            "metrics": METRICS, "head_sets": {k: [head_label(*h) for h in v] for k, v in head_sets.items()}}


def means_path(means_dir: str | Path, task: str, length: int) -> Path:
    """Where a (task, length) group's head means are kept: xz-compressed JSON, since the float32
    base64 of a committed study's means compresses by a quarter."""
    return Path(means_dir) / f"{task}_{length_label(length)}.json.xz"


def write_means(path: Path, means: torch.Tensor, meta: dict) -> None:
    data = base64.b64encode(means.float().cpu().numpy().astype("<f4").tobytes()).decode("ascii")
    text = json.dumps({"kind": MEANS_KIND, **meta, "shape": list(means.shape), "float32_b64": data})
    atomic_write_bytes(path, lzma.compress(text.encode("utf-8"), preset=9 | lzma.PRESET_EXTREME))


def read_means(path: Path, meta: dict) -> torch.Tensor | None:
    """The means stored at `path` for these instances (or, where only that is there, in the plain
    `.json` that earlier runs wrote beside it); None when there is neither."""
    if not path.is_file() and path.suffix == ".xz" and path.with_suffix("").is_file():
        path = path.with_suffix("")
    if not path.is_file():
        return None
    raw = path.read_bytes()
    if path.suffix == ".xz":
        unpack = lzma.LZMADecompressor()
        try:
            raw = unpack.decompress(raw, max_length=MAX_DECOMPRESSED)  # never a bomb's gigabytes
        except lzma.LZMAError as e:
            raise ConfigError(f"{path} is no xz archive of head means ({e})") from None
        if not unpack.eof:
            raise ConfigError(f"{path} is truncated or expands past {MAX_DECOMPRESSED >> 30} GiB: not head means")
    obj = json.loads(raw)
    if obj.get("kind") != MEANS_KIND or any(obj.get(k) != v for k, v in meta.items()):
        raise ConfigError(f"{path} holds head means of other instances or settings; use another output folder")
    arr = np.frombuffer(base64.b64decode(obj["float32_b64"]), dtype="<f4").reshape(obj["shape"])
    return torch.from_numpy(arr.copy())


def _record(model_name: str, model: LoadedModel, inst, name: str, heads: list[str], metrics: dict,
            baseline: dict | None) -> dict:
    r = {"model": model_name, "task": inst.task, "length": inst.target_tokens, "seed": inst.seed,
         "index": inst.index, "id": inst.id, "n_tokens": inst.n_tokens, "head_set": name, "heads": heads,
         "dtype": dtype_name(model.dtype), "device": model.device.type,
         "metrics": {k: v for k, v in metrics.items() if k != "detail"}, "detail": metrics["detail"]}
    if baseline is not None:
        r["baseline"] = baseline["metrics"]
    return r


def ablation_study(model: LoadedModel, instances_by_task: Mapping[str, Sequence[Any]],
                   head_sets: Mapping[str, Iterable[Head]], *, model_name: str | None = None,
                   store: ResultStore | None = None, means_dir: str | Path | None = None,
                   chunk_size: int = runtime.DEFAULT_CHUNK, progress: bool = True,
                   on_record: Callable[[dict], None] | None = None) -> list[dict]:
    """One record per (instance, head set), plus the unablated one per instance (head_set "none").

    Instances are grouped by (task, length); each group's head means come from its own
    unablated passes (which also give the baseline records), so a group's means are ready
    before its first ablated pass. With `store`, finished records are skipped and new ones
    appended; with `means_dir`, each group's means are written there once complete and read
    back on a resumed run. Every ablated record carries its instance's unablated metrics.
    """
    name = model_name or model.spec.name
    sets: dict[str, list[Head]] = {k: [(int(a), int(b)) for a, b in v] for k, v in head_sets.items()}
    if BASELINE in sets:
        raise ConfigError(f"{BASELINE!r} names the unablated pass; rename that head set")
    groups: dict[tuple[str, int], list] = {}
    for task, insts in instances_by_task.items():
        for inst in insts:
            if inst.task != task:
                raise ConfigError(f"instance {inst.id!r} is a {inst.task} instance, listed under {task}")
            groups.setdefault((task, inst.target_tokens), []).append(inst)
    done: dict[tuple, dict] = {}
    if store is not None:
        done = {store.key(r): r for r in store.records()}
    out: list[dict] = []

    def keep(record: dict) -> dict:
        if store is not None and record not in store:
            store.append(record)
        if on_record is not None:
            on_record(record)
        out.append(record)
        return record

    def stored(inst, set_name: str) -> dict | None:
        probe = {"model": name, "task": inst.task, "length": inst.target_tokens, "seed": inst.seed,
                 "index": inst.index, "head_set": set_name}
        return done.get(store.key(probe)) if store is not None else None

    total = sum(len(g) for g in groups.values()) * (1 + len(sets))
    with tqdm(total=total, desc=f"ablations {name}", unit="pass", disable=not progress) as bar:
        for (task, length), insts in groups.items():
            bar.set_postfix(task=task, length=length)
            meta = {"model": name, "task": task, "length": length, "dtype": dtype_name(model.dtype),
                    "instances": [x.id for x in insts]}
            path = means_path(means_dir, task, length) if means_dir is not None else None
            means = read_means(path, meta) if path is not None else None
            base: dict[str, dict] = {}
            acc = HeadOutputMeans.for_model(model)
            for inst in insts:  # unablated passes: baselines and, unless stored, the means
                old = stored(inst, BASELINE)
                if old is None or means is None:
                    hooks = acc.hooks() if means is None else []
                    metrics = score_instance(model, inst, prompt_hooks=hooks, chunk_size=chunk_size)
                    old = old or _record(name, model, inst, BASELINE, [], metrics, None)
                base[inst.id] = keep(old)
                bar.update(1)
            if means is None:
                means = acc.mean()
                if path is not None:
                    write_means(path, means, {**meta, "n_positions": acc.n_positions})
            for inst in insts:
                for set_name, heads in sets.items():
                    record = stored(inst, set_name)
                    if record is None:
                        metrics = score_instance(model, inst, mean_ablation_hooks(model, heads, means),
                                                 chunk_size=chunk_size)
                        record = _record(name, model, inst, set_name, [head_label(*h) for h in heads], metrics,
                                         base[inst.id])
                    keep(record)
                    bar.update(1)
    return out

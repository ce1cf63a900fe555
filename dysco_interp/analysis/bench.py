"""Decode speed and memory: DySCO against vanilla on the same backend, in one process.

For each context length: prefill once, then time single decode steps of each method from
copies of that cache, one method's steps back to back after its warm-up steps (a block takes
about a second at most, so the clock drifts little between blocks); report medians, tokens
per second, their ratio, and on a GPU the peak memory of each method's steps. The layer
floor of DySCO over vanilla is 1 + (L* + 1) / L (the partial pass runs layers 0..L*); on a
GPU the bandwidth floor of one step is (weight bytes + KV bytes) / measured copy bandwidth,
and DySCO's is that times its layer floor. With a batch of B random sequences, tokens per
second count the tokens of all rows. On a GPU two prefills of up to two chunks run before the
timed one (`warm_up_prefill_s`), so that the timed prefill runs the pieces it compiles at a
process's second prefill, compiled and warm.

Decoding is driven in one place only, `bench_decoder.BenchDecoder`: everything else here times, counts
bytes and writes rows.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import statistics
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import transformers
from torch.profiler import ProfilerActivity, profile, record_function
from transformers import AutoModelForCausalLM

from dysco_interp.analysis.bench_decoder import METHODS, BenchDecoder, Step, StepsAhead, waited
from dysco_interp.analysis.step_timeline import STEP_LABEL, profiled_timeline
from dysco_interp.atomic import atomic_open
from dysco_interp.decoding.backends import BackendSpec
from dysco_interp.decoding.backends.static import CUDA_PREFILL_CHUNK
from dysco_interp.decoding.config import DecodingConfig
from dysco_interp.decoding.methods import flat_name
from dysco_interp.decoding.plan import Read
from dysco_interp.decoding.prompts import PromptBatch, pad_id, prepare_prompt
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet, paper_heads, resolve_heads
from dysco_interp.models import LoadedModel, dtype_name, from_hf, with_yarn
from dysco_interp.models.placement import Placement, materialize
from dysco_interp.models.tiny import tiny_config, tiny_tokenizer
from dysco_interp.models.yarn import yarn_factor

# Qwen3-8B's shape (config.json of Qwen/Qwen3-8B); weights are random, speed does not depend on them.
GEOMETRIES: dict[str, dict[str, Any]] = {
    "qwen3-8b": dict(style="qwen3", vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                     num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                     max_position_embeddings=131072, rope_theta=1000000.0, tie_word_embeddings=False,
                     initializer_range=0.02, layer_types=["full_attention"] * 36, max_window_layers=36),
    # Qwen3-32B's shape (config.json of Qwen/Qwen3-32B): about 61 GiB of bf16 weights, two H100s at 128K
    "qwen3-32b": dict(style="qwen3", vocab_size=151936, hidden_size=5120, intermediate_size=25600,
                      num_hidden_layers=64, num_attention_heads=64, num_key_value_heads=8, head_dim=128,
                      max_position_embeddings=40960, rope_theta=1000000.0, tie_word_embeddings=False,
                      initializer_range=0.02, layer_types=["full_attention"] * 64, max_window_layers=64),
}
def random_model(geometry: str, device: torch.device, dtype: torch.dtype, yarn_factor: float | None = None,
                 devices: Sequence[torch.device] | None = None) -> LoadedModel:
    """A LoadedModel of a real model's shape with random weights, built on the device, or with
    `devices` split over them by layers, each layer made on its own device (with `yarn_factor`,
    its rope scaled by YaRN, as the paper runs Qwen3 past 32K)."""
    shape = dict(GEOMETRIES[geometry])
    style, vocab = shape.pop("style"), shape.pop("vocab_size")
    config = with_yarn(tiny_config(style, vocab_size=vocab, **shape), yarn_factor)
    placement = None if devices is None else Placement.even(devices, config.num_hidden_layers)
    with torch.device("meta" if placement else device):
        hf = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=dtype)
    if placement:
        materialize(hf, placement)
    return from_hf(hf, tiny_tokenizer(style), f"{geometry}-random", placement=placement)


def bench_heads(model: LoadedModel, model_name: str, source: str, geometry: str | None) -> HeadSet:
    """The QRHeads to time: 'shipped', 'paper' or a head file. 'paper' is the paper's Qwen3-8B
    list; on the Qwen3-32B shape, which has no published list, the same heads at the same
    relative depth (what a step costs depends on the deepest QRHead layer and the head count)."""
    if source == "paper":
        eight = paper_heads("qwen3-8b")
        if geometry == "qwen3-32b":
            s = model.spec
            assert eight.n_layers and eight.n_heads  # the recorded list names its model's geometry
            depth = (s.n_layers - 1) / (eight.n_layers - 1)
            width = s.n_heads // eight.n_heads
            return HeadSet([(round(layer * depth), head * width) for layer, head in eight.heads], model=s.name,
                           n_layers=s.n_layers, n_heads=s.n_heads, n_kv_heads=s.n_kv_heads)
        if geometry != "qwen3-8b":
            raise ConfigError("--heads paper is the Qwen3-8B list: use it with --random-geometry qwen3-8b or qwen3-32b")
        # the random model has the list's shape; naming it keeps the decode loop's model check honest
        return dataclasses.replace(eight.validate_for(model.spec, allow_other_model=True), model=model.spec.name)
    return resolve_heads(model, source)


def layer_floor(model: LoadedModel, heads: HeadSet, method: str) -> float:
    """DySCO's lowest possible cost over vanilla in layers run: the reuse variant has no second pass."""
    return 1 + (heads.max_layer + 1) / model.spec.n_layers if method == "dysco" else 1.0


# ---------------------------------------------------------------------------- memory and bandwidth


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def model_devices(model: LoadedModel) -> list[torch.device]:
    """Every device the model runs on, the first one first."""
    return list(dict.fromkeys(model.layout.devices))


def sync_all(devices: Sequence[torch.device]) -> None:
    for device in devices:
        sync(device)


def copy_bandwidth(device: torch.device | Sequence[torch.device], n_bytes: int = 1 << 30) -> float | None:
    """Device memory bandwidth in bytes/s from a large copy (read + write), median of 5; the
    mean over several devices."""
    if not isinstance(device, torch.device):
        each = [copy_bandwidth(d, n_bytes) for d in device]
        known = [b for b in each if b is not None]
        return statistics.mean(known) if known and len(known) == len(each) else None
    if device.type != "cuda":
        return None
    a = torch.empty(n_bytes // 2, dtype=torch.bfloat16, device=device)
    b = torch.empty_like(a)
    times = []
    for _ in range(6):
        sync(device)
        t0 = time.perf_counter()
        b.copy_(a)
        sync(device)
        times.append(time.perf_counter() - t0)
    return 2 * n_bytes / statistics.median(times[1:])


# The bandwidth floor's bandwidth per card: one fixed number, the median copy bandwidth measured on
# that card (the H100's 2,960 GB/s; the H200's 4,136 GB/s, the median of the ten committed H200
# benchmarks), so a run's own probe, which moves by up to 6% between runs, never moves the target. A
# card not listed falls back to its run's probe.
FLOOR_BANDWIDTH = {"NVIDIA H100 80GB HBM3": 2960e9, "NVIDIA H200": 4136e9}
FIXED_FLOOR, PROBED_FLOOR = "fixed for the card (its median measured copy bandwidth)", "this run's copy probe"


def floor_bandwidth(devices: Sequence[torch.device], probed: float | None) -> tuple[float | None, str | None]:
    """The bandwidth (bytes/s) the floor divides by on `devices`, and where it comes from: the
    card's fixed number (`FLOOR_BANDWIDTH`) where every device is that card, else `probed`."""
    names = {torch.cuda.get_device_name(d) if d.type == "cuda" else d.type for d in devices}
    fixed = FLOOR_BANDWIDTH.get(names.pop()) if len(names) == 1 else None
    if fixed is not None:
        return fixed, FIXED_FLOOR
    return probed, (PROBED_FLOOR if probed else None)


def kv_bytes(model: LoadedModel, n_tokens: int) -> int:
    """Bytes of keys and values that n_tokens occupy: what one decoding step must read."""
    s = model.spec
    return 2 * s.n_layers * s.n_kv_heads * s.d_head * n_tokens * model.prefill_model.dtype.itemsize


def tensors_bytes_by_device(tensors) -> dict[torch.device, int]:
    out: dict[torch.device, int] = {}
    for t in tensors:
        out[t.device] = out.get(t.device, 0) + t.numel() * t.element_size()
    return out


def allocated_kv_bytes(cache) -> dict[torch.device, int]:
    """What the cache holds in memory on each device (fixed-capacity buffers include their empty slots)."""
    if hasattr(cache, "buffers"):
        return tensors_bytes_by_device(t for pair in cache.buffers if pair is not None for t in pair)
    return tensors_bytes_by_device(t for layer in cache.layers for t in (layer.keys, layer.values))


def weight_bytes(model: LoadedModel) -> int:
    return sum(tensors_bytes_by_device(model.prefill_model.parameters()).values())


def memory_kept_by(fn: Step, token: torch.Tensor, devices: Sequence[torch.device]) -> dict[torch.device, int]:
    """Device memory a step leaves reserved on each device (e.g. the pools of the CUDA graphs
    it captures); the allocator's free cached blocks are released before and after, so only
    what is held counts."""
    sync_all(devices)
    torch.cuda.empty_cache()
    before = {d: torch.cuda.memory_reserved(d) for d in devices}
    fn(token)
    sync_all(devices)
    torch.cuda.empty_cache()
    return {d: max(torch.cuda.memory_reserved(d) - before[d], 0) for d in devices}


def memory_fields(weights: int, kv: int, prefill_peak: int, allocated: int, kept: dict[str, int],
                  extra: dict[str, int]) -> dict:
    """One device's memory in GiB. Each method's peak alone is weights + one KV cache + what its
    first step kept (CUDA-graph pools) + its decoding step's transient peak (both methods'
    caches live together in the benchmark, so the allocator's total is not it)."""
    gib = 2**30
    row = {"kv_allocated_gib": round(kv / gib, 3), "prefill_peak_gib": round((prefill_peak + weights) / gib, 3),
           "allocated_gib": round(allocated / gib, 3)}
    for m in METHODS:
        row[f"{m}_first_step_kept_gib"] = round(kept[m] / gib, 3)
        row[f"{m}_step_extra_peak_gib"] = round(extra[m] / gib, 3)
    for m in METHODS:
        row[f"{m}_peak_mem_gib"] = round((weights + kv + kept[m] + extra[m]) / gib, 3)
    return row


def profile_step(fn: Step, token: torch.Tensor, path: str) -> None:
    """Where one more step's time goes: torch.profiler's operator table, by device time, at
    `path`, and on a GPU the step's timeline (`step_timeline`) as JSON beside it."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if token.is_cuda else [])
    sync(token.device)
    with profile(activities=activities) as prof:
        with record_function(STEP_LABEL):
            fn(token)
            sync(token.device)
    key = "self_cuda_time_total" if token.is_cuda else "self_cpu_time_total"
    with atomic_open(path) as f:
        f.write(prof.key_averages().table(sort_by=key, row_limit=40))
    timeline = profiled_timeline(prof.events()) if token.is_cuda else None
    if timeline is not None:
        with atomic_open(Path(path).with_suffix(".json")) as f:
            f.write(json.dumps(timeline, indent=1) + "\n")


# ---------------------------------------------------------------------------- one context length


def bench_ids(model: LoadedModel, n_context: int, n_steps: int, n_warmup: int, batch: int = 1) -> torch.Tensor:
    """The random context and the tokens fed after it, `[batch, n_context + n_warmup + n_steps + 1]`,
    fixed by the context length (the peer is fed the same)."""
    gen = torch.Generator().manual_seed(n_context)
    return torch.randint(10, min(len(model.tokenizer), 30000), (batch, n_context + n_steps + n_warmup + 1),
                         generator=gen)


def task_prompts(model: LoadedModel, task: str, n_context: int, batch: int = 1) -> PromptBatch:
    """`batch` copies of one instance of `task` made for about `n_context` tokens with the model's
    tokenizer (seed 0, the first instance): a context with text, for the methods that find spans in
    the prompt (InstABoost, PASTA, QR-PASTA). Its length is the instance's, within the task's
    tolerance of `n_context`."""
    from dysco_interp.tasks.registry import get_task

    spec = get_task(task)
    prompt = spec.evaluation.prompt(spec.generate(model.tokenizer, n_context, seed=0, index=0))
    return PromptBatch.of([prepare_prompt(model, prompt)] * batch, pad_id(model))


def bench_context(model: LoadedModel, heads: HeadSet, config: DecodingConfig, backend: BackendSpec | str,
                  n_context: int, n_steps: int, n_warmup: int, profile_dir: str | None = None, batch: int = 1,
                  extra: dict[str, tuple[DecodingConfig, Read | None]] | None = None,
                  versus: BackendSpec | str | None = None, prompts: PromptBatch | None = None) -> dict:
    """One row: both methods' median step time, tokens/s, their ratio and (on a GPU) memory:
    for a model split over GPUs, each GPU's in `per_device`, the fullest GPU's at the top. The
    context is random ids of `n_context` tokens, or `prompts` (`task_prompts`): then the row's
    context is their length; the tokens fed after it are random either way."""
    device = model.device
    devices = model_devices(model)
    cuda = device.type == "cuda"
    ids = bench_ids(model, n_context, n_steps, n_warmup, batch)
    if prompts is not None:
        ids = torch.cat([prompts.ids, ids[:, n_context:]], dim=1)
        n_context = prompts.width
    decoder = BenchDecoder(model, heads, config, backend, extra, versus)
    warm_prefill_s = []
    if cuda:  # prefill compiles its pieces at a process's second prefill of a batch size: not in the timed one
        for _ in range(2):
            t0 = time.perf_counter()
            decoder.prefill(ids[:, :min(n_context, 2 * CUDA_PREFILL_CHUNK)], reserve=0)
            sync_all(devices)
            warm_prefill_s.append(round(time.perf_counter() - t0, 3))
        torch.cuda.empty_cache()
        for d in devices:
            torch.cuda.reset_peak_memory_stats(d)
        before = {d: torch.cuda.memory_allocated(d) for d in devices}
    t0 = time.perf_counter()
    # the steps timed one by one and run ahead, and on a GPU the untimed first step measuring
    # memory; the profiled step
    steps_each = n_warmup + 2 * n_steps + int(cuda) + int(bool(profile_dir))
    prefix = decoder.prefill(ids[:, :n_context], reserve=decoder.grows_by(steps_each))
    sync_all(devices)
    prefill_s = time.perf_counter() - t0
    if cuda:
        prefill_peak = {d: torch.cuda.max_memory_allocated(d) - before[d] for d in devices}
        # the prefill's freed blocks go back to the device before vanilla's copy of the cache is
        # made: at batch 4 and 100K the two caches fill an 8B model's card, and the copy's blocks
        # may not fit the prefill's cached ones
        torch.cuda.empty_cache()
    queues = decoder.steps(ids[:, :n_context] if prompts is None else prompts, prefix, steps_each)
    steps = {m: waited(q) for m, q in queues.items()}
    times: dict[str, list[float]] = {m: [] for m in steps}
    ahead_ms: dict[str, float] = {}
    peaks = {m: dict.fromkeys(devices, 0) for m in steps}
    kept = {m: dict.fromkeys(devices, 0) for m in steps}
    # the run ahead's tokens on the device before it starts: a token copied from the host would wait for the device
    fed = ids[:, n_context + n_warmup:n_context + n_warmup + n_steps].T.contiguous().to(device)
    # each method's steps back to back, as decoding runs them: a method that prepares a step's
    # selection in the step before (dysco-lagged) finds it prepared for the keys it has, which
    # the other methods' steps on the shared context would otherwise have moved
    for method, fn in steps.items():
        for i in range(n_warmup + n_steps):
            tok = ids[:, n_context + i].to(device)
            if cuda and i == 0:  # one more untimed step, measuring what it keeps
                kept[method] = memory_kept_by(fn, tok, devices)
            if cuda:
                for d in devices:
                    torch.cuda.reset_peak_memory_stats(d)
                base = {d: torch.cuda.memory_allocated(d) for d in devices}
            sync_all(devices)
            t0 = time.perf_counter()
            fn(tok)
            sync_all(devices)
            if i >= n_warmup:
                times[method].append(time.perf_counter() - t0)
                if cuda:
                    for d in devices:
                        peaks[method][d] = max(peaks[method][d], torch.cuda.max_memory_allocated(d) - base[d])
        # the same number of steps, each queued before the last one's token and records are read
        ahead = StepsAhead(queues[method])
        sync_all(devices)
        t0 = time.perf_counter()
        for tok in fed:
            ahead(tok)
        ahead.flush()
        sync_all(devices)
        ahead_ms[method] = (time.perf_counter() - t0) / n_steps * 1e3
        if profile_dir:
            step = n_warmup + n_steps
            profile_step(fn, ids[:, n_context + step].to(device), f"{profile_dir}/{n_context}_{method}.txt")
    v, d = statistics.median(times["vanilla"]), statistics.median(times["dysco"])
    row = {
        "context": n_context,
        "batch_size": batch,
        "steps": n_steps,
        "prefill_s": round(prefill_s, 3),
        "warm_up_prefill_s": warm_prefill_s,  # two prefills of up to two chunks before it (GPU only)
        "vanilla_step_ms": round(v * 1e3, 3),
        "dysco_step_ms": round(d * 1e3, 3),
        "vanilla_tok_per_s": round(batch / v, 3),  # tokens of all rows together
        "dysco_tok_per_s": round(batch / d, 3),
        "ratio": round(d / v, 4),
        "vanilla_step_ms_iqr": [round(x * 1e3, 3) for x in statistics.quantiles(times["vanilla"], n=4)[::2]],
        "dysco_step_ms_iqr": [round(x * 1e3, 3) for x in statistics.quantiles(times["dysco"], n=4)[::2]],
        # the mean step of `steps` steps run ahead (`StepsAhead`), as the decode loop runs them on a GPU
        "vanilla_ahead_step_ms": round(ahead_ms["vanilla"], 3),
        "dysco_ahead_step_ms": round(ahead_ms["dysco"], 3),
        "ahead_ratio": round(ahead_ms["dysco"] / ahead_ms["vanilla"], 4),
    }
    for name in decoder.timed:
        e = statistics.median(times[name])
        row.update({f"{name}_step_ms": round(e * 1e3, 3), f"{name}_tok_per_s": round(batch / e, 3),
                    f"{name}_over_dysco": round(e / d, 4), f"{name}_ahead_step_ms": round(ahead_ms[name], 3),
                    f"{name}_ahead_over_vanilla": round(ahead_ms[name] / ahead_ms["vanilla"], 4)})
        if cuda:
            row[f"{name}_peak_step_gib"] = round(max(peaks[name].values()) / 2**30, 4)
            row["dysco_peak_step_gib"] = round(max(peaks["dysco"].values()) / 2**30, 4)
    if cuda:
        weights = tensors_bytes_by_device(model.prefill_model.parameters())
        kv = allocated_kv_bytes(prefix.cache)
        per_device = [{"device": str(dev), **memory_fields(
            weights.get(dev, 0), kv.get(dev, 0), prefill_peak[dev], torch.cuda.memory_allocated(dev),
            {m: kept[m][dev] for m in METHODS}, {m: peaks[m][dev] for m in METHODS})} for dev in devices]
        row["kv_cache_gib"] = round(batch * kv_bytes(model, n_context) / 2**30, 3)
        if len(per_device) == 1:
            row.update({k: v for k, v in per_device[0].items() if k != "device"})
        else:
            fullest = max(per_device, key=lambda r: r["dysco_peak_mem_gib"])
            row.update({k: v for k, v in fullest.items() if k != "device"}, fullest_device=fullest["device"],
                       per_device=per_device)
    return row


# ---------------------------------------------------------------------------- every context length


def bench_rows(model: LoadedModel, heads: HeadSet, config: DecodingConfig, backend: BackendSpec | str,
               contexts: list[int], n_steps: int, n_warmup: int, bandwidth: float | None,
               profile_dir: str | None = None, batch: int = 1,
               extra: dict[str, tuple[DecodingConfig, Read | None]] | None = None,
               versus: BackendSpec | str | None = None, task: str | None = None) -> Iterator[dict]:
    """`bench_context` for each context length, with the layer floor and, given the bandwidth a
    floor divides by (`floor_bandwidth`), the bandwidth floor; the context an instance of `task`
    (`task_prompts`) instead of random ids when one is named."""
    floor = layer_floor(model, heads, config.method)
    n_weight_bytes = weight_bytes(model)
    for n in contexts:
        prompts = None if task is None else task_prompts(model, task, n, batch)
        row = bench_context(model, heads, config, backend, n, n_steps, n_warmup, profile_dir, batch, extra, versus,
                            prompts)
        if task is not None:
            row["task_context"] = task
        row["ratio_over_layer_floor"] = round(row["ratio"] / floor, 4)
        if bandwidth:
            step_bytes = n_weight_bytes + row["kv_cache_gib"] * 2**30
            row["bandwidth_floor_ms"] = round(step_bytes / bandwidth * 1e3, 3)
            row["bandwidth_floor_tok_per_s"] = round(batch * bandwidth / step_bytes, 2)
            # DySCO's own floor: its partial pass reads layers 0..L* (weights and KV) once more
            row["dysco_bandwidth_floor_ms"] = round(row["bandwidth_floor_ms"] * floor, 3)
            row["vanilla_share_of_floor"] = round(row["bandwidth_floor_ms"] / row["vanilla_step_ms"], 4)
            row["dysco_share_of_floor"] = round(row["dysco_bandwidth_floor_ms"] / row["dysco_step_ms"], 4)
            row["vanilla_ahead_share_of_floor"] = round(row["bandwidth_floor_ms"] / row["vanilla_ahead_step_ms"], 4)
            row["dysco_ahead_share_of_floor"] = round(row["dysco_bandwidth_floor_ms"] / row["dysco_ahead_step_ms"], 4)
        yield row


def provenance(device: torch.device) -> dict:
    """Where a measurement ran: the device's name, the platform, and the torch and transformers versions."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    return {"machine": {"device": name, "platform": platform.platform()},
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__}}


def bench_result(model: LoadedModel, name: str, heads: HeadSet, heads_source: str, config: DecodingConfig,
                 backend: BackendSpec | str, random_weights: bool, bandwidth: float | None, command: str,
                 rows: list[dict], peer: dict | None = None,
                 floor: tuple[float | None, str | None] = (None, None)) -> dict:
    """The benchmark's JSON document: the setting, the machine, the versions and the rows; with
    `peer` (`{"method", "rows"}` from `bench_peer`), each row also gets our vanilla tokens/s over
    the peer's at its context. `bandwidth`: this run's copy probe; `floor`: the bandwidth the rows'
    floors divide by and its source (`floor_bandwidth`)."""
    if peer is not None:
        by_context = {r["context"]: r for r in peer["rows"]}
        for row in rows:
            other = by_context.get(row["context"])
            if other is not None:
                row["vanilla_over_peer"] = round(row["vanilla_tok_per_s"] / other["peer_tok_per_s"], 3)
                row["dysco_over_peer"] = round(row["dysco_tok_per_s"] / other["peer_tok_per_s"], 3)
    spec = BackendSpec.of(backend)
    static = spec.described(model) or None  # a backend with options says how it decodes
    return {
        "benchmark": "decode-step",
        "backend": spec.name,
        "decode_attention": static["decode_attention"] if static else None,  # None: the backend's only one
        "static": static,
        "model": name,
        "random_weights": random_weights,
        "yarn_factor": yarn_factor(model.hf_config),
        "dtype": dtype_name(model.dtype),
        "heads": {"source": heads_source, "n": len(heads), "deepest_layer": heads.max_layer, "labels": heads.labels()},
        "n_layers": model.spec.n_layers,
        "layer_floor": round(layer_floor(model, heads, config.method), 4),
        "weights_gib": round(weight_bytes(model) / 2**30, 3),
        # a split runs its devices one after another: its floor is all bytes at one card's bandwidth
        "devices": [str(d) for d in model_devices(model)],
        "n_gpus": sum(d.type == "cuda" for d in model_devices(model)),
        "copy_bandwidth_gb_per_s": round(bandwidth / 1e9, 1) if bandwidth else None,
        "floor_bandwidth_gb_per_s": round(floor[0] / 1e9, 1) if floor[0] else None,
        "floor_bandwidth_source": floor[1],
        # by the record names, as every committed benchmark keeps them
        "config": {"method": config.method, **{flat_name(name): config.parameter(name)
                                                for name in ("select_p", "select_k", "beta")}},
        "threads": torch.get_num_threads(),
        **provenance(model.device),
        "command": command,
        "rows": rows,
        "peer": peer,
    }

"""Decode speed and memory: DySCO against vanilla on the same backend, in one run.

For each context length: prefill once, then time single decode steps of both methods
alternately from copies of that cache (drift hits both alike), after warm-up steps, and
report medians, tokens per second, their ratio, and on a GPU the peak memory of each
method's steps. The layer floor of DySCO over vanilla is 1 + (L* + 1) / L (the partial
pass runs layers 0..L*); on a GPU the bandwidth floor of one step is (weight bytes + KV
bytes) / measured copy bandwidth. With --batch-size B, B random sequences decode together
and tokens per second count the tokens of all rows.

    # CPU, one thread, the TransformerLens path
    python analyses/bench_decode.py --model qwen2.5-coder-0.5b --contexts 2048,4096 --backend bridge \
        --threads 1 --out figures/bench_decode.json
    # GPU, a Qwen3-8B-shaped model with random weights and the paper's Qwen3-8B heads
    python analyses/bench_decode.py --random-geometry qwen3-8b --heads paper --device cuda --dtype bfloat16 \
        --backend static --contexts 32768,65536,102400 --out figures/bench_decode_gpu_qwen3-8b_static.json
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time

# Qwen3-8B's shape (config.json of Qwen/Qwen3-8B); weights are random, speed does not depend on them.
GEOMETRIES = {
    "qwen3-8b": dict(style="qwen3", vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                     num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                     max_position_embeddings=131072, rope_theta=1000000.0, tie_word_embeddings=False,
                     initializer_range=0.02, layer_types=["full_attention"] * 36, max_window_layers=36),
}


def random_model(geometry: str, device, dtype):
    """A LoadedModel of a real model's shape with random weights, built on the device."""
    import torch
    from transformers import AutoModelForCausalLM

    from dysco_interp.models import from_hf
    from dysco_interp.models.tiny import tiny_config, tiny_tokenizer

    shape = dict(GEOMETRIES[geometry])
    style, vocab = shape.pop("style"), shape.pop("vocab_size")
    config = tiny_config(style, vocab_size=vocab, **shape)
    with torch.device(device):
        hf = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=dtype)
    return from_hf(hf, tiny_tokenizer(style), f"{geometry}-random")


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bandwidth(device, n_bytes: int = 1 << 30) -> float | None:
    """Device memory bandwidth in bytes/s from a large copy (read + write), median of 5."""
    import torch

    if device.type != "cuda":
        return None
    a = torch.empty(n_bytes // 2, dtype=torch.bfloat16, device=device)
    b = torch.empty_like(a)
    times = []
    for _ in range(6):
        _sync(device)
        t0 = time.perf_counter()
        b.copy_(a)
        _sync(device)
        times.append(time.perf_counter() - t0)
    return 2 * n_bytes / statistics.median(times[1:])


def bench_context(model, heads, config, backend: str, n_context: int, n_steps: int, n_warmup: int,
                  profile_dir: str | None = None, batch: int = 1) -> dict:
    import torch

    from dysco_interp.decoding.backends import make_backend
    from dysco_interp.decoding.dysco import Rows, _Stepper

    device = model.device
    gen = torch.Generator().manual_seed(n_context)
    ids = torch.randint(10, min(len(model.tokenizer), 30000), (batch, n_context + n_steps + n_warmup + 1), generator=gen)
    plain = make_backend(model, backend, None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    t0 = time.perf_counter()
    prefix = plain.prefill(ids[:, :n_context].to(device), None, reserve=n_steps + n_warmup + 1)
    _sync(device)
    prefill_s = time.perf_counter() - t0
    prefill_peak = torch.cuda.max_memory_allocated(device) - before if device.type == "cuda" else None
    states = {"vanilla": prefix.clone(), "dysco": prefix}
    rows = Rows.of([_Prompt(tuple(row.tolist())) for row in ids[:, :n_context]], 0)
    stepper = _Stepper(make_backend(model, backend, heads), config, rows)
    stepper.relevance = torch.full((batch, n_context), 1.0 / n_context, device=device)  # as if warmed up
    runs = {
        "vanilla": lambda tok: plain.step(states["vanilla"], tok),
        "dysco": lambda tok: stepper.full_step(states["dysco"], tok, "decode"),
    }
    times = {m: [] for m in runs}
    peaks = {m: 0 for m in runs}
    kept = {m: 0 for m in runs}
    for i in range(n_warmup + n_steps):
        tok = ids[:, n_context + i].to(device)
        for method, fn in runs.items():
            if device.type == "cuda" and i == 0:  # one more untimed step, measuring what it keeps
                kept[method] = memory_kept_by(fn, tok)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
                base = torch.cuda.memory_allocated(device)
            _sync(device)
            t0 = time.perf_counter()
            fn(tok)
            _sync(device)
            if i >= n_warmup:
                times[method].append(time.perf_counter() - t0)
                if device.type == "cuda":
                    peaks[method] = max(peaks[method], torch.cuda.max_memory_allocated(device) - base)
    if profile_dir:
        step = n_warmup + n_steps
        for method, fn in runs.items():
            profile_step(fn, ids[:, n_context + step].to(device), f"{profile_dir}/{n_context}_{method}.txt")
    v, d = statistics.median(times["vanilla"]), statistics.median(times["dysco"])
    row = {
        "context": n_context,
        "batch_size": batch,
        "steps": n_steps,
        "prefill_s": round(prefill_s, 3),
        "vanilla_step_ms": round(v * 1e3, 3),
        "dysco_step_ms": round(d * 1e3, 3),
        "vanilla_tok_per_s": round(batch / v, 3),  # tokens of all rows together
        "dysco_tok_per_s": round(batch / d, 3),
        "ratio": round(d / v, 4),
        "vanilla_step_ms_iqr": [round(x * 1e3, 3) for x in statistics.quantiles(times["vanilla"], n=4)[::2]],
        "dysco_step_ms_iqr": [round(x * 1e3, 3) for x in statistics.quantiles(times["dysco"], n=4)[::2]],
    }
    if device.type == "cuda":
        row.update({
            "kv_cache_gib": round(batch * kv_bytes(model, n_context) / 2**30, 3),
            "kv_allocated_gib": round(allocated_kv_bytes(prefix.cache) / 2**30, 3),
            "prefill_peak_gib": round((prefill_peak + weight_bytes(model)) / 2**30, 3),
            "allocated_gib": round(torch.cuda.memory_allocated(device) / 2**30, 3),
            "vanilla_first_step_kept_gib": round(kept["vanilla"] / 2**30, 3),
            "dysco_first_step_kept_gib": round(kept["dysco"] / 2**30, 3),
            "vanilla_step_extra_peak_gib": round(peaks["vanilla"] / 2**30, 3),
            "dysco_step_extra_peak_gib": round(peaks["dysco"] / 2**30, 3),
        })
        row.update(peak_memory(row, weight_bytes(model)))
    return row


def profile_step(fn, token, path: str) -> None:
    """Where one more step's time goes: torch.profiler's operator table, by device time."""
    import pathlib

    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if token.is_cuda else [])
    with profile(activities=activities) as prof:
        fn(token)
        _sync(token.device)
    key = "self_cuda_time_total" if token.is_cuda else "self_cpu_time_total"
    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(path).write_text(prof.key_averages().table(sort_by=key, row_limit=40))


def kv_bytes(model, n_tokens: int) -> int:
    """Bytes of keys and values that n_tokens occupy: what one decoding step must read."""
    s = model.spec
    return 2 * s.n_layers * s.n_kv_heads * s.d_head * n_tokens * model.prefill_model.dtype.itemsize


def allocated_kv_bytes(cache) -> int:
    """What the cache holds in memory (fixed-capacity buffers include their empty slots)."""
    if hasattr(cache, "kv_bytes"):
        return cache.kv_bytes()
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))


def weight_bytes(model) -> int:
    return sum(t.numel() * t.element_size() for t in model.prefill_model.parameters())


def peak_memory(row: dict, n_weight_bytes: int) -> dict:
    """Each method's peak alone: weights + one KV cache + what its first step kept (CUDA-graph
    pools) + its decoding step's transient peak (both methods' caches live together in the
    benchmark, so the allocator's total is not it)."""
    base = n_weight_bytes / 2**30 + row["kv_allocated_gib"]
    return {f"{m}_peak_mem_gib": round(base + row.get(f"{m}_first_step_kept_gib", 0) + row[f"{m}_step_extra_peak_gib"], 3)
            for m in ("vanilla", "dysco")}


def memory_kept_by(fn, token) -> int:
    """Device memory a step leaves reserved (e.g. the pools of the CUDA graphs it captures); the
    allocator's free cached blocks are released before and after, so only what is held counts."""
    import torch

    torch.cuda.synchronize(token.device)
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved(token.device)
    fn(token)
    torch.cuda.synchronize(token.device)
    torch.cuda.empty_cache()
    return max(torch.cuda.memory_reserved(token.device) - before, 0)


class _Prompt:
    """A context without chat template (benchmarks feed raw ids)."""

    def __init__(self, ids):
        import torch

        self.ids = ids
        self.template = torch.zeros(len(ids), dtype=torch.bool)
        self.encoded = type("Encoded", (), {"n_generation_prompt": 0})()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-coder-0.5b")
    p.add_argument("--random-geometry", choices=sorted(GEOMETRIES), default=None,
                   help="benchmark a real model's shape with random weights instead of --model")
    p.add_argument("--heads", default="shipped", help="head file, 'shipped', or 'paper' (the paper's Qwen3-8B list)")
    p.add_argument("--method", default="dysco", choices=["dysco", "dysco-reuse"],
                   help="the DySCO step timed against vanilla (dysco-reuse: one pass, bias after the deepest QRHead)")
    p.add_argument("--backend", default="bridge", choices=["bridge", "sdpa", "static"])
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--contexts", default="2048,4096")
    p.add_argument("--batch-size", type=int, default=1, help="sequences decoded together (sdpa and static)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (1 for the CPU benchmark)")
    p.add_argument("--out", default="figures/bench_decode.json")
    p.add_argument("--profile", default=None, help="folder for a torch.profiler table of one extra step per method")
    args = p.parse_args(argv)

    import torch
    import transformers

    if args.threads:
        torch.set_num_threads(args.threads)
    from dysco_interp.decoding.config import DecodingConfig
    from dysco_interp.heads import load_heads, paper_heads, shipped_heads
    from dysco_interp.models import dtype_name, load_model, resolve_device, resolve_dtype

    if args.random_geometry:
        device = resolve_device(args.device)
        model = random_model(args.random_geometry, device, resolve_dtype(args.dtype, device))
        name = model.spec.name
    else:
        model = load_model(args.model, device=args.device, dtype=args.dtype, progress=False)
        name = args.model
    if args.heads == "paper":
        if args.random_geometry != "qwen3-8b":
            raise SystemExit("--heads paper is the Qwen3-8B list: use it with --random-geometry qwen3-8b")
        heads = paper_heads("qwen3-8b").validate_for(model.spec, allow_other_model=True)
    elif args.heads == "shipped":
        heads = shipped_heads(name, spec=model.spec)
    else:
        heads = load_heads(args.heads, spec=model.spec)
    config = DecodingConfig(method=args.method)
    n_layers, deepest = model.spec.n_layers, heads.max_layer
    floor = 1 + (deepest + 1) / n_layers if args.method == "dysco" else 1.0  # reuse: no second pass
    device = model.device
    bandwidth = copy_bandwidth(device)
    n_weight_bytes = weight_bytes(model)
    rows = []
    for n in [int(x) for x in args.contexts.split(",")]:
        row = bench_context(model, heads, config, args.backend, n, args.steps, args.warmup, args.profile, args.batch_size)
        row["ratio_over_layer_floor"] = round(row["ratio"] / floor, 4)
        if bandwidth:
            step_bytes = n_weight_bytes + row["kv_cache_gib"] * 2**30
            row["bandwidth_floor_ms"] = round(step_bytes / bandwidth * 1e3, 3)
            row["bandwidth_floor_tok_per_s"] = round(args.batch_size * bandwidth / step_bytes, 2)
        rows.append(row)
        print(
            f"context {n:>7}: vanilla {row['vanilla_step_ms']:9.2f} ms ({row['vanilla_tok_per_s']:.1f} tok/s)  "
            f"dysco {row['dysco_step_ms']:9.2f} ms ({row['dysco_tok_per_s']:.1f} tok/s)  ratio {row['ratio']:.3f} "
            f"(layer floor {floor:.3f})" + (f"  bandwidth floor {row['bandwidth_floor_ms']:.2f} ms" if bandwidth else ""),
            flush=True,
        )
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    result = {
        "benchmark": "decode-step",
        "backend": args.backend,
        "model": name,
        "random_weights": bool(args.random_geometry),
        "dtype": dtype_name(model.dtype),
        "heads": {"source": args.heads, "n": len(heads), "deepest_layer": deepest, "labels": heads.labels()},
        "n_layers": n_layers,
        "layer_floor": round(floor, 4),
        "weights_gib": round(n_weight_bytes / 2**30, 3),
        "copy_bandwidth_gb_per_s": round(bandwidth / 1e9, 1) if bandwidth else None,
        "config": {"method": config.method, "top_p": config.top_p, "top_k": config.top_k, "beta": config.beta},
        "threads": torch.get_num_threads(),
        "machine": {"device": device_name, "platform": platform.platform()},
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "command": "python analyses/bench_decode.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "rows": rows,
    }
    from dysco_interp.analysis.report import write_json

    write_json(args.out, result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

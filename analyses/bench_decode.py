"""Decode-step cost: DySCO against vanilla on the same backend (TransformerLens bridge).

For each context length: prefill once, branch the cache, then time single decode steps
of both methods alternately (so drift hits both alike) and report medians. The layer
floor of DySCO over vanilla is 1 + (L* + 1) / L: the partial pass runs layers 0..L*.
One CPU thread, as the project's benchmarks require.

    python analyses/bench_decode.py --model qwen2.5-coder-0.5b --heads shipped \
        --contexts 2048,4096 --out figures/bench_decode.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_context(model, heads, config, n_context: int, n_steps: int, n_warmup: int) -> dict:
    import torch

    from dysco_interp.decoding import runtime
    from dysco_interp.decoding.dysco import _Stepper

    gen = torch.Generator().manual_seed(n_context)
    ids = torch.randint(100, min(len(model.tokenizer), 30000), (1, n_context + n_steps + n_warmup), generator=gen)
    prefix, _ = runtime.prefill(model, ids[:, :n_context])
    vanilla_cache, dysco_cache = runtime.clone_cache(prefix), runtime.clone_cache(prefix)
    del prefix
    stepper = _Stepper(model, config, heads, torch.zeros(n_context, dtype=torch.bool), None)
    # relevance as if warmed up on the context
    stepper.relevance = torch.full((1, n_context), 1.0 / n_context)
    vanilla, dysco = [], []
    for i in range(n_warmup + n_steps):
        pos = n_context + i
        tok = int(ids[0, pos])
        tv = _time(lambda: runtime.step(model, vanilla_cache, torch.tensor([[tok]])))
        td = _time(lambda: stepper.full_step(dysco_cache, tok, pos, "decode"))
        if i >= n_warmup:
            vanilla.append(tv)
            dysco.append(td)
    v, d = statistics.median(vanilla), statistics.median(dysco)
    return {
        "context": n_context,
        "steps": n_steps,
        "vanilla_step_ms": round(v * 1e3, 2),
        "dysco_step_ms": round(d * 1e3, 2),
        "vanilla_tok_per_s": round(1 / v, 3),
        "dysco_tok_per_s": round(1 / d, 3),
        "ratio": round(d / v, 3),
        "vanilla_step_ms_iqr": [round(x * 1e3, 2) for x in statistics.quantiles(vanilla, n=4)[::2]],
        "dysco_step_ms_iqr": [round(x * 1e3, 2) for x in statistics.quantiles(dysco, n=4)[::2]],
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-coder-0.5b")
    p.add_argument("--heads", default="shipped", help="head file or 'shipped'")
    p.add_argument("--contexts", default="2048,4096")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="figures/bench_decode.json")
    args = p.parse_args(argv)

    import torch
    import transformers

    torch.set_num_threads(args.threads)
    from dysco_interp.decoding.config import DecodingConfig
    from dysco_interp.heads import load_heads, shipped_heads
    from dysco_interp.models import load_model

    model = load_model(args.model, progress=False)
    heads = shipped_heads(args.model, spec=model.spec) if args.heads == "shipped" else load_heads(args.heads, spec=model.spec)
    config = DecodingConfig()
    n_layers, deepest = model.spec.n_layers, heads.max_layer
    floor = 1 + (deepest + 1) / n_layers
    rows = []
    for n in [int(x) for x in args.contexts.split(",")]:
        row = bench_context(model, heads, config, n, args.steps, args.warmup)
        row["ratio_over_floor"] = round(row["ratio"] / floor, 3)
        rows.append(row)
        print(
            f"context {n:>6}: vanilla {row['vanilla_step_ms']:8.1f} ms  dysco {row['dysco_step_ms']:8.1f} ms  "
            f"ratio {row['ratio']:.3f}  (floor {floor:.3f}, ratio/floor {row['ratio_over_floor']:.3f})",
            flush=True,
        )
    result = {
        "benchmark": "decode-step",
        "backend": "TransformerLens bridge (eager attention) for both methods",
        "model": args.model,
        "heads": {"source": args.heads, "n": len(heads), "deepest_layer": deepest, "labels": heads.labels()},
        "n_layers": n_layers,
        "layer_floor": round(floor, 4),
        "config": {"top_p": config.top_p, "top_k": config.top_k, "beta": config.beta},
        "threads": args.threads,
        "machine": {"platform": platform.platform(), "processor": platform.processor()},
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "command": "python analyses/bench_decode.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

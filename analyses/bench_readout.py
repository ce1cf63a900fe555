"""Gold-edge attention from read-outs at long context: what `readout_edge_attention` costs per length.

The paper's Figure 3 measures how much attention the QRHeads put on each Path Traversal step's gold
edge. Through the bridge that needs every head's pattern rows; through the static backend's
read-outs it needs only the chosen heads' last-query rows, one decoding step per answer token.
This times it on a real model's shape with random weights (the masses mean nothing there; the run
shows what the measurement costs at 32K-128K tokens); with --against-bridge, also every head through
the bridge (`teacher_forced_edge_attention`) on the same instance, and both paths' gold-edge mass:

    python analyses/bench_readout.py --random-geometry qwen3-8b --heads paper --device cuda --dtype bfloat16 \
        --contexts 32768,102400 --against-bridge --out figures/bench_readout_gpu_qwen3-8b_static.json
"""

from __future__ import annotations

import sys
import time

import torch

from dysco_interp.analysis import bench
from dysco_interp.analysis.edge_attention import readout_edge_attention, teacher_forced_edge_attention
from dysco_interp.analysis.report import write_json
from dysco_interp.cli import args as cli_args
from dysco_interp.decoding.choices import BACKENDS
from dysco_interp.models import resolve_device, resolve_dtype
from dysco_interp.tasks.path_traversal import generate_instance


def main(argv=None) -> int:
    p = cli_args.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--random-geometry", choices=sorted(bench.GEOMETRIES), required=True)
    p.add_argument("--heads", default="paper", help="'paper' (the paper's Qwen3-8B list) or a head file")
    p.add_argument("--backend", default="static", choices=list(BACKENDS))
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--contexts", type=cli_args.positive_ints, default="32768")
    p.add_argument("--against-bridge", action="store_true",
                   help="also measure every head through the bridge on the same instances")
    p.add_argument("--out", type=cli_args.output_file, default="figures/bench_readout.json")
    args = p.parse_args(argv)

    device = resolve_device(args.device)
    model = bench.random_model(args.random_geometry, device, resolve_dtype(args.dtype, device))
    heads = bench.bench_heads(model, model.spec.name, args.heads, args.random_geometry)
    cuda = device.type == "cuda"
    paths = {"readout": lambda inst: readout_edge_attention(model, inst, heads.heads, args.backend)}
    if args.against_bridge:
        paths["bridge"] = lambda inst: teacher_forced_edge_attention(model, inst)
    rows = []
    for n in args.contexts:
        instance = generate_instance(model.tokenizer, n, seed=0)
        for path, measure in paths.items():
            if cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            attention = measure(instance)
            if cuda:
                torch.cuda.synchronize(device)
            seconds = time.perf_counter() - t0
            row = {"context": n, "path": path, "n_tokens": instance.n_tokens, "n_edges": instance.n_edges,
                   "route_steps": instance.n_hops, "seconds": round(seconds, 2),
                   "gold_mass_qrheads": [round(x, 5) for x in attention.gold_mass(heads.heads).tolist()]}
            if cuda:
                row["peak_mem_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
            rows.append(row)
            print(f"context {n:>7} {path:>8}: {seconds:6.1f} s for {instance.n_hops} route steps"
                  + (f", peak {row['peak_mem_gib']} GiB" if cuda else ""), flush=True)
    command = "python analyses/bench_readout.py " + " ".join(argv if argv is not None else sys.argv[1:])
    write_json(args.out, {"benchmark": "gold-edge attention from read-outs", "model": model.spec.name,
                          "random_weights": True, "backend": args.backend, "heads": args.heads,
                          "heads_read": len(heads), "command": command, **bench.provenance(device), "rows": rows})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

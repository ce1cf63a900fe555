"""The decoding experiments behind the Path Traversal, ablation and robustness tables.

Parts (each a set of resumable `ResultStore` files under --out-dir, one record per
(instance, method); a killed run continues where it stopped):
- tau:        UniAttnS temperatures on MRCR-style data -> mrcr/<model>_<len>_tau.jsonl
              (the paper picks tau on MRCR; we never pick it on the test instances)
- pt:         vanilla, UniAttnS (the chosen tau) and DySCO per length
              -> path_traversal/<model>_<len>.jsonl
- ablation:   DySCO vs random heads vs static scaling, Path Traversal and MRCR
              -> ablations/<model>_<task>_<len>.jsonl
- robustness: p, K and beta varied one at a time around the paper's defaults
              -> robustness/<model>_<task>_<len>.jsonl
- reuse:      DySCO vs its one-pass variant (bias only after the deepest QRHead layer), both
              in one process -> reuse/<model>_<task>_<len>.jsonl (ablation_table.py reads them)

Data: the task files `path_traversal_<len>.jsonl` and `mrcr_<len>.jsonl` in --data-dir
(made with `dysco-interp make-data ... --model MODEL`).

    python analyses/decoding_runs.py --model qwen2.5-coder-0.5b --data-dir DATA --device cuda \
        --dtype bfloat16 --backend sdpa --batch-size 50 --parts tau,pt,ablation,robustness
    python analyses/decoding_runs.py --small --data-dir DATA --out-dir OUT   # smollm2-135m, CPU, minutes
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

PARTS = ("tau", "pt", "ablation", "robustness", "reuse")
# The paper's robustness grid, one parameter at a time around (p 0.975, K 4096, beta 2).
GRID = {"top_p": (0.9, 0.95, 0.975, 0.99), "top_k": (1024, 2048, 4096, 8192), "beta": (1.5, 2.0, 2.5, 3.0)}
SMALL_GRID = {"top_p": (0.9,), "top_k": (256,), "beta": (1.5,)}
GRID_LABEL = {"top_p": "p", "top_k": "K", "beta": "beta"}
SMALL_TAUS = (1.0, 0.85)


def tau_label(tau: float) -> str:
    return f"uniattns-tau{tau:g}"


def grid_methods(base, grid) -> dict:
    """"dysco" (the defaults) plus one config per other grid value, each differing in one parameter."""
    methods = {"dysco": base}
    for field, values in grid.items():
        for v in values:
            if v != getattr(base, field):
                methods[f"{GRID_LABEL[field]}={v:g}"] = base.replace(**{field: v})
    return methods


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="default qwen2.5-coder-0.5b (smollm2-135m with --small)")
    p.add_argument("--data-dir", required=True)
    p.add_argument("--out-dir", default="figures")
    p.add_argument("--parts", default=",".join(PARTS))
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--backend", default="sdpa", choices=["bridge", "sdpa", "static"])
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--n", type=int, default=None, help="instances per file (default: all)")
    p.add_argument("--pt-lengths", default="1k,2k,4k,8k")
    p.add_argument("--ablation-lengths", default="2k,8k")
    p.add_argument("--robustness-length", default="2k")
    p.add_argument("--tau-length", default="2k")
    p.add_argument("--taus", default="1.0,0.9,0.8,0.7,0.6")
    p.add_argument("--pt-new-tokens", type=int, default=120, help="4 route lines take about 60")
    p.add_argument("--mrcr-new-tokens", type=int, default=160, help="the answers take 60-120")
    p.add_argument("--heads", default="shipped")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--small", action="store_true",
                   help="smollm2-135m at 1k, 2 instances, 8 new tokens, one other value per parameter (CPU, minutes)")
    args = p.parse_args(argv)
    args.model = args.model or ("smollm2-135m" if args.small else "qwen2.5-coder-0.5b")
    if args.small:
        args.n, args.batch_size = args.n or 2, 2
        args.pt_lengths = args.ablation_lengths = args.robustness_length = args.tau_length = "1k"
        args.taus, args.pt_new_tokens, args.mrcr_new_tokens = ",".join(map(str, SMALL_TAUS)), 8, 8
    parts = [x for x in args.parts.split(",") if x]
    unknown = set(parts) - set(PARTS)
    if unknown:
        raise SystemExit(f"unknown part(s) {sorted(unknown)}; choose from {', '.join(PARTS)}")

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from dysco_interp.decoding.config import DecodingConfig
    from dysco_interp.analysis.result_tables import tau_sweep
    from dysco_interp.experiments.evaluate import evaluate
    from dysco_interp.heads import load_heads, shipped_heads
    from dysco_interp.models import load_model
    from dysco_interp.analysis.stores import read_records
    from dysco_interp.tasks import load_dataset

    data_dir, out_dir = Path(args.data_dir), Path(args.out_dir)
    model = load_model(args.model, device=args.device, dtype=args.dtype, progress=False)
    heads = shipped_heads(args.model, spec=model.spec) if args.heads == "shipped" else load_heads(args.heads, spec=model.spec)
    lengths = lambda text: [x for x in text.split(",") if x]  # noqa: E731

    def data(task, length):
        path = data_dir / f"{task}_{length}.jsonl"
        if not path.is_file():
            raise SystemExit(f"missing {path}; make it with `dysco-interp make-data {task} --model {args.model} "
                             f"--lengths {length} --out {data_dir}`")
        instances = load_dataset(path)
        return instances[: args.n] if args.n else instances

    def run(task, length, methods, store_path):
        t0 = time.perf_counter()
        run = evaluate(model, args.model, task, data(task, length), methods, heads, store_path,
                       backend=args.backend, batch_size=args.batch_size)
        print(f"{run.path}: {len(run.new)} new records in {time.perf_counter() - t0:.1f}s", flush=True)

    def new_tokens(task):
        return args.pt_new_tokens if task == "path_traversal" else args.mrcr_new_tokens

    tau_store = out_dir / "mrcr" / f"{args.model}_{args.tau_length}_tau.jsonl"
    if "tau" in parts:
        taus = [float(t) for t in args.taus.split(",")]
        methods = {tau_label(t): DecodingConfig(method="uniattns", tau=t, max_new_tokens=args.mrcr_new_tokens) for t in taus}
        run("mrcr", args.tau_length, methods, tau_store)
    if "pt" in parts:
        if not tau_store.is_file():
            raise SystemExit(f"part 'pt' needs the tau sweep {tau_store}; run part 'tau' first")
        sweep = tau_sweep(read_records(tau_store)).get(args.model)
        if sweep is None:
            raise SystemExit(f"{tau_store} holds no UniAttnS records of {args.model}")
        tau = sweep["chosen_tau"]
        print(f"UniAttnS tau chosen on MRCR: {tau:g} (sweep: {sweep['rows']})")
        base = DecodingConfig(max_new_tokens=args.pt_new_tokens)
        methods = {"vanilla": base.replace(method="vanilla"), "dysco": base}
        if tau != 1.0:  # tau = 1 is vanilla decoding; the table reads it from the vanilla runs
            methods[tau_label(tau)] = base.replace(method="uniattns", tau=tau)
        for length in lengths(args.pt_lengths):
            run("path_traversal", length, methods, out_dir / "path_traversal" / f"{args.model}_{length}.jsonl")
    for task in ("path_traversal", "mrcr"):
        base = DecodingConfig(max_new_tokens=new_tokens(task))
        if "ablation" in parts:
            methods = {"dysco": base, "dysco-random": base.replace(method="dysco-random"),
                       "dysco-static": base.replace(method="dysco-static")}
            for length in lengths(args.ablation_lengths):
                run(task, length, methods, out_dir / "ablations" / f"{args.model}_{task}_{length}.jsonl")
        if "reuse" in parts:
            methods = {"dysco": base, "dysco-reuse": base.replace(method="dysco-reuse")}
            for length in lengths(args.ablation_lengths):
                run(task, length, methods, out_dir / "reuse" / f"{args.model}_{task}_{length}.jsonl")
        if "robustness" in parts:
            methods = {"vanilla": base.replace(method="vanilla"),
                       **grid_methods(base, SMALL_GRID if args.small else GRID)}
            length = args.robustness_length
            run(task, length, methods, out_dir / "robustness" / f"{args.model}_{task}_{length}.jsonl")
    return 0


if __name__ == "__main__":
    sys.exit(main())

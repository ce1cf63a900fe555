"""Decode speed and memory: DySCO against vanilla on the same backend, in one run.

What is timed and how: dysco_interp/analysis/bench.py. With --batch-size B, B random
sequences decode together and tokens per second count the tokens of all rows.

    # CPU, one thread, the TransformerLens path
    python analyses/bench_decode.py --model qwen2.5-coder-0.5b --contexts 2048,4096 --backend bridge \
        --threads 1 --out figures/bench_decode.json
    # GPU, a Qwen3-8B-shaped model with random weights and the paper's Qwen3-8B heads
    python analyses/bench_decode.py --random-geometry qwen3-8b --heads paper --device cuda --dtype bfloat16 \
        --backend static --contexts 32768,65536,102400 --out figures/bench_decode_gpu_qwen3-8b_static.json
    # the same, with the flex backend's steps timed beside the static backend's in the same run
    python analyses/bench_decode.py --random-geometry qwen3-8b --heads paper --device cuda --dtype bfloat16 \
        --backend static --versus flex --also dysco-hard --also uniattns --contexts 32768,65536 \
        --out figures/bench_decode_gpu_qwen3-8b_static_vs_flex.json
    # the methods that find spans in the prompt's text, on a Path Traversal instance as the context
    python analyses/bench_decode.py --random-geometry qwen3-8b --heads paper --device cuda --dtype bfloat16 \
        --backend static --contexts 102400 --task-context path_traversal --also instaboost \
        --also 'pasta={"heads": "L10H0 L12H3"}' --also 'qr-pasta={"heads": "L10H0 L12H3"}' --also pos-calibration
    # what the Triton matrix-vector kernel of a batch-1 step brings: the same run with cuBLAS for every product
    python analyses/bench_decode.py --random-geometry qwen3-8b --heads paper --device cuda --dtype bfloat16 \
        --backend static --contexts 102400 --also dysco-lagged --no-matvec
    # one method at two settings, each step under its own label
    python analyses/bench_decode.py --random-geometry qwen3-8b --heads paper --device cuda --dtype bfloat16 \
        --backend static --contexts 102400 --also dysco-lagged --also dysco-sparse \
        --also 'dysco-sparse:sparse-all={"sparse_layers": "all"}'
"""

from __future__ import annotations

import argparse
import sys

import torch

from dysco_interp.analysis import bench, bench_decoder, bench_peer
from dysco_interp.analysis.report import write_json
from dysco_interp.cli import args as cli_args
from dysco_interp.cli import user_methods
from dysco_interp.decoding.backends import BackendSpec
from dysco_interp.decoding.choices import BACKENDS, DECODE_ATTENTION, backends_with
from dysco_interp.decoding.config import preset
from dysco_interp.errors import ConfigError
from dysco_interp.models import load_model, resolve_device, resolve_dtype
from dysco_interp.studies.harness_protocol import TASKS, bind


def also_method(text: str) -> tuple[str, str, dict]:
    """NAME, NAME=JSON (a JSON object of the method's parameters), and either with :LABEL after
    the name, the step's name in place of the method's: (label, name, parameters)."""
    name, params = user_methods.method_option(text) if "=" in text else (text.strip(), {})
    method, colon, label = name.partition(":")
    if colon and not label.strip():
        raise argparse.ArgumentTypeError(f"{name}: give a label after the colon, e.g. dysco-sparse:all")
    return label.strip() or method.strip(), method.strip(), params


def main(argv=None) -> int:
    p = cli_args.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-coder-0.5b")
    p.add_argument("--random-geometry", choices=sorted(bench.GEOMETRIES), default=None,
                   help="benchmark a real model's shape with random weights instead of --model")
    p.add_argument("--heads", default="shipped", help="head file, 'shipped', or 'paper' (the paper's Qwen3-8B list)")
    p.add_argument("--method", default="dysco", choices=["dysco", "dysco-reuse"],
                   help="the DySCO step timed against vanilla (dysco-reuse: one pass, bias after the deepest QRHead)")
    p.add_argument("--backend", default="bridge", choices=list(BACKENDS))
    p.add_argument("--versus", default=None, choices=list(BACKENDS), metavar="BACKEND",
                   help="also time every step (vanilla, DySCO, --also's) on this backend, step by step beside "
                        "--backend's, on its own prefill of the same context (rows get BACKEND_vanilla_step_ms, "
                        "BACKEND_dysco_step_ms, BACKEND_<also>_step_ms, each with its _over_dysco)")
    p.add_argument("--user-method", action="store_true",
                   help="also time DySCO written as a user-defined SteeringMethod (the 'user' step)")
    p.add_argument("--read-heads", type=cli_args.nonnegative_int, default=0, metavar="N",
                   help="also time DySCO reading N more random heads' rows at every step ('dysco_readN')")
    p.add_argument("--also", type=also_method, action="append", default=[], metavar="NAME[:LABEL][=JSON]",
                   help="also time any registered method (repeat the flag), at the paper preset with these of its "
                        "parameters, e.g. --also 'uniattns={\"tau\": 0.9}' --also dysco-lagged; a LABEL names "
                        "the step instead of the method (one method at two settings: --also dysco-sparse "
                        "--also 'dysco-sparse:all={\"sparse_layers\": \"all\"}')")
    p.add_argument("--task-context", choices=list(TASKS), default=None, metavar="TASK",
                   help="the context is one instance of TASK (made for each context length with the model's "
                        "tokenizer) instead of random ids, so that methods finding spans in the prompt's text "
                        "(instaboost, pasta, qr-pasta) can be timed; each --also method gets TASK's instruction "
                        "texts as the steering harness binds them")
    p.add_argument("--decode-attention", choices=list(DECODE_ATTENTION), default=None,
                   help="the static backend's decoding attention: fused SDPA (its default) or the float32 reference")
    p.add_argument("--no-compile", action="store_true",
                   help="the static backend's written-out decoder, or the flex backend's FlexAttention, without "
                        "compiled kernels (to time what they bring)")
    p.add_argument("--no-matvec", action="store_true",
                   help="the static backend's decoding steps with cuBLAS for every product, not the Triton "
                        "matrix-vector kernel for one row (to time what it brings)")
    p.add_argument("--yarn", type=cli_args.yarn_factor, default=None, metavar="FACTOR",
                   help="YaRN rope scaling by FACTOR (the paper's Qwen3 setting past 32K tokens is 4)")
    p.add_argument("--device", default=None)
    p.add_argument("--devices", type=cli_args.devices, default=None,
                   help="split the model's layers over these devices, e.g. cuda:0,cuda:1 (not with --device)")
    p.add_argument("--dtype", default=None)
    p.add_argument("--contexts", type=cli_args.positive_ints, default="2048,4096")
    p.add_argument("--batch-size", type=int, default=1, help="sequences decoded together (sdpa and static)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (1 for the CPU benchmark)")
    p.add_argument("--out", type=cli_args.output_file, default="figures/bench_decode.json")
    p.add_argument("--peer", action="store_true",
                   help="also time plain transformers (StaticCache + torch.compile, vanilla) on the same contexts "
                        "and store it as the 'peer' entry with our speed over its")
    p.add_argument("--profile", default=None, help="folder for a torch.profiler table of one extra step per method")
    user_methods.add_methods_from_flag(p)
    args = p.parse_args(argv)
    try:  # every method and its parameters checked before a model is made
        if args.task_context:  # the instruction texts of the task, where a method emphasises one
            args.also = [(label, name, bind(name, params, args.task_context).params)
                         for label, name, params in args.also]
        labels = [label for label, _, _ in args.also]
        twice = sorted({label for label in labels if labels.count(label) > 1})
        if twice:
            raise ConfigError(f"--also names the step {twice[0]} twice: give each setting a label, "
                              f"e.g. --also '{twice[0]}:mine={{...}}'")
        bench_decoder.check_step_labels(labels)
        also = {label: preset("paper", method=name, params=params) for label, name, params in args.also}
    except ConfigError as e:
        p.error(str(e))

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.devices and args.device:
        raise SystemExit("give --device (one device) or --devices (a split), not both")
    if args.devices and args.peer:
        raise SystemExit("--peer runs plain transformers on one device: leave it out with --devices")
    if args.random_geometry:
        device = args.devices[0] if args.devices else resolve_device(args.device)
        model = bench.random_model(args.random_geometry, device, resolve_dtype(args.dtype, device), args.yarn,
                                   args.devices)
        name = model.spec.name
    else:
        model = load_model(args.model, device=args.device, dtype=args.dtype, progress=False, yarn_factor=args.yarn,
                           devices=args.devices)
        name = args.model
    try:
        heads = bench.bench_heads(model, name, args.heads, args.random_geometry)
    except ConfigError as e:
        raise SystemExit(str(e)) from None
    config = preset("paper", method=args.method)  # the committed timings ran the paper's selection
    for flag, option, given in (("--decode-attention", "decode_attention", args.decode_attention),
                                ("--no-compile", "compile_kernels", args.no_compile),
                                ("--no-matvec", "matvec", args.no_matvec)):
        owners = backends_with(option)
        if given and args.backend not in owners:
            raise SystemExit(f"{flag} sets the decoding of the {' or '.join(owners)} backend: "
                             f"add --backend {owners[0]}")
    if args.versus == args.backend:
        raise SystemExit("--versus names another backend than --backend")
    backend = BackendSpec(args.backend, decode_attention=args.decode_attention,
                          compile_kernels=False if args.no_compile else None,
                          matvec=False if args.no_matvec else None)
    versus = None if args.versus is None else BackendSpec(args.versus)
    floor = bench.layer_floor(model, heads, args.method)
    probed = bench.copy_bandwidth(bench.model_devices(model))
    bandwidth, source = bench.floor_bandwidth(bench.model_devices(model), probed)
    rows = []
    contexts = args.contexts
    extra = bench_decoder.extra_steps(config, model, args.user_method, args.read_heads, methods=also)
    timed = bench_decoder.timed_steps(extra, args.versus)
    for row in bench.bench_rows(model, heads, config, backend, contexts, args.steps, args.warmup, bandwidth,
                                args.profile, args.batch_size, extra, versus, args.task_context):
        rows.append(row)
        print(
            f"context {row['context']:>7}: "
            f"vanilla {row['vanilla_step_ms']:9.2f} ms ({row['vanilla_tok_per_s']:.1f} tok/s)  "
            f"dysco {row['dysco_step_ms']:9.2f} ms ({row['dysco_tok_per_s']:.1f} tok/s)  ratio {row['ratio']:.3f} "
            f"(layer floor {floor:.3f})"
            + (f"  bandwidth floor {row['bandwidth_floor_ms']:.2f} ms" if bandwidth else "")
            + "".join(f"  {name} {row[name + '_step_ms']:.2f} ms (x{row[name + '_over_dysco']:.3f} dysco)"
                      for name in timed)
            + f"  run ahead: vanilla {row['vanilla_ahead_step_ms']:.2f} ms, dysco {row['dysco_ahead_step_ms']:.2f} ms",
            flush=True,
        )
    peer = None
    if args.peer:
        compiled = model.device.type == "cuda"  # reduce-overhead captures CUDA graphs
        peer_rows = []
        for n in contexts:
            if model.device.type == "cuda":
                torch.cuda.empty_cache()
            ids = bench.bench_ids(model, n, args.steps, args.warmup, args.batch_size)
            row, _ = bench_peer.peer_row(model, ids, n, args.steps, args.warmup, compile=compiled)
            peer_rows.append(row)
            print(f"context {n:>7}: peer {row['peer_step_ms']:9.2f} ms ({row['peer_tok_per_s']:.1f} tok/s)", flush=True)
        peer = {"method": bench_peer.PEER + ("" if compiled else " (eager: no CUDA device)"), "rows": peer_rows}
    command = "python analyses/bench_decode.py " + " ".join(argv if argv is not None else sys.argv[1:])
    result = bench.bench_result(model, name, heads, args.heads, config, backend, bool(args.random_geometry),
                                probed, command, rows, peer, floor=(bandwidth, source))
    if versus is not None:  # how the other backend decoded; its timings are in the rows
        result["versus"] = {"backend": versus.name, **versus.described(model)}
    write_json(args.out, result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

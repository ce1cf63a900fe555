"""Time one decoding step's products of its rows at a model's shapes: the Triton kernels with
the norm, the gate and the residual add folded in, against those steps apart and against cuBLAS,
and (with --sweep) the kernels' tilings. A GPU with Triton only.

    python analyses/bench_matvec.py --random-geometry qwen3-8b --sweep --out OUT/bench_matvec_qwen3-8b.json
    python analyses/bench_matvec.py --batch 4 --sweep --out OUT/bench_matvec_qwen3-8b_batch4.json
"""

from __future__ import annotations

import platform
import sys

import torch

from dysco_interp.analysis import bench
from dysco_interp.analysis.bench_matvec import measure
from dysco_interp.analysis.report import command_line, write_json
from dysco_interp.cli import args as cli_args
from dysco_interp.decoding.backends.matvec import MAX_ROWS, has_triton
from dysco_interp.errors import ConfigError
from dysco_interp.models import resolve_dtype


def main(argv=None) -> int:
    p = cli_args.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--random-geometry", choices=sorted(bench.GEOMETRIES), default="qwen3-8b")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--copies", type=int, default=36, help="weights of each shape (a model's layers)")
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--batch", type=int, default=1, help="rows a step (a batch of 1 to 16)")
    p.add_argument("--sweep", action="store_true", help="also time the tilings of the folded kernel")
    p.add_argument("--out", type=cli_args.output_file, required=True)
    args = p.parse_args(argv)
    if args.copies < 1 or args.replays < 1:
        p.error("--copies and --replays are positive")
    if not 1 <= args.batch <= MAX_ROWS:
        p.error(f"--batch is 1 to {MAX_ROWS}: the kernels multiply no more rows than that")
    if not (torch.cuda.is_available() and has_triton()):
        raise SystemExit("bench_matvec times the Triton kernel: it needs a CUDA device and Triton")
    device = torch.device("cuda")
    try:
        dtype = resolve_dtype(args.dtype, device)
    except ConfigError as e:
        p.error(str(e))
    if dtype == torch.float32 and args.batch > 1:
        p.error("--batch above 1 times the tensor-core kernel: float32 rows beyond one are cuBLAS's")
    bandwidth, source = bench.floor_bandwidth([device], bench.copy_bandwidth(device))
    assert bandwidth is not None
    rows = measure(args.random_geometry, args.copies, args.replays, dtype, device, bandwidth, args.sweep, args.batch)
    for row in rows:
        timed = f"{row['us']:8.2f} us  {row['share_of_floor']:.3f}" if "us" in row else row["error"][:60]
        print(f"{row['product']:8} {row['way']:56} {timed}", flush=True)
    import triton
    write_json(args.out, {
        "command": command_line("analyses/bench_matvec.py", argv if argv is not None else sys.argv[1:]),
        "device": torch.cuda.get_device_name(device), "torch": torch.__version__, "triton": triton.__version__,
        "python": platform.python_version(), "geometry": args.random_geometry, "dtype": args.dtype,
        "batch": args.batch, "copies": args.copies, "replays": args.replays,
        "floor_bandwidth_gb_per_s": round(bandwidth / 1e9, 1),
        "floor_bandwidth_source": source, "rows": rows})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

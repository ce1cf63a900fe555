"""Prefill time and peak memory: the runtime's prefill against a naive full bridge forward.

Each (method, length) runs in a fresh process so that peak memory is not polluted by
earlier runs; peak = highest resident memory sampled during the call minus the
resident memory just before it. One CPU thread, as the project's benchmarks require.

    python analyses/bench_prefill.py --model qwen2.5-coder-0.5b --lengths 1024,2048,4096,8192 \
        --out figures/bench_prefill.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import threading
import time

METHODS = {
    "runtime-sdpa": "runtime.prefill through the SDPA twin, chunked",
    "runtime-bridge-chunked": "runtime.prefill through the bridge with a hook, chunked (eager, chunk x n scores)",
    "naive-bridge": "one full bridge forward (eager attention, n x n scores per layer)",
}


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRSS:
    """Samples resident memory in a thread while the block runs."""

    def __enter__(self):
        self.base = _rss_bytes()
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss_bytes())
            time.sleep(0.002)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_bytes())

    @property
    def delta_mib(self) -> float:
        return (self.peak - self.base) / 2**20


def _child(model_name: str, method: str, length: int, chunk: int) -> dict:
    import torch

    torch.set_num_threads(1)
    from dysco_interp.decoding import runtime
    from dysco_interp.models import load_model

    model = load_model(model_name, progress=False)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(100, min(len(model.tokenizer), 30000), (1, length), generator=gen)
    noop = [("blocks.0.attn.hook_pattern", lambda t, hook: None)]

    def run():
        with torch.inference_mode():
            if method == "runtime-sdpa":
                return runtime.prefill(model, ids, chunk_size=chunk)[1]
            if method == "runtime-bridge-chunked":
                return runtime.prefill(model, ids, chunk_size=chunk, hooks=noop)[1]
            return model.bridge(ids, logits_to_keep=1)[:, -1].float()

    # warm-up on a short input (lazy initialisation), then the measured call
    with torch.inference_mode():
        runtime.prefill(model, ids[:, :64])
        model.bridge(ids[:, :64], logits_to_keep=1)
    with PeakRSS() as mem:
        t0 = time.perf_counter()
        logits = run()
        seconds = time.perf_counter() - t0
    return {
        "method": method,
        "length": length,
        "seconds": round(seconds, 3),
        "peak_extra_mib": round(mem.delta_mib, 1),
        "argmax": int(logits.argmax()),
        "logits_head": [round(float(x), 5) for x in logits[0, :4]],
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-coder-0.5b")
    p.add_argument("--lengths", default="1024,2048,4096,8192")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--chunk", type=int, default=1024)
    p.add_argument("--out", default="figures/bench_prefill.json")
    p.add_argument("--child", nargs=2, metavar=("METHOD", "LENGTH"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.model, args.child[0], int(args.child[1]), args.chunk)))
        return 0

    import torch
    import transformer_lens
    import transformers

    rows = []
    for length in [int(x) for x in args.lengths.split(",")]:
        for method in args.methods.split(","):
            cmd = [sys.executable, __file__, "--model", args.model, "--chunk", str(args.chunk), "--child", method, str(length)]
            proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
            if proc.returncode != 0:
                print(proc.stderr[-2000:], file=sys.stderr)
                rows.append({"method": method, "length": length, "error": proc.stderr.strip().splitlines()[-1]})
            else:
                rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            r = rows[-1]
            print(f"{length:>6} {method:24} {r.get('seconds', '-'):>9}s  peak +{r.get('peak_extra_mib', '-')} MiB", flush=True)
    result = {
        "benchmark": "prefill",
        "model": args.model,
        "chunk_size": args.chunk,
        "threads": 1,
        "methods": METHODS,
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count()},
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "transformer_lens": getattr(transformer_lens, "__version__", "4.3")},
        "command": "python analyses/bench_prefill.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "rows": rows,
    }
    from dysco_interp.analysis.report import write_json

    write_json(args.out, result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

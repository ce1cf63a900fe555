"""Prefill time and peak memory: the runtime's prefill against a naive full bridge forward.

Each (method, length) is measured in a fresh process (`measure_prefill` is what that process
runs), so peak memory is not polluted by earlier runs; peak = highest resident memory
sampled during the call minus the resident memory just before it. One CPU thread, as the
project's benchmarks require.
"""

from __future__ import annotations

import os
import platform
import threading
import time

import torch
import transformer_lens
import transformers

from dysco_interp.decoding import runtime
from dysco_interp.hooks import pattern_name
from dysco_interp.models import load_model

METHODS = {
    "runtime-sdpa": "runtime.prefill through the SDPA twin, chunked",
    "runtime-bridge-chunked": "runtime.prefill through the bridge with a hook, chunked (eager, chunk x n scores)",
    "naive-bridge": "one full bridge forward (eager attention, n x n scores per layer)",
}


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRSS:
    """Samples resident memory in a thread while the block runs."""

    def __enter__(self):
        self.base = rss_bytes()
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes())
            time.sleep(0.002)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())

    @property
    def delta_mib(self) -> float:
        return (self.peak - self.base) / 2**20


def measure_prefill(model_name: str, method: str, length: int, chunk: int) -> dict:
    """One method on `length` random tokens, in this process: seconds, extra peak memory, and
    the next-token logits' argmax and first values (to check the methods agree)."""
    torch.set_num_threads(1)
    model = load_model(model_name, progress=False)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(100, min(len(model.tokenizer), 30000), (1, length), generator=gen)
    noop = [(pattern_name(0), lambda t, hook: None)]

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


def prefill_result(model_name: str, chunk: int, command: str, rows: list[dict]) -> dict:
    """The benchmark's JSON document: the setting, the machine, the versions and the rows."""
    return {
        "benchmark": "prefill",
        "model": model_name,
        "chunk_size": chunk,
        "threads": 1,
        "methods": METHODS,
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count()},
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "transformer_lens": getattr(transformer_lens, "__version__", "4.3")},
        "command": command,
        "rows": rows,
    }

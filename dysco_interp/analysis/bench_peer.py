"""The peer the decode benchmark measures beside us: plain transformers, vanilla greedy decoding
with a `StaticCache` and the forward compiled (`torch.compile(mode="reduce-overhead")`, which
captures CUDA graphs), the recipe transformers documents for fast static-cache decoding.

It runs on the same model object (the SDPA twin that shares the loaded weights), the same
random context as `bench.bench_context` for that length, and the same timing rule (median
step after warm-up, synchronised), so its tokens/s divide ours in one run.
"""

from __future__ import annotations

import statistics
import time

import torch

from dysco_interp.analysis.bench import sync
from dysco_interp.decoding import runtime
from dysco_interp.models import LoadedModel

PEER = 'transformers StaticCache + torch.compile(mode="reduce-overhead"), vanilla greedy'


@torch.inference_mode()
def peer_row(model: LoadedModel, ids: torch.Tensor, n_context: int, n_steps: int, n_warmup: int,
             compile: bool = True, chunk_size: int = runtime.DEFAULT_CHUNK) -> tuple[dict, torch.Tensor]:
    """Prefill `ids[:, :n_context]` into a StaticCache in chunks, then time greedy steps fed
    `ids[:, n_context + i]` (the tokens our benchmark feeds; `bench.bench_ids`). `compile=False`
    times the eager forward (for machines without a compiler toolchain, and the tests).

    Returns the row and the float32 logits of the last step `[batch, vocab]`."""
    from transformers import StaticCache

    hf, device = model.prefill_model, model.device
    batch = ids.shape[0]
    cache = StaticCache(config=hf.config, max_cache_len=n_context + n_steps + n_warmup + 1)
    t0 = time.perf_counter()
    for start in range(0, n_context, chunk_size):
        end = min(start + chunk_size, n_context)
        hf(input_ids=ids[:, start:end].to(device), past_key_values=cache, use_cache=True, logits_to_keep=1,
           cache_position=torch.arange(start, end, device=device))
    sync(device)
    prefill_s = time.perf_counter() - t0

    def forward(tokens, position):
        return hf(input_ids=tokens, past_key_values=cache, use_cache=True, cache_position=position).logits

    step = torch.compile(forward, mode="reduce-overhead", fullgraph=True) if compile else forward
    times = []
    for i in range(n_warmup + n_steps):
        tokens = ids[:, n_context + i: n_context + i + 1].to(device)
        position = torch.tensor([n_context + i], device=device)
        sync(device)
        t0 = time.perf_counter()
        logits = step(tokens, position)
        sync(device)
        if i >= n_warmup:
            times.append(time.perf_counter() - t0)
    median = statistics.median(times)
    row = {"context": n_context, "batch_size": batch, "peer_prefill_s": round(prefill_s, 3),
           "peer_step_ms": round(median * 1e3, 3), "peer_tok_per_s": round(batch / median, 3), "compiled": compile}
    return row, logits[:, -1].float()


__all__ = ["PEER", "peer_row"]

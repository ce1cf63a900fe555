"""One decoding step's products of its rows (one, or a small batch's), timed at a model's shapes:
the Triton kernels (`decoding.backends.matvec`) with the steps beside each product folded in,
against the same steps apart (the kernel's plain product or cuBLAS, beside the compiled pieces),
and the kernels' tilings.

Each product is timed over `copies` weights of its shape (as many as a model's layers, so the
weights come from memory, not the cache), in one CUDA graph replayed `replays` times, the best
of three; the share is the weights' bytes over that time at the card's floor bandwidth.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import torch

from dysco_interp.analysis.bench import GEOMETRIES
from dysco_interp.decoding.backends.fused_decoder import Kernels
from dysco_interp.decoding.backends.matvec import batch_tiling, folded, launch, shared_memory, tiling, why_not

# name -> the steps folded into it in a decoder layer
FOLDS = {"qkv": ("norm",), "o": ("residual",), "gate_up": ("norm", "glu"), "down": ("residual",)}
# the sweeps' tilings: for one row (output rows a program, chunk, warps), for a few (weight rows a
# program, chunk, chunks in flight, warps)
ONE_ROW = tuple(itertools.product((1, 2, 4), (1024, 2048), (4, 8)))
FEW_ROWS = tuple(itertools.product((16, 32, 64), (128, 256, 512), (2, 3, 4), (4, 8)))


@dataclass(frozen=True)
class Product:
    name: str
    n: int
    k: int

    @property
    def folds(self) -> tuple[str, ...]:
        return FOLDS[self.name]


def products(geometry: str) -> list[Product]:
    """A decoder layer's products of `geometry` (`bench.GEOMETRIES`), packed as the loader packs them."""
    g = GEOMETRIES[geometry]
    hidden, inner = g["hidden_size"], g["intermediate_size"]
    queries, kv = g["num_attention_heads"] * g["head_dim"], g["num_key_value_heads"] * g["head_dim"]
    return [Product("qkv", queries + 2 * kv, hidden), Product("o", hidden, queries),
            Product("gate_up", 2 * inner, hidden), Product("down", hidden, inner)]


def operands(product: Product, copies: int, dtype: torch.dtype, device: torch.device,
             seed: int = 0, rows: int = 1) -> tuple[list[torch.Tensor], torch.Tensor, dict]:
    """`copies` random weights, `rows` input rows and the folded steps' tensors."""
    g = torch.Generator(device=device).manual_seed(seed)
    n, k = product.n, product.k
    weights = [torch.randn(n, k, generator=g, device=device, dtype=dtype) / k**0.5 for _ in range(copies)]
    x = torch.randn(rows, 1, k, generator=g, device=device, dtype=dtype)
    made = {"norm": (torch.rand(k, generator=g, device=device, dtype=dtype) + 0.5, 1e-6), "glu": True,
            "residual": torch.randn(rows, 1, n, generator=g, device=device, dtype=dtype)}
    return weights, x, {name: made[name] for name in product.folds}


def graph_seconds(run: Callable[[torch.Tensor], object], weights: list[torch.Tensor], replays: int) -> float:
    """Seconds per product: one graph of a product on each weight, replayed, the best of three."""
    for w in weights[:2]:  # compiles and builds outside the capture
        run(w)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for w in weights:
            run(w)
    best = float("inf")
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3 / replays / len(weights))
    return best


def variants(x: torch.Tensor, extra: dict, tilings: Iterable[tuple[int, ...]],
             pieces: Kernels | None = None) -> dict[str, Callable]:
    """name -> a product of `x` on a weight with the steps `extra`, each way the step can run
    (`pieces`: the decoder's pieces, `Kernels.compiled()` unless given)."""
    pieces = Kernels.compiled() if pieces is None else pieces
    cublas = replace(pieces, matvec=None)

    def by_cublas(w: torch.Tensor) -> torch.Tensor:  # as the decoder runs the steps without the kernel
        if "residual" in extra:
            return cublas.residual_product(x, w, None, extra["residual"])[0]
        return cublas.product(x, w, **extra)

    def kernel(h: torch.Tensor, w: torch.Tensor, **steps) -> torch.Tensor:
        # `folded` leaves to cuBLAS what its kernels do not take: timing that None would time nothing
        out = folded(h, w, **steps)
        if out is None:
            raise RuntimeError(f"no Triton kernel ran: {why_not(h, w, None, **steps) or 'it did not build here'}")
        return out

    def apart(w: torch.Tensor) -> torch.Tensor:  # the kernel's plain product, each step a kernel of its own
        h = x if "norm" not in extra else pieces.rms_norm(x, *extra["norm"])
        out = kernel(h, w)
        out = out if "glu" not in extra else pieces.silu_mul(*out.chunk(2, dim=-1))
        return out if "residual" not in extra else extra["residual"] + out

    ways: dict[str, Callable] = {
        "cublas, steps apart": by_cublas,
        "kernel, product only": lambda w: kernel(x, w),
        "kernel, steps apart": apart,
        "kernel, steps folded": lambda w: kernel(x, w, **extra),
    }
    for tiles in tilings:
        ways[f"kernel, steps folded, tiling {tiles}"] = lambda w, tiles=tiles: launch(x, w, None, **extra, tiles=tiles)
    return ways


def measure(geometry: str, copies: int, replays: int, dtype: torch.dtype, device: torch.device,
            bandwidth: float, sweep: bool, rows: int = 1) -> list[dict]:
    """One row per (product, way) for a step of `rows` rows: microseconds a product and the share
    of its floor (`rule_tiling`: the tiling `matvec.tiling` or `matvec.batch_tiling` gives the
    product with its steps folded in). A tiling Triton cannot build here (too much shared
    memory) is a row with its error instead of a time."""
    out = []
    for product in products(geometry):
        weights, x, extra = operands(product, copies, dtype, device, rows=rows)
        glu = "glu" in product.folds
        n = product.n // 2 if glu else product.n
        rule = (tiling(n, product.k, True, glu) if rows == 1 else
                batch_tiling(n, product.k, glu, x.element_size(), shared_memory(device)))
        grid = (ONE_ROW if rows == 1 else FEW_ROWS) if sweep else ()
        for way, run in variants(x, extra, grid).items():
            row = {"product": product.name, "n": product.n, "k": product.k, "rows": rows,
                   "folds": list(product.folds), "way": way, "rule_tiling": list(rule)}
            try:
                seconds = graph_seconds(run, weights, replays)
            except Exception as e:  # noqa: BLE001 (Triton's compile errors have no common base)
                out.append({**row, "error": f"{type(e).__name__}: {e}".splitlines()[0][:200]})
                torch.cuda.synchronize()
                continue
            floor = product.n * product.k * weights[0].element_size() / bandwidth
            out.append({**row, "us": round(seconds * 1e6, 3), "share_of_floor": round(floor / seconds, 3)})
        del weights
        torch.cuda.empty_cache()
    return out

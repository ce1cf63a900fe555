"""A matrix-vector product in Triton: `linear` for one row, as a decoding step at batch 1 runs it.

A decoding step at batch 1 multiplies one row by every weight matrix, so it is bound by reading
the weights. cuBLAS picks tiles made for matrices, and at Qwen3-8B's shapes on an H200 it read
them at 0.65 (the attention output, 4096 → 4096), 0.79 (query, key and value packed, 4096 →
6144) and 0.85 (the MLP's down projection, 12288 → 4096) of the copy bandwidth, the first and
last with a second kernel that adds up split-K partial sums. This kernel gives each program whole
rows and reads them in unrolled chunks, so every load is issued before the first sum needs it:
0.88, 0.95 and 1.00 there, and 1.08 against 1.02 for the packed gate and up projections (36
weights of each shape, one CUDA graph, 4,136 GB/s; 63 tilings swept, the two rules below the
fastest).

`matvec` is `torch.nn.functional.linear` wherever this kernel does not apply: on the CPU, without
Triton, for more than one row (batch > 1, prefill chunks), or for tensors it does not take. It
sums in float32 as cuBLAS does, in another order, so a bf16 output may differ in its last bit.
"""

from __future__ import annotations

import functools
import importlib.util
import warnings
from typing import Any

import torch
from torch.nn.functional import linear

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MAX_CHUNKS = 64  # the reduction is unrolled, chunk by chunk: past this, compiling costs more than it saves


@functools.cache
def has_triton() -> bool:
    return importlib.util.find_spec("triton") is not None


def tiling(n: int, k: int) -> tuple[int, int, int]:
    """(rows a program, columns a chunk, warps) for an `n` × `k` weight: a long reduction (the
    down projection) takes four rows of 2,048-column chunks in four warps, anything shorter one
    row of 1,024-column chunks in eight warps (the fastest of the sweep at each shape)."""
    if k >= 8192:
        return 4, 2048, 4
    return 1, min(1024, next_power_of_2(k)), 8


def next_power_of_2(k: int) -> int:
    return 1 << max(k - 1, 0).bit_length()


def why_not(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> str | None:
    """Why `matvec` falls back to `linear` for these tensors (None: the kernel runs)."""
    if x.device.type != "cuda":
        return "not on a CUDA device"
    if not has_triton():
        return "Triton is not installed"
    if weight.dim() != 2 or x.shape[-1] != weight.shape[1]:
        return "not a product of a row with a matrix"
    if x.numel() != x.shape[-1]:
        return "more than one row"
    if x.dtype not in DTYPES or weight.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
        return f"dtypes {x.dtype} and {weight.dtype}"
    if not (x.is_contiguous() and weight.is_contiguous() and (bias is None or bias.is_contiguous())):
        return "a tensor is not contiguous"
    if weight.device != x.device or (bias is not None and bias.device != x.device):
        return "tensors on different devices"
    _, chunk, _ = tiling(*weight.shape)
    if -(-weight.shape[1] // chunk) > MAX_CHUNKS:
        return f"a reduction over {weight.shape[1]} columns"
    return None


# (weight shape, dtype, bias or not, device) -> whether the kernel built for it: True, or why not
BUILT: dict[tuple, bool | str] = {}


def matvec(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`linear(x, weight, bias)`, by the Triton kernel for one row on a GPU."""
    if why_not(x, weight, bias) is not None:
        return linear(x, weight, bias)
    key = (tuple(weight.shape), x.dtype, bias is not None, x.device)
    built = BUILT.get(key)
    if built is True:
        return launch(x, weight, bias)
    if built is not None:
        return linear(x, weight, bias)
    # the first call of a shape builds the kernel: where Triton cannot build it for this GPU,
    # cuBLAS does the products, as it would without Triton
    try:
        out = launch(x, weight, bias)
    except Exception as e:  # noqa: BLE001 (Triton's compile and launch errors have no common base)
        BUILT[key] = f"{type(e).__name__}: {e}".splitlines()[0]
        warnings.warn(f"the Triton matrix-vector kernel does not run for a {tuple(weight.shape)} weight in "
                      f"{x.dtype} here ({BUILT[key]}); those products go to cuBLAS", RuntimeWarning, stacklevel=2)
        return linear(x, weight, bias)
    BUILT[key] = True
    return out


def launch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    n, k = weight.shape
    rows, chunk, warps = tiling(n, k)
    out = torch.empty(*x.shape[:-1], n, dtype=x.dtype, device=x.device)
    with torch.cuda.device(x.device):  # Triton launches on the current device
        triton_kernel()[(-(-n // rows),)](weight, x, weight if bias is None else bias, out, n, k, rows, chunk,
                                          bias is not None, n % rows == 0, k % chunk == 0, num_warps=warps)
    return out


@functools.cache
def triton_kernel() -> Any:
    """The kernel, defined on first use: the CPU build of torch comes without Triton."""
    import triton
    import triton.language as tl

    @triton.jit
    def rows_times_vector(w_ptr, x_ptr, b_ptr, y_ptr, n, K: tl.constexpr, ROWS: tl.constexpr, CHUNK: tl.constexpr,
                          HAS_BIAS: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        starts = rows.to(tl.int64) * K
        acc = tl.zeros([ROWS, CHUNK], tl.float32)
        for first in tl.static_range(0, K, CHUNK):  # unrolled: the loads of every chunk go out at once
            cols = first + tl.arange(0, CHUNK)
            if EVEN_N and EVEN_K:
                # each weight is read once a step: evicted first, so the row vector stays in L2
                w = tl.load(w_ptr + starts[:, None] + cols[None, :], eviction_policy="evict_first")
                x = tl.load(x_ptr + cols, eviction_policy="evict_last")
            else:
                inside = (rows[:, None] < n) & (cols[None, :] < K)
                w = tl.load(w_ptr + starts[:, None] + cols[None, :], mask=inside, other=0.0,
                            eviction_policy="evict_first")
                x = tl.load(x_ptr + cols, mask=cols < K, other=0.0, eviction_policy="evict_last")
            acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
        y = tl.sum(acc, axis=1)
        if HAS_BIAS:
            y += tl.load(b_ptr + rows, mask=rows < n, other=0.0).to(tl.float32)
        tl.store(y_ptr + rows, y.to(y_ptr.dtype.element_ty), mask=rows < n)

    return rows_times_vector

"""Products of a decoding step's few rows in Triton: `linear` for one row, as a decoding step at
batch 1 runs it, and for up to 16 rows (a step of a small batch), with the small steps beside a
product folded into it.

A decoding step at batch 1 multiplies one row by every weight matrix, so it is bound by reading
the weights. cuBLAS picks tiles made for matrices, and at Qwen3-8B's shapes on an H200 it read
them at 0.65 (the attention output, 4096 → 4096), 0.79 (query, key and value packed, 4096 →
6144) and 0.85 (the MLP's down projection, 12288 → 4096) of the copy bandwidth, the first and
last with a second kernel that adds up split-K partial sums. The kernel for one row gives each
program whole rows and reads them in unrolled chunks, so every load is issued before the first
sum needs it: 0.88, 0.95 and 1.00 there, and 1.08 against 1.02 for the packed gate and up
projections (36 weights of each shape, one CUDA graph, 4,136 GB/s; 63 tilings swept, the two
rules below the fastest; with a step folded in, four rows a program).

A step of 2 to 16 rows is still bound by the weights, but a row's sums on the CUDA cores each
cost as much as the first row's (both batch kernels of that kind lost to cuBLAS, `figures/README.md`).
The kernel for a few rows multiplies a tile of weight rows by all rows at once on the tensor
cores (`tl.dot`, the rows padded to 16), with the loads pipelined over the reduction
(`batch_tiling`).

The small steps a decoder layer takes just before or after a product each cost a kernel of
their own, about 2 us on an H200 with the gap after it, for a row of a few KB. `folded` takes
them into the product:
- `norm=(weight, eps)`: the rows go through an RMS norm first. Every program reads the whole
  rows anyway, so it sums their squares beside its products and scales its sums at the end
  (no load waits for the norm; for one row the normed row is never rounded, where transformers
  rounds it; for a few, the row times the norm's weight is rounded to the dtype the tensor
  cores take);
- `glu=True`: the weight is a gate projection's rows followed by an up projection's (the packed
  MLP), and the output is `silu(gate) * up`, each program taking gate rows and their up rows;
- `residual=r`: the output is `r + product`, the residual stream after the product.

`folded` gives None wherever these kernels do not apply (`why_not`): on the CPU, without Triton,
for more than 16 rows (larger batches, prefill chunks), for more than one row in float32, or
for tensors they do not take; the caller (`fused_decoder.Kernels`) then runs `linear` and the
steps as pieces. They sum in float32 as cuBLAS does, in another order, so a bf16 output may
differ in its last bit.
"""

from __future__ import annotations

import functools
import importlib.util
import warnings
from typing import Any

import torch

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MAX_CHUNKS = 64  # the reduction is unrolled, chunk by chunk: past this, compiling costs more than it saves
MAX_ROWS = 16  # the fewest rows `tl.dot` multiplies: past them a step is a matrix product, cuBLAS's


@functools.cache
def has_triton() -> bool:
    return importlib.util.find_spec("triton") is not None


def tiling(n: int, k: int, folded: bool = False, glu: bool = False) -> tuple[int, int, int]:
    """(output rows a program, columns a chunk, warps) for an `n` × `k` weight: a plain product of
    a short reduction takes one row of 1,024-column chunks in eight warps; a long reduction (the
    down projection), or a product with a step folded in, four rows of 2,048-column chunks in four
    warps, and with `glu` two rows, each with its up row (the fastest of the sweeps at each
    shape: more rows a program read the row vector and the norm's weight fewer times)."""
    if glu:
        return 2, min(2048, next_power_of_2(k)), 4
    if folded or k >= 8192:
        return 4, min(2048, next_power_of_2(k)), 4
    return 1, min(1024, next_power_of_2(k)), 8


def next_power_of_2(k: int) -> int:
    return 1 << max(k - 1, 0).bit_length()


def batch_tiling(n: int, k: int, glu: bool = False, element_size: int = 2,
                 shared: int = 232_448) -> tuple[int, int, int, int]:
    """(weight rows a program, columns a chunk, chunks in flight, warps) of the kernel for a few
    rows, for an `n` × `k` weight (its first half's rows with `glu`) in `shared` bytes of shared
    memory a block. The fastest of the batch-4 sweep at each Qwen3-8B shape on an H200
    (`figures/README.md`): 64 rows of 256-column chunks, four in flight, in four warps; for a long
    reduction (the down projection) 32 rows of 512; with `glu` 64 gate rows and their 64 up rows
    of 128-column chunks, three in flight, in eight warps. Fewer chunks in flight where they do
    not fit, and shorter chunks where two would not."""
    block_n, block_k, most, warps = (64, 128, 3, 8) if glu else (32, 512, 4, 4) if k >= 8192 else (64, 256, 4, 4)
    block_n, block_k = min(block_n, max(16, next_power_of_2(n))), min(block_k, max(16, next_power_of_2(k)))

    def fit(block_k: int) -> int:  # chunks whose weight tiles and rows fit at once
        return shared // ((block_n * (2 if glu else 1) + MAX_ROWS) * block_k * element_size)

    while fit(block_k) < 2 and block_k > 16:
        block_k //= 2
    return block_n, block_k, max(1, min(most, fit(block_k))), warps


@functools.cache
def shared_memory(device: torch.device) -> int:
    """Bytes of shared memory a block may use on `device` (torch before 2.4 does not say: 99 KB,
    the least of the GPUs Triton's tensor-core products run on)."""
    return getattr(torch.cuda.get_device_properties(device), "shared_memory_per_block_optin", 101_376)


def rows_of(x: torch.Tensor) -> int:
    """The rows a product of `x` multiplies: one kernel takes one row, the other up to `MAX_ROWS`."""
    return x.numel() // x.shape[-1] if x.shape[-1] else 0


def why_not(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
            norm: tuple[torch.Tensor, float] | None = None, glu: bool = False,
            residual: torch.Tensor | None = None) -> str | None:
    """Why the kernels do not run for these tensors (None: one does)."""
    if x.device.type != "cuda":
        return "not on a CUDA device"
    if not has_triton():
        return "Triton is not installed"
    if weight.dim() != 2 or x.shape[-1] != weight.shape[1]:
        return "not a product of rows with a matrix"
    if not 1 <= rows_of(x) <= MAX_ROWS:
        return f"no rows, or more than {MAX_ROWS}"
    if x.dtype == torch.float32 and rows_of(x) > 1:
        # the tensor cores' float32 sums run in one chain along the reduction: on an H200, 12 times
        # cuBLAS's distance from the exact product, and float32 is the dtype exactness is checked in
        return "float32 rows beyond one"
    n, k = weight.shape
    if glu and n % 2:
        return f"a gate and up projection of {n} rows"
    beside = {"bias": (bias, (n,)), "norm weight": (None if norm is None else norm[0], (k,)),
              "residual": (residual, (*x.shape[:-1], n // 2 if glu else n))}
    given = [t for t, _ in beside.values() if t is not None]
    for name, (t, shape) in beside.items():
        if t is not None and tuple(t.shape) != shape:
            return f"a {name} of shape {tuple(t.shape)}"
    if x.dtype not in DTYPES or any(t.dtype != x.dtype for t in (weight, *given)):
        return f"dtypes {x.dtype} and {weight.dtype}"
    if not all(t.is_contiguous() for t in (x, weight, *given)):
        return "a tensor is not contiguous"
    if any(t.device != x.device for t in (weight, *given)):
        return "tensors on different devices"
    _, chunk, _ = tiling(n, k)
    if rows_of(x) == 1 and -(-k // chunk) > MAX_CHUNKS:
        return f"a reduction over {k} columns"
    return None


# (weight shape, dtype, which of bias, norm, glu and residual are given, device) -> whether the
# kernel built for it: True, or why not
BUILT: dict[tuple, bool | str] = {}


def folded(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
           norm: tuple[torch.Tensor, float] | None = None, glu: bool = False,
           residual: torch.Tensor | None = None) -> torch.Tensor | None:
    """`linear(x, weight, bias)` by a Triton kernel for one row or a few, with the steps named in
    the module docstring folded in; None where no kernel runs (`why_not`, or a kernel Triton
    could not build on this GPU: that is said once, and the caller does the steps)."""
    if why_not(x, weight, bias, norm, glu, residual) is not None:
        return None
    key = (tuple(weight.shape), rows_of(x) == 1, x.dtype, bias is not None, norm is not None, glu,
           residual is not None, x.device)
    built = BUILT.get(key)
    if built is True:
        return launch(x, weight, bias, norm, glu, residual)
    if built is not None:
        return None
    try:
        out = launch(x, weight, bias, norm, glu, residual)
    except Exception as e:  # noqa: BLE001 (Triton's compile and launch errors have no common base)
        BUILT[key] = f"{type(e).__name__}: {e}".splitlines()[0]
        warnings.warn(f"the Triton kernel for {'one row' if key[1] else 'a few rows'} does not run for a "
                      f"{tuple(weight.shape)} weight in "
                      f"{x.dtype} here ({BUILT[key]}); those products go to cuBLAS", RuntimeWarning, stacklevel=2)
        return None
    BUILT[key] = True
    return out


def launch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           norm: tuple[torch.Tensor, float] | None = None, glu: bool = False,
           residual: torch.Tensor | None = None, tiles: tuple[int, ...] | None = None) -> torch.Tensor:
    """The kernel for one row or for a few on tensors `why_not` accepts; `tiles` instead of
    `tiling`'s (one row) or `batch_tiling`'s (a few)."""
    n, k = weight.shape
    n = n // 2 if glu else n
    out = torch.empty(*x.shape[:-1], n, dtype=x.dtype, device=x.device)
    norm_weight, eps = (weight, 0.0) if norm is None else norm
    tensors = (weight, x, weight if bias is None else bias, norm_weight, out if residual is None else residual, out)
    steps = (bias is not None, norm is not None, glu, residual is not None)
    with torch.cuda.device(x.device):  # Triton launches on the current device
        if rows_of(x) == 1:
            rows, chunk, warps = tiles or tiling(n, k, norm is not None or residual is not None, glu)
            triton_kernel()[(-(-n // rows),)](*tensors, float(eps), n, k, rows, chunk, *steps,
                                              n % rows == 0, k % chunk == 0, num_warps=warps)
        else:
            block_n, block_k, stages, warps = tiles or batch_tiling(n, k, glu, x.element_size(),
                                                                    shared_memory(x.device))
            batch_kernel()[(-(-n // block_n),)](*tensors, float(eps), rows_of(x), n, k, block_n, block_k,
                                                stages, *steps, num_warps=warps)
    return out


@functools.cache
def triton_kernel() -> Any:
    """The kernel, defined on first use: the CPU build of torch comes without Triton."""
    import triton
    import triton.language as tl

    @triton.jit
    def rows_times_vector(w_ptr, x_ptr, b_ptr, g_ptr, r_ptr, y_ptr, eps, n, K: tl.constexpr, ROWS: tl.constexpr,
                          CHUNK: tl.constexpr, HAS_BIAS: tl.constexpr, NORM: tl.constexpr, GLU: tl.constexpr,
                          RESIDUAL: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        starts = rows.to(tl.int64) * K
        # with GLU, the up projection's rows follow the gate's n rows: a program takes both
        up_starts = (rows + n).to(tl.int64) * K
        acc = tl.zeros([ROWS, CHUNK], tl.float32)
        up_acc = tl.zeros([ROWS, CHUNK], tl.float32)
        squares = tl.zeros([CHUNK], tl.float32)
        for first in tl.static_range(0, K, CHUNK):  # unrolled: the loads of every chunk go out at once
            cols = first + tl.arange(0, CHUNK)
            inside = (rows[:, None] < n) & (cols[None, :] < K)
            # each weight is read once a step: evicted first, so the row vector stays in L2
            if EVEN_N and EVEN_K:
                w = tl.load(w_ptr + starts[:, None] + cols[None, :], eviction_policy="evict_first")
                x = tl.load(x_ptr + cols, eviction_policy="evict_last").to(tl.float32)
            else:
                w = tl.load(w_ptr + starts[:, None] + cols[None, :], mask=inside, other=0.0,
                            eviction_policy="evict_first")
                x = tl.load(x_ptr + cols, mask=cols < K, other=0.0, eviction_policy="evict_last").to(tl.float32)
            if NORM:  # the norm's scale is applied to the sums at the end: no load waits for it
                squares += x * x
                if EVEN_K:
                    g = tl.load(g_ptr + cols, eviction_policy="evict_last")
                else:
                    g = tl.load(g_ptr + cols, mask=cols < K, other=0.0, eviction_policy="evict_last")
                x = x * g.to(tl.float32)
            acc += w.to(tl.float32) * x[None, :]
            if GLU:
                if EVEN_N and EVEN_K:
                    u = tl.load(w_ptr + up_starts[:, None] + cols[None, :], eviction_policy="evict_first")
                else:
                    u = tl.load(w_ptr + up_starts[:, None] + cols[None, :], mask=inside, other=0.0,
                                eviction_policy="evict_first")
                up_acc += u.to(tl.float32) * x[None, :]
        y = tl.sum(acc, axis=1)
        if NORM:
            inverse = tl.rsqrt(tl.sum(squares, axis=0) / K + eps)
            y = y * inverse
        if HAS_BIAS:
            y += tl.load(b_ptr + rows, mask=rows < n, other=0.0).to(tl.float32)
        dtype = y_ptr.dtype.element_ty
        if GLU:  # silu(gate) * up, each output rounded as torch rounds it
            up = tl.sum(up_acc, axis=1)
            if NORM:
                up = up * inverse
            if HAS_BIAS:
                up += tl.load(b_ptr + rows + n, mask=rows < n, other=0.0).to(tl.float32)
            gate = y.to(dtype).to(tl.float32)
            y = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32) * up.to(dtype).to(tl.float32)
        if RESIDUAL:  # the product rounded, then added to the stream, as `residual + linear(...)`
            y = y.to(dtype).to(tl.float32) + tl.load(r_ptr + rows, mask=rows < n).to(tl.float32)
        tl.store(y_ptr + rows, y.to(dtype), mask=rows < n)

    return rows_times_vector


@functools.cache
def batch_kernel() -> Any:
    """The kernel for a few rows, defined on first use."""
    import triton
    import triton.language as tl

    @triton.jit
    def rows_times_rows(w_ptr, x_ptr, b_ptr, g_ptr, r_ptr, y_ptr, eps, m, n, K: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr, HAS_BIAS: tl.constexpr,
                        NORM: tl.constexpr, GLU: tl.constexpr, RESIDUAL: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        batch = tl.arange(0, 16)  # the m rows, padded to tl.dot's 16 with zeros
        starts = rows.to(tl.int64) * K
        up_starts = (rows + n).to(tl.int64) * K
        acc = tl.zeros([BLOCK_N, 16], tl.float32)
        up_acc = tl.zeros([BLOCK_N, 16], tl.float32)
        squares = tl.zeros([16, BLOCK_K], tl.float32)
        for first in tl.range(0, K, BLOCK_K, num_stages=STAGES):
            cols = first + tl.arange(0, BLOCK_K)
            inside = (rows[:, None] < n) & (cols[None, :] < K)
            w = tl.load(w_ptr + starts[:, None] + cols[None, :], mask=inside, other=0.0, eviction_policy="evict_first")
            x = tl.load(x_ptr + batch[:, None] * K + cols[None, :], mask=(batch[:, None] < m) & (cols[None, :] < K),
                        other=0.0, eviction_policy="evict_last")
            if NORM:  # as for one row, the norm's scale is applied to the sums at the end
                xf = x.to(tl.float32)
                squares += xf * xf
                g = tl.load(g_ptr + cols, mask=cols < K, other=0.0, eviction_policy="evict_last")
                x = (xf * g.to(tl.float32)[None, :]).to(w.dtype)
            xt = tl.trans(x)
            acc = tl.dot(w, xt, acc)
            if GLU:
                u = tl.load(w_ptr + up_starts[:, None] + cols[None, :], mask=inside, other=0.0,
                            eviction_policy="evict_first")
                up_acc = tl.dot(u, xt, up_acc)
        if NORM:
            inverse = tl.rsqrt(tl.sum(squares, axis=1) / K + eps)[None, :]
            acc = acc * inverse
            up_acc = up_acc * inverse
        if HAS_BIAS:
            acc += tl.load(b_ptr + rows, mask=rows < n, other=0.0).to(tl.float32)[:, None]
        dtype = y_ptr.dtype.element_ty
        if GLU:  # silu(gate) * up, each output rounded as torch rounds it
            if HAS_BIAS:
                up_acc += tl.load(b_ptr + rows + n, mask=rows < n, other=0.0).to(tl.float32)[:, None]
            gate = acc.to(dtype).to(tl.float32)
            acc = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32) * up_acc.to(dtype).to(tl.float32)
        at = batch[None, :].to(tl.int64) * n + rows[:, None]  # output [m, n], the tile transposed
        ours = (batch[None, :] < m) & (rows[:, None] < n)
        if RESIDUAL:
            acc = acc.to(dtype).to(tl.float32) + tl.load(r_ptr + at, mask=ours, other=0.0).to(tl.float32)
        tl.store(y_ptr + at, acc.to(dtype), mask=ours)

    return rows_times_rows

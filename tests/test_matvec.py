"""The Triton kernels for a decoding step's rows: `linear`'s results for one row or up to 16 on a GPU,
`linear` itself elsewhere."""

import dataclasses
import warnings

import pytest
import torch
from torch.nn.functional import linear

from dysco_interp.decoding import backends
from dysco_interp.decoding.backends import matvec as matvec_module
from dysco_interp.decoding.backends.fused_decoder import EAGER, rms_norm, silu_mul
from dysco_interp.decoding.backends.matvec import MAX_ROWS, batch_tiling, folded, launch, tiling, why_not
from dysco_interp.decoding.config import DecodingConfig
from dysco_interp.decoding.loop import compare_methods, generate_batch
from dysco_interp.errors import ConfigError
from dysco_interp.heads import HeadSet
from dysco_interp.models.tiny import STYLES, tiny_model

on_gpu = pytest.mark.skipif(not (torch.cuda.is_available() and matvec_module.has_triton()),
                            reason="needs a CUDA device and Triton")


def operands(n: int, k: int, rows: int = 1, dtype=torch.float32, device="cpu", bias: bool = True, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 1, k, generator=g).to(device, dtype)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(device, dtype)
    b = torch.randn(n, generator=g).to(device, dtype) if bias else None
    return x, w, b


# the eager pieces with the kernels: a product no kernel takes is `linear`'s
WITH_KERNEL = dataclasses.replace(EAGER, matvec=folded)


def test_off_a_gpu_it_is_linear_itself():
    for rows, bias in ((1, True), (1, False), (3, True), (17, True)):
        x, w, b = operands(40, 24, rows, bias=bias)
        assert why_not(x, w, b) == "not on a CUDA device"
        assert folded(x, w, b) is None and folded(x, w, b, residual=torch.zeros(rows, 1, 40)) is None
        assert torch.equal(WITH_KERNEL.product(x, w, b), linear(x, w, b))


FOLDS = {"plain": {}, "norm": {"norm": True}, "glu": {"glu": True}, "residual": {"residual": True},
         "norm and glu": {"norm": True, "glu": True}, "norm and residual": {"norm": True, "residual": True}}


def folds_for(x: torch.Tensor, n: int, norm: bool = False, glu: bool = False, residual: bool = False,
              seed: int = 1) -> dict:
    """The steps' tensors for a product of `x` with an `n`-row weight."""
    g = torch.Generator().manual_seed(seed)
    k, outputs = x.shape[-1], n // 2 if glu else n
    made = {"norm": ((torch.rand(k, generator=g) + 0.5).to(x.device, x.dtype), 1e-6) if norm else None,
            "glu": True if glu else None,
            "residual": torch.randn(*x.shape[:-1], outputs, generator=g).to(x.device, x.dtype) if residual else None}
    return {name: value for name, value in made.items() if value is not None}


def composed(x, w, b, norm=None, glu=False, residual=None, exact=False):
    """The steps one by one, as transformers takes them; `exact`: in float64, the norm's output unrounded."""
    if exact:
        x, w, b = x.double(), w.double(), None if b is None else b.double()
        norm = None if norm is None else (norm[0].double(), norm[1])
        residual = None if residual is None else residual.double()
    if norm is not None:
        x = rms_norm(x, *norm) if not exact else x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm[1]) * norm[0]
    out = linear(x, w, b)
    if glu:
        out = silu_mul(*out.chunk(2, dim=-1))
    return out if residual is None else residual + out


@pytest.mark.parametrize("fold", [f for f in FOLDS if "residual" not in f])
def test_the_eager_product_takes_the_steps_one_by_one(fold):
    """Off a GPU (and wherever the kernel does not run) `Kernels.product` is the transformers
    order of the steps it is given, and `residual_product` the residual add and the norm after."""
    for rows in (1, 3):
        x, w, b = operands(40, 24, rows)
        extra = folds_for(x, 40, **FOLDS[fold])
        assert torch.equal(EAGER.product(x, w, b, **extra), composed(x, w, b, **extra))
        residual, norm = torch.randn(rows, 1, 40), (torch.rand(40) + 0.5, 1e-6)
        stream, normed = EAGER.residual_product(x, w, b, residual, norm)
        assert torch.equal(stream, residual + linear(x, w, b)) and torch.equal(normed, rms_norm(stream, *norm))
        assert EAGER.residual_product(x, w, b, residual)[1] is None


def test_a_kernel_that_does_not_build_leaves_the_products_to_cublas(monkeypatch):
    """Where Triton cannot build the kernel for a GPU, the first call says so once and every call of
    that shape gets `linear`'s result."""
    launches = []

    def unbuildable(*args):
        launches.append(args)
        raise RuntimeError("no kernel image for this device\nmore detail")

    monkeypatch.setattr(matvec_module, "BUILT", {})
    monkeypatch.setattr(matvec_module, "why_not", lambda *args: None)
    monkeypatch.setattr(matvec_module, "launch", unbuildable)
    x, w, b = operands(40, 24)
    with pytest.warns(RuntimeWarning, match=r"a \(40, 24\) weight .*no kernel image for this device\)"):
        assert torch.equal(WITH_KERNEL.product(x, w, b), linear(x, w, b))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(WITH_KERNEL.product(x, w, b), linear(x, w, b))
    assert len(launches) == 1


def test_the_tiling_reads_whole_rows_in_power_of_two_chunks():
    assert tiling(4096, 12288) == (4, 2048, 4)  # the down projection: the fastest tiling of the sweep
    assert tiling(6144, 4096) == (1, 1024, 8)
    assert tiling(100, 576) == (1, 1024, 8)  # one masked chunk
    assert tiling(10, 3) == (1, 4, 8)
    # a step folded in: more rows a program read the row and the norm's weight fewer times
    assert tiling(6144, 4096, folded=True) == tiling(4096, 12288, folded=True) == (4, 2048, 4)
    assert tiling(24576, 4096, folded=True, glu=True) == (2, 2048, 4)  # two gate rows and their two up rows
    assert tiling(10, 3, folded=True) == (4, 4, 4)


def test_the_batch_tiling_fits_the_shared_memory_it_is_given():
    """A few rows: tiles of weight rows and of the rows padded to 16, as many chunks in flight as
    the block's shared memory holds (up to four), a smaller chunk where two would not fit."""
    for n, k, glu in ((6144, 4096, False), (4096, 12288, False), (12288, 4096, True), (6, 3, False)):
        for size in (2, 4):
            for shared in (232_448, 166_912, 101_376, 49_152):
                block_n, block_k, stages, warps = batch_tiling(n, k, glu, size, shared)
                assert 16 <= block_n <= 64 and 16 <= block_k <= max(16, 2 * k) and 1 <= stages <= 4
                assert warps == (8 if glu else 4)
                assert stages * (block_n * (2 if glu else 1) + MAX_ROWS) * block_k * size <= shared
                assert stages >= 2 or block_k == 16
    # the fastest of the batch-4 sweep at each Qwen3-8B shape on an H200
    assert batch_tiling(6144, 4096) == batch_tiling(4096, 4096) == (64, 256, 4, 4)
    assert batch_tiling(4096, 12288) == (32, 512, 4, 4)
    assert batch_tiling(12288, 4096, glu=True) == (64, 128, 3, 8)
    assert batch_tiling(4096, 12288, shared=166_912) == (32, 512, 3, 4)  # an A100's block
    assert batch_tiling(6, 3) == (16, 16, 4, 4)  # one masked tile


@on_gpu
@pytest.mark.parametrize("rows", [1, 2, 4, 16])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("n,k", [(6144, 4096), (4096, 12288), (37, 1536), (8963, 1536), (1536, 8960), (5, 3)])
def test_on_a_gpu_a_step_s_rows_get_cublas_result_to_the_rounding(rows, dtype, n, k):
    x, w, b = operands(n, k, rows, dtype=dtype, device="cuda", bias=n % 2 == 1)
    if dtype == torch.float32 and rows > 1:  # the reference dtype's sums stay cuBLAS's
        assert why_not(x, w, b) == "float32 rows beyond one" and folded(x, w, b) is None
        return
    assert why_not(x, w, b) is None
    ours, ref = folded(x, w, b), linear(x, w, b)
    assert ours is not None
    assert ours.shape == ref.shape and ours.dtype == ref.dtype
    exact = linear(x.double(), w.double(), None if b is None else b.double())
    # summed in float32 in another order: as close to the exact product as cuBLAS, to a rounding
    ulp = torch.finfo(dtype).eps * exact.abs().max().item()
    assert (ours.double() - exact).abs().max().item() <= 2 * (ref.double() - exact).abs().max().item() + ulp


@on_gpu
@pytest.mark.parametrize("rows", [1, 4, 16])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("n,k", [(6144, 4096), (4096, 12288), (38, 1536), (1536, 8960), (6, 3)])
@pytest.mark.parametrize("fold", [f for f in FOLDS if f != "plain"])
def test_on_a_gpu_a_folded_product_gets_the_steps_result_to_the_rounding(rows, dtype, n, k, fold):
    """The norm, the MLP's activation and the residual add folded into the product are as close
    to the steps' float64 result as the steps one by one (transformers' roundings of each step's
    output) are, to a rounding: the sums run in another order, and the normed rows are rounded
    at another point."""
    x, w, b = operands(n, k, rows, dtype=dtype, device="cuda", bias=n % 4 == 2)
    x = 3 * x  # a norm that changes the row
    extra = folds_for(x, n, **FOLDS[fold])
    if dtype == torch.float32 and rows > 1:
        assert why_not(x, w, b, **extra) == "float32 rows beyond one" and folded(x, w, b, **extra) is None
        return
    assert why_not(x, w, b, **extra) is None
    ours, ref = folded(x, w, b, **extra), composed(x, w, b, **extra)
    assert ours is not None and ours.shape == ref.shape and ours.dtype == ref.dtype
    exact = composed(x, w, b, **extra, exact=True)
    ulp = torch.finfo(dtype).eps * exact.abs().max().item()
    assert (ours.double() - exact).abs().max().item() <= 2 * (ref.double() - exact).abs().max().item() + 2 * ulp


@on_gpu
@pytest.mark.parametrize("rows", [1, 4])
def test_on_a_gpu_every_tiling_gives_the_same_product(rows):
    """The benchmark's sweeps (`analyses/bench_matvec.py`) time other tilings of the same sums."""
    dtype = torch.float32 if rows == 1 else torch.bfloat16  # float32 rows beyond one are cuBLAS's
    x, w, b = operands(300, 2048, rows, dtype=dtype, device="cuda")
    extra = folds_for(x, 300, norm=True, residual=True)
    ref = launch(x, w, b, **extra)
    tilings = (((1, 512, 4), (2, 1024, 8), (4, 2048, 4), (8, 256, 4)) if rows == 1 else
               ((16, 128, 2, 4), (32, 256, 3, 8), (64, 64, 4, 4), (16, 512, 1, 4)))
    for tiles in tilings:  # summed in another order: bf16 outputs may differ in their last bit
        torch.testing.assert_close(launch(x, w, b, **extra, tiles=tiles), ref,
                                   **({"rtol": 1e-5, "atol": 1e-5} if rows == 1 else {}))


@on_gpu
def test_on_a_gpu_what_the_kernel_does_not_take_goes_to_linear():
    x, w, b = operands(64, 32, dtype=torch.bfloat16, device="cuda")
    cases = {
        f"more than {MAX_ROWS}": (torch.cat([x] * (MAX_ROWS + 1)), w, b),
        "dtypes": (x.double(), w.double(), b.double()),
        "not contiguous": (x, w.t().contiguous().t(), b),
        "not a product": (x, w[:, :16], b),
    }
    for name, bad in {"residual": x[..., :63], "norm": (x[0, 0, :31], 1e-6)}.items():
        assert f"a {'norm weight' if name == 'norm' else name} of shape" in why_not(x, w, b, **{name: bad})
    assert why_not(x, w[:63], b[:63], glu=True) == "a gate and up projection of 63 rows"
    assert why_not(x, w, b, glu=True, residual=x[..., :31]) == "a residual of shape (1, 1, 31)"
    for reason, args in cases.items():
        assert reason in why_not(*args)
        if reason != "not a product":
            assert folded(*args) is None
            torch.testing.assert_close(WITH_KERNEL.product(*args), linear(*args), rtol=0, atol=0)


@on_gpu
@pytest.mark.parametrize("rows", [1, 4])
def test_on_a_gpu_it_replays_in_a_cuda_graph(rows):
    x, w, b = operands(300, 2048, rows, dtype=torch.bfloat16, device="cuda")
    expected = folded(x, w, b)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = folded(x, w, b)
    x.copy_(2 * x)
    graph.replay()
    torch.testing.assert_close(out, folded(x, w, b), rtol=0, atol=0)
    assert not torch.equal(out, expected)


def test_the_static_backend_option_is_checked_before_a_model_loads(tiny_llama):
    with pytest.raises(ConfigError, match="matvec is True, False or None"):
        backends.StaticOptions(matvec="yes")
    with pytest.raises(ConfigError, match="matrix-vector kernel needs a CUDA device"):
        backends.make_backend(tiny_llama, "static", matvec=True)
    with pytest.raises(ConfigError, match="the sdpa backend has no option matvec"):
        backends.BackendSpec("sdpa", matvec=False)
    described = backends.BackendSpec("static").described(tiny_llama)
    assert described["triton_matvec"] is False  # on a CPU every product is torch's


PROMPTS = ["You can travel from Paris to Berlin by train. Rome is quiet. " * 6 + "Give a route.",
           "Oslo has a harbour. Bergen is rainy. " * 3 + "Which city has a harbour?"]


def kernel_case(model, monkeypatch, record_positions: bool = True):
    """Heads, methods and backends to decode `model` with and without the kernels, and the list
    each call of `folded` by the static backend appends to: (rows, whether a kernel ran)."""
    s = model.spec
    heads = HeadSet([(1, 0), (2, 3), (1, 2)], model=s.name, n_layers=s.n_layers, n_heads=s.n_heads,
                    n_kv_heads=s.n_kv_heads)
    methods = {"vanilla": DecodingConfig(method="vanilla", max_new_tokens=10),
               "dysco": DecodingConfig(params={"beta": 4.0, "select_p": 0.7}, max_new_tokens=10,
                                       record_positions=record_positions)}
    calls = []

    def counted(x, w, b=None, **extra):
        out = folded(x, w, b, **extra)
        calls.append((matvec_module.rows_of(x), out is not None))
        return out

    from dysco_interp.decoding.backends import static

    monkeypatch.setattr(static, "folded", counted)
    specs = {"triton": backends.BackendSpec("static", matvec=True),
             "cublas": backends.BackendSpec("static", matvec=False), "sdpa": backends.BackendSpec("sdpa")}
    return heads, methods, specs, calls


@on_gpu
@pytest.mark.parametrize("style", STYLES)
def test_on_a_gpu_the_kernels_decode_the_tokens_of_cublas(style, monkeypatch):
    """Every decoding step's products of one row go through the kernel, and the tokens and DySCO's
    selections are those of cuBLAS and of the sdpa backend (float32 weights, every style: one the
    written-out decoder does not run keeps the transformers forward)."""
    model = tiny_model(style, device="cuda")
    heads, methods, specs, calls = kernel_case(model, monkeypatch)
    # one prompt at a time: a step of one row
    out = {name: [compare_methods(model, p, methods, heads, backend=spec) for p in PROMPTS]
           for name, spec in specs.items()}
    # each step's products of its one row, where the written-out decoder runs the model (a first
    # prefill of a shape runs eagerly, through cuBLAS); elsewhere the transformers forward does them
    ran = [r for _, r in calls]
    assert all(ran) and bool(ran) == backends.BackendSpec("static").described(model)["written_out_decoder"]
    for name in methods:
        for runs in zip(out["triton"], out["cublas"], out["sdpa"]):
            ours, ref, other = (run[name] for run in runs)
            assert ours.tokens == ref.tokens == other.tokens, name
            steps = [[(t.position, t.selected) for t in r.trace.steps] for r in (ours, ref, other)]
            assert steps[0] == steps[1] == steps[2], name


@on_gpu
@pytest.mark.parametrize("style", STYLES)
def test_on_a_gpu_the_few_rows_kernel_scores_a_batch_as_close_to_cublas_as_another_path(style, monkeypatch):
    """A batch's steps (two rows in bf16: float32 rows beyond one stay with cuBLAS) go through the
    kernel for a few rows. Greedy tokens of a random bf16 model part at near ties wherever the
    last bits differ (they did within 10 tokens), so the check is teacher forced on cuBLAS's own
    tokens: the gold tokens' log-probabilities are as close to cuBLAS's as the sdpa backend's
    (another bf16 path; 0.03-0.06 nats apart on the CPU) to a rounding, and the argmax is
    cuBLAS's wherever its margin is clear of that."""
    model = tiny_model(style, device="cuda", dtype=torch.bfloat16)
    heads, methods, specs, calls = kernel_case(model, monkeypatch, record_positions=False)
    gold = [r.tokens for r in generate_batch(model, PROMPTS, methods, heads, backend=specs["cublas"])["vanilla"]]
    calls.clear()
    out = {name: generate_batch(model, PROMPTS, methods, heads, backend=spec, forced=gold)
           for name, spec in specs.items()}
    steps = [(n, ran) for n, ran in calls if n <= MAX_ROWS]  # a compiled prefill's chunks are cuBLAS's
    assert bool(steps) == backends.BackendSpec("static").described(model)["written_out_decoder"]
    assert all(ran and n == 2 for n, ran in steps)
    scores = {name: [r.forced for m in methods for r in out[name][m]] for name in specs}
    logprob = {name: torch.tensor([f.logprob for f in forced]) for name, forced in scores.items()}
    ref = logprob["cublas"]
    rounding = torch.finfo(torch.bfloat16).eps * (1 + ref.abs().max().item())  # a bf16 logit's last bit
    bound = 2 * (logprob["sdpa"] - ref).abs().max().item() + rounding
    assert (logprob["triton"] - ref).abs().max().item() <= bound
    for ours, theirs in zip(scores["triton"], scores["cublas"]):
        for a, b, margin in zip(ours.argmax, theirs.argmax, theirs.margin):
            assert a == b or margin <= 2 * bound


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a machine without a GPU")
def test_the_benchmark_says_in_one_line_that_it_needs_a_gpu(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "analyses" / "bench_matvec.py"
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(script), "--out", str(out)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode != 0 and not out.exists()
    assert proc.stderr.strip().splitlines() == [
        "bench_matvec times the Triton kernel: it needs a CUDA device and Triton"]
    proc = subprocess.run([sys.executable, str(script), "--copies", "0", "--out", str(out)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "positive" in proc.stderr
    proc = subprocess.run([sys.executable, str(script), "--batch", "17", "--out", str(out)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "--batch is 1 to 16" in proc.stderr


@pytest.mark.parametrize("name", ["qkv", "o", "gate_up", "down"])
def test_the_benchmark_s_cublas_way_takes_each_product_s_steps(name):
    """`analyses/bench_matvec.py` times the decoder's own steps without the kernel: on the CPU its
    cuBLAS way is the steps one by one (the kernel's ways need a GPU)."""
    from dysco_interp.analysis import bench_matvec

    product = bench_matvec.Product(name, 12, 8)
    weights, x, extra = bench_matvec.operands(product, 1, torch.float32, torch.device("cpu"))
    run = bench_matvec.variants(x, extra, (), pieces=EAGER)["cublas, steps apart"]
    torch.testing.assert_close(run(weights[0]), composed(x, weights[0], None, **extra), rtol=0, atol=0)

"""Shared fixtures and helpers of the pytest suite.

The kernel cache is pointed at a fresh temporary directory *before* `attnfuse` is imported
anywhere, so a test run never reads entries a previous run (or another checkout) wrote and
never litters the user's `~/.cache/attnfuse`. Under pytest-xdist (`-n 2`, README's test
command) the workers share the directory the controlling process made, as processes share a
kernel cache anywhere (its writes are atomic renames, `runtime/cache.py`): each kernel is then
compiled once per run, not once per worker; the controlling process removes it at the end.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

_SHARED = os.environ.get("ATTNFUSE_TEST_CACHE_DIR") if os.environ.get("PYTEST_XDIST_WORKER") else None
_CACHE_DIR = _SHARED or tempfile.mkdtemp(prefix="attnfuse-test-cache-")
_OWNS_CACHE_DIR = _SHARED is None
# Workers, started after this module is imported in the controlling process, inherit it.
os.environ["ATTNFUSE_TEST_CACHE_DIR"] = _CACHE_DIR
os.environ["ATTNFUSE_CACHE_DIR"] = _CACHE_DIR
# Inductor's caches too: a graph cached by another run would hide a change of a fake kernel.
os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(_CACHE_DIR, "inductor")

import pytest  # noqa: E402
import torch  # noqa: E402

import attnfuse as af  # noqa: E402,F401

HAS_CUDA = torch.cuda.is_available()
# Kernels of CPU tensors run on Triton's interpreter; on a CUDA machine the suite runs the CPU
# tests too only when the user asks for it with TRITON_INTERPRET=1.
INTERPRETER = not HAS_CUDA or os.environ.get("TRITON_INTERPRET", "0") == "1"

# Acceptance tolerances (DESIGN.md / the brief).
FP32_MAX_ABS = 1e-4
HALF_MAX_REL = 1e-2
# The log-sum-exp is fp32 whatever the inputs. Its error is bounded by the largest score
# error, which for 16-bit inputs is dominated by rounding the rotated q and k back to the input
# dtype before the product: see `lse_tolerance`.
LSE_ATOL = 1e-3


# --------------------------------------------------------------------------------------------
# Session plumbing
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def attnfuse_cache_dir():
    """The kernel cache directory of this test run (removed at its end, `pytest_unconfigure`)."""
    return _CACHE_DIR


@pytest.fixture(autouse=True)
def _cuda_faults_belong_to_their_test(request):
    """After each test that used CUDA, waits for its kernels, so that a kernel's fault (an
    illegal address or instruction) is reported at the test that launched it. A fault is
    sticky: every later CUDA call of the process fails. So the process ends there: an xdist
    worker exits (xdist reports the test as crashed and starts a fresh worker, with a fresh
    context), a serial run stops with the test's name, rather than failing every later test."""
    yield
    if not (HAS_CUDA and torch.cuda.is_initialized()):
        return
    try:
        torch.cuda.synchronize()
    except RuntimeError as err:  # torch.AcceleratorError is one
        message = f"CUDA fault in {request.node.nodeid}: {str(err).splitlines()[0]}"
        if os.environ.get("PYTEST_XDIST_WORKER"):
            sys.stderr.write(message + "\n")
            sys.stderr.flush()
            os._exit(3)
        pytest.exit(message, returncode=1)


def pytest_unconfigure(config):
    """The process that made the cache directory removes it, after its workers, if any, end."""
    if _OWNS_CACHE_DIR:
        shutil.rmtree(_CACHE_DIR, ignore_errors=True)


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "interpreter: runs generated kernels on CPU tensors through Triton's interpreter "
        "(skipped when TRITON_INTERPRET is off, as on a CUDA machine by default)",
    )


def pytest_collection_modifyitems(config, items):
    """`@pytest.mark.gpu` tests skip without a CUDA device (or under the interpreter, which
    would run them on the CPU at real sizes); `@pytest.mark.interpreter` tests skip when the
    interpreter is off (a CUDA machine: run them with TRITON_INTERPRET=1, or on a CPU one)."""
    skip_gpu = None
    if not HAS_CUDA:
        skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    elif INTERPRETER:
        skip_gpu = pytest.mark.skip(reason="TRITON_INTERPRET=1: GPU tests need compiled kernels")
    skip_interp = pytest.mark.skip(reason="needs Triton's interpreter (TRITON_INTERPRET=1)")
    for item in items:
        if skip_gpu is not None and "gpu" in item.keywords:
            item.add_marker(skip_gpu)
        if not INTERPRETER and "interpreter" in item.keywords:
            item.add_marker(skip_interp)


# --------------------------------------------------------------------------------------------
# Numerics helpers
# --------------------------------------------------------------------------------------------


def error_of(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> float:
    """The quantity the tolerance applies to: max abs error in fp32, relative L2 otherwise."""
    o, r = out.detach().to("cpu", torch.float64), ref.detach().to("cpu", torch.float64)
    if dtype == torch.float32:
        return (o - r).abs().max().item() if o.numel() else 0.0
    denom = r.norm().item()
    num = (o - r).norm().item()
    if denom == 0.0:
        return num
    return num / denom


def assert_close_to_reference(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    """Acceptance: fp32 max abs error <= 1e-4; fp16/bf16 ||out-ref||/||ref|| <= 1e-2.

    NaN (or inf) in the output never passes, whatever the reference says.
    """
    assert out.dtype == dtype, f"output dtype {out.dtype}, expected {dtype}"
    assert tuple(out.shape) == tuple(ref.shape), f"shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    o = out.detach().to("cpu", torch.float64)
    assert not torch.isnan(o).any(), f"output has {int(torch.isnan(o).sum())} NaN values"
    assert torch.isfinite(o).all(), "output has non-finite values"
    err = error_of(out, ref, dtype)
    if dtype == torch.float32:
        assert err <= FP32_MAX_ABS, f"fp32 max abs error {err:.3e} > {FP32_MAX_ABS:.0e}"
    else:
        assert err <= HALF_MAX_REL, f"{dtype} relative error {err:.3e} > {HALF_MAX_REL:.0e}"


def lse_tolerance(spec, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Per-row lse tolerance `[B, Hq, Nq]`: 1e-3, plus for 16-bit inputs the score error of
    rounding each of q~ and k~ once to the input dtype, `2 * eps * scale * |q_i| * max_j |k_j|`
    (an upper bound on |s_ij|). The lse moves by at most the largest score error of its row."""
    from attnfuse.dsl.blocks import ScaledDotProduct

    dtype = q.dtype
    q, k = q.detach().cpu().double(), k.detach().cpu().double()
    base = torch.full(q.shape[:3], LSE_ATOL, dtype=torch.float64)
    if dtype not in (torch.float16, torch.bfloat16) or q.numel() == 0 or k.numel() == 0:
        return base
    sdp = spec.block(ScaledDotProduct)
    scale = sdp.scale if isinstance(sdp, ScaledDotProduct) and sdp.scale is not None else q.shape[-1] ** -0.5
    eps = torch.finfo(dtype).eps
    k_max = k.norm(dim=-1).amax(dim=-1)  # [B, Hkv]
    k_max = k_max.repeat_interleave(q.shape[1] // k.shape[1], dim=1)[..., None]
    return base + 2 * eps * scale * q.norm(dim=-1) * k_max


def assert_lse_close(
    lse: torch.Tensor, ref_lse: torch.Tensor, atol: float | torch.Tensor = LSE_ATOL
) -> None:
    """The log-sum-exp is fp32 in every dtype; -inf rows must be exactly -inf in both.
    `atol`: a number or a per-row tensor (see `lse_tolerance`)."""
    assert lse.dtype == torch.float32, f"lse dtype {lse.dtype}, expected float32"
    assert tuple(lse.shape) == tuple(ref_lse.shape)
    lse, ref_lse = lse.detach().cpu().double(), ref_lse.detach().cpu().double()
    assert not torch.isnan(lse).any(), "lse has NaN values"
    ref_empty = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), ref_empty), "lse is -inf on other rows than the reference"
    assert torch.isfinite(lse[~ref_empty]).all()
    if (~ref_empty).any():
        atol = torch.as_tensor(atol, dtype=torch.float64).expand(lse.shape)
        err = (lse - ref_lse).abs()[~ref_empty]
        excess = err / atol[~ref_empty]
        worst = int(excess.argmax())
        assert excess[worst] <= 1, (
            f"lse error {err[worst].item():.3e} > tolerance {atol[~ref_empty][worst].item():.3e} "
            f"(max abs error {err.max().item():.3e})"
        )


def make_qkv(
    b: int = 1,
    hq: int = 2,
    hkv: int | None = None,
    nq: int = 32,
    nk: int | None = None,
    d: int = 32,
    dv: int | None = None,
    dtype: torch.dtype = torch.float32,
    *,
    seed: int = 0,
    strided: bool = False,
    device: str | torch.device = "cpu",
    requires_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Seeded random q [B,Hq,Nq,D], k [B,Hkv,Nk,D], v [B,Hkv,Nk,Dv] (never zeros).

    `strided=True` makes [B, N, H, D] tensors and returns their `.transpose(1, 2)` views, the
    layout a model's projections produce: the kernels must honour arbitrary strides.
    """
    hkv = hq if hkv is None else hkv
    nk = nq if nk is None else nk
    dv = d if dv is None else dv
    gen = torch.Generator().manual_seed(seed)

    def rand(h: int, n: int, dim: int) -> torch.Tensor:
        shape = (b, n, h, dim) if strided else (b, h, n, dim)
        t = torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype).to(device)
        if strided:
            t = t.transpose(1, 2)
        return t.requires_grad_(requires_grad) if requires_grad else t

    q, k, v = rand(hq, nq, d), rand(hkv, nk, d), rand(hkv, nk, dv)
    if strided and min(q.shape) > 1:
        assert not q.is_contiguous()
    return q, k, v


def check_against_formula(spec, formula, q, k, v, seed: int = 1, **call) -> None:
    """`spec(q, k, v, **call)` and its q, k, v gradients against `formula(q, k, v)` written out
    in float64 by the test (autograd through it), with the float64 bounds the block tests use."""
    out = spec(q, k, v, **call)
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    expected = formula(qd, kd, vd)
    torch.testing.assert_close(out.double(), expected.detach(), rtol=2e-5, atol=2e-6)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
    out.backward(grad)
    expected.backward(grad.double())
    for got, want in ((q.grad, qd.grad), (k.grad, kd.grad), (v.grad, vd.grad)):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)


def check_against_reference(fn, spec, q, k, v, *, lse: bool = True, **kwargs):
    """Runs `fn` (a spec or compiled function) and checks output (and lse) against the reference."""
    if lse:
        out, out_lse = fn(q, k, v, return_lse=True, **kwargs)
        ref, ref_lse = af.reference_attention(spec, q, k, v, return_lse=True)
        assert_close_to_reference(out, ref, q.dtype)
        assert_lse_close(out_lse, ref_lse, lse_tolerance(spec, q, k))
        return out, out_lse
    out = fn(q, k, v, **kwargs)
    ref = af.reference_attention(spec, q, k, v)
    assert_close_to_reference(out, ref, q.dtype)
    return out


GRAD_TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 2e-2}
"""Relative L2 error of each gradient against the float64 reference (`gradient_errors`)."""


def check_forward_backward(spec, q, k, v, *, lse: bool = False, lse_slack: float = 3.0, **call):
    """Forward (and, with `lse`, the log-sum-exp, within `lse_slack` times `lse_tolerance`)
    and backward through the kernels, checked against the float64 reference: the output's
    tolerance of `assert_close_to_reference`, each gradient's relative L2 error within
    `GRAD_TOLERANCE`. A `bias=` that requires grad has its gradient checked too."""
    from attnfuse.runtime.reference import gradient_errors, reference_gradients

    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    if lse:
        out, out_lse = spec(q, k, v, return_lse=True, **call)
        ref, ref_lse = af.reference_attention(spec, q, k, v, return_lse=True, **call)
        assert_lse_close(out_lse, ref_lse, lse_tolerance(spec, q, k) * lse_slack)
    else:
        out = spec(q, k, v, **call)
        ref = af.reference_attention(spec, q, k, v, **call)
    assert_close_to_reference(out, ref, q.dtype)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(out.dtype)
    out.backward(grad_out)
    got = {"q": q.grad, "k": k.grad, "v": v.grad}
    bias = call.get("bias")
    if bias is not None and bias.requires_grad:
        got["bias"] = bias.grad
    errors = gradient_errors(got, reference_gradients(spec, q, k, v, grad_out, **call))
    for name, err in errors.items():
        assert err <= GRAD_TOLERANCE[q.dtype], f"d{name}: relative error {err:.2e} ({errors})"
    return out


class NoFallback:
    """Stands in for a Gluon launch's portable fallback (`launch.portable`): the same kernel
    info, and a call that fails the test, so a passing call is known to have run the Gluon
    kernel."""

    def __init__(self, portable):
        self.info = portable.info
        self.check_grid = portable.check_grid

    def __call__(self, tensors):
        raise AssertionError("the call fell back to the portable kernel")


def direct_then_graphed(steps, monkeypatch):
    """`steps(mode)` run with launch graphs off ("direct"), then on ("graphed"); both results.
    Fails unless some schedule replayed as a graph in the second run and no capture failed."""
    from attnfuse.runtime import launch_graphs

    replays = record_graph_replays(monkeypatch)
    monkeypatch.setattr(launch_graphs, "ENABLED", False)
    direct = steps("direct")
    monkeypatch.setattr(launch_graphs, "ENABLED", True)
    graphed = steps("graphed")
    assert any(replayed for replayed, _failed in replays), f"no launches replayed as a graph: {replays}"
    assert all(failed is None for _replayed, failed in replays), replays
    return direct, graphed


def record_graph_replays(monkeypatch) -> list[tuple[bool, str | None]]:
    """Every `LaunchGraphs` call from now on: (whether it ran its launches as a CUDA graph, why
    its schedule's capture failed or None)."""
    from attnfuse.runtime.launch_graphs import LaunchGraphs

    calls: list[tuple[bool, str | None]] = []
    original = LaunchGraphs.__call__

    def recorded(self, tensors):
        calls.append((original(self, tensors), self.failed))
        return calls[-1][0]

    monkeypatch.setattr(LaunchGraphs, "__call__", recorded)
    return calls


def gluon_only(launch, monkeypatch) -> None:
    """Make `launch` (a `GluonLaunch` or `GluonBackwardLaunch`) fail the test if it falls back."""
    monkeypatch.setattr(launch, "portable", NoFallback(launch.portable))


@pytest.fixture
def index_tile_blocks():
    """The out-of-tree blocks that read positions and heads (test/python/blocks), registered
    for the test: FIRE's bias, chunked attention and StreamingLLM's sinks and window."""
    from blocks import chunk_block, fire_block, sink_window_block

    from attnfuse.blocks import register_block_module, unregister_block_module

    modules = (fire_block, chunk_block, sink_window_block)
    for module in modules:
        register_block_module(module)
    yield {"fire": lambda: af.attention(fire_block.fire_log(0.8, 0.5, 6.0)),
           "fire-causal": lambda: af.attention(fire_block.fire_log(0.8, 0.5, 6.0), af.causal()),
           "chunked-24": lambda: af.attention(chunk_block.chunked(24), af.causal()),
           "chunked-7": lambda: af.attention(chunk_block.chunked(7), af.causal()),
           "sink-window": lambda: af.attention(sink_window_block.sink_window(4, 200), af.causal())}
    for module in modules:
        unregister_block_module(module)


@pytest.fixture
def launched(monkeypatch) -> list[str]:
    """The names of the kernels launched while the test runs, in order."""
    from attnfuse.runtime.launch import KernelLaunch

    names: list[str] = []
    original = KernelLaunch.__call__
    monkeypatch.setattr(KernelLaunch, "__call__",
                        lambda self, tensors: (names.append(self.info.name), original(self, tensors))[1])
    return names


# --------------------------------------------------------------------------------------------
# Gluon kernels compiled for sm_90 ahead of time (no GPU needed)
# --------------------------------------------------------------------------------------------


class _TargetOnlyDriver:
    """What an ahead-of-time compile asks Triton's driver for: a device, a stream, a target."""

    def __init__(self, target):
        self.target = target

    def get_current_device(self):
        return 0

    def get_current_stream(self, _device):
        return 0

    def get_current_target(self):
        return self.target




@pytest.fixture
def sm90():
    """Triton's active driver replaced by one that only names sm_90 (restored after)."""
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    # The previous active driver as it was (None until first asked for: on a machine without
    # a GPU, asking would fail), so that later tests see what they would have seen.
    previous = driver._active
    driver.set_active(_TargetOnlyDriver(GPUTarget("cuda", 90, 32)))
    try:
        yield
    finally:
        driver._active = previous


def gluon_forward_for_sm90(spec, head_dim: int, consumers: int = 2, persistent: bool = False):
    """`(program, compiled)`: `spec`'s Gluon forward, lowered with the schedule options the
    runtime gives `head_dim` and `consumers` (`gluon_forward.SCHEDULES`), printed, imported as
    the runtime imports it and compiled for sm_90 (under the `sm90` fixture, without
    TRITON_INTERPRET) at N = 256, 4 heads, bf16, over a model's `[B, N, H, D]` layout."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from attnfuse.dialects import make_context
    from attnfuse.lowering.gluon import emit_gluon_kernel
    from attnfuse.runtime import gluon_forward
    from attnfuse.runtime.compiler import CompileKey, lower_spec
    from attnfuse.runtime.config import TileConfig
    from attnfuse.transforms.warp_specialize import WarpSpecializePass

    module = lower_spec(spec, CompileKey(head_dim, head_dim, "bf16", TileConfig(64, 64, 4, 2), ("fused", "fused")))
    WarpSpecializePass(**gluon_forward.SCHEDULES[head_dim].options(consumers, persistent)).apply(make_context(), module)
    program = emit_gluon_kernel(next(op for op in module.ops if op.sym_name.data == "attention_fwd"))
    kernel = program.kernels[0]
    # Stored and imported as the runtime does it (`gluon_forward._gluon_module`).
    printed = gluon_forward._gluon_module(program.source)
    # A [B, N, H, D] projection seen as [B, H, N, D], as models pass q, k and v.
    x = torch.empty(1, 256, 4, head_dim, dtype=torch.bfloat16).transpose(1, 2)
    rows = gl.NVMMASharedLayout.get_default_for([1, 1, 64, head_dim], gl.bfloat16)
    keys = gl.NVMMASharedLayout.get_default_for([1, 1, kernel.block_n, head_dim], gl.bfloat16)
    descs = [TensorDescriptor(x, list(x.shape), list(x.stride()), [1, 1, n, head_dim], layout)
             for n, layout in ((64, rows), (kernel.block_n, keys), (kernel.block_n, keys), (64, rows))]
    lse, slopes = torch.empty(1, 4, 256), torch.empty(4)
    bias = torch.empty(1, 4, 256, 256, dtype=torch.bfloat16).expand(2, 4, 256, 256)  # a broadcast batch
    pointers: list[object] = []
    for role in kernel.roles:
        if role in kernel.operands:
            continue
        pointers += {"lse": [lse, *lse.stride()], "bias": [bias, *bias.stride()]}.get(role, [slopes])
    batch_heads = [4] if persistent else []  # the persistent launch's tile count
    compiled = printed.attention_fwd.warmup(*descs, *pointers, 0.1, 256, 256, 4, 1, *batch_heads, grid=(1,),
                                            num_warps=4)
    return program, compiled


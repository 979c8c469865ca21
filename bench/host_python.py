"""AttnFuse's own host work per call, without a GPU: the kernel launches replaced by no-ops, so
what is timed is the Python of a call (checks, plan lookup, block lists, allocations, autograd
glue) and PyTorch's autograd engine, on the CPU.

A training step on the H200 costs the host a few tenths of a ms (`bench/host_overhead.py`,
which needs a GPU); this script measures the part that does not depend on Triton's launcher,
so that host-side changes can be checked on a machine without one.

    python bench/host_python.py [--steps 3000] [--repeat 1] [--cases rope,causal,...] [--launch stub|direct]
                                [--profile CASE]

Per case it prints microseconds per inference forward (under `torch.no_grad()`) and per
training step (forward + backward, the gradients reset to None each step as an optimizer's
zero_grad does), the launches each makes, and a *floor*: what any call path must do at
least, the same output / gradient allocations and the same number of (no-op) launches, in
a bare `torch.autograd.Function` for the step. Cases:

- `rope`: RoPE + causal at the Llama-3-8B head layout (Hq=32, Hkv=8, D=128), N=64;
- `ropepos`: as `rope`, with call-time positions (one `[N]` tensor for q and k, reused);
- `causal`: causal, B=1, H=8, N=128, D=64;
- `bias`: additive_bias (a `[1, H, N, N]` bias that requires a gradient), B=1, H=8, N=128, D=64;
- `sparse`: block_sparse(64), B=4, H=12, N=4096, D=64, one layout (8.6% dense) reused;
- `sparse2`: as `sparse`, two layouts alternating call by call (two layers of a model).

`--launch stub` replaces `KernelLaunch.__call__` (a launch costs nothing); `--launch direct`
keeps AttnFuse's launch path and replaces only the compiled kernel, as a GPU call with
Triton 3.6 (the H200's) takes it: argument and specialization building, Triton's runner and
launch metadata (the installed Triton's own code), a stand-in of 3.6's `CudaLauncher` and
a no-op C launch (`_Compiled`); the CUDA device and stream queries are stood in for by
C calls of the same shape (`stub_cuda_queries`). All tensors are fp16 on the CPU
and no kernel ever runs. Times are the calling thread's CPU time (`per_call_us`).

On a GPU a schedule of several launches (a training step's backward) replays as one CUDA graph
from the second call with the same tensors (`runtime/launch_graphs.py`); CPU tensors never take
that path, so this script's `direct` figures are a GPU call's with `ATTNFUSE_LAUNCH_GRAPHS=off`.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TRITON_INTERPRET", "1")  # kernels load for the interpreter (never run)

import torch
import triton.compiler.compiler as compiler_module
from triton.compiler.compiler import CompiledKernel
from types import SimpleNamespace
from host_overhead import print_profile  # bench/ is the script's directory

import attnfuse as af
from attnfuse.runtime import launch as launch_module

CASES = ("rope", "ropepos", "causal", "bias", "sparse", "sparse2")


REPEAT = 1
"""Blocks of `--steps` calls per measurement (`--repeat`); the fastest block counts."""


def per_call_us(step, steps: int) -> float:
    """Mean microseconds of this thread's CPU time per `step()` over `steps` calls, after a
    warm-up; with `REPEAT` > 1 the least of that many such blocks (other processes' load
    only ever slows a block down). CPU time, not wall time: on a shared machine, wall time
    also counts the slices other processes run in (on the CPU, autograd runs the backward on
    the calling thread)."""
    for _ in range(50):
        step()
    best = float("inf")
    for _block in range(REPEAT):
        start = time.thread_time()
        for _ in range(steps):
            step()
        best = min(best, (time.thread_time() - start) / steps * 1e6)
    return best


class _Kernel:
    """Stands in for a compiled kernel on the JIT's launch path: launching it returns an
    object shaped like Triton's compiled kernel (`_Compiled`), so that `KernelLaunch` takes
    its direct path from the second call on."""

    def __init__(self):
        self.params: list[object] = []

    def __getitem__(self, grid):
        def launch(*args, **_flags):
            param = type("Param", (), {"is_constexpr": False, "name": "", "default": None})
            self.params = [param] * len(args)
            return _Compiled()
        return launch


def _c_launch(grid_x, grid_y, grid_z, stream, function, cooperative, pdl, global_scratch,
              profile_scratch, kernel_metadata, launch_metadata, enter_hook, exit_hook, *args):
    """Stands in for the C launcher of Triton 3.6 (its argument order): it calls the launch
    hooks it is given, as that one does, and launches nothing."""
    if enter_hook is not None:
        enter_hook(launch_metadata)
    if exit_hook is not None:
        exit_hook(launch_metadata)


class CudaLauncher:
    """Stands in for Triton 3.6's NVIDIA `CudaLauncher` (same name and module, so that the
    direct launcher treats it as that one): its `__call__` works out the scratch buffers
    (none: both sizes are 0, as for AttnFuse's kernels) as that one does, then calls the C
    launcher, `_c_launch`."""

    num_ctas = 1
    global_scratch_size = global_scratch_align = 0
    profile_scratch_size = profile_scratch_align = 0
    launch_cooperative_grid = launch_pdl = False
    launch = staticmethod(_c_launch)

    def __call__(self, grid_x, grid_y, grid_z, stream, function, *args):
        def allocate_scratch(size, align):
            if size > 0:
                raise AssertionError("no scratch in this stand-in")
            return None

        global_scratch = allocate_scratch(self.global_scratch_size, self.global_scratch_align)
        profile_scratch = allocate_scratch(self.profile_scratch_size, self.profile_scratch_align)
        self.launch(grid_x, grid_y, grid_z, stream, function, self.launch_cooperative_grid,
                    self.launch_pdl, global_scratch, profile_scratch, *args)


CudaLauncher.__module__ = "triton.backends.nvidia.driver"


class _Compiled:
    """A compiled kernel as Triton 3.6's `CompiledKernel` (the H200's) is launched: its
    runner and launch metadata are the installed Triton's own methods (3.9's, the same
    code as 3.6's), its launcher a `CudaLauncher` stand-in; only the C launch is a no-op."""

    packed_metadata = (4, 1, 0)
    function = 0
    name = "stub"
    src = None
    metadata = None

    def __init__(self):
        self.run = CudaLauncher()

    def _init_handles(self):
        pass

    __getitem__ = CompiledKernel.__getitem__
    launch_metadata = CompiledKernel.launch_metadata


def stub_cuda_queries() -> None:
    """Stands in for the CUDA queries a launch makes (the CPU build of torch has none), with
    C calls of the same shape (`int()` is 0, `int(0)` is 0): the current device and its raw
    stream, in Triton's runner (through `triton.compiler.compiler.driver`) and in
    AttnFuse's direct launcher; the Triton version is taken as 3.6's, the H200's."""
    compiler_module.driver = SimpleNamespace(
        active=SimpleNamespace(get_current_device=int, get_current_stream=int))
    try:
        from attnfuse.runtime import triton_launcher
    except ImportError:
        return  # a checkout that launches through Triton's runner (compare_checkouts)
    triton_launcher.current_device = int
    triton_launcher.raw_stream = int
    triton_launcher.triton_version = lambda: (3, 6)


def direct_launch(launch) -> None:
    """Replaces the kernel of `launch` by a `_Kernel` (before its first launch)."""
    object.__setattr__(launch, "kernel", _Kernel())
    launch.__dict__.pop("constexpr_params", None)
    launch.runners.clear()


def make_case(name: str):
    """(compiled function, q, k, v, keyword arguments per call (a function of the call's
    index), output gradient, what the floor allocates per call)."""
    torch.manual_seed(0)
    f16 = dict(dtype=torch.float16)
    if name in ("rope", "ropepos"):
        fn = af.compile(af.attention(af.rope(theta=500000.0), af.causal()))
        b, hq, hkv, n, d = 1, 32, 8, 64, 128
    elif name == "causal":
        fn = af.compile(af.attention(af.causal()))
        b, hq, hkv, n, d = 1, 8, 8, 128, 64
    elif name == "bias":
        fn = af.compile(af.attention(af.additive_bias()))
        b, hq, hkv, n, d = 1, 8, 8, 128, 64
    else:
        fn = af.compile(af.attention(af.block_sparse(64)))
        b, hq, hkv, n, d = 4, 12, 12, 4096, 64
    q = torch.randn(b, hq, n, d, **f16, requires_grad=True)
    k = torch.randn(b, hkv, n, d, **f16, requires_grad=True)
    v = torch.randn(b, hkv, n, d, **f16, requires_grad=True)
    leaves = [q, k, v]
    if name == "bias":
        bias = torch.randn(1, hq, n, n, **f16, requires_grad=True)
        leaves.append(bias)
        kwargs = lambda i: {"bias": bias}  # noqa: E731
    elif name.startswith("sparse"):
        blocks = n // 64
        layouts = [torch.rand(blocks, blocks, generator=torch.Generator().manual_seed(s)) < 0.086
                   for s in range(2)]
        for layout in layouts:
            layout.fill_diagonal_(True)
        count = 1 if name == "sparse" else 2
        kwargs = lambda i: {"block_layout": layouts[i % count]}  # noqa: E731
    elif name == "ropepos":
        positions = torch.arange(n)
        kwargs = lambda i: {"q_positions": positions, "k_positions": positions}  # noqa: E731
    else:
        kwargs = lambda i: {}  # noqa: E731
    return fn, leaves, kwargs, torch.randn(b, hq, n, d, **f16)


class _Floor(torch.autograd.Function):
    """The least a training call does: allocate the output and log-sum-exp, launch, save
    q, k, v, o, lse; in the backward, allocate dq, dk, dv and delta, launch."""

    @staticmethod
    def forward(ctx, launches, q, k, v):
        b, h, n, _d = q.shape
        out = torch.empty(b, h, n, v.shape[-1], dtype=q.dtype)
        lse = torch.empty(b, h, n, dtype=torch.float32)
        for launch in launches[0]:
            launch({})
        ctx.launches = launches[1]
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype) for t in (q, k, v))
        torch.empty(lse.shape, dtype=torch.float32)
        for launch in ctx.launches:
            launch({})
        return None, dq, dk, dv


def run_case(name: str, steps: int, mode: str, profile: bool) -> None:
    fn, leaves, kwargs, grad_out = make_case(name)
    q, k, v = leaves[:3]
    launched: list[str] = []
    counter = [0]
    if mode == "stub":
        launch_module.KernelLaunch.__call__ = lambda self, tensors: launched.append(self.info.name)
    else:
        stub_cuda_queries()
        original = launch_module.KernelLaunch.__call__

        def direct(self, tensors):
            launched.append(self.info.name)
            if not isinstance(self.kernel, _Kernel):
                direct_launch(self)
            original(self, tensors)

        launch_module.KernelLaunch.__call__ = direct

    def forward():
        counter[0] += 1
        with torch.no_grad():
            fn(q, k, v, **kwargs(counter[0]))

    def training_step():
        counter[0] += 1
        for leaf in leaves:
            leaf.grad = None
        fn(q, k, v, **kwargs(counter[0])).backward(grad_out)

    def noop(_tensors):
        pass

    fwd_us = per_call_us(forward, steps)
    fwd_launches = len(launched) / (steps * REPEAT + 50)
    launched.clear()
    step_us = per_call_us(training_step, steps)
    step_launches = len(launched) / (steps * REPEAT + 50)
    names = ", ".join(sorted(set(launched)))
    nf, ns = round(fwd_launches), round(step_launches)
    # The floor's forward makes the forward's launches; its step, the step's split in one
    # forward launch and the rest in the backward.
    b, h, n, _d = q.shape

    def floor_forward():
        with torch.no_grad():
            torch.empty(b, h, n, v.shape[-1], dtype=q.dtype)
            torch.empty(b, h, n, dtype=torch.float32)
            for _ in range(nf):
                noop({})

    floor_launches = ([noop], [noop] * (ns - 1))

    def floor_step():
        for leaf in leaves:
            leaf.grad = None
        _Floor.apply(floor_launches, q, k, v).backward(grad_out)

    floor_fwd = per_call_us(floor_forward, steps)
    floor_step_us = per_call_us(floor_step, steps)
    print(f"{name:8s} forward {fwd_us:7.1f} us ({nf} launches; floor {floor_fwd:5.1f} us)   "
          f"training step {step_us:7.1f} us ({ns} launches; floor {floor_step_us:6.1f} us)   "
          f"[{names}]")
    if profile:
        print_profile(forward, 1000, top=30)
        print_profile(training_step, 1000, top=40)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--repeat", type=int, default=1,
                        help="blocks of --steps calls per figure; the fastest block is printed")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {','.join(CASES)}")
    parser.add_argument("--launch", choices=("stub", "direct"), default="direct")
    parser.add_argument("--profile", action="store_true", help="cProfile's top entries of each case")
    args = parser.parse_args()
    global REPEAT
    REPEAT = args.repeat
    torch.set_num_threads(1)  # host work is single-threaded; other threads only add jitter
    print(f"torch {torch.__version__}, launches: {args.launch}, {args.steps} calls per measurement")
    for name in args.cases.split(","):
        run_case(name, args.steps, args.launch, args.profile)


if __name__ == "__main__":
    main()

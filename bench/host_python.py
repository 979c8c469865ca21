"""AttnFuse's own host work per call, without a GPU: every kernel launch replaced by a no-op,
so what is timed is the Python of a call (checks, plan lookup, allocations, autograd glue) and
PyTorch's autograd engine, on the CPU.

A training step on the H200 costs the host about 0.7 ms (`bench/host_overhead.py`, which
needs a GPU); this script measures the part that does not depend on Triton's launcher, so
that host-side changes can be checked on a machine without one.

    python bench/host_python.py [--steps 2000] [--profile]

Prints microseconds per inference forward and per training step (forward + backward, the
gradients reset to None each step as an optimizer's zero_grad does) for RoPE + causal at the
Llama-3-8B head layout (Hq=32, Hkv=8, D=128) with N=64, and the launches a step makes.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TRITON_INTERPRET", "1")  # the one real call compiles for the interpreter

import torch
from host_overhead import print_profile  # bench/ is the script's directory

import attnfuse as af
from attnfuse.runtime import launch as launch_module


def per_call_us(step, steps: int) -> float:
    """Mean wall microseconds of `step()` over `steps` calls, after a warm-up."""
    for _ in range(50):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--profile", action="store_true", help="cProfile's top entries of a training step")
    args = parser.parse_args()
    fn = af.compile(af.attention(af.rope(theta=500000.0), af.causal()))
    q = torch.randn(1, 32, 64, 128, requires_grad=True)
    k = torch.randn(1, 8, 64, 128, requires_grad=True)
    v = torch.randn(1, 8, 64, 128, requires_grad=True)
    grad_out = torch.randn(1, 32, 64, 128)
    fn(q, k, v).backward(grad_out)  # compiles and runs the real kernels once

    launched: list[str] = []
    launch_module.KernelLaunch.__call__ = lambda self, tensors: launched.append(self.info.name)

    def forward():
        with torch.no_grad():
            fn(q, k, v)

    def training_step():
        for leaf in (q, k, v):
            leaf.grad = None
        fn(q, k, v).backward(grad_out)

    print(f"inference forward: {per_call_us(forward, args.steps):.1f} us per call")
    launched.clear()
    print(f"training step: {per_call_us(training_step, args.steps):.1f} us per step")
    print(f"launches per step: {len(launched) / (args.steps + 50):.0f} ({', '.join(sorted(set(launched)))})")
    if args.profile:
        print_profile(training_step, 500, top=25)


if __name__ == "__main__":
    main()

"""A training step's host cost with the autograd node made by the C apply directly
(`attention_autograd._apply_direct`, what a call does where `attention_autograd.DIRECT_APPLY`) against one made through
`Function.apply` (each monkeypatched in as `api.apply_attention` in turn), interleaved in one process so that the machine's load falls on both
alike: the part of `bench/host_python.py`'s step that `apply_attention` saves.

    python bench/host_apply_ab.py [--cases causal,rope] [--blocks 40] [--steps 300]

Launches as `host_python.py --launch direct` makes them (no kernel runs); times are the
thread's CPU time per step, fastest / 25th percentile / median block.
"""

from __future__ import annotations

import argparse
import time

import torch

import host_python  # bench/ is the script's directory (sets TRITON_INTERPRET first)
from attnfuse.runtime import api, attention_autograd
from attnfuse.runtime import launch as launch_module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="causal,rope")
    parser.add_argument("--blocks", type=int, default=40)
    parser.add_argument("--steps", type=int, default=300, help="steps per block")
    args = parser.parse_args()
    torch.set_num_threads(1)
    host_python.stub_cuda_queries()
    original = launch_module.KernelLaunch.__call__

    def direct(self, tensors):
        if not isinstance(self.kernel, host_python._Kernel):
            host_python.direct_launch(self)
        original(self, tensors)

    launch_module.KernelLaunch.__call__ = direct
    paths = {"direct C apply": attention_autograd._apply_direct, "Function.apply": attention_autograd._AttentionFunction.apply}
    restore = api.apply_attention
    try:
        for case in args.cases.split(","):
            fn, leaves, kwargs, grad_out = host_python.make_case(case)
            q, k, v = leaves[:3]

            def step():
                for leaf in leaves:
                    leaf.grad = None
                fn(q, k, v, **kwargs(0)).backward(grad_out)

            for _ in range(60):
                step()
            times: dict[str, list[float]] = {name: [] for name in paths}
            for _block in range(args.blocks):
                for name, apply in paths.items():
                    api.apply_attention = apply
                    start = time.thread_time()
                    for _ in range(args.steps):
                        step()
                    times[name].append((time.thread_time() - start) / args.steps * 1e6)
            for name, xs in times.items():
                xs.sort()
                print(f"{case:8s} {name:15s} fastest {xs[0]:6.1f}  p25 {xs[len(xs) // 4]:6.1f}  "
                      f"median {xs[len(xs) // 2]:6.1f} us per step")
    finally:
        api.apply_attention = restore


if __name__ == "__main__":
    main()

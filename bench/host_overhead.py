"""Host (CPU) cost of a call: what the Python side spends to enqueue one forward (+backward)
step, beside the peers, and where it goes.

    python bench/host_overhead.py [--seq-len 128] [--profile] [--small]

At a small sequence length the GPU finishes each kernel before the host has launched the next,
so the time to enqueue many steps back to back is the host's cost per step. Printed per
implementation: ms per forward and per forward+backward step, then microseconds per launch of
one backward kernel through `KernelLaunch`, and (with --profile) cProfile's top entries for
AttnFuse's forward+backward. `--small` instead runs plain causal attention at B=1 H=8 D=64 fp16
beside SDPA's default backend, forward and forward+backward (the host-bound shape of the
compare_checkouts runs), and skips the per-launch timings.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import torch
import torch.nn.functional as F

import attnfuse as af


def host_ms(step, iters: int = 300) -> float:
    """Mean host time per `step()` when enqueued back to back."""
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        step()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / iters * 1e3


def print_profile(step, iters: int, top: int = 30) -> None:
    """cProfile's `top` entries, by own time, over `iters` calls of `step()`."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(iters):
        step()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    print(text.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--small", action="store_true", help="causal, B=1 H=8 D=64 fp16, beside SDPA")
    args = parser.parse_args()
    n = args.seq_len
    torch.manual_seed(0)
    if args.small:
        small(n, args.profile)
        return
    q = torch.randn(1, 32, n, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, 8, n, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(1, 8, n, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad_out = torch.randn_like(q)
    fn = af.compile(af.attention(af.rope(theta=500000.0), af.causal()))

    def fwd():
        with torch.no_grad():
            fn(q, k, v)

    def fwd_bwd():
        fn(q, k, v).backward(grad_out)

    def cudnn_fwd_bwd():
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).backward(grad_out)

    print(f"N={n}: attnfuse fwd {host_ms(fwd):.3f} ms/step, fwd+bwd {host_ms(fwd_bwd):.3f} ms/step")
    try:
        print(f"N={n}: sdpa-cudnn (no rotation) fwd+bwd {host_ms(cudnn_fwd_bwd):.3f} ms/step")
    except Exception as err:  # cuDNN attention missing from this build
        print(f"sdpa-cudnn unavailable: {type(err).__name__}: {err}")

    # One backward kernel, launched alone.
    plan = fn.plan(q, k, v)
    with torch.no_grad():
        out, lse = fn.forward(plan, {}, q, k, v)
    tensors = {"q": q.detach(), "k": k.detach(), "v": v.detach(), "o": out, "lse": lse,
               "do": grad_out, "dq": torch.empty_like(q), "dk": torch.empty_like(k),
               "dv": torch.empty_like(v), "delta": torch.empty_like(lse),
               "q_rot": torch.empty_like(q), "k_rot": torch.empty_like(k), **plan.constants}
    for launch in plan.launches:
        launch(tensors)
        us = host_ms(lambda launch=launch: launch(tensors), iters=1000) * 1e3
        print(f"  launch {launch.info.name}: {len(launch.info.roles)} roles, {us:.1f} us")

    if args.profile:
        print_profile(fwd_bwd, 200)
        torch.cuda.synchronize()


def small(n: int, profile: bool) -> None:
    """Host cost of causal attention at B=1 H=8 D=64 fp16 against SDPA (default backend)."""
    q, k, v = (torch.randn(1, 8, n, 64, device="cuda", dtype=torch.float16, requires_grad=True)
               for _ in range(3))
    grad_out = torch.randn_like(q)
    fn = af.compile(af.attention(af.causal()))

    def fwd():
        with torch.no_grad():
            fn(q, k, v)

    def fwd_bwd():
        fn(q, k, v).backward(grad_out)

    def sdpa_fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def sdpa_fwd_bwd():
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad_out)

    print(f"N={n} causal B=1 H=8 D=64 fp16: attnfuse fwd {host_ms(fwd):.4f} ms/step, "
          f"fwd+bwd {host_ms(fwd_bwd):.4f} ms/step")
    print(f"N={n} causal B=1 H=8 D=64 fp16: sdpa fwd {host_ms(sdpa_fwd):.4f} ms/step, "
          f"fwd+bwd {host_ms(sdpa_fwd_bwd):.4f} ms/step")
    if profile:
        print_profile(fwd_bwd, 200)
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()

"""Where the compiled Gluon fused backward's time goes (torch.profiler, CUDA kernel times):
causal and RoPE + causal at the Llama-3-8B heads, bf16, N=8192, deterministic=False. H200 only.

    python3 bench/gluon_backward_profile.py
"""

from __future__ import annotations

import os

import torch
from torch.profiler import ProfilerActivity, profile

import attnfuse as af


def main() -> None:
    os.environ.setdefault("ATTNFUSE_BACKWARD_TARGET", "gluon")
    n = int(os.environ.get("N", 8192))
    for name, spec in (("causal", af.attention(af.causal())), ("rope+causal", af.attention(af.rope(), af.causal()))):
        fn = af.compile(spec, deterministic=False)
        q = torch.randn(1, 32, n, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(1, 8, n, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(1, 8, n, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        do = torch.randn(1, 32, n, 128, device="cuda", dtype=torch.bfloat16)
        out = fn(q, k, v)
        for _ in range(3):
            torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
            torch.cuda.synchronize()
        print(f"== {name} N={n}: CUDA time per backward (5 calls)")
        for event in sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:12]:
            print(f"  {event.device_time_total / 5 / 1000:8.3f} ms  x{event.count // 5:<3} {event.key[:90]}")


if __name__ == "__main__":
    main()

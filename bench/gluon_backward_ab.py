"""The compiler's Gluon fused backward beside the hand-written probe it follows
(bench/gluon_backward_probe.py, `wg2_writer_lse`) and cuDNN, at the Llama-3-8B heads (bf16,
B=1, 32/8 heads of 128), causal and dense, several rounds in one process: the dK/dV/dQ kernel
alone and the whole backward (autograd.grad with retain_graph; the probe: delta, the kernel,
the dQ conversion). ms, triton.testing.do_bench medians (L2 flushed). H200 only.

    python3 bench/gluon_backward_ab.py --seq-lens 4096,8192 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, os.path.dirname(__file__))

import attnfuse as af  # noqa: E402
from attnfuse.runtime.gluon_backward import GluonBackwardLaunch  # noqa: E402


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq-lens", default="4096,8192")
    parser.add_argument("--cases", default="causal,dense")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.environ["ATTNFUSE_BACKWARD_TARGET"] = "gluon"
    from gluon_backward_probe import Backward
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for case in args.cases.split(","):
        causal = case == "causal"
        spec = af.attention(af.causal()) if causal else af.attention()
        for n in (int(x) for x in args.seq_lens.split(",")):
            gen = torch.Generator(device="cuda").manual_seed(0)
            q = torch.randn(1, 32, n, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
            k = torch.randn(1, 8, n, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
            v = torch.randn(1, 8, n, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
            do = torch.randn(1, 32, n, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
            fn = af.compile(spec, deterministic=False)
            qa, ka, va = (t.clone().requires_grad_() for t in (q, k, v))
            out = fn(qa, ka, va)
            plan = fn.plan(qa, ka, va, training=True)
            launch = next(x for x in plan.launches if isinstance(x, GluonBackwardLaunch))
            with torch.no_grad():
                o, lse = fn(q, k, v, return_lse=True)
            tensors = {"q": q, "k": k, "v": v, "do": do, "lse": lse.contiguous(),
                       "delta": (o.float() * do.float()).sum(-1).contiguous(),
                       "dk": torch.empty_like(k), "dv": torch.empty_like(v),
                       "dq_acc": torch.zeros(q.shape, device="cuda", dtype=torch.float32)}
            probe = Backward("wg2_writer_lse", q, k, v, o, lse.contiguous(), do, causal)
            qc, kc, vc = (t.clone().requires_grad_() for t in (q, k, v))
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                out_c = F.scaled_dot_product_attention(qc, kc, vc, is_causal=causal, enable_gqa=True)
            impls = {
                "compiled kernel": lambda: launch(tensors),
                "probe kernel": probe.kernel,
                "compiled backward": lambda: torch.autograd.grad(out, (qa, ka, va), do, retain_graph=True),
                "probe backward": probe,
                "cuDNN backward": lambda: torch.autograd.grad(out_c, (qc, kc, vc), do, retain_graph=True),
            }
            for r in range(args.rounds):
                cells = [f"{label} {bench(impl):.3f}" for label, impl in impls.items()]
                print(f"{case} N={n} round {r}: " + " | ".join(cells), flush=True)
            print(f"  fallbacks {launch.fallbacks}", flush=True)
            # Host time of one backward call (launches queued, not waited for).
            import time
            portable = launch.portable
            impls["portable fused kernel"] = lambda: portable(tensors)
            for label in ("compiled kernel", "portable fused kernel", "compiled backward", "cuDNN backward"):
                torch.cuda.synchronize()
                times = []
                for _ in range(20):
                    start = time.perf_counter()
                    impls[label]()
                    times.append(time.perf_counter() - start)
                    torch.cuda.synchronize()
                times.sort()
                print(f"  host {label}: median {times[10] * 1e6:.0f} us", flush=True)


if __name__ == "__main__":
    main()

"""Time of each backward kernel alone (rotation, preprocess, dK/dV, dQ) for RoPE+causal at the
Llama-3-8B geometry, under several backward tile configurations: where the backward's time
goes, and which configuration suits each kernel.

    python bench/backward_kernels.py [--seq-lens 2048,4096]
"""

from __future__ import annotations

import argparse

import torch
import triton

import attnfuse as af

CONFIGS = [(128, 64, 8, 3), (128, 64, 8, 2), (64, 64, 4, 3), (64, 64, 4, 2), (128, 32, 8, 3),
           (64, 32, 4, 3), (128, 64, 4, 3), (128, 128, 8, 2)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seq-lens", default="2048,4096")
    args = parser.parse_args()
    spec = af.attention(af.rope(theta=500000.0), af.causal())
    for n in map(int, args.seq_lens.split(",")):
        torch.manual_seed(0)
        q = torch.randn(1, 32, n, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, 8, n, 128, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(1, 8, n, 128, device="cuda", dtype=torch.bfloat16)
        grad_out = torch.randn_like(q)
        for bwd in CONFIGS:
            fn = af.compile(spec, config=af.TileConfig(128, 64, 8, 3, *bwd))
            plan = fn.plan(q, k, v)
            out, lse = fn.forward(plan, {}, q, k, v)
            tensors = {"q": q, "k": k, "v": v, "o": out, "lse": lse, "do": grad_out,
                       "dq": torch.empty_like(q), "dk": torch.empty_like(k), "dv": torch.empty_like(v),
                       "delta": torch.empty_like(lse), "q_rot": torch.empty_like(q),
                       "k_rot": torch.empty_like(k), **plan.constants}
            times = []
            for launch in plan.launches:
                if launch.info.name == "attention_fwd":
                    continue
                try:
                    launch(tensors)  # compile, and fill what later kernels read
                    ms = triton.testing.do_bench(lambda: launch(tensors), warmup=10, rep=50,
                                                 return_mode="median")
                except Exception as err:
                    times.append(f"{launch.info.name} failed ({type(err).__name__})")
                    continue
                times.append(f"{launch.info.name} {ms:.4f}")
            print(f"N={n} bwd={bwd}: " + ", ".join(times), flush=True)


if __name__ == "__main__":
    main()

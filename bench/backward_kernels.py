"""Time of each backward kernel alone (rotation, preprocess, dQ forming delta, dK/dV, dQ) for RoPE+causal at the
Llama-3-8B geometry, sweeping the dQ and the dK/dV tile configurations independently: where
the backward's time goes, and which configuration suits each kernel.

    python bench/backward_kernels.py [--seq-lens 2048,4096] [--head-dim 128]
        [--dq-configs 64,64,4,2;128,64,8,3] [--dkdv-configs 64,32,4,3;128,32,4,5]

A configuration is block_m,block_n,num_warps,num_stages. Each line gives one kernel's median
time (triton.testing.do_bench) and its matrix-product throughput (causal FLOPs: the dQ kernel
does 3 products per block pair, dK/dV 4).
"""

from __future__ import annotations

import argparse
import itertools

import torch
import triton

import attnfuse as af

DQ_CONFIGS = [(64, 64, 4, 2), (128, 64, 8, 3), (128, 64, 8, 2), (128, 32, 8, 3), (64, 32, 4, 3),
              (128, 32, 4, 3), (64, 64, 4, 3)]
DKDV_CONFIGS = [cfg for cfg in itertools.product((64, 128), (16, 32, 64), (4, 8), (2, 3, 4))
                if not (cfg[0] == 128 and cfg[1] == 64 and cfg[2] == 4)]
PRODUCTS = {"attention_bwd_dq": 3, "attention_bwd_dq_delta": 3, "attention_bwd_dkdv": 4}
SWEPT_AS = {"attention_bwd_dq_delta": "attention_bwd_dq"}
"""Kernels that take another kernel's configuration (the dQ kernel that forms delta)."""


def parse_configs(text: str | None, default: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """`block_m,block_n,warps,stages;...` as tuples, or `default` when no text is given."""
    if not text:
        return default
    return [tuple(int(x) for x in part.split(",")) for part in text.split(";") if part]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seq-lens", default="2048,4096")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dq-configs")
    parser.add_argument("--dkdv-configs")
    args = parser.parse_args()
    spec = af.attention(af.rope(theta=500000.0), af.causal())
    dq_configs = parse_configs(args.dq_configs, DQ_CONFIGS)
    dkdv_configs = parse_configs(args.dkdv_configs, DKDV_CONFIGS)
    d = args.head_dim
    for n in map(int, args.seq_lens.split(",")):
        torch.manual_seed(0)
        q = torch.randn(1, 32, n, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, 8, n, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(1, 8, n, d, device="cuda", dtype=torch.bfloat16)
        grad_out = torch.randn_like(q)
        causal_flops = 2 * 32 * n * n * d / 2
        # The dQ sweep keeps dK/dV at its first configuration and the other way round.
        sweeps = [("attention_bwd_dq", cfg, dkdv_configs[0]) for cfg in dq_configs]
        sweeps += [("attention_bwd_dkdv", dq_configs[0], cfg) for cfg in dkdv_configs]
        for kernel, dq_cfg, dkdv_cfg in sweeps:
            fn = af.compile(spec, config=af.TileConfig(128, 64, 8, 3, *dq_cfg, *dkdv_cfg))
            plan = fn.plan(q, k, v)
            out, lse = fn.forward(plan, {}, q, k, v)
            tensors = {"q": q, "k": k, "v": v, "o": out, "lse": lse, "do": grad_out,
                       "dq": torch.empty_like(q), "dk": torch.empty_like(k), "dv": torch.empty_like(v),
                       "delta": torch.empty_like(lse), "q_rot": torch.empty_like(q),
                       "k_rot": torch.empty_like(k), **plan.constants}
            cfg = dq_cfg if kernel == "attention_bwd_dq" else dkdv_cfg
            times = []
            for launch in plan.launches:
                name = launch.info.name
                if name == "attention_fwd" or (name in PRODUCTS and SWEPT_AS.get(name, name) != kernel):
                    continue
                try:
                    launch(tensors)  # compile, and fill what later kernels read
                    ms = triton.testing.do_bench(lambda: launch(tensors), warmup=10, rep=50,
                                                 return_mode="median")
                except Exception as err:  # a configuration that does not fit is reported
                    times.append(f"{name} failed ({type(err).__name__})")
                    continue
                rate = ""
                if name in PRODUCTS:
                    compiled = launch.launch_jit(launch.arguments(tensors)[0], launch.shares_offsets(tensors))
                    rate = (f" ({PRODUCTS[name] * causal_flops / ms / 1e9:.0f} TFLOP/s, "
                            f"{compiled.n_regs} regs, {compiled.n_spills} spills, "
                            f"{compiled.metadata.shared} B shared)")
                times.append(f"{name} {ms:.4f}{rate}")
            print(f"N={n} D={d} {kernel} cfg={cfg}: " + ", ".join(times), flush=True)


if __name__ == "__main__":
    main()

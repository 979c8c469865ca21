"""Time of the forward attention kernel alone, and of a whole forward call, under a sweep of
forward tile configurations: which configuration suits the forward at a given shape.

    python bench/forward_kernels.py [--seq-lens 2048,4096] [--shape llama3-8b|paper]
        [--variants causal,rope_causal] [--configs 128,64,8,3;128,128,8,3]

A configuration is block_m,block_n,num_warps,num_stages. Each line gives the `attention_fwd`
kernel's median time (triton.testing.do_bench) with its throughput (causal FLOPs: 2 products),
registers, spills and shared memory, and the median time of the whole call `fn(q, k, v)`
(rotation kernels and host work included).
"""

from __future__ import annotations

import argparse
import itertools

import torch
import triton

import attnfuse as af
from backward_kernels import parse_configs  # bench/ is on the path of a script run from it

CONFIGS = [cfg for cfg in itertools.product((64, 128), (32, 64, 128), (4, 8), (2, 3, 4))
           if not (cfg[0] == 128 and cfg[2] == 4 and cfg[1] == 128)]
SHAPES = {"llama3-8b": (1, 32, 8, 128, torch.bfloat16), "paper": (4, 12, 12, 64, torch.float16)}
VARIANTS = {
    "causal": lambda: af.attention(af.causal()),
    "rope_causal": lambda: af.attention(af.rope(theta=500000.0), af.causal()),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seq-lens", default="4096")
    parser.add_argument("--shape", default="llama3-8b", choices=sorted(SHAPES))
    parser.add_argument("--variants", default="causal,rope_causal")
    parser.add_argument("--configs")
    args = parser.parse_args()
    b, hq, hkv, d, dtype = SHAPES[args.shape]
    configs = parse_configs(args.configs, CONFIGS)
    for n in map(int, args.seq_lens.split(",")):
        torch.manual_seed(0)
        q = torch.randn(b, hq, n, d, device="cuda", dtype=dtype)
        k = torch.randn(b, hkv, n, d, device="cuda", dtype=dtype)
        v = torch.randn(b, hkv, n, d, device="cuda", dtype=dtype)
        causal_flops = 2 * 2 * b * hq * n * n * d / 2
        for variant in args.variants.split(","):
            spec = VARIANTS[variant]()
            reference = None
            for cfg in configs:
                fn = af.compile(spec, config=af.TileConfig(*cfg, 64, 64, 4, 2, 64, 32, 4, 3))
                try:
                    with torch.no_grad():
                        out = fn(q, k, v)
                        call_ms = triton.testing.do_bench(lambda: fn(q, k, v), warmup=10, rep=100,
                                                          return_mode="median")
                    plan = fn.plan(q, k, v)
                    kernel = next(launch for launch in plan.launches if launch.info.name == "attention_fwd")
                    tensors = {"q": q, "k": k, "v": v, "o": torch.empty_like(q),
                               "lse": torch.empty(b, hq, n, device="cuda"),
                               "q_rot": q.clone(), "k_rot": k.clone(), **plan.constants}
                    kernel(tensors)
                    kernel_ms = triton.testing.do_bench(lambda: kernel(tensors), warmup=10, rep=100,
                                                        return_mode="median")
                    compiled = kernel.launch_jit(kernel.arguments(tensors)[0], kernel.shares_offsets(tensors))
                except Exception as err:  # a configuration that does not fit is reported
                    print(f"{args.shape} N={n} {variant} cfg={cfg}: failed ({type(err).__name__}: "
                          f"{str(err)[:80]})", flush=True)
                    continue
                if reference is None:
                    reference = out
                err = ((out.float() - reference.float()).norm() / reference.float().norm()).item()
                print(f"{args.shape} N={n} {variant} cfg={cfg}: attention_fwd {kernel_ms:.4f} ms "
                      f"({causal_flops / kernel_ms / 1e9:.0f} TFLOP/s, {compiled.n_regs} regs, "
                      f"{compiled.n_spills} spills, {compiled.metadata.shared} B shared), "
                      f"call {call_ms:.4f} ms, diff vs first cfg {err:.1e}", flush=True)


if __name__ == "__main__":
    main()

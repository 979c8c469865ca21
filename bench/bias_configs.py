"""Forward tile configurations for attention with an additive bias: which configuration
suits a kernel that streams a bias as large as the scores, and one whose bias is broadcast
(a key-padding row)? (docs/performance.md §3.)

    python bench/bias_configs.py

Causal attention at the Llama-3-8B geometry (B=1, Hq=32, Hkv=8, D=128, bf16) and the paper
shape (B=4, H=12, D=64, fp16), with no bias, a full [1, Hq, N, N] bias and a broadcast
[B, 1, 1, N] bias, each under five forward configurations (block_m, block_n, num_warps,
num_stages). Prints the median time of the whole forward call (triton.testing.do_bench).
"""

from __future__ import annotations

import torch
import triton

import attnfuse as af
from attnfuse.runtime.config import BACKWARD_HOPPER_D64, BACKWARD_HOPPER_D128

FORWARD_CONFIGS = [(64, 64, 4, 3), (128, 64, 8, 3), (64, 32, 4, 3), (128, 32, 8, 3), (128, 64, 8, 4)]
SHAPES = [  # label, B, Hq, Hkv, D, dtype, sequence lengths, backward tiles
    ("llama", 1, 32, 8, 128, torch.bfloat16, (2048, 4096), BACKWARD_HOPPER_D128),
    ("paper", 4, 12, 12, 64, torch.float16, (2048, 8192), BACKWARD_HOPPER_D64),
]


def main() -> None:
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, Triton {triton.__version__}; "
          "causal; forward call median ms (do_bench)")
    for label, b, hq, hkv, d, dtype, seq_lens, backward in SHAPES:
        for n in seq_lens:
            q = torch.randn(b, hq, n, d, device="cuda", dtype=dtype)
            k, v = (torch.randn(b, hkv, n, d, device="cuda", dtype=dtype) for _ in range(2))
            biases = {
                "none": None,
                "full [1,Hq,N,N]": torch.randn(1, hq, n, n, device="cuda", dtype=dtype),
                "key row [B,1,1,N]": torch.randn(b, 1, 1, n, device="cuda", dtype=dtype),
            }
            for name, bias in biases.items():
                blocks = [af.causal()] if bias is None else [af.causal(), af.additive_bias()]
                extra = {} if bias is None else {"bias": bias}
                timings = []
                for forward in FORWARD_CONFIGS:
                    fn = af.compile(af.attention(*blocks), config=af.TileConfig(*forward, *backward))
                    ms = triton.testing.do_bench(lambda fn=fn, extra=extra, q=q, k=k, v=v: fn(q, k, v, **extra),
                                                 warmup=25, rep=100, return_mode="median")
                    timings.append(f"{forward}: {ms:.4f}")
                print(f"{label} N={n} bias {name}: " + "; ".join(timings), flush=True)


if __name__ == "__main__":
    main()

"""Forward tile configurations for sliding-window attention at long sequences: does the
128-row D=64 forward that `choose_tile_config` uses for long causal rows also suit a window,
whose rows keep only `window` keys? (It does not: docs/performance.md §3.)

    python bench/window_configs.py

Paper shape (B=4, H=12, D=64, fp16), N=8192 and 16384: causal, and causal windows of 1024
and 4096 keys with and without RoPE, each under four forward configurations
(block_m, block_n, num_warps, num_stages). Prints the median time of the whole forward call
(triton.testing.do_bench).
"""

from __future__ import annotations

import torch
import triton

import attnfuse as af
from attnfuse.runtime.config import BACKWARD_HOPPER_D64

FORWARD_CONFIGS = [(64, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (64, 128, 4, 3)]
VARIANTS = {
    "causal": lambda window: [af.causal()],
    "window_causal": lambda window: [af.causal(), af.sliding_window(window)],
    "rope_window_causal": lambda window: [af.rope(), af.causal(), af.sliding_window(window)],
}


def main() -> None:
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, Triton {triton.__version__}; "
          "paper shape B=4 H=12 D=64 fp16, forward call median ms (do_bench)")
    for n in (8192, 16384):
        q, k, v = (torch.randn(4, 12, n, 64, device="cuda", dtype=torch.float16) for _ in range(3))
        for name, blocks in VARIANTS.items():
            for window in (0,) if name == "causal" else (1024, 4096):
                spec = af.attention(*blocks(window))
                timings = []
                for forward in FORWARD_CONFIGS:
                    fn = af.compile(spec, config=af.TileConfig(*forward, *BACKWARD_HOPPER_D64))
                    ms = triton.testing.do_bench(lambda fn=fn, q=q, k=k, v=v: fn(q, k, v), warmup=25, rep=100,
                                                 return_mode="median")
                    timings.append(f"{forward}: {ms:.4f}")
                print(f"N={n} {name} window={window}: " + "; ".join(timings), flush=True)


if __name__ == "__main__":
    main()

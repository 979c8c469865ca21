"""`python -m attnfuse`: compile a RoPE + causal variant, run it, check it against the
reference, and show what it became (on the GPU if there is one, else on Triton's CPU
interpreter)."""

from __future__ import annotations

import argparse

import torch

import attnfuse as af


def main() -> None:
    """Runs the demo."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seq", type=int, default=None, help="sequence length (default: 256 on CPU, 4096 on GPU)")
    parser.add_argument("--show-source", action="store_true", help="print the whole generated Triton source")
    args = parser.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    n = args.seq or (4096 if device == "cuda" else 256)
    dtype = torch.float16
    spec = af.attention(af.rope(theta=10000.0), af.causal())
    print(f"variant: {spec!r}\n\nattn IR (spec.ir()):\n{spec.ir()}\n")

    torch.manual_seed(0)
    # Llama-style GQA: 8 query heads share 2 key/value heads.
    q = torch.randn(1, 8, n, 64, device=device, dtype=dtype)
    k = torch.randn(1, 2, n, 64, device=device, dtype=dtype)
    v = torch.randn(1, 2, n, 64, device=device, dtype=dtype)
    fn = af.compile(spec)
    out, lse = fn(q, k, v, return_lse=True)
    ref = af.reference_attention(spec, q, k, v, device=device)
    err = ((out.double() - ref).norm() / ref.norm()).item()
    where = "GPU" if device == "cuda" else "CPU (Triton interpreter)"
    print(f"ran on {where}: out {tuple(out.shape)} {out.dtype}, lse {tuple(lse.shape)}")
    print(f"relative error vs the float64 reference: {err:.2e} ({'ok' if err < 1e-2 else 'TOO LARGE'})")
    print(f"kernels launched: {', '.join(k.info.name for k in fn.plan(q, k, v).launches)}")
    print(f"pipeline: attnfuse-opt -p '{fn.last.pipeline}'\n")
    source = fn.source
    lines = source.splitlines()
    shown = lines if args.show_source else lines[:40]
    print("generated Triton (fn.source):\n" + "\n".join(shown))
    if not args.show_source:
        print(f"... ({len(lines) - len(shown)} more lines; --show-source prints them all)")
    if err >= 1e-2:
        raise SystemExit(1)


if __name__ == "__main__":
    main()

"""`python -m attnfuse`: compile a RoPE + causal variant, run it forward and backward, check
both against the reference, and show what it became (on the GPU if there is one, else on
Triton's CPU interpreter)."""

from __future__ import annotations

import argparse

import torch

import attnfuse as af
from attnfuse.runtime.reference import reference_gradients


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
    q = torch.randn(1, 8, n, 64, device=device, dtype=dtype, requires_grad=True)
    k = torch.randn(1, 2, n, 64, device=device, dtype=dtype, requires_grad=True)
    v = torch.randn(1, 2, n, 64, device=device, dtype=dtype, requires_grad=True)
    fn = af.compile(spec)
    out, lse = fn(q, k, v, return_lse=True)
    ref = af.reference_attention(spec, q, k, v, device=device)
    err = ((out.double() - ref).norm() / ref.norm()).item()
    where = "GPU" if device == "cuda" else "CPU (Triton interpreter)"
    print(f"ran on {where}: out {tuple(out.shape)} {out.dtype}, lse {tuple(lse.shape)}")
    print(f"relative error vs the float64 reference: {err:.2e} ({'ok' if err < 1e-2 else 'TOO LARGE'})")
    # Training: gradients of the unrotated q and k, through the fused backward kernels.
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    ref_grads = reference_gradients(spec, q, k, v, grad_out, device=device)
    grad_errs = {name: ((t.grad.double() - ref_grads[name]).norm() / ref_grads[name].norm()).item()
                 for name, t in (("q", q), ("k", k), ("v", v))}
    err = max(err, *grad_errs.values())
    shown_errs = ", ".join(f"d{name} {e:.2e}" for name, e in grad_errs.items())
    print(f"backward, relative error of the gradients: {shown_errs} ({'ok' if err < 1e-2 else 'TOO LARGE'})")
    # The plan of the call above: autograd recorded it (q, k, v require grad).
    launches = [launch.info.name for launch in fn.plan(q, k, v, training=True).launches]
    print(f"kernels generated: {', '.join(launches)}")
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

"""The training step's attention (forward + backward, and the backward alone) with each of
AttnFuse's backwards beside cuDNN, in one run (H200):

    python bench/backward_targets.py --out bench/results [--reps 30] [--seq-lens 4096,8192]
    python bench/backward_targets.py --smoke       # CPU (interpreter), tiny shapes: checks the script

Columns (a fresh `af.compile` each, since a plan keeps the backward it was made with):

- `default`: `deterministic=True` and nothing forced, what a call gets by default: the Gluon
  backward with its dQ adds in key-block order (`bwd-dq=ordered`) where `gluon_backward`
  takes it, else the split; every gradient bit-for-bit reproducible;
- `separate`: `deterministic=True` with `ATTNFUSE_BACKWARD=separate` — FlashAttention-2's
  split (dK/dV, then dQ), deterministic too;
- `fused tl`: `deterministic=False` with `ATTNFUSE_BACKWARD=fused` (the portable target, the
  only one that prints the fused backward today): one dK/dV kernel adding each block pair's dQ part into
  an fp32 accumulator with atomics, then a finishing kernel;
- `nondet auto`: `deterministic=False` and nothing forced: what a call allowing a
  non-deterministic backward gets (the Gluon backward where `gluon_backward` takes it);
- `ordered_gluon`, `fused_gluon`: the Gluon backward forced (`ATTNFUSE_BACKWARD_TARGET=gluon`)
  wherever it lowers, its adds in key-block order or not;
- cuDNN: `F.scaled_dot_product_attention` under `sdpa_kernel(CUDNN_ATTENTION)`, given the
  Hkv key/value heads (`enable_gqa`) where it takes them, else expanded once outside the
  timing; with RoPE, q and k rotated by a `torch.compile`d function inside the step.

Rows: causal, dense and RoPE + causal at the Llama-3-8B heads (B=1, 32/8 heads of 128, bf16),
or with `--geometry paper` at the paper's shape (B=4, 12 heads of 64, fp16); `--cases` also
takes the pointwise normalizers (`relu`, `relu+causal`, `sigmoid+causal`) and soft-capping
(`softcap+causal`, a cap of 50), which no cuDNN call can say: their rows have no cuDNN column,
and their gradients are compared with the split backward's (`ATTNFUSE_BACKWARD=separate`,
deterministic). So are the additive-bias cases, `bias+causal` (a padding mask `[B, 1, N, N]` as a
Hugging Face model passes it: 10% of the keys of each sequence masked by -1e9, no gradient) and
`biasgrad+causal` (a learned bias per head and key, `[1, H, 1, N]`, that requires a gradient:
the backward also stores the full-size dS, which autograd sums onto the bias).
Every other AttnFuse column's gradients are compared with cuDNN's (max abs error, and the relative
Frobenius error of dq, dk, dv). Times: median ms of CUDA-event-timed steps
(`benchlib.median_ms`), gradients reset outside the events; "bwd" times `out.backward(g)` alone
on a fresh forward each step.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attnfuse as af
from attnfuse.runtime.reference import reference_gradients
import benchlib

ALL_COLUMNS = (
    # (name, deterministic, ATTNFUSE_BACKWARD, ATTNFUSE_BACKWARD_TARGET)
    ("default", True, None, None),
    ("separate", True, "separate", None),
    ("fused_tl", False, "fused", None),
    ("nondet_auto", False, None, None),
    ("ordered_gluon", True, "ordered", "gluon"),  # the ordered Gluon backward wherever it lowers
    ("fused_gluon", False, "fused", "gluon"),  # the unordered Gluon backward wherever it lowers
)
COLUMNS = ALL_COLUMNS
"""The columns of this run (`--columns`)."""
CASES = ("causal", "dense", "rope+causal")
POINTWISE = {"relu": af.relu, "sigmoid": af.sigmoid}
"""Normalizers a case may name besides the softmax (`relu+causal`)."""
NO_PEER = {"softcap": lambda: af.softcap(50.0), "bias": af.additive_bias, "biasgrad": af.additive_bias}
"""Score blocks a case may name that SDPA cannot say (`softcap+causal`: Gemma-2's cap of 50);
as for a pointwise normalizer, the split backward's gradients are the reference."""


def bias_data(part: str, b: int, hq: int, n: int, device, dtype) -> torch.Tensor:
    """The bias of a `bias` or `biasgrad` case: a padding mask (the last 10% of each sequence's
    keys at -1e9, no gradient), or a learned bias per head and key that requires one."""
    if part == "bias":
        mask = torch.zeros(b, 1, n, n, device=device, dtype=dtype)
        mask[..., n - n // 10:] = -1e9
        return mask
    return (0.1 * torch.randn(1, hq, 1, n, device=device, dtype=dtype)).requires_grad_()


def time_training(fn, leaves, grad_out, device, warmup, reps) -> tuple[float, float]:
    """(fwd+bwd ms, bwd-alone ms) of `fn(*leaves)` with `grad_out`."""
    def reset():
        for t in leaves:
            t.grad = None

    def fwdbwd():
        fn(*leaves).backward(grad_out)

    both = benchlib.median_ms(fwdbwd, device, warmup, reps, before=reset)[0]
    pending = []

    def forward():
        reset()
        pending.append(fn(*leaves))

    def backward():
        pending.pop().backward(grad_out)

    bwd = benchlib.median_ms(backward, device, warmup, reps, before=forward)[0]
    return both, bwd


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--seq-lens", default="4096,8192")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--geometry", choices=("llama", "paper"), default="llama",
                        help="llama: B=1, 32/8 heads of 128, bf16; paper: B=4, 12 heads of 64, fp16")
    parser.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny shapes, no cuDNN")
    parser.add_argument("--columns", default=",".join(name for name, *_ in ALL_COLUMNS if name != "fused_gluon"),
                        help="AttnFuse's columns, of " + ", ".join(name for name, *_ in ALL_COLUMNS)
                        + " (all but fused_gluon by default)")
    args = parser.parse_args()
    global COLUMNS
    known = {name: column for name, *_ in ALL_COLUMNS for column in [(name, *_)]}
    unknown = [name for name in args.columns.split(",") if name not in known]
    if unknown:
        parser.error(f"unknown columns {unknown}")
    COLUMNS = tuple(known[name] for name in args.columns.split(","))
    device = "cpu" if args.smoke else "cuda"
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        b, hq, hkv, d, dtype, seq_lens, warmup, reps = 1, 4, 2, 16, torch.float32, [40], 0, 1
    else:
        b, hq, hkv, d, dtype = (1, 32, 8, 128, torch.bfloat16) if args.geometry == "llama" else \
            (4, 12, 12, 64, torch.float16)
        seq_lens, warmup, reps = [int(n) for n in args.seq_lens.split(",")], 5, args.reps
    meta = benchlib.metadata(device)
    stem = f"{benchlib.stamp()}-backward-targets"  # one pair of files per run, rewritten per case
    rows = []
    for case in args.cases.split(","):
        parts = case.split("+")
        pointwise = [POINTWISE[p]() for p in parts if p in POINTWISE]
        no_peer = [NO_PEER[p]() for p in parts if p in NO_PEER]
        causal, rope = "causal" in parts, "rope" in parts
        spec = af.attention(*([af.rope(theta=500000.0)] if rope else []), *pointwise, *no_peer,
                            *([af.causal()] if causal else []))
        for n in seq_lens:
            torch.manual_seed(0)
            q = torch.randn(b, hq, n, d, device=device, dtype=dtype, requires_grad=True)
            k, v = (torch.randn(b, hkv, n, d, device=device, dtype=dtype, requires_grad=True) for _ in range(2))
            grad_out = torch.randn(b, hq, n, d, device=device, dtype=dtype)
            biases = [bias_data(p, b, hq, n, device, dtype) for p in parts if p in ("bias", "biasgrad")]
            # Leaves of the step: q, k, v and a bias that requires a gradient.
            leaves = (q, k, v, *[t for t in biases if t.requires_grad])
            data = {"bias": biases[0]} if biases else {}
            theta = 500000.0 ** (-torch.arange(0, d, 2, device=device, dtype=torch.float32) / d)
            angle = torch.arange(n, device=device, dtype=torch.float32)[:, None] * theta[None, :]
            cos, sin = angle.cos(), angle.sin()
            row = {"case": f"{case} B{b} H{hq}/{hkv} D{d} N{n} {str(dtype).removeprefix('torch.')}"}
            if args.smoke:
                grads64 = reference_gradients(spec, q, k, v, grad_out, **data)
                ref_grads = tuple(grads64[name] for name in ("q", "k", "v", "bias")[:len(leaves)])
            elif pointwise or no_peer:
                with benchlib.environment({"ATTNFUSE_BACKWARD": "separate", "ATTNFUSE_BACKWARD_TARGET": None}):
                    ref_grads = torch.autograd.grad(af.compile(spec)(q, k, v, **data), leaves, grad_out)
            else:
                gqa = benchlib.cudnn_takes_gqa(q.detach(), k.detach(), v.detach())
                row["cudnn_gqa"] = gqa
                rotate = torch.compile(benchlib.rotate_half) if rope else None

                def cudnn(q, k, v):
                    if rope:
                        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
                    if not gqa:
                        k, v = (t.repeat_interleave(hq // hkv, 1) for t in (k, v))
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

                ref_grads = torch.autograd.grad(cudnn(q, k, v), (q, k, v), grad_out)
                row["cudnn_fwdbwd_ms"], row["cudnn_bwd_ms"] = time_training(cudnn, (q, k, v), grad_out,
                                                                            device, warmup, reps)
            for name, deterministic, backward, target in COLUMNS:
                with benchlib.environment({"ATTNFUSE_BACKWARD": backward, "ATTNFUSE_BACKWARD_TARGET": target}):
                    compiled = af.compile(spec, deterministic=deterministic)

                    def fn(q, k, v, *_bias, compiled=compiled, data=data):
                        return compiled(q, k, v, **data)  # (a bias leaf is the `data` one)

                    grads = torch.autograd.grad(fn(q, k, v), leaves, grad_out)
                    row[f"{name}_kernels"] = " ".join(
                        # "gluon:" marks a kernel launched on the Gluon target.
                        ("gluon:" if type(launch).__name__.startswith("Gluon") else "")
                        + launch.info.name.removeprefix("attention_bwd_")
                        for launch in compiled.plan(q, k, v, training=True, backward=True).launches)
                    row[f"{name}_fallbacks"] = {
                        launch.info.name: dict(launch.fallbacks)
                        for plan_launches in [compiled.plan(q, k, v, training=True).launches]
                        for launch in plan_launches if getattr(launch, "fallbacks", None)}
                    row[f"{name}_err"] = max((g.float() - r.float()).abs().max().item() for g, r in zip(grads, ref_grads))
                    row[f"{name}_rel"] = max(((g.float() - r.float()).norm() / r.float().norm()).item()
                                             for g, r in zip(grads, ref_grads))
                    row[f"{name}_fwdbwd_ms"], row[f"{name}_bwd_ms"] = time_training(fn, leaves, grad_out,
                                                                                    device, warmup, reps)
            benchlib.log(str(row))
            rows.append(row)
            write(args.out, stem, meta, rows, args.smoke)


def write(out: Path, stem: str, meta, rows, smoke: bool) -> None:
    """The markdown and JSON of the rows so far (rewritten after each case)."""
    header = ["case", *(f"{name} fwd+bwd / bwd ms" for name, *_ in COLUMNS), "cuDNN fwd+bwd / bwd ms",
              *(f"cuDNN / {name} (fwd+bwd, bwd)" for name, *_ in COLUMNS), "max rel err vs cuDNN (or the split)", "the program's kernels"]
    table = []
    for r in rows:
        cells = [r["case"]]
        for name, *_ in COLUMNS:
            cells.append(f"{benchlib.fmt(r[f'{name}_fwdbwd_ms'])} / {benchlib.fmt(r[f'{name}_bwd_ms'])}")
        cells.append(f"{benchlib.fmt(r.get('cudnn_fwdbwd_ms'))} / {benchlib.fmt(r.get('cudnn_bwd_ms'))}")
        for name, *_ in COLUMNS:
            if "cudnn_fwdbwd_ms" in r:
                cells.append(f"{r['cudnn_fwdbwd_ms'] / r[f'{name}_fwdbwd_ms']:.2f}, "
                             f"{r['cudnn_bwd_ms'] / r[f'{name}_bwd_ms']:.2f}")
            else:
                cells.append("-")
        cells.append(", ".join(f"{r[f'{name}_rel']:.1e}" for name, *_ in COLUMNS))
        cells.append("; ".join(f"{name}: {r[f'{name}_kernels']}"
                               + (f" (portable fallbacks: {r[f'{name}_fallbacks']})" if r.get(f"{name}_fallbacks") else "")
                               for name, *_ in COLUMNS))
        table.append(cells)
    reference = "the float64 reference" if smoke else \
        "cuDNN's gradients (the split backward's for a pointwise normalizer, which cuDNN cannot say)"
    markdown = ["# Attention forward + backward: AttnFuse's backwards beside cuDNN", "",
                *benchlib.metadata_lines(meta),
                f"- median ms of CUDA-event-timed steps; ratios > 1 mean AttnFuse is faster; errors against {reference}",
                "", *benchlib.markdown_table(header, table)]
    benchlib.write_outputs(out, stem, {"metadata": meta, "rows": rows}, markdown)


if __name__ == "__main__":
    main()

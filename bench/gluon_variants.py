"""The Gluon forward on the variants beyond the plain softmax, beside the portable (tl) kernel
and a peer, in one run (H200):

    python bench/gluon_variants.py --out bench/results [--reps 30] [--seq-lens 4096,8192]
    python bench/gluon_variants.py --smoke     # CPU (interpreter), tiny shapes: checks the script

Rows: ReLU (dense), sigmoid + causal, and an additive bias + causal (a random `[1, Hq, N, N]`
bias in the inputs' dtype, broadcast over the batch), at the paper's shape (B=4, 12 heads of 64,
fp16) and the Llama-3-8B heads (B=1, 32/8 heads of 128, bf16). Columns: `gluon` and `tl`
force the target (`ATTNFUSE_FORWARD_TARGET`), `auto` is what a call gets; the bias rows also
time compiled flex_attention with a `score_mod` reading the same bias and a causal
`BlockMask` (no peer takes ReLU or sigmoid weights). Every column's output is compared with
the variant's reference (`af.reference_attention`, in float32 on the GPU; the max abs error
is reported, the correctness tests being test/python/test_gpu_gluon.py's). Times: median ms of
CUDA-event-timed calls (`benchlib.median_ms`), inference (`torch.no_grad`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import attnfuse as af
import benchlib

VARIANTS = {
    "relu": (af.attention(af.relu()), False),
    "sigmoid+causal": (af.attention(af.sigmoid(), af.causal()), True),
    "bias+causal": (af.attention(af.additive_bias(), af.causal()), True),
}
"""name -> (spec, causal)."""
GEOMETRIES = {"paper": (4, 12, 12, 64, torch.float16), "llama": (1, 32, 8, 128, torch.bfloat16)}
COLUMNS = (("gluon", "gluon"), ("tl", "triton"), ("auto", "auto"))


def flex_call(q, k, v, bias, causal: bool):
    """Compiled flex_attention reading `bias` in a score_mod, with a causal BlockMask."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    n_q, n_k = q.shape[-2], k.shape[-2]
    offset = n_k - n_q
    mask = None
    if causal:
        mask = create_block_mask(lambda b, h, i, j: j <= i + offset, B=None, H=None, Q_LEN=n_q, KV_LEN=n_k,
                                 device=q.device)
    compiled = torch.compile(flex_attention)

    def score_mod(score, b, h, i, j):
        return score + bias[0, h, i, j]

    return lambda: compiled(q, k, v, score_mod=score_mod, block_mask=mask, enable_gqa=q.shape[1] != k.shape[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--seq-lens", default="4096,8192")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--geometries", default=",".join(GEOMETRIES))
    parser.add_argument("--no-flex", action="store_true", help="skip the flex_attention column")
    parser.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny shapes, no flex")
    args = parser.parse_args(argv)
    device = "cpu" if args.smoke else "cuda"
    seq_lens = [40] if args.smoke else [int(n) for n in args.seq_lens.split(",")]
    meta = benchlib.metadata(device)
    rows = []
    for geometry in args.geometries.split(","):
        b, hq, hkv, d, dtype = GEOMETRIES[geometry]
        if args.smoke:
            b, hq, hkv, d, dtype = 1, 4, 2, 16, torch.float32
        for name in args.variants.split(","):
            spec, causal = VARIANTS[name]
            for n in seq_lens:
                torch.manual_seed(0)
                q = torch.randn(b, hq, n, d, device=device, dtype=dtype)
                k, v = (torch.randn(b, hkv, n, d, device=device, dtype=dtype) for _ in range(2))
                bias = torch.randn(1, hq, n, n, device=device, dtype=dtype) if name.startswith("bias") else None
                data = {"bias": bias} if bias is not None else {}
                row = {"case": f"{name} B{b} H{hq}/{hkv} D{d} N{n} {str(dtype).removeprefix('torch.')}"}
                with torch.no_grad():
                    # The attn-IR interpreter in float32 on the GPU (`af.reference_attention`;
                    # float64 on the CPU would take minutes at these sizes).
                    expected = af.reference_attention(spec, q, k, v, dtype=torch.float32, device=q.device, **data)
                    for column, target in COLUMNS:
                        with benchlib.environment({"ATTNFUSE_FORWARD_TARGET": target}):
                            fn = af.compile(spec)  # a fresh function: a plan keeps its target
                            got = fn(q, k, v, **data)
                            launches = [x for x in fn.plan(q, k, v).launches if x.info.name == "attention_fwd"]
                            row[f"{column}_kernel"] = " ".join(
                                ("gluon:" if type(x).__name__ == "GluonLaunch" else "") + x.info.name for x in launches)
                            row[f"{column}_err"] = (got.float() - expected).abs().max().item()
                            row[f"{column}_ms"] = benchlib.median_ms(lambda: fn(q, k, v, **data), device, 3 if args.smoke else 10,
                                                                     2 if args.smoke else args.reps)[0]
                    row["flex_ms"] = row["flex_err"] = float("nan")
                    if bias is not None and not (args.no_flex or args.smoke):
                        try:
                            call = flex_call(q, k, v, bias, causal)
                            row["flex_err"] = (call().float() - expected).abs().max().item()
                            row["flex_ms"] = benchlib.median_ms(call, device, 10, args.reps)[0]
                        except Exception as err:  # a peer's failure is reported, not fatal
                            benchlib.log(f"flex at {row['case']}: {benchlib.first_line(err)}")
                benchlib.log(str(row))
                rows.append(row)
    header = ["case", "Gluon ms", "tl ms", "auto ms", "flex ms", "tl / Gluon", "flex / auto", "auto runs",
              "max abs err (Gluon, tl, auto, flex)"]
    table = [[r["case"], benchlib.fmt(r["gluon_ms"]), benchlib.fmt(r["tl_ms"]), benchlib.fmt(r["auto_ms"]),
              benchlib.fmt(r["flex_ms"]), benchlib.fmt(r["tl_ms"] / r["gluon_ms"], ".2f"),
              benchlib.fmt(r["flex_ms"] / r["auto_ms"], ".2f"), r["auto_kernel"],
              ", ".join(f"{r[c + '_err']:.1e}" for c in ("gluon", "tl", "auto", "flex"))] for r in rows]
    markdown = ["# The Gluon forward on ReLU, sigmoid and bias variants, beside tl and flex", "",
                *benchlib.metadata_lines(meta),
                "- rows: inference forward, median ms; ratios > 1 mean the denominator is faster", "",
                *benchlib.markdown_table(header, table)]
    benchlib.write_outputs(args.out, f"{benchlib.stamp()}-gluon-variants", {"metadata": meta, "rows": rows}, markdown)
    print("\n".join(markdown))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

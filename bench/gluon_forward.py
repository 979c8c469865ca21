"""The forward on the Gluon target beside the portable (tl) target and cuDNN, at issue 17's
sizes, in one run (H200):

    python bench/gluon_forward.py --out bench/results [--reps 100] [--head-dims 64]

Rows: causal and dense, B=4 H=12 D=64 fp16 at N=4096/8192/16384; causal and dense with the
Llama-3-8B heads (B=1, 32 query / 8 key-value heads, D=128, bf16) at N=4096/8192; RoPE +
causal at the Llama heads, where cuDNN gets a compiled pre-rotation and AttnFuse pre-rotates
in its own kernels for the Gluon column (the fused rotation is not lowered to Gluon) and
as the Rotation Calculus decides for the others. Each AttnFuse column forces
its target (`ATTNFUSE_FORWARD_TARGET`); `auto` is what a call gets by default. `Gluon` runs the
schedule `gluon_forward.SCHEDULES` gives the head dim and variant (three consumer warpgroups at
D=64, two at D=128 and 256; the persistent grid for dense kernels at D=128); `Gluon 2c` and
`Gluon 3c` force two and three consumers on the plain grid (`ATTNFUSE_GLUON_CONSUMERS`,
`ATTNFUSE_GLUON_PERSISTENT=0`; three at D=128 take 64-key blocks) and `Gluon persistent` the
persistent grid with the table's consumers (`ATTNFUSE_GLUON_PERSISTENT=1`), so one run compares
them beside tl and cuDNN. A column the head dim refuses (three consumers or the persistent
grid at D=256) is `refused`. Every result
is checked against cuDNN's first. Times: median ms of CUDA-event-timed calls, every column of a
row timed side by side in interleaved rounds (`benchlib.interleaved_median_ms`), inference
(`torch.no_grad`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attnfuse as af
import benchlib
from attnfuse.errors import ArgumentError

CASES = (
    [("causal", 4, 12, 12, 64, n, torch.float16) for n in (4096, 8192, 16384)]
    + [("dense", 4, 12, 12, 64, n, torch.float16) for n in (4096, 8192)]
    + [("causal", 1, 32, 8, 128, n, torch.bfloat16) for n in (4096, 8192)]
    + [("dense", 1, 32, 8, 128, n, torch.bfloat16) for n in (4096, 8192)]
    + [("rope+causal", 1, 32, 8, 128, n, torch.bfloat16) for n in (4096, 8192)]
    + [(name, 2, 16, 16, 256, n, torch.bfloat16) for name in ("causal", "dense") for n in (4096, 8192)]
)
"""Issue 17's table, and head dim 256 (Gemma's 16 heads of 256; only with `--head-dims 256`)."""
ROPE_SWEEP = (
    [("rope+causal", 4, 12, 12, 64, n, torch.float16) for n in (1024, 2048, 4096, 8192, 16384)]
    + [("rope+causal", 1, 32, 8, 128, n, torch.bfloat16) for n in (1024, 2048, 4096, 8192, 16384)]
)
"""`--cases rope-sweep`: issue 17's "RoPE + causal at every N from 1k to 16k", at the paper's
shape (D=64) and the Llama-3-8B heads."""
TARGETS = (("gluon", "gluon", None, None), ("gluon2", "gluon", "2", "0"), ("gluon3", "gluon", "3", "0"),
           ("gluon_ps", "gluon", None, "1"), ("triton", "triton", None, None), ("auto", "auto", None, None))
"""Columns: (name, ATTNFUSE_FORWARD_TARGET, ATTNFUSE_GLUON_CONSUMERS, ATTNFUSE_GLUON_PERSISTENT; None:
the table's). The consumer-count columns run the plain grid, so they compare consumer counts
alone."""


def time_cell(row: dict, column: str) -> str:
    """A column's ms, or `refused` where the head dim refused its forced choice."""
    return "refused" if row.get(f"{column}_rows") == "refused" else benchlib.fmt(row[f"{column}_ms"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--head-dims", default="64,128", help="the cases of these head dims only (256 too: 64,128,256)")
    parser.add_argument("--cases", choices=("issue", "rope-sweep"), default="issue",
                        help="issue 17's table (default) or RoPE + causal from N=1k to 16k")
    parser.add_argument("--columns", default=",".join(t[0] for t in TARGETS),
                        help="the AttnFuse columns to time (default all: " + ",".join(t[0] for t in TARGETS) + ")")
    args = parser.parse_args()
    head_dims = {int(d) for d in args.head_dims.split(",")}
    columns = set(args.columns.split(","))
    unknown = columns - {t[0] for t in TARGETS}
    if unknown:
        parser.error(f"unknown columns {sorted(unknown)}")
    cases = CASES if args.cases == "issue" else ROPE_SWEEP
    meta = benchlib.metadata("cuda")
    rows = []
    for name, b, hq, hkv, d, n, dtype in [case for case in cases if case[4] in head_dims]:
        torch.manual_seed(0)
        q = torch.randn(b, hq, n, d, device="cuda", dtype=dtype)
        k, v = (torch.randn(b, hkv, n, d, device="cuda", dtype=dtype) for _ in range(2))
        causal = name != "dense"
        rope = name.startswith("rope")
        blocks = ([af.rope(theta=500000.0)] if rope else []) + ([af.causal()] if causal else [])
        spec = af.attention(*blocks)
        theta = 500000.0 ** (-torch.arange(0, d, 2, device="cuda", dtype=torch.float32) / d)
        angle = torch.arange(n, device="cuda", dtype=torch.float32)[:, None] * theta[None, :]
        cos, sin = angle.cos(), angle.sin()
        rotate = torch.compile(benchlib.rotate_half) if rope else None

        # cuDNN's SDPA is given the Hkv key/value heads (`enable_gqa`) where it takes them;
        # otherwise they are expanded to Hq heads once, untimed, and with RoPE the keys are
        # rotated before they are expanded (rotating the expanded keys would charge the cuDNN
        # column Hq / Hkv times the key rotation), the expansion then inside the timed call.
        k_full, v_full = (t.repeat_interleave(hq // hkv, 1) for t in (k, v))
        gqa = hq != hkv and benchlib.cudnn_takes_gqa(q, k, v)

        def cudnn():
            qq = rotate(q, cos, sin) if rope else q
            if gqa or hq == hkv:
                kk, vv = (rotate(k, cos, sin) if rope else k), v
            else:
                kk, vv = (rotate(k, cos, sin).repeat_interleave(hq // hkv, 1) if rope else k_full), v_full
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal, enable_gqa=gqa)

        with torch.no_grad():
            row = {"case": f"{name} B{b} H{hq}/{hkv} D{d} N{n} {str(dtype).removeprefix('torch.')}",
                   "cudnn_gqa": gqa}
            try:
                expected = cudnn().float()
                timed = {"cudnn": cudnn}
            except RuntimeError as err:  # a head dim this cuDNN does not take: compare with SDPA's math
                benchlib.log(f"cuDNN refused {row['case']}: {benchlib.first_line(err)}")
                row["cudnn_ms"] = float("nan")
                timed = {}
                with sdpa_kernel(SDPBackend.MATH):
                    qq, kk = (rotate(q, cos, sin), rotate(k, cos, sin)) if rope else (q, k)
                    expected = F.scaled_dot_product_attention(qq.float(), kk.float(), v.float(), is_causal=causal,
                                                              enable_gqa=hq != hkv)
            for column, target, consumers, persistent in TARGETS:
                if column not in columns:
                    row[f"{column}_ms"] = row[f"{column}_err"] = float("nan")
                    row[f"{column}_rows"] = None
                    continue
                settings = {"ATTNFUSE_FORWARD_TARGET": target, "ATTNFUSE_GLUON_CONSUMERS": consumers,
                            "ATTNFUSE_GLUON_PERSISTENT": persistent}
                with benchlib.environment(settings):
                    try:
                        # A fused rotation is not lowered to Gluon: its column pre-rotates (one kernel
                        # per operand, then the Gluon forward reads the copies).
                        placement = ("pre_rotated", "pre_rotated") if rope and target == "gluon" else "auto"
                        # A fresh function per column: a plan keeps the target it was made with.
                        fn = af.compile(spec, rope_placement=placement)
                        got = fn(q, k, v).float()
                        launch = next(x for x in fn.plan(q, k, v).launches if x.info.name == "attention_fwd")
                        row[f"{column}_rows"] = getattr(getattr(launch, "launch", None), "block_m", None)
                        row[f"{column}_err"] = (got - expected).abs().max().item()
                        timed[column] = lambda fn=fn: fn(q, k, v)  # the plan keeps its target
                    except ArgumentError as err:  # a choice this head dim refuses
                        benchlib.log(f"{column} at {row['case']}: refused: {err}")
                        row[f"{column}_ms"] = row[f"{column}_err"] = float("nan")
                        row[f"{column}_rows"] = "refused"
            # Timed side by side, interleaved (`benchlib.interleaved_median_ms`): timed one after
            # another, whatever ran last ran on a hotter GPU (dense N=8192 moved 6-8% by order).
            for column, (ms, _spread) in benchlib.interleaved_median_ms(timed, "cuda", 10, args.reps).items():
                row[f"{column}_ms"] = ms
        flops = 4 * b * hq * n * n * d * (0.5 if causal else 1.0)
        row["gluon_tflops"] = flops / row["gluon_ms"] / 1e9
        benchlib.log(str(row))
        rows.append(row)
    header = ["case", "Gluon ms (rows/program)", "Gluon 2c ms", "Gluon 3c ms", "Gluon persistent ms", "tl ms",
              "auto ms", "cuDNN ms", "cuDNN / Gluon", "cuDNN / Gluon 3c", "cuDNN / Gluon persistent", "cuDNN / auto",
              "Gluon TFLOP/s", "max err (Gluon, 2c, 3c, persistent, tl)"]
    table = [[r["case"], f"{benchlib.fmt(r['gluon_ms'])} ({r['gluon_rows'] or 'portable'})", time_cell(r, "gluon2"),
              time_cell(r, "gluon3"), time_cell(r, "gluon_ps"), benchlib.fmt(r["triton_ms"]),
              benchlib.fmt(r["auto_ms"]), benchlib.fmt(r["cudnn_ms"]), benchlib.fmt(r["cudnn_ms"] / r["gluon_ms"], ".2f"),
              benchlib.fmt(r["cudnn_ms"] / r["gluon3_ms"], ".2f"), benchlib.fmt(r["cudnn_ms"] / r["gluon_ps_ms"], ".2f"),
              benchlib.fmt(r["cudnn_ms"] / r["auto_ms"], ".2f"), benchlib.fmt(r["gluon_tflops"], ".0f"),
              ", ".join(f"{r[c + '_err']:.1e}" for c in ("gluon", "gluon2", "gluon3", "gluon_ps", "triton"))]
             for r in rows]
    markdown = ["# Forward on the Gluon target beside the tl target and cuDNN", "", *benchlib.metadata_lines(meta),
                "- rows: inference forward, median ms, a row's columns (cuDNN's too) timed in interleaved rounds; "
                "ratios > 1 mean AttnFuse is faster", "",
                *benchlib.markdown_table(header, table)]
    benchlib.write_outputs(args.out, f"{benchlib.stamp()}-gluon-forward", {"metadata": meta, "rows": rows}, markdown)


if __name__ == "__main__":
    main()

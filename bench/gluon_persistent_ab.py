"""The Gluon forward's persistent grid against its one-program-per-tile grid, interleaved, beside
cuDNN (H200): does `gluon_forward.SCHEDULES`' persistent choice per head dim and tile class hold?

    python bench/gluon_persistent_ab.py [--rounds 8] [--reps 30] [--out bench/results]

For each case (dense and causal, the Llama-3-8B heads at D=128 and the paper's B=4 H=12 at
D=64), two functions whose plans were made under `ATTNFUSE_GLUON_PERSISTENT=0` and `=1` and
cuDNN's SDPA are timed in rounds, one median of `--reps` CUDA-event-timed calls each per round,
the order rotated from round to round and reversed every other round, so that the GPU's drift (clocks, heat) falls on all
three alike. The verdict is the median over rounds of the per-round ratio.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attnfuse as af
import benchlib
from attnfuse.runtime.gluon_forward import GluonLaunch

CASES = (
    [(name, 1, 32, 8, 128, n, torch.bfloat16) for name in ("dense", "causal") for n in (4096, 8192)]
    + [(name, 4, 12, 12, 64, n, torch.float16) for name in ("dense", "causal") for n in (4096, 8192)]
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    meta = benchlib.metadata("cuda")
    rows = []
    for name, b, hq, hkv, d, n, dtype in CASES:
        torch.manual_seed(0)
        q = torch.randn(b, hq, n, d, device="cuda", dtype=dtype)
        k, v = (torch.randn(b, hkv, n, d, device="cuda", dtype=dtype) for _ in range(2))
        causal = name == "causal"
        spec = af.attention(af.causal()) if causal else af.attention()
        gqa = hq != hkv

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

        impls = {"cudnn": cudnn}
        errors = {}
        with torch.no_grad():
            expected = cudnn().float()
            for form in ("0", "1"):
                settings = {"ATTNFUSE_FORWARD_TARGET": "gluon", "ATTNFUSE_GLUON_PERSISTENT": form}
                with benchlib.environment(settings):
                    fn = af.compile(spec)
                    errors[form] = (fn(q, k, v).float() - expected).abs().max().item()  # the plan is made here
                launch = next(x for x in fn.plan(q, k, v).launches if x.info.name == "attention_fwd")
                if not isinstance(launch, GluonLaunch) or launch.launch.persistent != (form == "1"):
                    raise SystemExit(f"{name} N={n} D={d}: the persistent={form} plan is not that Gluon launch")
                impls[f"persistent={form}"] = lambda fn=fn: fn(q, k, v)
            times: dict[str, list[float]] = {impl: [] for impl in impls}
            names = list(impls)
            for r in range(args.rounds):
                # Rotated, and reversed every other round, so no implementation always follows another.
                order = names[r % len(names):] + names[:r % len(names)]
                for impl in order[::-1] if r % 2 else order:
                    times[impl].append(benchlib.median_ms(impls[impl], "cuda", 5, args.reps)[0])
        ratio = [one / zero for one, zero in zip(times["persistent=1"], times["persistent=0"])]
        vs_cudnn = {form: statistics.median(c / t for c, t in zip(times["cudnn"], times[f"persistent={form}"]))
                    for form in ("0", "1")}
        row = {"case": f"{name} B{b} H{hq}/{hkv} D{d} N{n} {str(dtype).removeprefix('torch.')}",
               **{f"{impl}_ms": statistics.median(t) for impl, t in times.items()},
               "persistent_over_grid": statistics.median(ratio), "ratio_range": (min(ratio), max(ratio)),
               "cudnn_over_grid": vs_cudnn["0"], "cudnn_over_persistent": vs_cudnn["1"],
               "max_err": max(errors.values())}
        benchlib.log(str(row))
        rows.append(row)
    header = ["case", "grid ms", "persistent ms", "cuDNN ms", "persistent / grid (median of rounds)",
              "range over rounds", "cuDNN / grid", "cuDNN / persistent", "max err"]
    table = [[r["case"], benchlib.fmt(r["persistent=0_ms"]), benchlib.fmt(r["persistent=1_ms"]),
              benchlib.fmt(r["cudnn_ms"]), benchlib.fmt(r["persistent_over_grid"], ".3f"),
              f"{r['ratio_range'][0]:.3f}–{r['ratio_range'][1]:.3f}", benchlib.fmt(r["cudnn_over_grid"], ".2f"),
              benchlib.fmt(r["cudnn_over_persistent"], ".2f"), f"{r['max_err']:.1e}"] for r in rows]
    markdown = ["# Gluon forward: persistent grid against one program per tile, interleaved", "",
                *benchlib.metadata_lines(meta),
                f"- {args.rounds} rounds, each a median of {args.reps} calls per implementation, order rotated; "
                "ratios < 1 mean the persistent grid is faster", "", *benchlib.markdown_table(header, table)]
    benchlib.write_outputs(args.out, f"{benchlib.stamp()}-gluon-persistent-ab", {"metadata": meta, "rows": rows},
                           markdown)


if __name__ == "__main__":
    main()

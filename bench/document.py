"""Packed sequences (`document()`): AttnFuse's document filter beside compiled flex_attention's
document mask, forward and forward + backward, in one process.

    python bench/document.py --out DIR [--geometry llama,paper] [--seq-lens 8192,16384]
                             [--variants causal,bidirectional] [--modes fwd,fwdbwd]
    python bench/document.py --smoke --out DIR      # CPU, tiny sizes: checks the script

A pack of N tokens holds documents of random lengths (uniform in `--doc-lens`, seed 0; the last
one cut at N), shared by the batch: `doc_ids [N]`. Geometries: `llama` is B=1, 32 query and 8
key/value heads of 128, bf16; `paper` is B=4, 12 heads of 64, fp16. Variants: `causal` (a
language model's packed pretraining: `af.document()` with `af.causal()`) and `bidirectional`
(an encoder's: `af.document()` alone).

Columns:

- `attnfuse`: `af.compile(af.attention(af.document(), ...))` called with `doc_ids=` the same
  tensor every call, as a training loop passes its packing (the runtime keeps the block lists it
  derives from it): the runtime's own choice of forward (`ATTNFUSE_FORWARD_TARGET` unset);
- `attnfuse-gluon` / `attnfuse-tl`: the same with the forward forced to the Gluon target (on an
  sm_90 GPU: 128 x 128 tiles walking the document lists) / to the portable Triton kernel; the
  backward is the runtime's in every column;
- `flex`: `torch.compile(flex_attention)` with the BlockMask of the same mask_mod
  (`doc[q] == doc[kv]`, and `q >= kv` when causal) built once by `create_block_mask`, reused
  across calls, `enable_gqa=True`;
- `cudnn-nodoc`: cuDNN's SDPA over the whole pack with no document filter (`is_causal` for the
  causal variant): what the same tokens cost when documents are ignored, for scale (it is not
  the same attention, so it has no error column).

Every output (and in `fwdbwd` dq, dk and dv) is first checked against a float32 reference over
the first key/value head's query group, document by document (each document attends to itself
alone); a row above `--tol` relative error is FAIL and not timed. Timing: triton's `do_bench`
median with L2 flushed (the wall clock on the CPU). Writes `.json`, `.md` and (matplotlib) `.png`
to `--out`.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import benchlib

GEOMETRIES = {
    "llama": {"batch": 1, "heads_q": 32, "heads_kv": 8, "head_dim": 128, "dtype": torch.bfloat16},
    "paper": {"batch": 4, "heads_q": 12, "heads_kv": 12, "head_dim": 64, "dtype": torch.float16},
}
TARGETS = {"attnfuse": None, "attnfuse-gluon": "gluon", "attnfuse-tl": "triton"}
"""AttnFuse columns and the forward target each forces (None: the runtime's choice)."""


def document_ids(n: int, low: int, high: int, device: str) -> torch.Tensor:
    """`[n]` int32 ids of consecutive documents of lengths uniform in [low, high] (seed 0)."""
    gen = torch.Generator().manual_seed(0)
    ids, doc = [], 0
    while len(ids) < n:
        ids += [doc] * int(torch.randint(low, high + 1, (1,), generator=gen))
        doc += 1
    return torch.tensor(ids[:n], dtype=torch.int32, device=device)


def segments(doc_ids: torch.Tensor) -> list[tuple[int, int]]:
    """Each document's [start, end) in the pack."""
    starts = torch.nonzero(torch.diff(doc_ids.cpu(), prepend=torch.tensor([-1], dtype=doc_ids.dtype))).flatten()
    bounds = [*starts.tolist(), doc_ids.numel()]
    return list(zip(bounds[:-1], bounds[1:]))


def reference(q, k, v, grad, doc_ids, causal: bool, group: int) -> dict[str, torch.Tensor]:
    """float32 outputs and gradients of the first key/value head's query group (`group` query
    heads), document by document."""
    qs, ks, vs = (t[:, :n].detach().float().requires_grad_(grad is not None)
                  for t, n in ((q, group), (k, 1), (v, 1)))
    out = torch.empty(qs.shape[0], group, qs.shape[2], vs.shape[-1], device=q.device)
    for start, end in segments(doc_ids):
        kk, vv = (t[:, :, start:end].expand(-1, group, -1, -1) for t in (ks, vs))
        out[:, :, start:end] = F.scaled_dot_product_attention(qs[:, :, start:end], kk, vv, is_causal=causal)
    result = {"out": out.detach()}
    if grad is not None:
        (out * grad[:, :group].float()).sum().backward()
        result |= {"dq": qs.grad, "dk": ks.grad, "dv": vs.grad}
    return result


def document_mask(doc_ids: torch.Tensor):
    """flex_attention's mask_mod of `af.document()` over shared ids."""
    def same_document(batch, head, q_idx, kv_idx):
        return doc_ids[q_idx] == doc_ids[kv_idx]
    return same_document


def causal_document_mask(doc_ids: torch.Tensor):
    """flex_attention's mask_mod of `af.document()` with `af.causal()`: a function of its own
    (compiled flex caches its kernels per mask_mod code, so the two variants must not share
    one whose behaviour a captured flag changes)."""
    def same_document_causal(batch, head, q_idx, kv_idx):
        return (doc_ids[q_idx] == doc_ids[kv_idx]) & (q_idx >= kv_idx)
    return same_document_causal


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want).norm() / want.norm().clamp_min(1e-30)).item()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--geometry", default="llama,paper")
    parser.add_argument("--seq-lens", default="8192,16384")
    parser.add_argument("--variants", default="causal,bidirectional")
    parser.add_argument("--modes", default="fwd,fwdbwd")
    parser.add_argument("--doc-lens", default="256,4096", help="document lengths low,high (uniform)")
    parser.add_argument("--columns", default="attnfuse,attnfuse-gluon,attnfuse-tl,flex,cudnn-nodoc")
    parser.add_argument("--warmup", type=float, default=25.0, help="do_bench warmup, ms")
    parser.add_argument("--rep", type=float, default=100.0, help="do_bench repetition time, ms")
    parser.add_argument("--tol", type=float, default=2e-2)
    parser.add_argument("--nondeterministic", action="store_true",
                        help="af.compile(..., deterministic=False): the unordered fused backward where it runs")
    parser.add_argument("--out", type=Path, default=benchlib.ROOT / "bench" / "results")
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny sizes: checks the script end to end")
    args = parser.parse_args(argv)

    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    if device == "cpu" and not args.smoke:
        print("document.py: no CUDA device; pass --smoke to check the script on the CPU", file=sys.stderr)
        return 2
    import attnfuse as af
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    geometries = {name: dict(GEOMETRIES[name]) for name in args.geometry.split(",")}
    seq_lens = [int(n) for n in args.seq_lens.split(",")]
    low, high = (int(x) for x in args.doc_lens.split(","))
    columns = args.columns.split(",")
    if args.smoke:
        geometries = {"smoke": {"batch": 1, "heads_q": 4, "heads_kv": 2, "head_dim": 16, "dtype": torch.float32}}
        seq_lens, low, high = [160], 20, 70
        args.warmup = args.rep = 1.0
        columns = [c for c in columns if c in ("attnfuse", "flex")]
    if device == "cuda":
        from triton.testing import do_bench

        def time_ms(fn) -> float:
            return float(do_bench(fn, warmup=args.warmup, rep=args.rep, return_mode="median"))
    else:
        def time_ms(fn) -> float:
            return benchlib.median_ms(fn, "cpu", warmup=1, reps=2)[0]

    benchlib.bench_tool.configure_dynamo()
    flex = torch.compile(flex_attention, dynamic=False) if device == "cuda" else flex_attention
    cases = [(g, n, variant, mode) for g in geometries for n in seq_lens
             for variant in args.variants.split(",") for mode in args.modes.split(",")]
    rows: list[dict] = []
    ok = True
    with benchlib.CaseProgress(len(cases) * len(columns)) as progress:
        for geometry, n, variant, mode in cases:
            shape = geometries[geometry]
            causal, training = variant == "causal", mode == "fwdbwd"
            b, hq, hkv, d, dtype = (shape[key] for key in ("batch", "heads_q", "heads_kv", "head_dim", "dtype"))
            gen = torch.Generator().manual_seed(1)
            q, k, v = (torch.randn(b, h, n, d, generator=gen).to(dtype).to(device).requires_grad_(training)
                       for h in (hq, hkv, hkv))
            grad = torch.randn(b, hq, n, d, generator=gen).to(dtype).to(device) if training else None
            doc_ids = document_ids(n, low, high, device)
            want = reference(q, k, v, grad, doc_ids, causal, hq // hkv)
            spec = af.attention(af.document(), af.causal()) if causal else af.attention(af.document())

            block_mask = create_block_mask((causal_document_mask if causal else document_mask)(doc_ids),
                                           None, None, n, n, device=device)
            calls = {
                "flex": lambda: flex(q, k, v, block_mask=block_mask, enable_gqa=hq != hkv),
                "cudnn-nodoc": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=hq != hkv),
            }
            for column, target in TARGETS.items():
                fn = af.compile(spec, deterministic=not args.nondeterministic)
                calls[column] = lambda fn=fn: fn(q, k, v, doc_ids=doc_ids)
            row = {"geometry": geometry, "n": n, "variant": variant, "mode": mode, "documents": len(segments(doc_ids)),
                   "shape": f"B={b} Hq={hq} Hkv={hkv} D={d} {str(dtype).removeprefix('torch.')}"}
            for column in columns:
                progress.step(f"{geometry} {variant} {mode} N={n} {column}")
                settings = {"ATTNFUSE_FORWARD_TARGET": TARGETS.get(column)} if column in TARGETS else {}
                backend = sdpa_kernel(SDPBackend.CUDNN_ATTENTION) if column == "cudnn-nodoc" and device == "cuda" \
                    else contextlib.nullcontext()
                try:
                    with benchlib.environment(settings), backend:
                        step = calls[column]
                        if training:
                            def run(call=step):
                                for t in (q, k, v):
                                    t.grad = None
                                call().backward(grad)
                        else:
                            def run(call=step):
                                with torch.no_grad():
                                    call()
                        if column == "cudnn-nodoc":  # not the same attention: timed, not checked
                            row[f"{column}_ms"] = time_ms(run)
                        elif not benchlib.record_checked(row, column, check(step, q, k, v, grad, want, hq // hkv),
                                                         args.tol, lambda run=run: time_ms(run)):
                            ok = False
                except Exception as err:  # noqa: BLE001 - one column failing is a cell
                    row[f"{column}_error"] = benchlib.first_line(err)
            if row.get("attnfuse_ms") and row.get("flex_ms"):
                row["flex_over_attnfuse"] = row["flex_ms"] / row["attnfuse_ms"]
            rows.append(row)
            del q, k, v, grad, want, block_mask, calls
            if device == "cuda":
                torch.cuda.empty_cache()

    meta = benchlib.metadata(device)
    lines = table(rows, columns)
    print("\n".join(lines))
    markdown = [f"# Packed sequences: document() against flex_attention ({meta['gpu'] or 'CPU'})", ""]
    markdown += benchlib.metadata_lines(meta)
    markdown += [f"- documents: lengths uniform in [{low}, {high}] (seed 0), shared by the batch",
                 "- timing: " + ("triton do_bench median, L2 flushed" if device == "cuda" else "CPU wall clock (smoke test)"),
                 "- ms per call (fwd: under no_grad; fwdbwd: the call and `backward`)", ""]
    markdown += lines
    document = {"metadata": meta, "config": {**vars(args), "out": str(args.out)}, "rows": rows}
    json_path, _ = benchlib.write_outputs(args.out, f"{benchlib.stamp()}-document", document, markdown)
    plot(document, columns, json_path.with_suffix(".png"))
    return 0 if ok else 1


def check(call, q, k, v, grad, want: dict[str, torch.Tensor], group: int) -> float:
    """The largest relative error of a call's output (and gradients) over the reference's heads."""
    if grad is None:
        with torch.no_grad():
            return relative_error(call()[:, :group], want["out"])
    for t in (q, k, v):
        t.grad = None
    out = call()
    out.backward(grad)
    got = {"out": out[:, :group], "dq": q.grad[:, :group], "dk": k.grad[:, :1], "dv": v.grad[:, :1]}
    return max(relative_error(got[name], want[name]) for name in want)


def table(rows: list[dict], columns: list[str]) -> list[str]:
    header = ["shape", "variant", "mode", "N", "documents", *[f"{c} ms" for c in columns], "flex / attnfuse"]
    cells = []
    for row in rows:
        times = [row.get(f"{c}_error") or benchlib.fmt(row.get(f"{c}_ms"), ".4f") for c in columns]
        cells.append([row["shape"], row["variant"], row["mode"], row["n"], row["documents"], *times,
                      benchlib.fmt(row.get("flex_over_attnfuse"), ".2f", "x")])
    return benchlib.markdown_table(header, cells)


def plot(document: dict, columns: list[str], path: Path) -> None:
    """ms against N per (geometry, variant, mode), one line per column (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    rows = document["rows"]
    groups = sorted({(r["geometry"], r["variant"], r["mode"]) for r in rows})
    if not groups:
        return
    fig, axes = plt.subplots(1, len(groups), figsize=(4.5 * len(groups), 3.6), squeeze=False)
    for ax, (geometry, variant, mode) in zip(axes[0], groups):
        mine = sorted((r for r in rows if (r["geometry"], r["variant"], r["mode"]) == (geometry, variant, mode)),
                      key=lambda r: r["n"])
        for column in columns:
            points = [(r["n"], r[f"{column}_ms"]) for r in mine if r.get(f"{column}_ms")]
            if points:
                ax.plot(*zip(*points), marker="o", label=column)
        ax.set_title(f"{geometry} {variant} {mode}", fontsize=9)
        ax.set_xlabel("N (tokens in the pack)")
        ax.set_ylabel("ms")
        ax.set_xscale("log", base=2)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())

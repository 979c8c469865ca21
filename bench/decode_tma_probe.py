"""Whether TMA loads would let a split-KV decode step reach issue 16's 80% of copy bandwidth:
hand-written probe kernels beside AttnFuse's printed decode, at the decode benchmark's long
single-sequence caches (fp16, one query token, contiguous cache), on a Hopper GPU.

Kernels (each program owns one key/value head's contiguous share of the keys, one wave):

- `stream ptr` / `stream tma`: only read K and V (pointer loads against tensor-descriptor
  loads, which Triton lowers to TMA copies with mbarriers on sm_90);
- `split ptr` / `split tma`: the split kernel's arithmetic (the group's query rows against a
  key block, online softmax, the value product), writing per-split partial outputs and
  log-sum-exps; the partials are merged in torch only to check the result against SDPA.

Each is timed as bench/decode_profile.py times AttnFuse (`graph_times`: a one-call CUDA graph
after a dirty and a clean L2 flush, 16 calls per graph warm; `kernel_profile`: device µs per
kernel). A probe, not a product: what it finds decides whether the printer's decode loads
become descriptor loads.

    python bench/decode_tma_probe.py [--rows 2,3] [--reps 50] [--out DIR] [--sweep loads|lens]

`--sweep lens` times instead the split kernel (pointer loads, three stages, four warps) as it
is, with its loop's end read from memory first (AttnFuse's decode reads `kv_lens` before its
key loop), and with that read preceded by L2 prefetches of the split's first key and value
rows (`prefetch.global.L2`).
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.tools.tensor_descriptor import TensorDescriptor

import benchlib  # type: ignore[import-not-found]
from decode_profile import ROWS, Flush, decode_inputs, graph_times, kernel_profile  # type: ignore[import-not-found]


@triton.jit
def load_kv(k_desc, v_desc, k_ptr, v_ptr, row, offsets, D: tl.constexpr, TMA: tl.constexpr):
    """The K and V blocks from key row `row` (of the [rows, D] views): through the tensor
    descriptors (TMA copies on sm_90) with `TMA`, else as pointer blocks at `offsets`."""
    if TMA:
        return k_desc.load([row, 0]), v_desc.load([row, 0])
    return tl.load(k_ptr + row * D + offsets), tl.load(v_ptr + row * D + offsets)


@triton.jit
def stream_probe(k_desc, v_desc, k_ptr, v_ptr, out_ptr, rows_per_program, D: tl.constexpr,
                 BLOCK: tl.constexpr, STAGES: tl.constexpr, TMA: tl.constexpr):
    """Sums program `pid`'s contiguous share of K and V (the reads a decode makes, nothing else)."""
    pid = tl.program_id(0)
    base = pid * rows_per_program
    offsets = tl.arange(0, BLOCK)[:, None] * D + tl.arange(0, D)[None, :]
    acc = tl.zeros([BLOCK, D], dtype=tl.float32)
    for row in tl.range(0, rows_per_program, BLOCK, num_stages=STAGES):
        k, v = load_kv(k_desc, v_desc, k_ptr, v_ptr, base + row, offsets, D, TMA)
        acc += k.to(tl.float32) + v.to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc))


@triton.jit
def prefetch_rows(ptr, first_row, ROWS: tl.constexpr, D: tl.constexpr):
    """Asks L2 for rows [first_row, first_row + ROWS) of a row-major [*, D] fp16 tensor, one
    `prefetch.global.L2` per 128-byte line; nothing waits for them."""
    lines = tl.arange(0, ROWS * D // 64)
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l",
                              [ptr + first_row * D + lines * 64], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def split_probe(q_ptr, k_desc, v_desc, k_ptr, v_ptr, o_ptr, lse_ptr, lens_ptr, seq_len, split_len, qk_scale,
                GROUP: tl.constexpr, BLOCK_M: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr,
                STAGES: tl.constexpr, TMA: tl.constexpr, LENS: tl.constexpr = False,
                PREFETCH: tl.constexpr = 0):
    """One split of one key/value head: the group's query rows against keys
    [split * split_len, (split + 1) * split_len), partial output and lse per row. With `LENS`
    the split's end is clipped to the sequence length read from `lens_ptr` (as AttnFuse's
    decode reads `kv_lens`: the loop waits for that read); with `PREFETCH` the split's first
    PREFETCH key and value rows are asked of L2 before that read."""
    head = tl.program_id(0)
    split = tl.program_id(1)
    splits = tl.num_programs(1)
    if PREFETCH > 0:
        prefetch_rows(k_ptr, head * seq_len + split * split_len, PREFETCH, D)
        prefetch_rows(v_ptr, head * seq_len + split * split_len, PREFETCH, D)
    end = split_len
    if LENS:
        end = tl.minimum(tl.maximum(tl.load(lens_ptr) - split * split_len, 0), split_len)
    rows = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, D)
    live = rows < GROUP
    q = tl.load(q_ptr + (head * GROUP + rows)[:, None] * D + cols[None, :], mask=live[:, None], other=0.0)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    base = head * seq_len + split * split_len
    offsets = tl.arange(0, BLOCK)[:, None] * D + cols[None, :]
    for n in tl.range(0, end, BLOCK, num_stages=STAGES):
        k, v = load_kv(k_desc, v_desc, k_ptr, v_ptr, base + n, offsets, D, TMA)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        l = l * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    out_rows = (head * GROUP + rows) * splits + split
    tl.store(o_ptr + out_rows[:, None] * D + cols[None, :], acc / l[:, None], mask=live[:, None])
    tl.store(lse_ptr + out_rows, m + tl.log2(l), mask=live)


def merge(o: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """The exact merge of per-split partials (lse in log2 units) over the split axis."""
    weights = torch.softmax(lse * 0.6931471805599453, dim=-1)
    return (o * weights[..., None]).sum(-2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="2,3")
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--out", default=None)
    parser.add_argument("--quick", action="store_true", help="a few configurations only")
    parser.add_argument("--sweep", choices=("loads", "lens"), default="loads",
                        help="loads: pointer against TMA loads (stream and split); lens: the split kernel "
                             "with the kv_lens read before its loop, with and without L2 prefetches ahead of it")
    args = parser.parse_args(argv)
    import attnfuse as af

    decode = af.compile(af.attention(af.causal()))
    lines = [f"# Decode TMA probe ({torch.cuda.get_device_name()})", ""]
    lines += benchlib.metadata_lines(benchlib.metadata("cuda")) + [""]
    flush = Flush()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for row in args.rows.split(","):
        title, b, hq, hkv, d, length = ROWS[row]
        assert b == 1, "the probe takes one sequence"
        q, k, v, lens = decode_inputs(row)
        kv_bytes = 2 * k.numel() * k.element_size()
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            ref = F.scaled_dot_product_attention(q, k, v, enable_gqa=True).float()
        lines += [f"## {title} ({kv_bytes / 1e6:.1f} MB of K and V)", ""]
        table = []

        def record(name, fn, read_bytes, err=""):
            try:
                fn()
                times = graph_times(fn, flush, args.reps)
                prof = kernel_profile(fn)
            except Exception as exc:  # noqa: BLE001 - a configuration that does not compile
                table.append([name, "n/a", "", "", "", "", "", benchlib.first_line(exc)[:120]])
                return
            kern = "; ".join(f"{n[:40]} {t:.2f}" for n, t in prof["kernels"].items())
            table.append([name, f"{times['dirty']:.2f}", f"{times['clean']:.2f}", f"{times['warm']:.2f}",
                          f"{prof['span']:.2f}", f"{read_bytes / times['clean'] / 1e3:.0f}",
                          f"{read_bytes / prof['span'] / 1e3:.0f}", f"{err} {kern}".strip()])
            print(table[-1], flush=True)

        def attnfuse_call():
            return decode(q, k, v, kv_lens=lens)

        err = (attnfuse_call().float() - ref).abs().max().item()
        record("attnfuse decode", attnfuse_call, kv_bytes, f"err {err:.1e}")

        k2, v2 = k.view(-1, d), v.view(-1, d)
        out = torch.empty(4096, device="cuda", dtype=torch.float32)
        rows_total = hkv * length
        blocks = (64, 128)
        stage_counts = (3, 4, 6) if not args.quick else (3, 4)
        program_counts = (128, 256) if not args.quick else (128,)
        stream_configs = itertools.product(program_counts, blocks, stage_counts, (False, True))
        for programs, block, stages, tma in stream_configs if args.sweep == "loads" else ():
            share = rows_total // programs
            if share % block:
                continue
            kd = TensorDescriptor.from_tensor(k2, [block, d])
            vd = TensorDescriptor.from_tensor(v2, [block, d])

            def stream(programs=programs, share=share, block=block, stages=stages, tma=tma, kd=kd, vd=vd):
                stream_probe[(programs,)](kd, vd, k2, v2, out, share, D=d, BLOCK=block, STAGES=stages,
                                          TMA=tma, num_warps=4)
            record(f"stream {'tma' if tma else 'ptr'} P={programs} {block}x{stages}", stream,
                   2 * programs * share * d * 2)

        group = hq // hkv
        block_m = max(16, triton.next_power_of_2(group))
        scale = d ** -0.5 * 1.4426950408889634
        q2 = q.view(hq, d)
        if args.sweep == "loads":
            split_configs = [(*c, False, 0) for c in itertools.product(
                (sms // hkv, 2 * sms // hkv) if not args.quick else (sms // hkv,), blocks,
                stage_counts, (4, 8) if not args.quick else (4,), (False, True))]
        else:  # the kv_lens read before the loop, and L2 prefetches ahead of it
            split_configs = [(sms // hkv, block, 3, 4, False, lens_read, prefetch) for block in blocks
                             for lens_read, prefetch in ((False, 0), (True, 0), (True, block), (True, 2 * block))]
        for splits, block, stages, warps, tma, lens_read, prefetch in split_configs:
            split_len = triton.cdiv(triton.cdiv(length, splits), block) * block
            splits = triton.cdiv(length, split_len)
            if splits * split_len != length:
                continue
            o = torch.empty(hkv * group, splits, d, device="cuda", dtype=torch.float32)
            lse = torch.empty(hkv * group, splits, device="cuda", dtype=torch.float32)
            kd = TensorDescriptor.from_tensor(k2, [block, d])
            vd = TensorDescriptor.from_tensor(v2, [block, d])

            def split_call(splits=splits, split_len=split_len, block=block, stages=stages, warps=warps,
                           tma=tma, kd=kd, vd=vd, o=o, lse=lse, lens_read=lens_read, prefetch=prefetch):
                split_probe[(hkv, splits)](q2, kd, vd, k2, v2, o, lse, lens, length, split_len, scale,
                                           GROUP=group, BLOCK_M=block_m, D=d, BLOCK=block, STAGES=stages,
                                           TMA=tma, LENS=lens_read, PREFETCH=prefetch, num_warps=warps)
            try:
                split_call()
                got = merge(o, lse).view(1, hq, 1, d)
                perr = f"err {(got - ref).abs().max().item():.1e}"
            except Exception as exc:  # noqa: BLE001
                perr = benchlib.first_line(exc)[:120]
            form = (" lens" if lens_read else "") + (f" prefetch{prefetch}" if prefetch else "")
            record(f"split {'tma' if tma else 'ptr'} S={splits} {block}x{stages} w{warps}{form}", split_call,
                   kv_bytes, perr)
        lines += benchlib.markdown_table(
            ["kernel", "graph µs (dirty flush)", "graph µs (clean flush)", "warm µs", "kernel span µs",
             "GB/s (clean graph)", "GB/s (kernel span)", "notes"], table)
        lines.append("")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        path = Path(args.out) / f"{benchlib.stamp()}-decode_tma_probe.md"
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

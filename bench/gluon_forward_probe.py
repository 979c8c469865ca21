"""A warp-specialized Hopper attention forward written in Gluon by hand: the probe that says what
Triton 3.6's Gluon can express and how fast it runs, before the tile IR lowers to it (issue 17).

Design (FlashAttention-3's forward, without the ping-pong between two query tiles):

- one program per (block of BLOCK_M query rows, batch x query head); the longest causal
  programs first;
- a 1-warp loader partition issues TMA loads of Q once and of K and V blocks into a ring of
  STAGES shared-memory buffers, each buffer with a "ready" barrier (TMA byte count) and an
  "empty" barrier (released by the consumers: K right after S = QK^T, V after O += PV);
- the default partition (2 warpgroups, 128 rows) runs the products with `warpgroup_mma`, P from
  registers, and overlaps the softmax of block j with the PV product of block j-1 (issue S_j,
  issue PV_{j-1}, wait for S_j only, softmax S_j, then wait for PV_{j-1});
- O goes out through shared memory and a TMA store; the log-sum-exp (natural log) by plain
  stores.

    python bench/gluon_forward_probe.py --compile-only      # no GPU: compile for sm_90 offline
    python bench/gluon_forward_probe.py --out DIR           # H200: check and time beside cuDNN

Sequence lengths must be multiples of the block sizes (a probe, not the product).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

LOG2E = 1.4426950408889634


@gluon.jit
def _loader(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, k_ready, k_empty, v_ready,
            v_empty, q_row, kv_row, n_blocks, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row, 0], q_bar, q_smem)
    for j in range(n_blocks):
        stage = j % STAGES
        phase = (j // STAGES) & 1
        # Barriers start as if phase 1 had completed: the first round waits on nothing.
        mbarrier.wait(k_empty.index(stage), phase ^ 1)
        mbarrier.expect(k_ready.index(stage), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [kv_row + j * BLOCK_N, 0], k_ready.index(stage),
                                        k_bufs.index(stage))
        mbarrier.wait(v_empty.index(stage), phase ^ 1)
        mbarrier.expect(v_ready.index(stage), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [kv_row + j * BLOCK_N, 0], v_ready.index(stage),
                                        v_bufs.index(stage))


@gluon.jit
def _softmax_step(s, m_i, l_i, qk_scale, q_start, k_start, diag, CAUSAL: gl.constexpr,
                  BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, s_layout: gl.constexpr):
    """One block's online-softmax update: (p, alpha, m_new, l_new); s in the scaled base-2
    domain after this."""
    s = s * qk_scale
    if CAUSAL:
        # Only blocks that cross the diagonal mask; the check is one scalar compare.
        if k_start + BLOCK_N > q_start + diag:
            rows = q_start + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
            cols = k_start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
            keep = cols[None, :] <= rows[:, None] + diag
            s = gl.where(keep, s, -float("inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1))
    # A row with no key yet keeps m = -inf; subtracting 0 keeps its p at 0, not NaN.
    m_safe = gl.where(m_new == -float("inf"), 0.0, m_new)
    p = gl.exp2(s - m_safe[:, None])
    alpha = gl.exp2(m_i - m_safe)
    l_new = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, m_new, l_new


@gluon.jit
def _consumer(q_smem, k_bufs, v_bufs, q_bar, k_ready, k_empty, v_ready, v_empty, n_blocks,
              qk_scale, q_start, diag, CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr,
              BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr,
              s_layout: gl.constexpr, o_layout: gl.constexpr, p_layout: gl.constexpr):
    dtype: gl.constexpr = q_smem.dtype
    m_i = gl.full([BLOCK_M], -float("inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_M], gl.float32, layout=gl.SliceLayout(1, s_layout))
    o = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)

    mbarrier.wait(q_bar, 0)
    # Block 0: S_0, its softmax; PV_0 is issued in the loop's first step.
    mbarrier.wait(k_ready.index(0), 0)
    s = warpgroup_mma(q_smem, k_bufs.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=(s,))
    mbarrier.arrive(k_empty.index(0), count=1)
    p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, qk_scale, q_start, 0, diag, CAUSAL, BLOCK_M,
                                       BLOCK_N, s_layout)
    for j in range(1, n_blocks):
        stage = j % STAGES
        phase = (j // STAGES) & 1
        prev = (j - 1) % STAGES
        prev_phase = ((j - 1) // STAGES) & 1
        mbarrier.wait(k_ready.index(stage), phase)
        s = warpgroup_mma(q_smem, k_bufs.index(stage).permute((1, 0)), s_zero, use_acc=False,
                          is_async=True)
        # O_{j-1} = O_{j-2} * alpha_{j-1} + P_{j-1} V_{j-1}, issued behind S_j.
        o = o * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        mbarrier.wait(v_ready.index(prev), prev_phase)
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        o = warpgroup_mma(p_op, v_bufs.index(prev), o, is_async=True)
        # Groups complete in issue order: at most one outstanding means S_j is done.
        s = warpgroup_mma_wait(1, deps=(s,))
        mbarrier.arrive(k_empty.index(stage), count=1)
        p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, qk_scale, q_start, j * BLOCK_N, diag,
                                           CAUSAL, BLOCK_M, BLOCK_N, s_layout)
        o, p_op = warpgroup_mma_wait(0, deps=(o, p_op))
        mbarrier.arrive(v_empty.index(prev), count=1)
    last = (n_blocks - 1) % STAGES
    last_phase = ((n_blocks - 1) // STAGES) & 1
    o = o * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    mbarrier.wait(v_ready.index(last), last_phase)
    p_op = gl.convert_layout(p.to(dtype), p_layout)
    o = warpgroup_mma(p_op, v_bufs.index(last), o, is_async=True)
    o, p_op = warpgroup_mma_wait(0, deps=(o, p_op))
    mbarrier.arrive(v_empty.index(last), count=1)
    return o, m_i, l_i


@gluon.jit
def attention_fwd_ws(q_desc, k_desc, v_desc, o_desc, lse_ptr, sm_scale, seq_q, seq_k, heads,
                     group, CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                     HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr):
    dtype: gl.constexpr = q_desc.dtype
    bh = gl.program_id(1)
    # Longest causal programs first (the last query blocks see the most keys).
    block = gl.num_programs(0) - 1 - gl.program_id(0) if CAUSAL else gl.program_id(0)
    q_start = block * BLOCK_M
    kv_head = bh // group
    batch = bh // heads
    kv_bh = batch * (heads // group) + (bh % heads) // group
    q_row = bh * seq_q + q_start
    kv_row = kv_bh * seq_k
    diag = seq_k - seq_q  # bottom-right causal alignment
    if CAUSAL:
        hi = gl.minimum(seq_k, q_start + BLOCK_M + diag)
    else:
        hi = seq_k
    n_blocks = gl.cdiv(hi, BLOCK_N)

    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], q_desc.layout)
    k_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(v_empty.index(i), count=1)

    qk_scale = sm_scale * 1.4426950408889634
    o, m_i, l_i = gl.warp_specialize([
        (_consumer, (q_smem, k_bufs, v_bufs, q_bar, k_ready, k_empty, v_ready, v_empty, n_blocks,
                     qk_scale, q_start, diag, CAUSAL, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES,
                     s_layout, o_layout, p_layout)),
        (_loader, (q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_bar, k_ready, k_empty,
                   v_ready, v_empty, q_row, kv_row, n_blocks, BLOCK_N, STAGES)),
    ], [1], [24])

    # Rows without keys have l = 0: their output and weight are 0 and -inf, never NaN.
    l_safe = gl.where(l_i == 0.0, 1.0, l_i)
    o = o / gl.convert_layout(l_safe, gl.SliceLayout(1, o_layout))[:, None]
    lse = gl.where(l_i == 0.0, -float("inf"), (m_i + gl.log2(l_safe)) * 0.6931471805599453)
    rows = q_start + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    gl.store(lse_ptr + bh * seq_q + rows, lse)
    q_smem.store(o.to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [q_row, 0], q_smem)
    tma.store_wait(0)


def attention(q, k, v, causal: bool, block_m: int = 128, block_n: int = 128, stages: int = 2,
              num_warps: int = 8, maxnreg: int | None = 168):
    """o, lse of softmax attention (scale 1/sqrt(D)); q [B,Hq,N,D], k/v [B,Hkv,Nk,D]."""
    batch, heads, seq_q, dim = q.shape
    seq_k = k.shape[2]
    assert seq_q % block_m == 0 and seq_k % block_n == 0, "the probe needs whole blocks"
    dtype = gl.float16 if q.dtype == torch.float16 else gl.bfloat16
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:-1], device=q.device, dtype=torch.float32)
    q2, k2, v2, o2 = (t.reshape(-1, dim) for t in (q, k, v, o))
    q_layout = gl.NVMMASharedLayout.get_default_for([block_m, dim], dtype)
    kv_layout = gl.NVMMASharedLayout.get_default_for([block_n, dim], dtype)
    q_desc = TensorDescriptor.from_tensor(q2, [block_m, dim], q_layout)
    o_desc = TensorDescriptor.from_tensor(o2, [block_m, dim], q_layout)
    k_desc = TensorDescriptor.from_tensor(k2, [block_n, dim], kv_layout)
    v_desc = TensorDescriptor.from_tensor(v2, [block_n, dim], kv_layout)
    grid = (seq_q // block_m, batch * heads)
    extra = {"maxnreg": maxnreg} if maxnreg else {}
    attention_fwd_ws[grid](q_desc, k_desc, v_desc, o_desc, lse, 1.0 / math.sqrt(dim), seq_q, seq_k,
                           heads, heads // k.shape[1], causal, block_m, block_n, dim, stages,
                           num_warps=num_warps, **extra)
    return o, lse


def compile_only(capability: int) -> None:
    """Compile for sm_`capability` with no GPU (tensors on the CPU, nothing launched)."""
    sys.path.insert(0, os.path.dirname(__file__))
    from kernel_resources import TargetOnlyDriver, resources
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    driver.set_active(TargetOnlyDriver(GPUTarget("cuda", capability, 32)))
    for dim, causal in ((64, True), (128, True), (128, False)):
        q = torch.empty(1, 2, 256, dim, dtype=torch.float16)
        k = torch.empty(1, 2, 256, dim, dtype=torch.float16)
        dtype = gl.float16
        q_layout = gl.NVMMASharedLayout.get_default_for([128, dim], dtype)
        descs = [TensorDescriptor.from_tensor(t.reshape(-1, dim), [128, dim], q_layout) for t in (q, k, k, q)]
        lse = torch.empty(1, 2, 256)
        compiled = attention_fwd_ws.warmup(*descs, lse, 0.1, 256, 256, 2, 1, causal, 128, 128, dim, 2,
                                           num_warps=8, maxnreg=168, grid=(1,))
        used = resources(compiled.asm["cubin"])
        print(f"D={dim} causal={causal}: {used}, shared {compiled.metadata.shared} B", flush=True)


def reference(q, k, v, causal):
    import torch.nn.functional as F
    group = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(group, 1) for t in (k, v))
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--capability", type=int, default=90)
    parser.add_argument("--out")
    parser.add_argument("--sweep", action="store_true", help="also time a few tile configurations")
    args = parser.parse_args()
    if args.compile_only:
        compile_only(args.capability)
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
    import attnfuse as af

    torch.manual_seed(0)
    rows = []
    # Correctness first, at a small GQA shape and the benchmark's.
    for dim, causal, (b, h, hkv, n) in ((64, True, (1, 4, 2, 512)), (128, False, (1, 4, 1, 384)),
                                        (128, True, (2, 8, 8, 1024))):
        q = torch.randn(b, h, n, dim, device="cuda", dtype=torch.float16)
        k, v = (torch.randn(b, hkv, n, dim, device="cuda", dtype=torch.float16) for _ in range(2))
        o, _ = attention(q, k, v, causal)
        err = (o.float() - reference(q, k, v, causal)).abs().max().item()
        print(f"check D={dim} causal={causal} {b}x{h}/{hkv}x{n}: max err {err:.2e}", flush=True)
        rows.append({"check": f"D={dim} causal={causal}", "max_err": err})
    cases = [("causal", 4, 12, 12, 64, n, torch.float16) for n in (4096, 8192, 16384)]
    cases += [("dense", 4, 12, 12, 64, 4096, torch.float16)]
    cases += [("causal", 1, 32, 8, 128, n, torch.bfloat16) for n in (4096, 8192)]
    cases += [("dense", 1, 32, 8, 128, 4096, torch.bfloat16)]
    for name, b, h, hkv, dim, n, dtype in cases:
        causal = name == "causal"
        q = torch.randn(b, h, n, dim, device="cuda", dtype=dtype)
        k, v = (torch.randn(b, hkv, n, dim, device="cuda", dtype=dtype) for _ in range(2))
        fn = af.compile(af.attention(af.causal()) if causal else af.attention())
        kk, vv = (t.repeat_interleave(h // hkv, 1) for t in (k, v))
        impls = {"gluon": lambda: attention(q, k, v, causal),
                 "attnfuse_tl": lambda: fn(q, k, v)}

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, kk, vv, is_causal=causal)
        impls["cudnn"] = cudnn
        row = {"case": f"{name} B{b} H{h}/{hkv} D{dim} N{n} {str(dtype)[6:]}"}
        for label, impl in impls.items():
            row[label] = triton.testing.do_bench(impl, warmup=50, rep=300)
        out = attention(q, k, v, causal)[0].float()
        row["err_vs_cudnn"] = (out - cudnn().float()).abs().max().item()
        flops = 4 * b * h * n * n * dim * (0.5 if causal else 1)
        row["gluon_tflops"] = flops / row["gluon"] / 1e9
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.sweep:
        for dim, dtype in ((64, torch.float16), (128, torch.bfloat16)):
            b, h, n = (4, 12, 8192) if dim == 64 else (1, 32, 8192)
            q, k, v = (torch.randn(b, h, n, dim, device="cuda", dtype=dtype) for _ in range(3))
            for bm, bn, stages, warps, nreg in ((128, 128, 2, 8, 168), (128, 128, 3, 8, 168),
                                               (128, 64, 3, 8, 168), (128, 64, 4, 8, 168),
                                               (128, 128, 2, 8, None), (64, 128, 2, 4, None)):
                if dim == 128 and bn == 128 and stages > 2:
                    continue
                try:
                    ms = triton.testing.do_bench(lambda: attention(q, k, v, True, bm, bn, stages, warps, nreg),
                                                 warmup=50, rep=300)
                    row = {"sweep": f"D{dim} causal N{n} bm{bm} bn{bn} st{stages} w{warps} nreg{nreg}", "ms": ms}
                except Exception as e:  # a configuration that does not fit is reported, not fatal
                    row = {"sweep": f"D{dim} bm{bm} bn{bn} st{stages} w{warps} nreg{nreg}", "error": str(e)[:200]}
                print(json.dumps(row), flush=True)
                rows.append(row)
    if args.out:
        with open(os.path.join(args.out, "gluon_forward_probe.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

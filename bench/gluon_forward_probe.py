"""Warp-specialized Hopper attention forwards written in Gluon by hand: the probes that say what
Triton 3.6's Gluon can express and how fast it runs, before the tile IR lowers to it (issue 17).

`attention_fwd_ws` (the lead's first probe; variants `probe`, `probe_fix`): one program per
(block of 128 query rows, batch x query head), the longest causal programs first; a 1-warp
loader partition issues TMA loads of Q once and of K and V blocks into a ring of STAGES
shared-memory buffers, each with a "ready" barrier (TMA byte count) and an "empty" barrier
(released by the consumers: K right after S = QK^T, V after O += PV); the default partition
(2 warpgroups in lockstep) runs the products with `warpgroup_mma`, P from registers, and means to
overlap the softmax of block j with PV_{j-1} (issue S_j, issue PV_{j-1}, wait for S_j only,
softmax S_j, then wait for PV_{j-1}). ptxas hoists that last wait above the softmax, so in the
SASS nothing overlaps (`ex2-under-PV 0/..` in --compile-only); `probe_fix` adds a block boundary
that keeps the order.

`attention_fwd_pp` (variants `pp2`, `pp2_free`, `pp2_st3`, `pp3`): FlashAttention-3's ping-pong.
NUM_WG consumer partitions of one warpgroup each (64 query rows apiece, NUM_WG * 64 per
program) share the K/V ring; an mbarrier token ring makes their GEMM issue alternate, so one
warpgroup's softmax runs under the others' products; each consumer stores its own O (TMA) and
lse. Register budgets per partition through `warp_specialize`'s worker_num_regs.

`attention_fwd_ps` (variants `ps2`, `ps3`): the same, persistent (one program per SM walking
tiles, the causal ones longest first), the loader running ahead into the next tile.

    python bench/gluon_forward_probe.py --compile-only      # no GPU: compile for sm_90 offline
    python bench/gluon_forward_probe.py --out DIR           # H200: check and time beside cuDNN

Sequence lengths must be multiples of the block sizes (Nq of 64 for the ping-pong kernel, Nk of
its key block; a probe, not the product).
"""

from __future__ import annotations

import argparse
import itertools
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
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma_init
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

LOG2E = 1.4426950408889634
DEVICE = "cuda"  # where the checks and timings put their tensors


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
              s_layout: gl.constexpr, o_layout: gl.constexpr, p_layout: gl.constexpr,
              ORDER_FIX: gl.constexpr):
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
        if ORDER_FIX:
            # A try_wait loop on Q's barrier (long complete: it returns at once) between the
            # softmax and the wait for PV: ptxas otherwise hoists that wait above the softmax,
            # which then no longer overlaps PV.
            mbarrier.wait(q_bar, 0)
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
                     HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr,
                     ORDER_FIX: gl.constexpr = False):
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
    # At least one (fully masked) block when no row of the program has a key: no zero-trip hang.
    n_blocks = gl.maximum(gl.cdiv(hi, BLOCK_N), 1)

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
                     s_layout, o_layout, p_layout, ORDER_FIX)),
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


# ---------------------------------------------------------------------------------------------
# Ping-pong: NUM_WG consumer warpgroups, each a partition of its own (4 warps, 64 query rows of
# the program's NUM_WG * 64), sharing one K/V ring. Consumer 0 is the default partition, the
# others workers; each stores its own O and lse (workers return nothing). With PINGPONG an
# mbarrier token ring orders the GEMM issue of the warpgroups (0, 1, .., 0, 1, ..), so one
# warpgroup's softmax runs while the next one's products occupy the tensor cores (FA3's
# scheduler barrier, made of mbarriers since Gluon has no named barriers).
# ---------------------------------------------------------------------------------------------

ROWS_PER_WG = 64


@gluon.jit
def _pp_loader(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_bars, k_ready, k_empty, v_ready,
               v_empty, q_row, kv_row, n_blocks, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
               NUM_WG: gl.constexpr):
    # Q of consumer 0, then K_0, then the other Q tiles: consumer 0 starts as soon as it can.
    mbarrier.expect(q_bars.index(0), q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row, 0], q_bars.index(0), q_bufs.index(0))
    for j in range(n_blocks):
        stage = j % STAGES
        phase = (j // STAGES) & 1
        # Barriers start as if phase 1 had completed: the first round waits on nothing.
        mbarrier.wait(k_empty.index(stage), phase ^ 1)
        mbarrier.expect(k_ready.index(stage), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [kv_row + j * BLOCK_N, 0], k_ready.index(stage),
                                        k_bufs.index(stage))
        if j == 0:
            for c in gl.static_range(1, NUM_WG):
                mbarrier.expect(q_bars.index(c), q_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(q_desc, [q_row + c * 64, 0], q_bars.index(c),
                                                q_bufs.index(c))
        mbarrier.wait(v_empty.index(stage), phase ^ 1)
        mbarrier.expect(v_ready.index(stage), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [kv_row + j * BLOCK_N, 0], v_ready.index(stage),
                                        v_bufs.index(stage))


@gluon.jit
def _pp_softmax(s, m_i, l_i, qk_scale, q_start, k_start, diag, CAUSAL: gl.constexpr,
                BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, s_layout: gl.constexpr):
    """One block's online-softmax update on raw scores s; m_i is kept in the scaled base-2
    domain, so p = exp2(s * scale - m) is one FMA and an exp2 per score (FA3's form)."""
    if CAUSAL:
        # Only blocks that cross this warpgroup's diagonal mask; one scalar compare.
        if k_start + BLOCK_N > q_start + diag + 1:
            rows = q_start + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
            cols = k_start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
            keep = cols[None, :] <= rows[:, None] + diag
            s = gl.where(keep, s, -float("inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    # A row with no key yet keeps m = -inf; subtracting 0 keeps its p at 0, not NaN.
    m_safe = gl.where(m_new == -float("inf"), 0.0, m_new)
    p = gl.exp2(s * qk_scale - m_safe[:, None])
    alpha = gl.exp2(m_i - m_safe)
    l_new = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, m_new, l_new


@gluon.jit
def _pp_sched_wait(sched, it, WG: gl.constexpr, PINGPONG: gl.constexpr):
    # Warpgroup WG's it-th GEMM issue waits for warpgroup WG-1's it-th (WG-1 = the last one's
    # (it-1)-th for WG 0, whose first issue waits on nothing: parity 1 reads as complete).
    if PINGPONG:
        if WG == 0:
            mbarrier.wait(sched.index(0), (it + 1) & 1)
        else:
            mbarrier.wait(sched.index(WG), it & 1)


@gluon.jit
def _pp_sched_pass(sched, WG: gl.constexpr, NUM_WG: gl.constexpr, PINGPONG: gl.constexpr):
    if PINGPONG:
        mbarrier.arrive(sched.index((WG + 1) % NUM_WG), count=1)


@gluon.jit
def _pp_consumer(o_desc, lse_ptr, q_bufs, k_bufs, v_bufs, q_bars, k_ready, k_empty, v_ready,
                 v_empty, sched, n_blocks, qk_scale, q_start, q_row, lse_row, seq_q, diag,
                 WG: gl.constexpr, NUM_WG: gl.constexpr, CAUSAL: gl.constexpr,
                 PINGPONG: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                 STAGES: gl.constexpr):
    BLOCK_M: gl.constexpr = 64
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    q_smem = q_bufs.index(WG)
    dtype: gl.constexpr = q_smem.dtype
    my_start = q_start + WG * BLOCK_M
    m_i = gl.full([BLOCK_M], -float("inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_M], gl.float32, layout=gl.SliceLayout(1, s_layout))
    o = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)

    mbarrier.wait(q_bars.index(WG), 0)
    # Block 0: S_0 and its softmax; PV_0 is issued beside S_1 in the loop.
    mbarrier.wait(k_ready.index(0), 0)
    _pp_sched_wait(sched, 0, WG, PINGPONG)
    s = warpgroup_mma(q_smem, k_bufs.index(0).permute((1, 0)), s_zero, use_acc=False,
                      is_async=True)
    _pp_sched_pass(sched, WG, NUM_WG, PINGPONG)
    s = warpgroup_mma_wait(0, deps=(s,))
    mbarrier.arrive(k_empty.index(0), count=1)
    p, alpha, m_i, l_i = _pp_softmax(s, m_i, l_i, qk_scale, my_start, 0, diag, CAUSAL, BLOCK_M,
                                     BLOCK_N, s_layout)
    # ptxas hoists a `wgmma.wait_group 0` (and the bar.sync + arrive after it) above a softmax
    # that precedes it in the same basic block, which serialises PV_{j-1} and the softmax of
    # S_j (seen in the SASS). A try_wait loop (a block boundary) between the softmax and the
    # wait keeps the order. Keeping PV in flight across the loop's back edge instead makes
    # ptxas serialise every wgmma (C7512, "insufficient register resources").
    # P goes to the MMA operand layout in 16 bits right after its softmax: the loop carries
    # 32 registers of P instead of 64 (at D=64 the fp32 P carried across the back edge pushed a
    # consumer past 200 registers).
    p_cur = gl.convert_layout(p.to(dtype), p_layout)
    for j in range(1, n_blocks):
        stage = j % STAGES
        phase = (j // STAGES) & 1
        prev = (j - 1) % STAGES
        prev_phase = ((j - 1) // STAGES) & 1
        # Data first, then the issue token: no warpgroup holds the token while it waits on TMA.
        mbarrier.wait(k_ready.index(stage), phase)
        mbarrier.wait(v_ready.index(prev), prev_phase)
        # O to block j-1's scale (alpha of block j-1), then O += P_{j-1} V_{j-1} behind S_j.
        o = o * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        _pp_sched_wait(sched, j, WG, PINGPONG)
        s = warpgroup_mma(q_smem, k_bufs.index(stage).permute((1, 0)), s_zero, use_acc=False,
                          is_async=True)
        o_acc = warpgroup_mma(p_cur, v_bufs.index(prev), o, is_async=True)
        _pp_sched_pass(sched, WG, NUM_WG, PINGPONG)
        # Groups complete in issue order: at most one outstanding means S_j is done.
        s = warpgroup_mma_wait(1, deps=(s,))
        mbarrier.arrive(k_empty.index(stage), count=1)
        p, alpha, m_i, l_i = _pp_softmax(s, m_i, l_i, qk_scale, my_start, j * BLOCK_N, diag,
                                         CAUSAL, BLOCK_M, BLOCK_N, s_layout)
        p_next = gl.convert_layout(p.to(dtype), p_layout)
        # A try_wait loop on Q's barrier (long complete, so it returns at once): a block
        # boundary that keeps the PV wait below the softmax.
        mbarrier.wait(q_bars.index(WG), 0)
        o, p_cur = warpgroup_mma_wait(0, deps=(o_acc, p_cur))
        mbarrier.arrive(v_empty.index(prev), count=1)
        p_cur = p_next
    last = (n_blocks - 1) % STAGES
    last_phase = ((n_blocks - 1) // STAGES) & 1
    mbarrier.wait(v_ready.index(last), last_phase)
    o = o * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    _pp_sched_wait(sched, n_blocks, WG, PINGPONG)
    o_acc = warpgroup_mma(p_cur, v_bufs.index(last), o, is_async=True)
    _pp_sched_pass(sched, WG, NUM_WG, PINGPONG)
    o, p_cur = warpgroup_mma_wait(0, deps=(o_acc, p_cur))
    mbarrier.arrive(v_empty.index(last), count=1)

    # Rows without keys have l = 0: their output and weight are 0 and -inf, never NaN.
    l_safe = gl.where(l_i == 0.0, 1.0, l_i)
    o = o / gl.convert_layout(l_safe, gl.SliceLayout(1, o_layout))[:, None]
    lse = gl.where(l_i == 0.0, -float("inf"), (m_i + gl.log2(l_safe)) * 0.6931471805599453)
    # A tile past the end of the sequence (NUM_WG * 64 need not divide it) stores nothing.
    if my_start < seq_q:
        rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
        gl.store(lse_ptr + lse_row + WG * BLOCK_M + rows, lse)
        # Q's buffer is free once S_{n-1} is done: O leaves through it.
        q_smem.store(o.to(dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(o_desc, [q_row + WG * BLOCK_M, 0], q_smem)
        tma.store_wait(0)


@gluon.jit
def attention_fwd_pp(q_desc, k_desc, v_desc, o_desc, lse_ptr, sm_scale, seq_q, seq_k, heads,
                     group, CAUSAL: gl.constexpr, NUM_WG: gl.constexpr, BLOCK_N: gl.constexpr,
                     HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, PINGPONG: gl.constexpr,
                     CONSUMER_REGS: gl.constexpr, LOADER_REGS: gl.constexpr):
    BLOCK_M: gl.constexpr = NUM_WG * 64
    dtype: gl.constexpr = q_desc.dtype
    bh = gl.program_id(1)
    # Longest causal programs first (the last query blocks see the most keys).
    block = gl.num_programs(0) - 1 - gl.program_id(0) if CAUSAL else gl.program_id(0)
    q_start = block * BLOCK_M
    batch = bh // heads
    kv_bh = batch * (heads // group) + (bh % heads) // group
    q_row = bh * seq_q + q_start
    kv_row = kv_bh * seq_k
    diag = seq_k - seq_q  # bottom-right causal alignment
    if CAUSAL:
        hi = gl.minimum(seq_k, q_start + BLOCK_M + diag)
    else:
        hi = seq_k
    # At least one block: a program whose rows all lack keys runs one fully masked block
    # (every consumer then ends with l = 0), which keeps the protocol free of a zero-trip case.
    n_blocks = gl.maximum(gl.cdiv(hi, BLOCK_N), 1)

    q_bufs = gl.allocate_shared_memory(dtype, [NUM_WG, 64, HEAD_DIM], q_desc.layout)
    k_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bars = gl.allocate_shared_memory(gl.int64, [NUM_WG, 1], mbarrier.MBarrierLayout())
    sched = gl.allocate_shared_memory(gl.int64, [NUM_WG, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for c in gl.static_range(NUM_WG):
        mbarrier.init(q_bars.index(c), count=1)
        mbarrier.init(sched.index(c), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=NUM_WG)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(v_empty.index(i), count=NUM_WG)

    qk_scale = sm_scale * 1.4426950408889634
    lse_row = bh * seq_q + q_start
    # Gluon takes the partition list literally (no tuples of functions, no loops): one list per
    # warpgroup count.
    if NUM_WG == 2:
        gl.warp_specialize([
            (_pp_consumer, (o_desc, lse_ptr, q_bufs, k_bufs, v_bufs, q_bars, k_ready, k_empty,
                            v_ready, v_empty, sched, n_blocks, qk_scale, q_start, q_row, lse_row,
                            seq_q, diag, 0, NUM_WG, CAUSAL, PINGPONG, BLOCK_N, HEAD_DIM, STAGES)),
            (_pp_consumer, (o_desc, lse_ptr, q_bufs, k_bufs, v_bufs, q_bars, k_ready, k_empty,
                            v_ready, v_empty, sched, n_blocks, qk_scale, q_start, q_row, lse_row,
                            seq_q, diag, 1, NUM_WG, CAUSAL, PINGPONG, BLOCK_N, HEAD_DIM, STAGES)),
            (_pp_loader, (q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_bars, k_ready,
                          k_empty, v_ready, v_empty, q_row, kv_row, n_blocks, BLOCK_N, STAGES,
                          NUM_WG)),
        ], [4, 1], [CONSUMER_REGS, LOADER_REGS])
    else:
        gl.static_assert(NUM_WG == 3, "two or three consumer warpgroups")
        gl.warp_specialize([
            (_pp_consumer, (o_desc, lse_ptr, q_bufs, k_bufs, v_bufs, q_bars, k_ready, k_empty,
                            v_ready, v_empty, sched, n_blocks, qk_scale, q_start, q_row, lse_row,
                            seq_q, diag, 0, NUM_WG, CAUSAL, PINGPONG, BLOCK_N, HEAD_DIM, STAGES)),
            (_pp_consumer, (o_desc, lse_ptr, q_bufs, k_bufs, v_bufs, q_bars, k_ready, k_empty,
                            v_ready, v_empty, sched, n_blocks, qk_scale, q_start, q_row, lse_row,
                            seq_q, diag, 1, NUM_WG, CAUSAL, PINGPONG, BLOCK_N, HEAD_DIM, STAGES)),
            (_pp_consumer, (o_desc, lse_ptr, q_bufs, k_bufs, v_bufs, q_bars, k_ready, k_empty,
                            v_ready, v_empty, sched, n_blocks, qk_scale, q_start, q_row, lse_row,
                            seq_q, diag, 2, NUM_WG, CAUSAL, PINGPONG, BLOCK_N, HEAD_DIM, STAGES)),
            (_pp_loader, (q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_bars, k_ready,
                          k_empty, v_ready, v_empty, q_row, kv_row, n_blocks, BLOCK_N, STAGES,
                          NUM_WG)),
        ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, LOADER_REGS])



# ---------------------------------------------------------------------------------------------
# Persistent ping-pong: the same consumers and token ring, one program per SM walking tiles
# pid, pid + G, ... (causal: the last query blocks of every head first, the longest work first).
# The loader runs ahead into the next tile (its Q once a consumer releases its Q buffer, its K/V
# through the same ring, whose counters run on across tiles), so a tile's prologue no longer
# waits on TMA latency and no CTA launch sits between tiles. O leaves through its own buffer.
# ---------------------------------------------------------------------------------------------

@gluon.jit
def _ps_tile(t, n_qblocks, bh_total, seq_q, seq_k, heads, group, CAUSAL: gl.constexpr,
             BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """(q_start, q_row, kv_row, n_blocks, bh) of tile t."""
    bh = t % bh_total
    if CAUSAL:
        block = n_qblocks - 1 - t // bh_total
    else:
        block = t // bh_total
    q_start = block * BLOCK_M
    batch = bh // heads
    kv_bh = batch * (heads // group) + (bh % heads) // group
    diag = seq_k - seq_q
    if CAUSAL:
        hi = gl.minimum(seq_k, q_start + BLOCK_M + diag)
    else:
        hi = seq_k
    n_blocks = gl.maximum(gl.cdiv(hi, BLOCK_N), 1)
    return q_start, bh * seq_q + q_start, kv_bh * seq_k, n_blocks, bh


@gluon.jit
def _ps_loader(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, k_empty,
               v_ready, v_empty, n_tiles, n_qblocks, bh_total, seq_q, seq_k, heads, group,
               CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
               NUM_WG: gl.constexpr):
    kv_count = 0
    i_t = 0
    for t in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        q_start, q_row, kv_row, n_blocks, bh = _ps_tile(t, n_qblocks, bh_total, seq_q, seq_k, heads,
                                                         group, CAUSAL, NUM_WG * 64, BLOCK_N)
        # A consumer's Q buffer is free once all S products of its previous tile are done.
        mbarrier.wait(q_empty.index(0), (i_t & 1) ^ 1)
        mbarrier.expect(q_ready.index(0), q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [q_row, 0], q_ready.index(0), q_bufs.index(0))
        for j in range(n_blocks):
            c = kv_count + j
            stage = c % STAGES
            phase = (c // STAGES) & 1
            mbarrier.wait(k_empty.index(stage), phase ^ 1)
            mbarrier.expect(k_ready.index(stage), k_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(k_desc, [kv_row + j * BLOCK_N, 0], k_ready.index(stage),
                                            k_bufs.index(stage))
            if j == 0:
                for w in gl.static_range(1, NUM_WG):
                    mbarrier.wait(q_empty.index(w), (i_t & 1) ^ 1)
                    mbarrier.expect(q_ready.index(w), q_desc.block_type.nbytes)
                    tma.async_copy_global_to_shared(q_desc, [q_row + w * 64, 0], q_ready.index(w),
                                                    q_bufs.index(w))
            mbarrier.wait(v_empty.index(stage), phase ^ 1)
            mbarrier.expect(v_ready.index(stage), v_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(v_desc, [kv_row + j * BLOCK_N, 0], v_ready.index(stage),
                                            v_bufs.index(stage))
        kv_count += n_blocks
        i_t += 1


@gluon.jit
def _ps_consumer(o_desc, lse_ptr, q_bufs, o_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready,
                 k_empty, v_ready, v_empty, sched, always, n_tiles, n_qblocks, bh_total, qk_scale,
                 seq_q, seq_k, heads, group, WG: gl.constexpr, NUM_WG: gl.constexpr,
                 CAUSAL: gl.constexpr, PINGPONG: gl.constexpr, BLOCK_N: gl.constexpr,
                 HEAD_DIM: gl.constexpr, STAGES: gl.constexpr):
    BLOCK_M: gl.constexpr = 64
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    q_smem = q_bufs.index(WG)
    o_smem = o_bufs.index(WG)
    dtype: gl.constexpr = q_smem.dtype
    diag = seq_k - seq_q
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    kv_count = 0
    i_t = 0
    it = 0  # this consumer's GEMM issues so far (the token ring's count)
    for t in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        q_start, q_row, kv_row, n_blocks, bh = _ps_tile(t, n_qblocks, bh_total, seq_q, seq_k, heads,
                                                         group, CAUSAL, NUM_WG * 64, BLOCK_N)
        my_start = q_start + WG * BLOCK_M
        m_i = gl.full([BLOCK_M], -float("inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
        l_i = gl.zeros([BLOCK_M], gl.float32, layout=gl.SliceLayout(1, s_layout))
        o = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=o_layout)

        mbarrier.wait(q_ready.index(WG), i_t & 1)
        st0 = kv_count % STAGES
        mbarrier.wait(k_ready.index(st0), (kv_count // STAGES) & 1)
        _pp_sched_wait(sched, it, WG, PINGPONG)
        s = warpgroup_mma(q_smem, k_bufs.index(st0).permute((1, 0)), s_zero, use_acc=False,
                          is_async=True)
        _pp_sched_pass(sched, WG, NUM_WG, PINGPONG)
        s = warpgroup_mma_wait(0, deps=(s,))
        mbarrier.arrive(k_empty.index(st0), count=1)
        p, alpha, m_i, l_i = _pp_softmax(s, m_i, l_i, qk_scale, my_start, 0, diag, CAUSAL,
                                         BLOCK_M, BLOCK_N, s_layout)
        p_cur = gl.convert_layout(p.to(dtype), p_layout)
        for j in range(1, n_blocks):
            c = kv_count + j
            stage = c % STAGES
            phase = (c // STAGES) & 1
            prev = (c - 1) % STAGES
            prev_phase = ((c - 1) // STAGES) & 1
            mbarrier.wait(k_ready.index(stage), phase)
            mbarrier.wait(v_ready.index(prev), prev_phase)
            o = o * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
            _pp_sched_wait(sched, it + j, WG, PINGPONG)
            s = warpgroup_mma(q_smem, k_bufs.index(stage).permute((1, 0)), s_zero, use_acc=False,
                              is_async=True)
            o_acc = warpgroup_mma(p_cur, v_bufs.index(prev), o, is_async=True)
            _pp_sched_pass(sched, WG, NUM_WG, PINGPONG)
            s = warpgroup_mma_wait(1, deps=(s,))
            mbarrier.arrive(k_empty.index(stage), count=1)
            p, alpha, m_i, l_i = _pp_softmax(s, m_i, l_i, qk_scale, my_start, j * BLOCK_N, diag,
                                             CAUSAL, BLOCK_M, BLOCK_N, s_layout)
            p_next = gl.convert_layout(p.to(dtype), p_layout)
            # The block boundary that keeps the PV wait below the softmax (see _pp_consumer),
            # on a barrier completed once before the partitions start.
            mbarrier.wait(always, 0)
            o, p_cur = warpgroup_mma_wait(0, deps=(o_acc, p_cur))
            mbarrier.arrive(v_empty.index(prev), count=1)
            p_cur = p_next
        # Every S product of this tile is done: the loader may bring the next tile's Q.
        mbarrier.arrive(q_empty.index(WG), count=1)
        c_last = kv_count + n_blocks - 1
        last = c_last % STAGES
        mbarrier.wait(v_ready.index(last), (c_last // STAGES) & 1)
        o = o * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        _pp_sched_wait(sched, it + n_blocks, WG, PINGPONG)
        o_acc = warpgroup_mma(p_cur, v_bufs.index(last), o, is_async=True)
        _pp_sched_pass(sched, WG, NUM_WG, PINGPONG)
        o, p_cur = warpgroup_mma_wait(0, deps=(o_acc, p_cur))
        mbarrier.arrive(v_empty.index(last), count=1)

        l_safe = gl.where(l_i == 0.0, 1.0, l_i)
        o = o / gl.convert_layout(l_safe, gl.SliceLayout(1, o_layout))[:, None]
        lse = gl.where(l_i == 0.0, -float("inf"), (m_i + gl.log2(l_safe)) * 0.6931471805599453)
        if my_start < seq_q:
            rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
            gl.store(lse_ptr + bh * seq_q + my_start + rows, lse)
            o_smem.store(o.to(dtype))
            fence_async_shared()
            tma.async_copy_shared_to_global(o_desc, [q_row + WG * BLOCK_M, 0], o_smem)
            tma.store_wait(0)
        kv_count += n_blocks
        it += n_blocks + 1
        i_t += 1


@gluon.jit
def attention_fwd_ps(q_desc, k_desc, v_desc, o_desc, lse_ptr, sm_scale, seq_q, seq_k, heads,
                     group, n_tiles, n_qblocks, bh_total, CAUSAL: gl.constexpr,
                     NUM_WG: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                     STAGES: gl.constexpr, PINGPONG: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                     LOADER_REGS: gl.constexpr):
    dtype: gl.constexpr = q_desc.dtype
    q_bufs = gl.allocate_shared_memory(dtype, [NUM_WG, 64, HEAD_DIM], q_desc.layout)
    o_bufs = gl.allocate_shared_memory(dtype, [NUM_WG, 64, HEAD_DIM], q_desc.layout)
    k_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [NUM_WG, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [NUM_WG, 1], mbarrier.MBarrierLayout())
    sched = gl.allocate_shared_memory(gl.int64, [NUM_WG, 1], mbarrier.MBarrierLayout())
    always = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for c in gl.static_range(NUM_WG):
        mbarrier.init(q_ready.index(c), count=1)
        mbarrier.init(q_empty.index(c), count=1)
        mbarrier.init(sched.index(c), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=NUM_WG)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(v_empty.index(i), count=NUM_WG)
    mbarrier.init(always, count=1)
    mbarrier.arrive(always, count=1)  # phase 0 complete for good: waits on it return at once
    qk_scale = sm_scale * 1.4426950408889634
    if NUM_WG == 2:
        gl.warp_specialize([
            (_ps_consumer, (o_desc, lse_ptr, q_bufs, o_bufs, k_bufs, v_bufs, q_ready, q_empty,
                            k_ready, k_empty, v_ready, v_empty, sched, always, n_tiles, n_qblocks,
                            bh_total, qk_scale, seq_q, seq_k, heads, group, 0, NUM_WG, CAUSAL,
                            PINGPONG, BLOCK_N, HEAD_DIM, STAGES)),
            (_ps_consumer, (o_desc, lse_ptr, q_bufs, o_bufs, k_bufs, v_bufs, q_ready, q_empty,
                            k_ready, k_empty, v_ready, v_empty, sched, always, n_tiles, n_qblocks,
                            bh_total, qk_scale, seq_q, seq_k, heads, group, 1, NUM_WG, CAUSAL,
                            PINGPONG, BLOCK_N, HEAD_DIM, STAGES)),
            (_ps_loader, (q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, q_empty,
                          k_ready, k_empty, v_ready, v_empty, n_tiles, n_qblocks, bh_total, seq_q,
                          seq_k, heads, group, CAUSAL, BLOCK_N, STAGES, NUM_WG)),
        ], [4, 1], [CONSUMER_REGS, LOADER_REGS])
    else:
        gl.static_assert(NUM_WG == 3, "two or three consumer warpgroups")
        gl.warp_specialize([
            (_ps_consumer, (o_desc, lse_ptr, q_bufs, o_bufs, k_bufs, v_bufs, q_ready, q_empty,
                            k_ready, k_empty, v_ready, v_empty, sched, always, n_tiles, n_qblocks,
                            bh_total, qk_scale, seq_q, seq_k, heads, group, 0, NUM_WG, CAUSAL,
                            PINGPONG, BLOCK_N, HEAD_DIM, STAGES)),
            (_ps_consumer, (o_desc, lse_ptr, q_bufs, o_bufs, k_bufs, v_bufs, q_ready, q_empty,
                            k_ready, k_empty, v_ready, v_empty, sched, always, n_tiles, n_qblocks,
                            bh_total, qk_scale, seq_q, seq_k, heads, group, 1, NUM_WG, CAUSAL,
                            PINGPONG, BLOCK_N, HEAD_DIM, STAGES)),
            (_ps_consumer, (o_desc, lse_ptr, q_bufs, o_bufs, k_bufs, v_bufs, q_ready, q_empty,
                            k_ready, k_empty, v_ready, v_empty, sched, always, n_tiles, n_qblocks,
                            bh_total, qk_scale, seq_q, seq_k, heads, group, 2, NUM_WG, CAUSAL,
                            PINGPONG, BLOCK_N, HEAD_DIM, STAGES)),
            (_ps_loader, (q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, q_empty,
                          k_ready, k_empty, v_ready, v_empty, n_tiles, n_qblocks, bh_total, seq_q,
                          seq_k, heads, group, CAUSAL, BLOCK_N, STAGES, NUM_WG)),
        ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, LOADER_REGS])


# ---------------------------------------------------------------------------------------------
# Host side: the variants, their launches, the checks and the timings.
# ---------------------------------------------------------------------------------------------

def _dtype(t):
    return gl.float16 if t.dtype == torch.float16 else gl.bfloat16


def attention(q, k, v, causal: bool, block_m: int = 128, block_n: int = 128, stages: int = 2,
              num_warps: int = 8, maxnreg: int | None = 168, order_fix: bool = False):
    """The lead's probe: o, lse of softmax attention (scale 1/sqrt(D)); q [B,Hq,N,D],
    k/v [B,Hkv,Nk,D]."""
    batch, heads, seq_q, dim = q.shape
    seq_k = k.shape[2]
    assert seq_q % block_m == 0 and seq_k % block_n == 0, "the probe needs whole blocks"
    dtype = _dtype(q)
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
                           num_warps=num_warps, ORDER_FIX=order_fix, **extra)
    return o, lse


def attention_pp(q, k, v, causal: bool, num_wg: int = 2, block_n: int = 128, stages: int = 2,
                 pingpong: bool = True, consumer_regs: int = 240, loader_regs: int = 24):
    """The ping-pong kernel: NUM_WG consumer warpgroups of 64 query rows each. Nq must be a
    multiple of 64 and Nk of block_n."""
    batch, heads, seq_q, dim = q.shape
    seq_k = k.shape[2]
    assert seq_q % ROWS_PER_WG == 0 and seq_k % block_n == 0, "the probe needs whole blocks"
    dtype = _dtype(q)
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:-1], device=q.device, dtype=torch.float32)
    q_desc, o_desc, k_desc, v_desc = _pp_descriptors(q, k, v, o, block_n)
    grid = (triton.cdiv(seq_q, num_wg * ROWS_PER_WG), batch * heads)
    attention_fwd_pp[grid](q_desc, k_desc, v_desc, o_desc, lse, 1.0 / math.sqrt(dim), seq_q, seq_k,
                           heads, heads // k.shape[1], causal, num_wg, block_n, dim, stages,
                           pingpong, consumer_regs, loader_regs, num_warps=4)
    return o, lse


def attention_ps(q, k, v, causal: bool, num_wg: int = 2, block_n: int = 128, stages: int = 2,
                 pingpong: bool = True, consumer_regs: int = 240, loader_regs: int = 24,
                 programs: int | None = None):
    """The persistent ping-pong kernel: one program per SM (or `programs`) walking the tiles."""
    batch, heads, seq_q, dim = q.shape
    seq_k = k.shape[2]
    assert seq_q % ROWS_PER_WG == 0 and seq_k % block_n == 0, "the probe needs whole blocks"
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:-1], device=q.device, dtype=torch.float32)
    q_desc, o_desc, k_desc, v_desc = _pp_descriptors(q, k, v, o, block_n)
    n_qblocks = triton.cdiv(seq_q, num_wg * ROWS_PER_WG)
    n_tiles = n_qblocks * batch * heads
    if programs is None:
        programs = torch.cuda.get_device_properties(q.device).multi_processor_count
    grid = (min(n_tiles, programs),)
    attention_fwd_ps[grid](q_desc, k_desc, v_desc, o_desc, lse, 1.0 / math.sqrt(dim), seq_q, seq_k,
                           heads, heads // k.shape[1], n_tiles, n_qblocks, batch * heads, causal,
                           num_wg, block_n, dim, stages, pingpong, consumer_regs, loader_regs,
                           num_warps=4)
    return o, lse


def _pp_descriptors(q, k, v, o, block_n):
    dim = q.shape[-1]
    dtype = _dtype(q)
    q_layout = gl.NVMMASharedLayout.get_default_for([ROWS_PER_WG, dim], dtype)
    kv_layout = gl.NVMMASharedLayout.get_default_for([block_n, dim], dtype)
    q2, k2, v2, o2 = (t.reshape(-1, dim) for t in (q, k, v, o))
    return (TensorDescriptor.from_tensor(q2, [ROWS_PER_WG, dim], q_layout),
            TensorDescriptor.from_tensor(o2, [ROWS_PER_WG, dim], q_layout),
            TensorDescriptor.from_tensor(k2, [block_n, dim], kv_layout),
            TensorDescriptor.from_tensor(v2, [block_n, dim], kv_layout))


# name -> head dim -> keyword arguments of the launch. `kernel` picks the launch function.
VARIANTS = {
    # The lead's probe: one 8-warp consumer partition (two warpgroups in lockstep).
    "probe": {"kernel": "ws", 64: {}, 128: {}},
    # The probe with the softmax kept ahead of the PV wait in the SASS (see _consumer).
    "probe_fix": {"kernel": "ws", 64: dict(order_fix=True), 128: dict(order_fix=True)},
    # Two consumer partitions of 4 warps (64 rows each, 128 per program), ping-pong issue order.
    "pp2": {"kernel": "pp", 64: dict(num_wg=2, block_n=128, consumer_regs=240),
            128: dict(num_wg=2, block_n=128, consumer_regs=240)},
    # The same partitions with no issue-order token: what the ping-pong itself buys.
    "pp2_free": {"kernel": "pp", 64: dict(num_wg=2, block_n=128, pingpong=False, consumer_regs=240),
                 128: dict(num_wg=2, block_n=128, pingpong=False, consumer_regs=240)},
    # Three consumers (192 rows per program share each K/V block): FA3's D=64 shape; at D=128
    # the 160 registers a consumer gets hold S and O only with 64-key blocks.
    "pp3": {"kernel": "pp", 64: dict(num_wg=3, block_n=128, consumer_regs=160),
            128: dict(num_wg=3, block_n=64, consumer_regs=160)},
    "pp3_free": {"kernel": "pp", 64: dict(num_wg=3, block_n=128, pingpong=False, consumer_regs=160),
                 128: dict(num_wg=3, block_n=64, pingpong=False, consumer_regs=160)},
    # Persistent versions of pp2 and pp3 (one program per SM, the loader running ahead).
    "ps2": {"kernel": "ps", 64: dict(num_wg=2, block_n=128, consumer_regs=240),
            128: dict(num_wg=2, block_n=128, consumer_regs=240)},
    "ps3": {"kernel": "ps", 64: dict(num_wg=3, block_n=128, consumer_regs=160),
            128: dict(num_wg=3, block_n=64, consumer_regs=160)},
    # Three K/V stages (at D=128 that is 224 KiB of the 227 KiB of shared memory).
    "pp2_st3": {"kernel": "pp", 64: dict(num_wg=2, block_n=128, stages=3, consumer_regs=240),
                128: dict(num_wg=2, block_n=128, stages=3, consumer_regs=240)},
}


def run_variant(name, q, k, v, causal, **extra):
    """o, lse of variant `name`, or None where it has no configuration for this head dim."""
    spec = VARIANTS[name]
    config = spec.get(q.shape[-1])
    if config is None:
        return None
    config = {**config, **extra}
    launch = {"ws": attention, "pp": attention_pp, "ps": attention_ps}[spec["kernel"]]
    return launch(q, k, v, causal, **config)


def _warmup_args(name, dim, causal, dtype=torch.float16):
    """Compile variant `name` for (dim, causal) with CPU tensors (no launch): its resources."""
    spec = VARIANTS[name]
    config = dict(spec[dim])
    n = 384
    q = torch.empty(1, 2, n, dim, dtype=dtype)
    k = torch.empty(1, 2, n, dim, dtype=dtype)
    lse = torch.empty(1, 2, n)
    if spec["kernel"] == "ws":
        bm, bn = config.get("block_m", 128), config.get("block_n", 128)
        lay_q = gl.NVMMASharedLayout.get_default_for([bm, dim], _dtype(q))
        lay_k = gl.NVMMASharedLayout.get_default_for([bn, dim], _dtype(q))
        qd = TensorDescriptor.from_tensor(q.reshape(-1, dim), [bm, dim], lay_q)
        kd = TensorDescriptor.from_tensor(k.reshape(-1, dim), [bn, dim], lay_k)
        return attention_fwd_ws.warmup(qd, kd, kd, qd, lse, 0.1, n, n, 2, 1, causal, bm, bn, dim,
                                       config.get("stages", 2), num_warps=config.get("num_warps", 8),
                                       ORDER_FIX=config.get("order_fix", False),
                                       maxnreg=config.get("maxnreg", 168), grid=(1,))
    bn = config.get("block_n", 128)
    qd, od, kd, vd = _pp_descriptors(q, k, k, q, bn)
    if spec["kernel"] == "ps":
        n_qblocks = triton.cdiv(n, config["num_wg"] * ROWS_PER_WG)
        return attention_fwd_ps.warmup(qd, kd, vd, od, lse, 0.1, n, n, 2, 1, 2 * n_qblocks, n_qblocks, 2,
                                       causal, config["num_wg"], bn, dim, config.get("stages", 2),
                                       config.get("pingpong", True), config.get("consumer_regs", 240),
                                       config.get("loader_regs", 24), num_warps=4, grid=(1,))
    return attention_fwd_pp.warmup(qd, kd, vd, od, lse, 0.1, n, n, 2, 1, causal, config["num_wg"], bn, dim,
                                   config.get("stages", 2), config.get("pingpong", True),
                                   config.get("consumer_regs", 240), config.get("loader_regs", 24),
                                   num_warps=4, grid=(1,))


def _exp2_under_pv(sass: str) -> str:
    """How much of the softmax runs while PV is in flight, from the SASS: in each window from a
    `WARPGROUP.DEPBAR.LE gsb0, 0x1` (S_j done, PV_{j-1} may run) to the next `DEPBAR ... 0x0`,
    the MUFU.EX2 count; `a/b` = EX2 in such windows / all EX2 in the kernel."""
    inside, total, open_window = 0, 0, False
    for line in sass.splitlines():
        if "WARPGROUP.DEPBAR.LE" in line:
            open_window = "0x1" in line
        elif "MUFU.EX2" in line:
            total += 1
            inside += open_window
    return f"{inside}/{total}"


def compile_only(capability: int) -> None:
    """Compile every variant for sm_`capability` with no GPU (nothing launched); print registers,
    spills (cuobjdump's STACK/LOCAL, and STL/LDL instructions in the SASS), shared memory and
    the per-partition register budgets (the setmaxnreg values in the PTX)."""
    import re
    import subprocess
    import tempfile
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from kernel_resources import TargetOnlyDriver, resources
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    driver.set_active(TargetOnlyDriver(GPUTarget("cuda", capability, 32)))
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    for name, spec in VARIANTS.items():
        for dim in (64, 128):
            if dim not in spec:
                continue
            for causal in (True, False):
                compiled = _warmup_args(name, dim, causal)
                used = resources(compiled.asm["cubin"])
                with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                    f.write(compiled.asm["cubin"])
                    f.flush()
                    sass = subprocess.run([cuobjdump, "-sass", f.name], capture_output=True, text=True).stdout
                spill_ops = len(re.findall(r"\b(STL|LDL)\b", sass))
                # ptxas' own verdict on the wgmma pipeline (C7512: "serialized"), from its -v.
                with tempfile.TemporaryDirectory() as tmp:
                    ptx_path = os.path.join(tmp, "k.ptx")
                    with open(ptx_path, "w") as f:
                        f.write(compiled.asm["ptx"])
                    arch = f"sm_{capability}a" if capability == 90 else f"sm_{capability}"
                    info = subprocess.run([ptxas, f"-arch={arch}", "-v", ptx_path, "-o",
                                           os.path.join(tmp, "k.cubin")], capture_output=True, text=True)
                serialized = "C7512" in info.stderr + info.stdout
                overlap = _exp2_under_pv(sass)
                nregs = sorted(set(int(x) for x in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)",
                                                              compiled.asm["ptx"])))
                print(f"{name:10s} D={dim:3d} causal={causal!s:5s} {spec[dim]}: REG {used.get('REG')} "
                      f"STACK {used.get('STACK')} LOCAL {used.get('LOCAL')} STL/LDL {spill_ops} "
                      f"setmaxnreg {nregs} shared {compiled.metadata.shared} B wgmma-serialized {serialized} "
                      f"ex2-under-PV {overlap}", flush=True)


def reference(q, k, v, causal):
    """o and lse (natural log) in float32, written from the semantics: scale 1/sqrt(D), GQA by
    head groups, bottom-right causal alignment (key j kept iff j <= i + Nk - Nq); a row with no
    key gives o = 0 and lse = -inf."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.float().repeat_interleave(group, 1) for t in (k, v))
    s = q.float() @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    n_q, n_k = q.shape[2], k.shape[2]
    if causal:
        i = torch.arange(n_q, device=q.device)[:, None]
        j = torch.arange(n_k, device=q.device)[None, :]
        s = s.masked_fill(j > i + n_k - n_q, -float("inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - torch.where(lse == -float("inf"), 0.0, lse)[..., None])
    return p @ v, lse


CHECKS = [  # (causal, B, Hq, Hkv, Nq, Nk, D, dtype)
    (True, 1, 4, 2, 512, 512, 64, torch.float16),
    (False, 1, 4, 1, 384, 384, 128, torch.float16),
    (True, 2, 8, 8, 1024, 1024, 128, torch.bfloat16),
    (False, 2, 4, 4, 640, 1024, 64, torch.bfloat16),
    (True, 1, 4, 2, 768, 256, 64, torch.float16),     # Nq > Nk: leading rows have no key
    (True, 1, 4, 4, 320, 1024, 128, torch.float16),   # Nq < Nk, Nq not a multiple of 128
]
CASES = [("causal", 4, 12, 12, 64, n, torch.float16) for n in (4096, 8192, 16384)]
CASES += [("dense", 4, 12, 12, 64, 4096, torch.float16)]
CASES += [("causal", 1, 32, 8, 128, n, torch.bfloat16) for n in (4096, 8192)]
CASES += [("dense", 1, 32, 8, 128, 4096, torch.bfloat16)]


def _case_inputs(case, seed=0):
    name, b, h, hkv, dim, n, dtype = case
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    q = torch.randn(b, h, n, dim, device=DEVICE, dtype=dtype, generator=g)
    k, v = (torch.randn(b, hkv, n, dim, device=DEVICE, dtype=dtype, generator=g) for _ in range(2))
    return q, k, v


def _case_label(case):
    name, b, h, hkv, dim, n, dtype = case
    return f"{name} B{b} H{h}/{hkv} D{dim} N{n} {str(dtype)[6:]}"


def _cudnn(q, k, v, causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
    group = q.shape[1] // k.shape[1]
    kk, vv = (t.repeat_interleave(group, 1) for t in (k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, kk, vv, is_causal=causal)


def check_variant(name):
    """Rows: max errors of o and lse against the float32 reference at the CHECKS shapes, and of o
    against cuDNN at the benchmark shapes (which also compiles what the timing will use)."""
    rows = []
    if name == "baseline":
        # The tl target against cuDNN at the benchmark shapes (compiles it for the timing).
        import attnfuse as af
        for case in CASES:
            q, k, v = _case_inputs(case)
            causal = case[0] == "causal"
            fn = af.compile(af.attention(af.causal()) if causal else af.attention())
            err = (fn(q, k, v).float() - _cudnn(q, k, v, causal).float()).abs().max().item()
            tol = 2e-2 if case[-1] == torch.float16 else 6e-2
            rows.append({"variant": "attnfuse_tl", "check": _case_label(case), "max_err_vs_cudnn": err,
                         "ok": bool(err < tol)})
        return rows
    # A persistent kernel is also run on 3 programs, so that each walks several tiles.
    extras = [{}, {"programs": 3}] if VARIANTS[name]["kernel"] == "ps" else [{}]
    for (causal, b, h, hkv, nq, nk, dim, dtype), extra in itertools.product(CHECKS, extras):
        label = f"check {'causal' if causal else 'dense'} B{b} H{h}/{hkv} Nq{nq} Nk{nk} D{dim} {str(dtype)[6:]}"
        label += "".join(f" {key}={value}" for key, value in extra.items())
        g = torch.Generator(device=DEVICE).manual_seed(1)
        q = torch.randn(b, h, nq, dim, device=DEVICE, dtype=dtype, generator=g)
        k, v = (torch.randn(b, hkv, nk, dim, device=DEVICE, dtype=dtype, generator=g) for _ in range(2))
        try:
            out = run_variant(name, q, k, v, causal, **extra)
        except AssertionError as e:  # a shape the variant does not take (whole blocks only)
            rows.append({"variant": name, "check": label, "skipped": str(e), "ok": True})
            continue
        except Exception as e:  # anything else is reported, not fatal
            rows.append({"variant": name, "check": label, "error": f"{type(e).__name__}: {str(e)[:300]}"})
            continue
        if out is None:
            continue
        o, lse = out
        torch.cuda.synchronize()
        ref_o, ref_lse = reference(q, k, v, causal)
        err_o = (o.float() - ref_o).abs().max().item()
        both_inf = (lse == -float("inf")) & (ref_lse == -float("inf"))
        err_lse = torch.where(both_inf, 0.0, (lse - ref_lse).abs()).max().item()
        # P is rounded to the input type before PV (as in every flash kernel): bf16 errs more.
        tol = 2e-2 if dtype == torch.float16 else 6e-2
        ok = bool(err_o < tol and err_lse < 2e-3 and torch.isfinite(o.float()).all().item())
        rows.append({"variant": name, "check": label, "max_err_o": err_o, "max_err_lse": err_lse, "ok": ok})
    for case in CASES:
        q, k, v = _case_inputs(case)
        causal = case[0] == "causal"
        try:
            out = run_variant(name, q, k, v, causal)
        except Exception as e:
            rows.append({"variant": name, "check": _case_label(case), "error": f"{type(e).__name__}: {str(e)[:300]}"})
            continue
        if out is None:
            continue
        err = (out[0].float() - _cudnn(q, k, v, causal).float()).abs().max().item()
        tol = 2e-2 if case[-1] == torch.float16 else 6e-2
        rows.append({"variant": name, "check": _case_label(case), "max_err_vs_cudnn": err,
                     "ok": bool(err < tol)})
    return rows


def time_variant(name):
    """Rows: ms (do_bench) and TFLOP/s of variant `name` ("baseline": cuDNN and the tl target)
    at the benchmark shapes."""
    rows = []
    for case in CASES:
        q, k, v = _case_inputs(case)
        kind, b, h, hkv, dim, n, dtype = case
        causal = kind == "causal"
        flops = 4 * b * h * n * n * dim * (0.5 if causal else 1)
        if name == "baseline":
            import attnfuse as af
            fn = af.compile(af.attention(af.causal()) if causal else af.attention())
            impls = {"cudnn": lambda: _cudnn(q, k, v, causal), "attnfuse_tl": lambda: fn(q, k, v)}
        else:
            if VARIANTS[name].get(dim) is None:
                continue
            impls = {name: lambda: run_variant(name, q, k, v, causal)}
        for label, impl in impls.items():
            try:
                ms = triton.testing.do_bench(impl, warmup=25, rep=200)
                rows.append({"variant": label, "case": _case_label(case), "ms": ms, "tflops": flops / ms / 1e9})
            except Exception as e:
                rows.append({"variant": label, "case": _case_label(case), "error": f"{type(e).__name__}: {str(e)[:300]}"})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def orchestrate(out_dir, names, check_timeout, time_timeout):
    """Checks of every variant in parallel subprocesses (a hang is killed by its timeout and
    reported; compiling them fills Triton's cache for the timing), then timings one process at a
    time; everything into out_dir/gluon_forward_probe.json and a table on stdout."""
    import subprocess
    import time
    me = os.path.abspath(__file__)
    os.makedirs(out_dir, exist_ok=True)
    results = {"checks": [], "timings": [], "failures": []}
    start = time.time()
    procs = {}
    for name in ["baseline"] + names:
        path = os.path.join(out_dir, f"check_{name}.json")
        # Output to a file, not a pipe: a full pipe would block a child while another is awaited.
        log_file = open(os.path.join(out_dir, f"check_{name}.log"), "w")
        procs[name] = (subprocess.Popen([sys.executable, me, "--check", name, "--json", path],
                                        stdout=log_file, stderr=subprocess.STDOUT), path, log_file)
    passed, wrong = [], set()
    for name, (proc, path, log_file) in procs.items():
        try:
            proc.wait(timeout=max(1, check_timeout - (time.time() - start)))
            timed_out = False
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            timed_out = True
        log_file.close()
        log = open(log_file.name).read()
        if timed_out:
            results["failures"].append({"variant": name, "phase": "check", "why": "timeout (hang?)",
                                        "log": log[-2000:]})
            continue
        if proc.returncode != 0 or not os.path.exists(path):
            results["failures"].append({"variant": name, "phase": "check", "why": f"rc {proc.returncode}",
                                        "log": log[-3000:]})
            continue
        rows = json.load(open(path))
        results["checks"] += rows
        bad = [r for r in rows if not r.get("ok", False)]
        print(f"[check] {name}: {len(rows) - len(bad)}/{len(rows)} ok"
              + "".join(f"\n    FAIL {r}" for r in bad), flush=True)
        # Timed if its process finished (a wrong result is flagged in the table, not hidden).
        if name != "baseline":
            passed.append(name)
        if bad:
            wrong.add(name)
    print(f"[checks done in {time.time() - start:.0f} s]", flush=True)
    for name in ["baseline"] + passed:
        path = os.path.join(out_dir, f"time_{name}.json")
        try:
            proc = subprocess.run([sys.executable, me, "--time", name, "--json", path], capture_output=True,
                                  text=True, timeout=time_timeout)
            if proc.returncode != 0:
                results["failures"].append({"variant": name, "phase": "time", "why": f"rc {proc.returncode}",
                                            "log": (proc.stdout + proc.stderr)[-3000:]})
            else:
                results["timings"] += json.load(open(path))
        except subprocess.TimeoutExpired:
            results["failures"].append({"variant": name, "phase": "time", "why": "timeout"})
    with open(os.path.join(out_dir, "gluon_forward_probe.json"), "w") as f:
        json.dump(results, f, indent=1)
    # The table: ms per case and implementation, and the ratio cuDNN / implementation.
    table = {}
    for r in results["timings"]:
        if "ms" in r:
            table.setdefault(r["case"], {})[r["variant"]] = r["ms"]
    columns = ["cudnn", "attnfuse_tl"] + passed
    if wrong:
        print("WRONG RESULTS (timed anyway):", sorted(wrong))
    print("case".ljust(34) + "".join((c[:10] + ("!" if c in wrong else "")).rjust(12) for c in columns))
    for case, row in table.items():
        print(case.ljust(34) + "".join((f"{row[c]:.3f}" if c in row else "-").rjust(12) for c in columns))
    print("cuDNN / implementation:")
    for case, row in table.items():
        print(case.ljust(34) + "".join((f"{row['cudnn'] / row[c]:.2f}" if c in row and "cudnn" in row else "-")
                                       .rjust(12) for c in columns))
    for failure in results["failures"]:
        print("FAILURE", {k: v for k, v in failure.items() if k != "log"})
        print(failure.get("log", "")[-1500:])
    print(f"[all done in {time.time() - start:.0f} s]", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--capability", type=int, default=90)
    parser.add_argument("--out", help="run everything, write DIR/gluon_forward_probe.json")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset")
    parser.add_argument("--check", metavar="VARIANT", help="(internal) check one variant")
    parser.add_argument("--time", metavar="VARIANT", help="(internal) time one variant or 'baseline'")
    parser.add_argument("--json", help="(internal) where --check/--time write their rows")
    parser.add_argument("--check-timeout", type=float, default=150)
    parser.add_argument("--time-timeout", type=float, default=60)
    args = parser.parse_args()
    if args.compile_only:
        compile_only(args.capability)
        return
    if args.check or args.time:
        rows = check_variant(args.check) if args.check else time_variant(args.time)
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
        return
    if not args.out:
        parser.error("--out DIR, --compile-only, --check or --time")
    orchestrate(args.out, [n for n in args.variants.split(",") if n], args.check_timeout, args.time_timeout)


if __name__ == "__main__":
    main()

"""A warp-specialized Hopper attention BACKWARD written in Gluon by hand (Triton 3.6): the probe
that says what FlashAttention-3's backward design costs in Gluon before the tile IR lowers to it
(issue 17). bench/gluon_forward_probe.py is its forward counterpart.

`attention_bwd_ws`: one program per (block of BLOCK_N key rows, batch x kv head); the program
walks every query block of every query head of its GQA group (Hq / Hkv heads), so K and V are
read once and dK, dV accumulate in registers over the whole group (no reduction afterwards).
Grid (B * Hkv, N / BLOCK_N), kv head fastest: causal's longest programs (key block 0) first.

- loader (worker partition, 1 warp): TMA loads of K and V once (one barrier), then Q and dO
  blocks (BLOCK_M = 64 rows; with LSE_SMEM also their lse and delta rows, 1-D TMA) into a ring
  of STAGES shared-memory buffers with a ready barrier (TMA byte count) and an empty barrier
  (released by the consumer once its last product reading that stage is done);
- consumer (default partition, 8 warps = two warpgroups in lockstep, or 4 warps = one, each
  warpgroup owning 64 of the block's keys): the products in the key-major ("swapped")
  orientation, so that P^T and dS^T come out of the tensor cores in the layout of the A operand
  of dV and dK:
      S^T  = K Q^T                      (A = K smem, B = Q^T smem view)
      dP^T = V dO^T                     (A = V smem, B = dO^T smem view)
      P^T  = exp2(S^T * scale * log2e - lse * log2e)   (causal mask on diagonal blocks only)
      dV  += P^T dO                     (A = P^T registers, B = dO smem; issued before the
                                         wait for dP^T, so dS^T is computed under it)
      dS^T = P^T o (dP^T - delta)
      dK  += dS^T Q                     (A = dS^T registers, B = Q smem)
      dQ_b = dS K  (queries x D)        (A = dS^T smem, transposed view; B = K smem; the two
                                         warpgroups take half of D each)
  5 products per block pair, as cuDNN and FA3. dQ_b * scale goes into an fp32 buffer dq_acc
  [B*Hq*N, D]: DQ="tma", a TMA reduce-add from a shared staging tile issued by the consumer
  (ttng.async_tma_reduce: Gluon 3.6's builder has it, its Python API does not; `_tma_reduce_add`
  wraps it); DQ="writer", the same reduces issued by a third partition (1 warp) from two
  staging tiles, the consumer only storing and signalling; DQ="atomic", fp32 atomics from
  registers (relaxed, REDG.F32x2); DQ="none", no dQ: the dK/dV half of the deterministic split
  (`det`), whose dQ comes from `attention_bwd_dq_ws` (FA2's dQ kernel, warp-specialized: Q,
  dO once, K/V through a ring, 3 products, dQ stored in bf16 by TMA, no atomics).
- delta = rowsum(dO o O) and the zeroing of dq_acc: a small `tl` preprocess kernel; dq_acc ->
  bf16 dq: a small `tl` kernel. Both are in each variant's timed total (`name`); `name:kernel`
  times the warp-specialized kernel(s) alone.

    PYTHONPATH=/tmp/lead/t36:. python bench/gluon_backward_probe.py --compile-only  # no GPU
    python3 bench/gluon_backward_probe.py --out DIR     # H200: check, then time beside cuDNN
    GLUON_BWD_PROBE_DRYRUN=1 python bench/gluon_backward_probe.py --out DIR  # CPU plumbing test

A probe, not the product: Nq == Nk, N a multiple of 128, head dim 128 (64 compiles, unchecked),
q/k/v/o/do contiguous [B, H, N, D], bf16 (fp16 compiles), no dropout, scale 1/sqrt(D).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

LOG2E = 1.4426950408889634
DEVICE = "cuda"  # where the checks and timings put their tensors


@builtin
def _tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """global[box at coord] += shared `src` (cp.reduce.async.bulk.tensor.add); completes like a
    TMA store (`tma.store_wait`). Gluon 3.6 has the builder call (ttng.async_tma_reduce) but no
    Python wrapper for it."""
    from triton._C.libtriton import ir
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle,
                                              coord, src.handle)


@gluon.jit
def _bwd_loader(q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, k_smem, v_smem, q_bufs,
                do_bufs, lse_bufs, delta_bufs, kv_bar, ready, empty, kv_row, q_base, seq, m_first,
                n_mb, rot, total, BLOCK_M: gl.constexpr, STAGES: gl.constexpr,
                LSE_SMEM: gl.constexpr):
    mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [kv_row, 0], kv_bar, k_smem)
    tma.async_copy_global_to_shared(v_desc, [kv_row, 0], kv_bar, v_smem)
    for it in range(total):
        stage = it % STAGES
        phase = (it // STAGES) & 1
        head = it // n_mb
        row = q_base + head * seq + (m_first + (it + rot) % n_mb) * BLOCK_M
        # Barriers start as if phase 1 had completed: the first round waits on nothing.
        mbarrier.wait(empty.index(stage), phase ^ 1)
        if LSE_SMEM:
            mbarrier.expect(ready.index(stage), q_desc.block_type.nbytes + do_desc.block_type.nbytes
                            + lse_desc.block_type.nbytes + delta_desc.block_type.nbytes)
        else:
            mbarrier.expect(ready.index(stage), q_desc.block_type.nbytes + do_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [row, 0], ready.index(stage), q_bufs.index(stage))
        tma.async_copy_global_to_shared(do_desc, [row, 0], ready.index(stage), do_bufs.index(stage))
        if LSE_SMEM:
            tma.async_copy_global_to_shared(lse_desc, [row], ready.index(stage), lse_bufs.index(stage))
            tma.async_copy_global_to_shared(delta_desc, [row], ready.index(stage),
                                            delta_bufs.index(stage))


@gluon.jit
def _bwd_dq_writer(dq_desc, dq_bufs, dq_full, dq_empty, q_base, seq, m_first, n_mb, rot, total,
                   BLOCK_M: gl.constexpr, DQ_BUFS: gl.constexpr):
    """DQ=3: the TMA reduce-adds of the consumer's dQ_b tiles, off the consumer's path: wait
    for a staged tile, issue its reduce, wait until the copy engine has read it, free it."""
    for it in range(total):
        b = it % DQ_BUFS
        mbarrier.wait(dq_full.index(b), (it // DQ_BUFS) & 1)
        row = q_base + (it // n_mb) * seq + (m_first + (it + rot) % n_mb) * BLOCK_M
        _tma_reduce_add(dq_desc, [row, 0], dq_bufs.index(b))
        tma.store_wait(0)
        mbarrier.arrive(dq_empty.index(b), count=1)


@gluon.jit
def _bwd_consumer(dk_desc, dv_desc, dq_desc, dq_ptr, lse_ptr, delta_ptr, k_smem, v_smem, q_bufs,
                  do_bufs, lse_bufs, delta_bufs, ds_smem, dq_bufs, kv_bar, ready, empty, dq_full,
                  dq_empty, sm_scale, kv_row, q_base, seq, n_start, m_first, n_mb, rot, total,
                  CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                  HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, NW: gl.constexpr,
                  DQ: gl.constexpr, DQ_BUFS: gl.constexpr, SYNC_RELEASE: gl.constexpr,
                  EARLY_DV: gl.constexpr, LSE_SMEM: gl.constexpr):
    dtype: gl.constexpr = k_smem.dtype
    # Key-major accumulators: each warpgroup owns 64 keys (rows) of S^T, dP^T, dK, dV.
    st_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, BLOCK_M, 16])
    kv_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, HEAD_DIM, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    # dQ_b has BLOCK_M (64) query rows: one warpgroup's M; two warpgroups split its columns.
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, NW // 4], instr_shape=[16, HEAD_DIM // (NW // 4), 16])

    qk_scale = sm_scale * 1.4426950408889634
    dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=kv_layout)
    dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=kv_layout)
    st_zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=st_layout)
    dq_zero = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=dq_layout)
    cols = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, st_layout))
    keys = n_start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, st_layout))
    dq_r = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, dq_layout))
    dq_c = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, dq_layout))

    mbarrier.wait(kv_bar, 0)
    for it in range(total):
        stage = it % STAGES
        phase = (it // STAGES) & 1
        head = it // n_mb
        m_start = (m_first + (it + rot) % n_mb) * BLOCK_M
        q_row = q_base + head * seq + m_start
        if not LSE_SMEM:
            # lse and delta of the block's query rows (columns of S^T), read while the TMA lands.
            lse2 = gl.load(lse_ptr + q_row + cols) * 1.4426950408889634
            delta = gl.load(delta_ptr + q_row + cols)
        q_s = q_bufs.index(stage)
        do_s = do_bufs.index(stage)
        mbarrier.wait(ready.index(stage), phase)
        st = warpgroup_mma(k_smem, q_s.permute((1, 0)), st_zero, use_acc=False, is_async=True)
        dpt = warpgroup_mma(v_smem, do_s.permute((1, 0)), st_zero, use_acc=False, is_async=True)
        if LSE_SMEM:
            # From the ring, as late as possible (short register lifetimes: FA3's way).
            lse2 = lse_bufs.index(stage).load(gl.SliceLayout(0, st_layout)) * 1.4426950408889634
        st = warpgroup_mma_wait(1, deps=(st,))
        pt = gl.exp2(st * qk_scale - lse2[None, :])
        if CAUSAL:
            # Only blocks that cross the diagonal mask (key j kept iff j <= query i).
            if m_start < n_start + BLOCK_N:
                pt = gl.where(keys[:, None] <= (m_start + cols)[None, :], pt, 0.0)
        if EARLY_DV:
            # dV = P^T dO issued before the wait for dP^T: dS^T is computed under it (groups
            # complete in issue order, so one outstanding means dP^T is done).
            pt_op = gl.convert_layout(pt.to(dtype), a_layout)
            dv_acc = warpgroup_mma(pt_op, do_s, dv, is_async=True)
            if LSE_SMEM:
                delta = delta_bufs.index(stage).load(gl.SliceLayout(0, st_layout))
            dpt = warpgroup_mma_wait(1, deps=(dpt,))
            dst = pt * (dpt - delta[None, :])
        else:
            if LSE_SMEM:
                delta = delta_bufs.index(stage).load(gl.SliceLayout(0, st_layout))
            dpt = warpgroup_mma_wait(0, deps=(dpt,))
            dst = pt * (dpt - delta[None, :])
            pt_op = gl.convert_layout(pt.to(dtype), a_layout)
            dv_acc = warpgroup_mma(pt_op, do_s, dv, is_async=True)
        ds16 = dst.to(dtype)
        if DQ != 0:
            # dS^T goes to shared memory for dQ_b = dS K (A = its transposed view): every warp's
            # part before the tensor cores read it (a fence for the async proxy, then a barrier).
            ds_smem.store(ds16)
            fence_async_shared()
        ds_op = gl.convert_layout(ds16, a_layout)
        dk_acc = warpgroup_mma(ds_op, q_s, dk, is_async=True)
        if DQ != 0:
            gl.thread_barrier()
            dq_acc = warpgroup_mma(ds_smem.permute((1, 0)), k_smem, dq_zero, use_acc=False,
                                   is_async=True)
            dv, dk, dq, pt_op, ds_op = warpgroup_mma_wait(0, deps=(dv_acc, dk_acc, dq_acc, pt_op,
                                                                   ds_op))
        else:
            dv, dk, pt_op, ds_op = warpgroup_mma_wait(0, deps=(dv_acc, dk_acc, pt_op, ds_op))
        if SYNC_RELEASE:
            # Every warpgroup's products on this stage are done before the loader may refill it.
            gl.thread_barrier()
        mbarrier.arrive(empty.index(stage), count=1)
        if DQ == 1:
            dq_s = dq_bufs.index(it % DQ_BUFS)
            # The reduce that last read this staging buffer has finished (issuing thread), and
            # every thread knows it (barrier) before anyone overwrites the buffer.
            tma.store_wait(DQ_BUFS - 1)
            gl.thread_barrier()
            dq_s.store(dq * sm_scale)
            fence_async_shared()
            gl.thread_barrier()
            _tma_reduce_add(dq_desc, [q_row, 0], dq_s)
        elif DQ == 3:
            b = it % DQ_BUFS
            mbarrier.wait(dq_empty.index(b), ((it // DQ_BUFS) & 1) ^ 1)
            dq_bufs.index(b).store(dq * sm_scale)
            fence_async_shared()
            gl.thread_barrier()  # every thread's part is in before the writer is told
            mbarrier.arrive(dq_full.index(b), count=1)
        elif DQ == 2:
            offs = (q_row + dq_r)[:, None] * HEAD_DIM + dq_c[None, :]
            gl.atomic_add(dq_ptr + offs, dq * sm_scale, sem="relaxed")  # no ordering needed

    # dK, dV leave through K's and V's buffers (no product reads them any more).
    dk = dk * sm_scale
    k_smem.store(dk.to(dtype))
    v_smem.store(dv.to(dtype))
    fence_async_shared()
    gl.thread_barrier()
    tma.async_copy_shared_to_global(dk_desc, [kv_row, 0], k_smem)
    tma.async_copy_shared_to_global(dv_desc, [kv_row, 0], v_smem)
    tma.store_wait(0)


@gluon.jit
def attention_bwd_ws(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, dq_desc, lse_desc,
                     delta_desc, dq_ptr, lse_ptr, delta_ptr, sm_scale, seq, group,
                     CAUSAL: gl.constexpr,
                     BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                     STAGES: gl.constexpr, DQ: gl.constexpr, DQ_BUFS: gl.constexpr,
                     SYNC_RELEASE: gl.constexpr, LOADER_REGS: gl.constexpr,
                     EARLY_DV: gl.constexpr, LSE_SMEM: gl.constexpr, STAGGER: gl.constexpr,
                     num_warps: gl.constexpr):
    """Gradients of one key block over the whole GQA group; grid (B * Hkv, N / BLOCK_N): the
    kv head varies fastest, so causal's longest programs (key block 0) start first."""
    gl.static_assert(BLOCK_N == 16 * num_warps, "each warpgroup owns 64 keys")
    dtype: gl.constexpr = q_desc.dtype
    bkv = gl.program_id(0)
    n_start = gl.program_id(1) * BLOCK_N
    kv_row = bkv * seq + n_start
    q_base = bkv * group * seq  # row of query head 0 of the group (batch-major layout)
    if CAUSAL:
        m_first = n_start // BLOCK_M  # queries i >= n_start see the block
    else:
        m_first = 0
    n_mb = seq // BLOCK_M - m_first
    total = group * n_mb
    if STAGGER:
        # Programs that run together start at different query blocks, so their dQ reduces
        # land on different rows instead of queueing on the same ones.
        rot = (gl.program_id(1) * n_mb) // gl.num_programs(1)
    else:
        rot = 0

    k_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], do_desc.layout)
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype)
    ds_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_M], ds_layout)
    if LSE_SMEM:
        lse_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], lse_desc.layout)
        delta_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], delta_desc.layout)
    else:
        lse_bufs = ds_smem  # unused
        delta_bufs = ds_smem
    if DQ == 1 or DQ == 3:
        dq_bufs = gl.allocate_shared_memory(gl.float32, [DQ_BUFS, BLOCK_M, HEAD_DIM], dq_desc.layout)
    else:
        dq_bufs = ds_smem  # unused
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    dq_full = gl.allocate_shared_memory(gl.int64, [DQ_BUFS, 1], mbarrier.MBarrierLayout())
    dq_empty = gl.allocate_shared_memory(gl.int64, [DQ_BUFS, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    for i in gl.static_range(DQ_BUFS):
        mbarrier.init(dq_full.index(i), count=1)
        mbarrier.init(dq_empty.index(i), count=1)

    # Gluon takes each partition's arguments literally (a tuple built beforehand loses the
    # constexpr-ness of its items): one written-out list per partition count.
    if DQ == 3:
        gl.warp_specialize([
            (_bwd_consumer, (dk_desc, dv_desc, dq_desc, dq_ptr, lse_ptr, delta_ptr, k_smem, v_smem,
                             q_bufs, do_bufs, lse_bufs, delta_bufs, ds_smem, dq_bufs, kv_bar, ready,
                             empty, dq_full, dq_empty, sm_scale, kv_row, q_base, seq, n_start,
                             m_first, n_mb, rot, total, CAUSAL, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES,
                             num_warps, DQ, DQ_BUFS, SYNC_RELEASE, EARLY_DV, LSE_SMEM)),
            (_bwd_loader, (q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, k_smem, v_smem,
                           q_bufs, do_bufs, lse_bufs, delta_bufs, kv_bar, ready, empty, kv_row,
                           q_base, seq, m_first, n_mb, rot, total, BLOCK_M, STAGES, LSE_SMEM)),
            (_bwd_dq_writer, (dq_desc, dq_bufs, dq_full, dq_empty, q_base, seq, m_first, n_mb,
                              rot, total, BLOCK_M, DQ_BUFS)),
        ], [1, 1], [LOADER_REGS, LOADER_REGS])
    else:
        gl.warp_specialize([
            (_bwd_consumer, (dk_desc, dv_desc, dq_desc, dq_ptr, lse_ptr, delta_ptr, k_smem, v_smem,
                             q_bufs, do_bufs, lse_bufs, delta_bufs, ds_smem, dq_bufs, kv_bar, ready,
                             empty, dq_full, dq_empty, sm_scale, kv_row, q_base, seq, n_start,
                             m_first, n_mb, rot, total, CAUSAL, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES,
                             num_warps, DQ, DQ_BUFS, SYNC_RELEASE, EARLY_DV, LSE_SMEM)),
            (_bwd_loader, (q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, k_smem, v_smem,
                           q_bufs, do_bufs, lse_bufs, delta_bufs, kv_bar, ready, empty, kv_row,
                           q_base, seq, m_first, n_mb, rot, total, BLOCK_M, STAGES, LSE_SMEM)),
        ], [1], [LOADER_REGS])


# ---------------------------------------------------------------------------------------------
# The deterministic split's dQ kernel (FA2's): one program per (block of BLOCK_M = 128 query
# rows, batch x query head), Q, dO, lse, delta once, K and V blocks through a ring; per block
# S = Q K^T, dP = dO V^T, dS = P o (dP - delta), dQ += dS K (A = dS from registers). 3 products
# per block pair (with the dK/dV kernel's 4: 7, as AttnFuse's portable backward); no atomics.
# ---------------------------------------------------------------------------------------------

@gluon.jit
def _dq_loader(q_desc, k_desc, v_desc, do_desc, q_smem, do_smem, k_bufs, v_bufs, q_bar, ready,
               empty, q_row, kv_row, n_blocks, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    mbarrier.expect(q_bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row, 0], q_bar, q_smem)
    tma.async_copy_global_to_shared(do_desc, [q_row, 0], q_bar, do_smem)
    for j in range(n_blocks):
        stage = j % STAGES
        phase = (j // STAGES) & 1
        mbarrier.wait(empty.index(stage), phase ^ 1)
        mbarrier.expect(ready.index(stage), k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [kv_row + j * BLOCK_N, 0], ready.index(stage),
                                        k_bufs.index(stage))
        tma.async_copy_global_to_shared(v_desc, [kv_row + j * BLOCK_N, 0], ready.index(stage),
                                        v_bufs.index(stage))


@gluon.jit
def _dq_consumer(dq_desc, lse_ptr, delta_ptr, q_smem, do_smem, k_bufs, v_bufs, q_bar, ready, empty,
                 sm_scale, q_row, q_start, n_blocks, CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr,
                 BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr,
                 NW: gl.constexpr):
    dtype: gl.constexpr = q_smem.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, BLOCK_N, 16])
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, HEAD_DIM, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dq_layout, k_width=2)
    qk_scale = sm_scale * 1.4426950408889634
    rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    lse2 = gl.load(lse_ptr + q_row + rows) * 1.4426950408889634
    delta = gl.load(delta_ptr + q_row + rows)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    dq = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=dq_layout)
    mbarrier.wait(q_bar, 0)
    for j in range(n_blocks):
        stage = j % STAGES
        phase = (j // STAGES) & 1
        k_s = k_bufs.index(stage)
        mbarrier.wait(ready.index(stage), phase)
        s = warpgroup_mma(q_smem, k_s.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        dp = warpgroup_mma(do_smem, v_bufs.index(stage).permute((1, 0)), s_zero, use_acc=False,
                           is_async=True)
        s = warpgroup_mma_wait(1, deps=(s,))
        p = gl.exp2(s * qk_scale - lse2[:, None])
        if CAUSAL:
            k_start = j * BLOCK_N
            if k_start + BLOCK_N > q_start:
                cols = k_start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
                p = gl.where(cols[None, :] <= (q_start + rows)[:, None], p, 0.0)
        dp = warpgroup_mma_wait(0, deps=(dp,))
        ds = gl.convert_layout((p * (dp - delta[:, None])).to(dtype), a_layout)
        dq_acc = warpgroup_mma(ds, k_s, dq, is_async=True)
        dq, ds = warpgroup_mma_wait(0, deps=(dq_acc, ds))
        gl.thread_barrier()  # both warpgroups are done with the stage
        mbarrier.arrive(empty.index(stage), count=1)
    # dQ leaves through Q's buffer (no product reads it any more).
    q_smem.store((dq * sm_scale).to(dtype))
    fence_async_shared()
    gl.thread_barrier()
    tma.async_copy_shared_to_global(dq_desc, [q_row, 0], q_smem)
    tma.store_wait(0)


@gluon.jit
def attention_bwd_dq_ws(q_desc, k_desc, v_desc, do_desc, dq_desc, lse_ptr, delta_ptr, sm_scale,
                        seq, heads, group, CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr,
                        BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr,
                        LOADER_REGS: gl.constexpr, num_warps: gl.constexpr):
    """dQ of one query block; grid (N / BLOCK_M, B * Hq), the longest causal programs first."""
    gl.static_assert(BLOCK_M == 16 * num_warps, "each warpgroup owns 64 query rows")
    dtype: gl.constexpr = q_desc.dtype
    bh = gl.program_id(1)
    block = gl.num_programs(0) - 1 - gl.program_id(0) if CAUSAL else gl.program_id(0)
    q_start = block * BLOCK_M
    q_row = bh * seq + q_start
    kv_bh = (bh // heads) * (heads // group) + (bh % heads) // group
    kv_row = kv_bh * seq
    if CAUSAL:
        n_blocks = gl.cdiv(q_start + BLOCK_M, BLOCK_N)
    else:
        n_blocks = seq // BLOCK_N
    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], do_desc.layout)
    k_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    gl.warp_specialize([
        (_dq_consumer, (dq_desc, lse_ptr, delta_ptr, q_smem, do_smem, k_bufs, v_bufs, q_bar, ready,
                        empty, sm_scale, q_row, q_start, n_blocks, CAUSAL, BLOCK_M, BLOCK_N,
                        HEAD_DIM, STAGES, num_warps)),
        (_dq_loader, (q_desc, k_desc, v_desc, do_desc, q_smem, do_smem, k_bufs, v_bufs, q_bar,
                      ready, empty, q_row, kv_row, n_blocks, BLOCK_N, STAGES)),
    ], [1], [LOADER_REGS])


# ---------------------------------------------------------------------------------------------
# The small `tl` kernels around it: delta (and dq_acc zeroed), dq_acc -> dq.
# ---------------------------------------------------------------------------------------------

@triton.jit
def _bwd_preprocess(o_ptr, do_ptr, delta_ptr, dq_acc_ptr, rows, ZERO_DQ: tl.constexpr,
                    BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr):
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    d = tl.arange(0, HEAD_DIM)
    offs = r[:, None] * HEAD_DIM + d[None, :]
    keep = r[:, None] < rows
    o = tl.load(o_ptr + offs, mask=keep, other=0.0).to(tl.float32)
    do = tl.load(do_ptr + offs, mask=keep, other=0.0).to(tl.float32)
    tl.store(delta_ptr + r, tl.sum(o * do, axis=1), mask=r < rows)
    if ZERO_DQ:
        tl.store(dq_acc_ptr + offs, tl.zeros([BLOCK, HEAD_DIM], tl.float32), mask=keep)


@triton.jit
def _dq_convert(dq_acc_ptr, dq_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    keep = offs < n
    tl.store(dq_ptr + offs, tl.load(dq_acc_ptr + offs, mask=keep).to(dq_ptr.dtype.element_ty),
             mask=keep)


# ---------------------------------------------------------------------------------------------
# Host side.
# ---------------------------------------------------------------------------------------------

def _gl_dtype(t):
    return gl.float16 if t.dtype == torch.float16 else gl.bfloat16


# name -> launch keyword arguments. BLOCK_N = 16 * warps (64 keys per warpgroup).
VARIANTS = {
    # Two consumer warpgroups (8 warps, 128 keys), dQ by TMA reduce-add, 2-stage Q/dO ring.
    "wg2_tma": dict(warps=8, block_m=64, stages=2, dq="tma"),
    # lse and delta TMA-loaded into the ring with Q and dO, read from shared memory when needed.
    "wg2_tma_lse": dict(warps=8, block_m=64, stages=2, dq="tma", lse_smem=True),
    "wg2_writer_lse": dict(warps=8, block_m=64, stages=2, dq="writer", dq_bufs=2, lse_smem=True),
    # The same, each program starting its walk at a different query block (dQ reduces spread).
    "wg2_writer_lse_stag": dict(warps=8, block_m=64, stages=2, dq="writer", dq_bufs=2, lse_smem=True,
                                stagger=True),
    # The same as wg2_tma, 3 stages.
    "wg2_tma_st3": dict(warps=8, block_m=64, stages=3, dq="tma"),
    # Two dQ staging buffers: the reduce of block i overlaps the products of block i+1.
    "wg2_tma_db": dict(warps=8, block_m=64, stages=2, dq="tma", dq_bufs=2),
    # dQ's TMA reduces issued by a third partition (1 warp), 2 staging buffers: the consumer
    # only stores the tile and signals.
    "wg2_writer": dict(warps=8, block_m=64, stages=2, dq="writer", dq_bufs=2),
    # The deterministic split: the dK/dV kernel without dQ, then the dQ kernel (128 query rows,
    # 64-key blocks); no atomics, no fp32 dQ buffer, 7 products per block pair.
    "det": dict(warps=8, block_m=64, stages=2, dq="none",
                dq_kernel=dict(block_m=128, block_n=64, stages=2, warps=8)),
    "det_n128": dict(warps=8, block_m=64, stages=2, dq="none",
                     dq_kernel=dict(block_m=128, block_n=128, stages=2, warps=8)),
    # dQ by fp32 atomics from registers.
    "wg2_atomic": dict(warps=8, block_m=64, stages=2, dq="atomic"),
    # dV issued after dS (no overlap of dS with dV): what the early issue buys.
    "wg2_tma_late_dv": dict(warps=8, block_m=64, stages=2, dq="tma", early_dv=False),
    # 128 query rows per block (S^T, dP^T 128 x 128: 64 registers each per thread, beside dK and
    # dV's 128): what the register file allows, for --compile-only.
    # (It also needs 290 KiB of shared memory: Q/dO/dQ tiles of 128 rows.)
    "wg2_m128": dict(warps=8, block_m=128, stages=2, dq="tma", lse_smem=True, compile_only=True),
    # One consumer warpgroup (4 warps, 64 keys), TMA reduce.
    "wg1_tma": dict(warps=4, block_m=64, stages=2, dq="tma"),
    # No dQ (the deterministic split's dK/dV half: 4 products per block pair).
    "wg2_nodq": dict(warps=8, block_m=64, stages=2, dq="none"),
}
# What `--out` runs unless told (about 4 minutes on an H200); the others are ablations.
DEFAULT_VARIANTS = ["wg2_writer_lse", "wg2_tma", "det", "wg2_writer", "wg2_tma_lse", "wg2_writer_lse_stag",
                    "wg2_atomic", "wg1_tma"]
DQ_MODES = {"none": 0, "tma": 1, "atomic": 2, "writer": 3}


def _descriptors(q, k, v, do, dk, dv, dq_acc, block_m, block_n):
    dim = q.shape[-1]
    dtype = _gl_dtype(q)
    q_layout = gl.NVMMASharedLayout.get_default_for([block_m, dim], dtype)
    kv_layout = gl.NVMMASharedLayout.get_default_for([block_n, dim], dtype)
    dq_layout = gl.NVMMASharedLayout.get_default_for([block_m, dim], gl.float32)
    flat = lambda t: t.reshape(-1, dim)  # noqa: E731
    return (TensorDescriptor.from_tensor(flat(q), [block_m, dim], q_layout),
            TensorDescriptor.from_tensor(flat(k), [block_n, dim], kv_layout),
            TensorDescriptor.from_tensor(flat(v), [block_n, dim], kv_layout),
            TensorDescriptor.from_tensor(flat(do), [block_m, dim], q_layout),
            TensorDescriptor.from_tensor(flat(dk), [block_n, dim], kv_layout),
            TensorDescriptor.from_tensor(flat(dv), [block_n, dim], kv_layout),
            TensorDescriptor.from_tensor(flat(dq_acc), [block_m, dim], dq_layout))


def _row_descriptors(lse, delta, block_m):
    """1-D descriptors of lse and delta ([B*Hq*N] fp32), BLOCK_M rows a box."""
    layout = gl.NVMMASharedLayout.get_default_for([block_m], gl.float32)
    return tuple(TensorDescriptor.from_tensor(t.reshape(-1), [block_m], layout) for t in (lse, delta))


def a_dq_acc_used(a):
    """Whether the dK/dV kernel accumulates dQ into the fp32 buffer (then converted)."""
    return a["dq"] != 0


def _dq_descriptors(q, k, v, do, dq, block_m, block_n):
    dim = q.shape[-1]
    dtype = _gl_dtype(q)
    q_layout = gl.NVMMASharedLayout.get_default_for([block_m, dim], dtype)
    kv_layout = gl.NVMMASharedLayout.get_default_for([block_n, dim], dtype)
    flat = lambda t: t.reshape(-1, dim)  # noqa: E731
    return (TensorDescriptor.from_tensor(flat(q), [block_m, dim], q_layout),
            TensorDescriptor.from_tensor(flat(k), [block_n, dim], kv_layout),
            TensorDescriptor.from_tensor(flat(v), [block_n, dim], kv_layout),
            TensorDescriptor.from_tensor(flat(do), [block_m, dim], q_layout),
            TensorDescriptor.from_tensor(flat(dq), [block_m, dim], q_layout))


def _launch_args(name, causal):
    spec = VARIANTS[name]
    warps = spec["warps"]
    return dict(block_m=spec["block_m"], block_n=16 * warps, stages=spec["stages"],
                dq=DQ_MODES[spec["dq"]], dq_bufs=spec.get("dq_bufs", 1),
                sync_release=spec.get("sync_release", True), loader_regs=spec.get("loader_regs", 24),
                early_dv=spec.get("early_dv", True), lse_smem=spec.get("lse_smem", False),
                stagger=spec.get("stagger", False),
                warps=warps, causal=causal,
                dq_kernel=spec.get("dq_kernel"))


class Backward:
    """Variant `name`'s backward for one problem: `prepare` (delta, dq_acc zeroed, descriptors),
    `kernel` (the warp-specialized kernel alone), `finish` (dq_acc -> dq); `__call__` all three.
    q/o/do [B,Hq,N,D], k/v [B,Hkv,N,D] contiguous, lse [B,Hq,N] fp32 natural log."""

    def __init__(self, name, q, k, v, o, lse, do, causal):
        a = self.args = _launch_args(name, causal)
        batch, heads, seq, dim = q.shape
        hkv = k.shape[1]
        assert k.shape[2] == seq and v.shape == k.shape, "the probe takes Nq == Nk"
        assert seq % a["block_n"] == 0 and seq % a["block_m"] == 0, "the probe needs whole blocks"
        assert heads % hkv == 0 and dim in (64, 128)
        for t in (q, k, v, o, do):
            assert t.is_contiguous() and t.dtype == q.dtype
        assert lse.dtype == torch.float32 and lse.is_contiguous() and lse.shape == q.shape[:-1]
        self.q, self.k, self.v, self.o, self.lse, self.do = q, k, v, o, lse, do
        self.causal, self.seq, self.dim, self.group = causal, seq, dim, heads // hkv
        self.rows = batch * heads * seq
        self.delta = torch.empty(q.shape[:-1], device=q.device, dtype=torch.float32)
        self.dq_acc = torch.empty(q.shape, device=q.device, dtype=torch.float32)
        self.dk, self.dv = torch.empty_like(k), torch.empty_like(v)
        self.dq = torch.empty_like(q) if a["dq"] or a["dq_kernel"] else None
        self.descs = (_descriptors(q, k, v, do, self.dk, self.dv, self.dq_acc, a["block_m"], a["block_n"])
                      + _row_descriptors(lse, self.delta, a["block_m"]))
        self.grid = (batch * hkv, seq // a["block_n"])
        self.heads = heads
        if a["dq_kernel"]:
            d = a["dq_kernel"]
            assert seq % d["block_m"] == 0 and seq % d["block_n"] == 0, "the probe needs whole blocks"
            self.dq_descs = _dq_descriptors(q, k, v, do, self.dq, d["block_m"], d["block_n"])
            self.dq_grid = (seq // d["block_m"], batch * heads)

    def prepare(self):
        _bwd_preprocess[(triton.cdiv(self.rows, 64),)](self.o, self.do, self.delta, self.dq_acc,
                                                       self.rows, self.args["dq"] != 0, 64,
                                                       self.dim, num_warps=4)

    def parts(self):
        """label -> launch of each warp-specialized kernel alone (timed separately)."""
        out = {"kernel": self.kernel}
        if self.args["dq_kernel"]:
            out.update({"dkdv": self.dkdv_kernel, "dq": self.dq_kernel})
        return out

    def kernel(self):
        self.dkdv_kernel()
        if self.args["dq_kernel"]:
            self.dq_kernel()

    def dkdv_kernel(self):
        a = self.args
        attention_bwd_ws[self.grid](*self.descs, self.dq_acc, self.lse, self.delta,
                                    1.0 / math.sqrt(self.dim), self.seq, self.group, self.causal,
                                    a["block_m"], a["block_n"], self.dim, a["stages"], a["dq"],
                                    a["dq_bufs"], a["sync_release"], a["loader_regs"],
                                    a["early_dv"], a["lse_smem"], a["stagger"], num_warps=a["warps"])

    def dq_kernel(self):
        if self.args["dq_kernel"]:
            d = self.args["dq_kernel"]
            attention_bwd_dq_ws[self.dq_grid](*self.dq_descs, self.lse, self.delta,
                                              1.0 / math.sqrt(self.dim), self.seq, self.heads,
                                              self.group, self.causal, d["block_m"], d["block_n"],
                                              self.dim, d["stages"], d.get("loader_regs", 24),
                                              num_warps=d["warps"])

    def finish(self):
        if a_dq_acc_used(self.args):
            n = self.dq.numel()
            _dq_convert[(triton.cdiv(n, 4096),)](self.dq_acc, self.dq, n, 4096, num_warps=4)

    def __call__(self):
        self.prepare()
        self.kernel()
        self.finish()
        return self.dq, self.dk, self.dv


# ---------------------------------------------------------------------------------------------
# Offline compile (no GPU): resources per variant.
# ---------------------------------------------------------------------------------------------

def _warmup(name, causal, dim=128, dtype=torch.bfloat16):
    """Compile variant `name` with CPU tensors (nothing launched)."""
    a = _launch_args(name, causal)
    n, heads, hkv = 256, 4, 1
    q = torch.empty(1, heads, n, dim, dtype=dtype)
    k = torch.empty(1, hkv, n, dim, dtype=dtype)
    dq_acc = torch.empty(1, heads, n, dim, dtype=torch.float32)
    lse = torch.empty(1, heads, n)
    descs = (_descriptors(q, k, k, q, k, k, dq_acc, a["block_m"], a["block_n"])
             + _row_descriptors(lse, lse, a["block_m"]))
    out = [("dkdv", attention_bwd_ws.warmup(*descs, dq_acc, lse, lse, 0.1, n, heads // hkv, causal,
                                            a["block_m"], a["block_n"], dim, a["stages"], a["dq"],
                                            a["dq_bufs"], a["sync_release"], a["loader_regs"],
                                            a["early_dv"], a["lse_smem"], a["stagger"],
                                            num_warps=a["warps"], grid=(1,)))]
    if a["dq_kernel"]:
        d = a["dq_kernel"]
        dq_descs = _dq_descriptors(q, k, k, q, q, d["block_m"], d["block_n"])
        out.append(("dq", attention_bwd_dq_ws.warmup(*dq_descs, lse, lse, 0.1, n, heads, heads // hkv,
                                                     causal, d["block_m"], d["block_n"], dim,
                                                     d["stages"], d.get("loader_regs", 24),
                                                     num_warps=d["warps"], grid=(1,))))
    return out


def compile_only(capability: int, names) -> None:
    """Compile every variant for sm_`capability` with no GPU; print registers, spills (STACK,
    LOCAL, STL/LDL in the SASS), shared memory, the per-partition setmaxnreg values, the
    wgmma count and ptxas' verdict on the wgmma pipeline (C7512 = serialized)."""
    import re
    import subprocess
    import tempfile
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from kernel_resources import TargetOnlyDriver, resources
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    driver.set_active(TargetOnlyDriver(GPUTarget("cuda", capability, 32)))
    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    for name in names:
        for causal in (True, False):
            label = f"{name:12s} causal={causal!s:5s} {VARIANTS[name]}"
            try:
                kernels = _warmup(name, causal)
            except Exception as e:  # a construct that does not compile is a finding
                print(f"{label}: COMPILE ERROR {type(e).__name__}: {str(e)[:2000]}", flush=True)
                continue
            for kernel_name, compiled in kernels:
                print(f"{label} [{kernel_name}]: {_resource_line(compiled, capability, bin_dir)}", flush=True)


def _resource_line(compiled, capability, bin_dir):
    import re
    import subprocess
    import tempfile
    from kernel_resources import resources
    used = resources(compiled.asm["cubin"])
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        sass = subprocess.run([os.path.join(bin_dir, "cuobjdump"), "-sass", f.name],
                              capture_output=True, text=True).stdout
    spill_ops = len(re.findall(r"\b(STL|LDL)\b", sass))
    with tempfile.TemporaryDirectory() as tmp:
        ptx_path = os.path.join(tmp, "k.ptx")
        with open(ptx_path, "w") as f:
            f.write(compiled.asm["ptx"])
        arch = f"sm_{capability}a" if capability == 90 else f"sm_{capability}"
        info = subprocess.run([os.path.join(bin_dir, "ptxas"), f"-arch={arch}", "-v", ptx_path,
                               "-o", os.path.join(tmp, "k.cubin")], capture_output=True, text=True)
    serialized = "C7512" in info.stderr + info.stdout
    ptx = compiled.asm["ptx"]
    nregs = sorted(set(int(x) for x in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)))
    counts = {key: len(re.findall(pattern, text)) for key, pattern, text in (
        ("HGMMA", r"HGMMA", sass),
        ("tma-reduce", r"cp\.reduce\.async\.bulk", ptx),
        ("red/atom.f32", r"(?:red|atom)\.global[.\w]*\.f32", ptx),
        ("bar.sync", r"\bbar\.sync|barrier\.sync", ptx))}
    return (f"REG {used.get('REG')} STACK {used.get('STACK')} LOCAL {used.get('LOCAL')} "
            f"STL/LDL {spill_ops} setmaxnreg {nregs} shared {compiled.metadata.shared} B "
            f"wgmma-serialized {serialized} " + " ".join(f"{key} {value}" for key, value in counts.items()))



# ---------------------------------------------------------------------------------------------
# GPU mode: references, checks, timings.
# ---------------------------------------------------------------------------------------------

def reference(q, k, v, do, causal):
    """o, lse (natural log), dq, dk, dv in float64, written from the semantics: scale
    1/sqrt(D), GQA by head groups (dk, dv summed over each group), causal key j kept iff j <= i
    (Nq == Nk). One query head at a time, so N=2048 at 32 heads stays small."""
    batch, heads, seq, dim = q.shape
    group = heads // k.shape[1]
    scale = 1.0 / math.sqrt(dim)
    f64 = torch.float64
    o = torch.empty(q.shape, dtype=f64, device=q.device)
    lse = torch.empty(q.shape[:-1], dtype=f64, device=q.device)
    dq = torch.empty(q.shape, dtype=f64, device=q.device)
    dk = torch.zeros(k.shape, dtype=f64, device=q.device)
    dv = torch.zeros(v.shape, dtype=f64, device=q.device)
    mask = torch.ones(seq, seq, dtype=torch.bool, device=q.device).tril() if causal else None
    for b in range(batch):
        for h in range(heads):
            qh, doh = q[b, h].to(f64), do[b, h].to(f64)
            kh, vh = k[b, h // group].to(f64), v[b, h // group].to(f64)
            s = qh @ kh.T * scale
            if causal:
                s = s.masked_fill(~mask, -float("inf"))
            lse[b, h] = torch.logsumexp(s, dim=-1)
            p = torch.exp(s - lse[b, h][:, None])
            o[b, h] = p @ vh
            dp = doh @ vh.T
            ds = p * (dp - (doh * o[b, h]).sum(-1, keepdim=True))
            dq[b, h] = ds @ kh * scale
            dk[b, h // group] += ds.T @ qh * scale
            dv[b, h // group] += p.T @ doh
    return o, lse, dq, dk, dv


def forward_fp32(q, k, v, causal):
    """o (input dtype) and lse (fp32) for the timing shapes, from TF32 products one kv head's
    group at a time: inputs for the backward, not a reference."""
    batch, heads, seq, dim = q.shape
    group = heads // k.shape[1]
    o, lse = torch.empty_like(q), torch.empty(q.shape[:-1], device=q.device, dtype=torch.float32)
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        for b in range(batch):
            for h in range(k.shape[1]):
                qh = q[b, h * group:(h + 1) * group].float()
                s = qh @ k[b, h].float().T / math.sqrt(dim)
                if causal:
                    s.masked_fill_(torch.ones(seq, seq, dtype=torch.bool, device=q.device).tril().logical_not(),
                                   -float("inf"))
                lse[b, h * group:(h + 1) * group] = torch.logsumexp(s, dim=-1)
                o[b, h * group:(h + 1) * group] = (torch.softmax(s, dim=-1) @ v[b, h].float()).to(q.dtype)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    return o, lse


CHECKS = [  # (causal, B, Hq, Hkv, N); D=128, bf16
    (True, 1, 32, 8, 1024),
    (False, 1, 32, 8, 1024),
    (True, 1, 32, 8, 2048),
    (True, 2, 4, 4, 512),     # no GQA, two batches
    (False, 1, 8, 1, 768),    # GQA 8 (MQA), N not a multiple of 256
]
CASES = [(causal, 1, 32, 8, n) for n in (4096, 8192) for causal in (True, False)]
DIM, DTYPE = 128, torch.bfloat16


def _inputs(case, seed):
    causal, batch, heads, hkv, seq = case
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    q = torch.randn(batch, heads, seq, DIM, device=DEVICE, dtype=DTYPE, generator=g)
    k, v = (torch.randn(batch, hkv, seq, DIM, device=DEVICE, dtype=DTYPE, generator=g) for _ in range(2))
    do = torch.randn(batch, heads, seq, DIM, device=DEVICE, dtype=DTYPE, generator=g)
    return q, k, v, do


def _label(case):
    causal, batch, heads, hkv, seq = case
    return f"{'causal' if causal else 'dense'} B{batch} H{heads}/{hkv} D{DIM} N{seq}"


def _cudnn_grads(q, k, v, do, causal):
    """dq, dk, dv of cuDNN SDPA (k, v expanded to the query heads, their gradients summed
    back over each group)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
    group = q.shape[1] // k.shape[1]
    qq = q.detach().requires_grad_()
    kk, vv = (t.detach().requires_grad_() for t in (k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = F.scaled_dot_product_attention(qq, kk.repeat_interleave(group, 1),
                                             vv.repeat_interleave(group, 1), is_causal=causal)
    return torch.autograd.grad(out, (qq, kk, vv), do)


def _attnfuse_fn(causal):
    sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import attnfuse as af
    return af.compile(af.attention(af.causal()) if causal else af.attention())


def _attnfuse_grads(q, k, v, do, causal):
    fn = _attnfuse_fn(causal)
    qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
    return torch.autograd.grad(fn(qq, kk, vv), (qq, kk, vv), do)


def _sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


HANG_S = 20.0  # a backward of the checked sizes takes milliseconds


def _finish_or_exit(what):
    """Wait for the GPU, or end this process (exit code 3) after HANG_S seconds: a kernel that
    deadlocks on its barriers would otherwise hold the GPU's SMs while the other variants'
    checks run beside it (ending the process ends its kernels)."""
    if DEVICE != "cuda":
        return
    import time
    done = torch.cuda.Event()
    done.record()
    start = time.time()
    while not done.query():
        if time.time() - start > HANG_S:
            print(f"HANG: {what} not done after {HANG_S:.0f} s; exiting", flush=True)
            os._exit(3)
        time.sleep(0.005)


def _rel_err(x, ref):
    """max |x - ref| / max |ref| (inf when x has a non-finite value)."""
    x = x.to(torch.float64)
    if not torch.isfinite(x).all():
        return float("inf")
    return ((x - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def prepare_references(path):
    """Saved once for every variant's check and timing: the check inputs' float64 references
    and cuDNN's / AttnFuse's errors against them (the tolerance's calibration); o and lse of
    the timing shapes (TF32 forward, the backward's inputs)."""
    data = []
    for i, case in enumerate(CHECKS):
        causal = case[0]
        q, k, v, do = _inputs(case, seed=100 + i)
        o, lse, dq, dk, dv = reference(q, k, v, do, causal)
        entry = {"case": case, "seed": 100 + i, "o": o.to(DTYPE), "lse": lse.float(),
                 "dq": dq, "dk": dk, "dv": dv, "calibration": {}}
        for impl, grads in (("cudnn", _cudnn_grads), ("attnfuse", _attnfuse_grads)):
            try:
                got = grads(q, k, v, do, causal)
                entry["calibration"][impl] = {n: _rel_err(g, r) for n, g, r in zip(("dq", "dk", "dv"), got, (dq, dk, dv))}
            except Exception as e:
                entry["calibration"][impl] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        print(_label(case), entry["calibration"], flush=True)
        data.append(entry)
    cases = []
    for i, case in enumerate(CASES):
        q, k, v, _ = _inputs(case, seed=i)
        o, lse = forward_fp32(q, k, v, case[0])
        cases.append({"case": case, "seed": i, "o": o, "lse": lse})
    torch.save({"checks": data, "cases": cases}, path)


def _tolerance(calibration, grad):
    """A variant's relative error may be 3x cuDNN's (bf16 rounding of P and dS, atomics' order)
    and never needs to beat 1e-2; no calibration: 2e-2."""
    ref = calibration.get("cudnn", {}).get(grad)
    return max(3.0 * ref, 1e-2) if isinstance(ref, float) and math.isfinite(ref) else 2e-2


def check_variant(name, ref_path):
    """Rows: relative errors of dq, dk, dv against float64 at CHECKS (ok within the tolerance),
    and against cuDNN's gradients at the timing CASES (ok below 3e-2 relative: two bf16
    results, the kernel's lse from a TF32 forward)."""
    rows = []
    refs = torch.load(ref_path, weights_only=False)
    for entry in refs["checks"]:
        case = entry["case"]
        causal = case[0]
        q, k, v, do = _inputs(case, entry["seed"])
        label = "check " + _label(case)
        try:
            dq, dk, dv = Backward(name, q, k, v, entry["o"], entry["lse"], do, causal)()
            _finish_or_exit(f"{name} {label}")
        except Exception as e:
            rows.append({"variant": name, "check": label, "ok": False,
                         "error": f"{type(e).__name__}: {str(e)[:600]}"})
            continue
        row = {"variant": name, "check": label, "ok": True}
        for grad, got in (("dq", dq), ("dk", dk), ("dv", dv)):
            if got is None:  # the no-dQ variant
                continue
            err = _rel_err(got, entry[grad])
            tol = _tolerance(entry["calibration"], grad)
            row[f"err_{grad}"], row[f"tol_{grad}"] = err, tol
            row["ok"] = row["ok"] and err <= tol
        rows.append(row)
        print(json.dumps(row), flush=True)
    for entry in refs["cases"]:
        case, o, lse = entry["case"], entry["o"], entry["lse"]
        causal = case[0]
        q, k, v, do = _inputs(case, seed=entry["seed"])
        label = "vs cuDNN " + _label(case)
        try:
            got = Backward(name, q, k, v, o, lse, do, causal)()
            _finish_or_exit(f"{name} {label}")
        except Exception as e:
            rows.append({"variant": name, "check": label, "ok": False,
                         "error": f"{type(e).__name__}: {str(e)[:600]}"})
            continue
        try:
            want = _cudnn_grads(q, k, v, do, causal)
        except Exception as e:  # no comparison, but the variant is not blamed for it
            got_finite = all(x is None or torch.isfinite(x).all().item() for x in got)
            rows.append({"variant": name, "check": label, "ok": got_finite,
                         "skipped": f"cuDNN failed ({type(e).__name__}: {str(e)[:200]}); finite: {got_finite}"})
            continue
        row = {"variant": name, "check": label, "ok": True}
        for grad, x, y in zip(("dq", "dk", "dv"), got, want):
            if x is None:
                continue
            err = _rel_err(x, y.to(torch.float64))
            row[f"err_{grad}"] = err
            row["ok"] = row["ok"] and err <= 3e-2
        rows.append(row)
        print(json.dumps(row), flush=True)
        del got, want, o, lse
    return rows


def _flops(case):
    causal, batch, heads, hkv, seq = case
    # Backward = 2.5 x the forward's 4 B H N^2 D; causal halves it.
    return 2.5 * 4 * batch * heads * seq * seq * DIM * (0.5 if causal else 1.0)


def _bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def time_variant(name, ref_path):
    """Rows: median ms (do_bench: CUDA events, L2 flushed before each call) and TFLOP/s at
    CASES; `baseline`: cuDNN's and AttnFuse's backward alone (forward once with grad, then
    autograd.grad with retain_graph timed)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
    rows = []
    for entry in torch.load(ref_path, weights_only=False)["cases"]:
        case = entry["case"]
        causal = case[0]
        q, k, v, do = _inputs(case, seed=entry["seed"])
        impls = {}
        if name == "baseline":
            group = q.shape[1] // k.shape[1]
            qq = q.detach().requires_grad_()
            # cuDNN gets k, v expanded to the query heads as leaves: its backward alone,
            # without the group sum.
            kx, vx = (t.repeat_interleave(group, 1).detach().requires_grad_() for t in (k, v))
            try:
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    out_c = F.scaled_dot_product_attention(qq, kx, vx, is_causal=causal)
                impls["cudnn"] = lambda: torch.autograd.grad(out_c, (qq, kx, vx), do, retain_graph=True)
            except Exception as e:
                rows.append({"variant": "cudnn", "case": _label(case),
                             "error": f"{type(e).__name__}: {str(e)[:300]}"})
            try:
                fn = _attnfuse_fn(causal)
                qa, ka, va = (t.detach().requires_grad_() for t in (q, k, v))
                out_a = fn(qa, ka, va)
                impls["attnfuse"] = lambda: torch.autograd.grad(out_a, (qa, ka, va), do, retain_graph=True)
            except Exception as e:
                rows.append({"variant": "attnfuse", "case": _label(case),
                             "error": f"{type(e).__name__}: {str(e)[:300]}"})
        else:
            bwd = Backward(name, q, k, v, entry["o"], entry["lse"], do, causal)
            impls[name] = bwd
            impls.update({f"{name}:{part}": fn for part, fn in bwd.parts().items()})
        for label, impl in impls.items():
            try:
                ms = _bench(impl)
                rows.append({"variant": label, "case": _label(case), "ms": ms,
                             "tflops": _flops(case) / ms / 1e9})
            except Exception as e:
                rows.append({"variant": label, "case": _label(case),
                             "error": f"{type(e).__name__}: {str(e)[:300]}"})
            print(json.dumps(rows[-1]), flush=True)
        del impls
        torch.cuda.empty_cache()
    return rows


def orchestrate(out_dir, names, check_timeout, time_timeout, budget):
    """References once; every variant's check in a parallel subprocess (a hang or crash is
    killed by its timeout and reported; compiling fills Triton's cache for the timing); then
    the timings one process at a time, of the baseline and of the variants whose every check
    passed (a wrong kernel is never timed). Writes OUT/<stamp>-gluon_backward_probe.{json,md}."""
    import subprocess
    import time
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import benchlib
    me = os.path.abspath(__file__)
    os.makedirs(out_dir, exist_ok=True)
    stamp = benchlib.stamp()
    results = {"meta": benchlib.metadata(DEVICE), "checks": [], "timings": [], "failures": [],
               "calibration": []}
    start = time.time()
    import tempfile
    # The references (about 200 MB at the timing shapes) stay out of DIR, which comes back.
    ref_dir = tempfile.mkdtemp(prefix="gluon_backward_refs")
    ref_path = os.path.join(ref_dir, "refs.pt")
    log = open(os.path.join(out_dir, "gluon_backward_refs.log"), "w")
    try:
        rc = subprocess.run([sys.executable, me, "--prepare", ref_path], stdout=log,
                            stderr=subprocess.STDOUT, timeout=check_timeout).returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    log.close()
    print(open(log.name).read()[-3000:], flush=True)
    if rc != 0:
        print(f"REFERENCES FAILED ({rc}): nothing checked, nothing timed", flush=True)
        return
    for entry in torch.load(ref_path, weights_only=False)["checks"]:
        results["calibration"].append({"case": _label(entry["case"]), **entry["calibration"]})
    print(f"[references in {time.time() - start:.0f} s]", flush=True)
    procs = {}
    for name in names:
        path = os.path.join(out_dir, f"check_{name}.json")
        log_file = open(os.path.join(out_dir, f"check_{name}.log"), "w")
        procs[name] = (subprocess.Popen([sys.executable, me, "--check", name, "--refs", ref_path,
                                         "--json", path], stdout=log_file, stderr=subprocess.STDOUT),
                       path, log_file)
    passed = []
    check_start = time.time()
    for name, (proc, path, log_file) in procs.items():
        try:
            proc.wait(timeout=max(1, check_timeout - (time.time() - check_start)))
            timed_out = False
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            timed_out = True
        log_file.close()
        text = open(log_file.name).read()
        if timed_out or proc.returncode != 0 or not os.path.exists(path):
            why = ("timeout (hang?)" if timed_out else "hang (its kernel did not finish)"
                   if proc.returncode == 3 else f"rc {proc.returncode}")
            results["failures"].append({"variant": name, "phase": "check", "why": why, "log": text[-3000:]})
            print(f"[check] {name}: FAILED ({why})\n{text[-1500:]}", flush=True)
            continue
        rows = json.load(open(path))
        results["checks"] += rows
        bad = [r for r in rows if not r.get("ok", False)]
        print(f"[check] {name}: {len(rows) - len(bad)}/{len(rows)} ok"
              + "".join(f"\n    FAIL {r}" for r in bad), flush=True)
        if bad:
            results["failures"].append({"variant": name, "phase": "check", "why": "wrong gradients (not timed)"})
        else:
            passed.append(name)
    print(f"[checks done at {time.time() - start:.0f} s]", flush=True)
    for name in ["baseline"] + passed:
        path = os.path.join(out_dir, f"time_{name}.json")
        left = budget - (time.time() - start)
        if left < 10:  # the run's wall-clock budget: what is left is reported, not timed
            results["failures"].append({"variant": name, "phase": "time", "why": f"skipped: {budget:.0f} s budget spent"})
            print(f"[time] {name}: skipped (budget)", flush=True)
            continue
        try:
            proc = subprocess.run([sys.executable, me, "--time", name, "--refs", ref_path, "--json", path],
                                  capture_output=True, text=True, timeout=min(time_timeout, left))
            if proc.returncode != 0:
                results["failures"].append({"variant": name, "phase": "time", "why": f"rc {proc.returncode}",
                                            "log": (proc.stdout + proc.stderr)[-3000:]})
                print(f"[time] {name}: FAILED rc {proc.returncode}\n{(proc.stdout + proc.stderr)[-1500:]}", flush=True)
            else:
                results["timings"] += json.load(open(path))
                print(f"[time] {name} done at {time.time() - start:.0f} s", flush=True)
        except subprocess.TimeoutExpired:
            results["failures"].append({"variant": name, "phase": "time", "why": "timeout"})
            print(f"[time] {name}: TIMEOUT", flush=True)
    _report(out_dir, stamp, results, passed, benchlib)
    import shutil
    shutil.rmtree(ref_dir, ignore_errors=True)
    print(f"[all done in {time.time() - start:.0f} s]", flush=True)


def _report(out_dir, stamp, results, passed, benchlib):
    table = {}
    for r in results["timings"]:
        if "ms" in r:
            table.setdefault(r["case"], {})[r["variant"]] = r
    seen = {r["variant"] for r in results["timings"] if "ms" in r}
    columns = ["cudnn", "attnfuse"] + [c for n in passed for c in (n, n + ":kernel", n + ":dkdv", n + ":dq")
                                       if c in seen]
    lines = ["# Hand-written warp-specialized Gluon attention backward (probe) beside cuDNN and AttnFuse", ""]
    lines += benchlib.metadata_lines(results["meta"])
    lines += ["Backward alone, median ms (triton.testing.do_bench, L2 flushed); `name` = delta "
              "preprocess + kernel(s) + dq conversion, `name:kernel` = the warp-specialized kernel(s) alone "
              "(`det`: `:dkdv` and `:dq` each); "
              "TFLOP/s = 2.5 x forward FLOPs (causal halved) / ms.", ""]
    rows = []
    for case, row in table.items():
        rows.append([case] + [benchlib.fmt(row[c]["ms"]) if c in row else "-" for c in columns])
    lines += benchlib.markdown_table(["case"] + columns, rows) + [""]
    rows = []
    for case, row in table.items():
        rows.append([case] + [benchlib.fmt(row[c]["tflops"], ".0f") if c in row else "-" for c in columns])
    lines += ["TFLOP/s:", ""] + benchlib.markdown_table(["case"] + columns, rows) + [""]
    rows = []
    for case, row in table.items():
        rows.append([case] + [benchlib.fmt(row["cudnn"]["ms"] / row[c]["ms"], ".2f")
                              if c in row and "cudnn" in row else "-" for c in columns])
    lines += ["cuDNN ms / column ms (above 1: faster than cuDNN):", ""]
    lines += benchlib.markdown_table(["case"] + columns, rows) + [""]
    lines += ["Checks (relative max error vs float64; tolerance max(3 x cuDNN's, 1e-2); at the timing "
              "shapes vs cuDNN's gradients, 3e-2):", ""]
    lines += benchlib.markdown_table(
        ["variant", "check", "ok", "dq", "dk", "dv", "error"],
        [[r["variant"], r["check"], r.get("ok"), benchlib.fmt(r.get("err_dq"), ".2e"),
          benchlib.fmt(r.get("err_dk"), ".2e"), benchlib.fmt(r.get("err_dv"), ".2e"),
          r.get("error", r.get("skipped", ""))] for r in results["checks"]]) + [""]
    lines += ["Calibration (cuDNN's and AttnFuse's relative errors vs float64):", ""]
    lines += [f"- {json.dumps(c)}" for c in results["calibration"]] + [""]
    if results["failures"]:
        lines += ["Failures:", ""] + [f"- {f['variant']} ({f['phase']}): {f['why']}" for f in results["failures"]]
    benchlib.write_outputs(__import__("pathlib").Path(out_dir), f"{stamp}-gluon_backward_probe", results, lines)
    print("\n".join(lines), flush=True)
    for failure in results["failures"]:
        if "log" in failure:
            print("FAILURE", failure["variant"], failure["phase"], failure["why"], "\n", failure["log"][-1500:])


def _dry_run_cpu():
    """GLUON_BWD_PROBE_DRYRUN=1: the GPU mode's plumbing on a machine without a GPU (tiny
    shapes, CPU tensors, a torch stand-in for the kernels, the wall clock for do_bench). Tests
    the script, not the kernels."""
    global DEVICE, CHECKS, CASES, Backward, _bench
    DEVICE = "cpu"
    CHECKS = [(True, 1, 4, 2, 256), (False, 1, 2, 1, 128)]
    CASES = [(True, 1, 4, 2, 256), (False, 1, 4, 2, 256)]
    real = Backward

    class StandIn(real):
        def __init__(self, name, q, k, v, o, lse, do, causal):
            self.args = _launch_args(name, causal)
            self.inputs = (q, k, v, o, lse, do, causal)
            self.kernel = self.dkdv_kernel = self.dq_kernel = self.__call__

        def __call__(self):
            q, k, v, o, lse, do, causal = self.inputs
            group = q.shape[1] // k.shape[1]
            kk, vv = (t.float().repeat_interleave(group, 1) for t in (k, v))
            s = q.float() @ kk.transpose(-1, -2) / math.sqrt(q.shape[-1])
            if causal:
                n = q.shape[2]
                s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).tril().logical_not(), -float("inf"))
            p = torch.exp(s - lse[..., None])
            dp = do.float() @ vv.transpose(-1, -2)
            ds = p * (dp - (do.float() * o.float()).sum(-1, keepdim=True)) / math.sqrt(q.shape[-1])
            fold = lambda t: t.unflatten(1, (k.shape[1], group)).sum(2)  # noqa: E731
            dq = (ds @ kk).to(q.dtype)
            dk, dv = fold(ds.transpose(-1, -2) @ q.float()).to(q.dtype), fold(p.transpose(-1, -2) @ do.float()).to(q.dtype)
            return (None if self.args["dq"] == 0 and not self.args["dq_kernel"] else dq), dk, dv

    Backward = StandIn

    def wall(fn):
        import time
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    _bench = wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--capability", type=int, default=90)
    parser.add_argument("--out", help="check and time everything, write DIR/<stamp>-gluon_backward_probe.{json,md}")
    parser.add_argument("--variants", help=f"comma-separated subset of {', '.join(VARIANTS)}, or 'all' "
                                           f"(default: all for --compile-only, {','.join(DEFAULT_VARIANTS)} "
                                           "for --out)")
    parser.add_argument("--prepare", metavar="PATH", help="(internal) write the check references")
    parser.add_argument("--check", metavar="VARIANT", help="(internal) check one variant")
    parser.add_argument("--refs", help="(internal) the references --check and --time read")
    parser.add_argument("--time", metavar="VARIANT", help="(internal) time one variant or 'baseline'")
    parser.add_argument("--json", help="(internal) where --check/--time write their rows")
    parser.add_argument("--check-timeout", type=float, default=120)
    parser.add_argument("--time-timeout", type=float, default=60)
    parser.add_argument("--budget", type=float, default=300,
                        help="wall-clock seconds of --out; timings past it are skipped (reported)")
    args = parser.parse_args()
    if os.environ.get("GLUON_BWD_PROBE_DRYRUN"):
        _dry_run_cpu()
    chosen = args.variants or ("all" if args.compile_only else ",".join(DEFAULT_VARIANTS))
    if chosen == "all":
        names = [n for n, spec in VARIANTS.items() if args.compile_only or not spec.get("compile_only")]
    else:
        names = [n for n in chosen.split(",") if n]
    for name in names:
        if name not in VARIANTS:
            parser.error(f"unknown variant {name!r}; known: {', '.join(VARIANTS)}")
    if args.compile_only:
        compile_only(args.capability, names)
        return
    if args.prepare:
        prepare_references(args.prepare)
        return
    if args.check or args.time:
        rows = check_variant(args.check, args.refs) if args.check else time_variant(args.time, args.refs)
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
        return
    if not args.out:
        parser.error("--out DIR, --compile-only, or an internal mode")
    orchestrate(args.out, names, args.check_timeout, args.time_timeout, args.budget)


if __name__ == "__main__":
    main()

"""Which formulation of the dK/dV kernel suits Hopper: an experiment outside the compiler.

Two hand-written Triton kernels compute causal dK and dV (GQA: a program owns a key block of
one key/value head and loops over its query heads), both with the log2-domain exponent:

- `transposed`: S^T = K Q^T, as `lower-to-tile` emits it (K and V are A operands, kept in
  registers);
- `natural`: S = Q K^T and P^T = trans(P) (K and V are B operands, read from shared memory),
  which frees registers for larger key blocks.

Each is timed beside the compiler's own dK/dV kernel for plain causal attention at the same
tile configuration, and checked against it. Every kernel, like the compiler's since commit
`4612aff`, reads a block-major grid (key/value head on axis 0, key block on axis 1: every
head's longest programs first); the logs before 17:30 UTC on 2026-11-29 ran a head-major one.
Prints ms, TFLOP/s (4 causal products), registers
and spills per configuration. `--ablation` instead steps the transposed kernel towards the
compiler's emitted code (scale applied before the log2 conversion rather than folded into it;
separate loops for the diagonal and the full query blocks), to find which difference costs
time.

    python bench/dkdv_formulations.py [--seq-len 4096] [--ablation] [--configs 64,32,4,3;...]
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

import attnfuse as af

LOG2E = 1.4426950408889634


@triton.jit
def _contribution(k, v, dk, dv, q, do, lse2, delta, queries, keys, qk_scale, sm_scale,
                  NATURAL: tl.constexpr, FOLD: tl.constexpr, MASKED: tl.constexpr):
    """One query block's contribution to dK and dV, from its loaded q, dO, lse and delta."""
    if NATURAL:
        s = tl.dot(q, tl.trans(k))
        if FOLD:
            p = tl.math.exp2(s * qk_scale - lse2[:, None])
        else:  # as lower-to-tile emits it: scale, then the log2 conversion
            s = s * sm_scale
            p = tl.math.exp2(s * 1.4426950408889634 - lse2[:, None])
        if MASKED:
            p = tl.where(keys[None, :] <= queries[:, None], p, 0.0)
        dv = tl.dot(tl.trans(p.to(do.dtype)), do, acc=dv)
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dk = tl.dot(tl.trans(ds.to(q.dtype)), q, acc=dk)
    else:
        st = tl.dot(k, tl.trans(q))
        if FOLD:
            pt = tl.math.exp2(st * qk_scale - lse2[None, :])
        else:
            st = st * sm_scale
            pt = tl.math.exp2(st * 1.4426950408889634 - lse2[None, :])
        if MASKED:
            pt = tl.where(keys[:, None] <= queries[None, :], pt, 0.0)
        dv = tl.dot(pt.to(do.dtype), do, acc=dv)
        dpt = tl.dot(v, tl.trans(do))
        dst = pt * (dpt - delta[None, :])
        dk = tl.dot(dst.to(q.dtype), q, acc=dk)
    return dk, dv


@triton.jit
def _query_block(Q, DO, LSE2, DELTA, head, start, cols, N, D: tl.constexpr, BLOCK_Q: tl.constexpr):
    """A query block of one head read through pointers: its positions, offsets, q, dO, the
    log2-domain lse and delta."""
    queries = start + tl.arange(0, BLOCK_Q)
    q_offsets = head * N * D + queries[:, None] * D + cols[None, :]
    q = tl.load(Q + q_offsets)
    do = tl.load(DO + q_offsets)
    lse2 = tl.load(LSE2 + head * N + queries)
    delta = tl.load(DELTA + head * N + queries)
    return queries, q_offsets, q, do, lse2, delta


@triton.jit
def _step(k, v, dk, dv, Q, DO, LSE2, DELTA, head, start, keys, cols, qk_scale, sm_scale, N,
          D: tl.constexpr, BLOCK_Q: tl.constexpr, NATURAL: tl.constexpr, FOLD: tl.constexpr,
          MASKED: tl.constexpr):
    """One query block's contribution, its q and dO read through pointers."""
    queries, q_offsets, q, do, lse2, delta = _query_block(Q, DO, LSE2, DELTA, head, start, cols, N,
                                                          D, BLOCK_Q)
    return _contribution(k, v, dk, dv, q, do, lse2, delta, queries, keys, qk_scale, sm_scale,
                         NATURAL, FOLD, MASKED)


@triton.jit
def _key_block(K, V, N, BLOCK_K: tl.constexpr, D: tl.constexpr):
    """The program's key block (block-major grid: key/value head on axis 0, block on axis 1):
    its keys, columns and offsets, its K and V rows, zeroed dK and dV accumulators, and the
    first query position that sees it and the first that sees all of it."""
    block = tl.program_id(1)
    kv_head = tl.program_id(0)
    keys = block * BLOCK_K + tl.arange(0, BLOCK_K)
    cols = tl.arange(0, D)
    kv_offsets = kv_head * N * D + keys[:, None] * D + cols[None, :]
    k = tl.load(K + kv_offsets)
    v = tl.load(V + kv_offsets)
    dk = tl.zeros([BLOCK_K, D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_K, D], dtype=tl.float32)
    first = block * BLOCK_K
    return kv_head, keys, cols, kv_offsets, k, v, dk, dv, first, first + BLOCK_K


@triton.jit
def dkdv_kernel(Q, K, V, DO, LSE2, DELTA, DK, DV, qk_scale, sm_scale, N, GROUP: tl.constexpr,
                BLOCK_K: tl.constexpr, BLOCK_Q: tl.constexpr, D: tl.constexpr, NATURAL: tl.constexpr,
                FOLD: tl.constexpr, SPLIT: tl.constexpr):
    kv_head, keys, cols, kv_offsets, k, v, dk, dv, first, full = _key_block(K, V, N, BLOCK_K, D)
    if SPLIT:
        # As lower-to-tile emits it: the diagonal (masked) blocks of every query head, then
        # the full blocks of every query head, each its own loop.
        for g in range(GROUP):
            head = kv_head * GROUP + g
            for start in range(first, full, BLOCK_Q):
                dk, dv = _step(k, v, dk, dv, Q, DO, LSE2, DELTA, head, start, keys, cols, qk_scale,
                               sm_scale, N, D, BLOCK_Q, NATURAL, FOLD, True)
        for g in range(GROUP):
            head = kv_head * GROUP + g
            for start in range(full, N, BLOCK_Q):
                dk, dv = _step(k, v, dk, dv, Q, DO, LSE2, DELTA, head, start, keys, cols, qk_scale,
                               sm_scale, N, D, BLOCK_Q, NATURAL, FOLD, False)
    else:
        # One loop per query head, the mask chosen per block at run time.
        for g in range(GROUP):
            head = kv_head * GROUP + g
            for start in range(first, N, BLOCK_Q):
                if start < full:
                    dk, dv = _step(k, v, dk, dv, Q, DO, LSE2, DELTA, head, start, keys, cols,
                                   qk_scale, sm_scale, N, D, BLOCK_Q, NATURAL, FOLD, True)
                else:
                    dk, dv = _step(k, v, dk, dv, Q, DO, LSE2, DELTA, head, start, keys, cols,
                                   qk_scale, sm_scale, N, D, BLOCK_Q, NATURAL, FOLD, False)
    tl.store(DK + kv_offsets, (dk * sm_scale).to(DK.dtype.element_ty))
    tl.store(DV + kv_offsets, dv.to(DV.dtype.element_ty))


@triton.jit
def _step_tma(k, v, dk, dv, q_desc, do_desc, LSE2, DELTA, head, start, keys, qk_scale, N,
              BLOCK_Q: tl.constexpr, MASKED: tl.constexpr):
    """One query block's contribution (transposed, folded scale), its q and dO read through
    tensor descriptors (TMA on Hopper: no per-element addresses in registers)."""
    queries = start + tl.arange(0, BLOCK_Q)
    q = q_desc.load([head * N + start, 0])
    do = do_desc.load([head * N + start, 0])
    lse2 = tl.load(LSE2 + head * N + queries)
    delta = tl.load(DELTA + head * N + queries)
    return _contribution(k, v, dk, dv, q, do, lse2, delta, queries, keys, qk_scale, 1.0,
                         False, True, MASKED)


@triton.jit
def dkdv_tma_kernel(q_desc, K, V, do_desc, LSE2, DELTA, DK, DV, qk_scale, sm_scale, N,
                    GROUP: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_Q: tl.constexpr,
                    D: tl.constexpr):
    """The split-loop transposed kernel with descriptor loads of the loop operands. q and dO
    are 2-D `[Hq * N, D]` views: the prototype needs N to be a multiple of BLOCK_Q."""
    kv_head, keys, cols, kv_offsets, k, v, dk, dv, first, full = _key_block(K, V, N, BLOCK_K, D)
    for g in range(GROUP):
        head = kv_head * GROUP + g
        for start in range(first, full, BLOCK_Q):
            dk, dv = _step_tma(k, v, dk, dv, q_desc, do_desc, LSE2, DELTA, head, start, keys,
                               qk_scale, N, BLOCK_Q, True)
    for g in range(GROUP):
        head = kv_head * GROUP + g
        for start in range(full, N, BLOCK_Q):
            dk, dv = _step_tma(k, v, dk, dv, q_desc, do_desc, LSE2, DELTA, head, start, keys,
                               qk_scale, N, BLOCK_Q, False)
    tl.store(DK + kv_offsets, (dk * sm_scale).to(DK.dtype.element_ty))
    tl.store(DV + kv_offsets, dv.to(DV.dtype.element_ty))


@triton.jit
def dkdv_atomic_dq_kernel(Q, K, V, DO, LSE2, DELTA, DK, DV, DQ, qk_scale, sm_scale, N,
                          GROUP: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_Q: tl.constexpr,
                          D: tl.constexpr):
    """The split-loop transposed kernel that also accumulates dQ (fp32, pre-zeroed) with
    atomic adds: FlashAttention-2's design, 5 products per block pair instead of the split's 7,
    and no separate dQ kernel. Not deterministic: the adds' order varies run to run."""
    kv_head, keys, cols, kv_offsets, k, v, dk, dv, first, full = _key_block(K, V, N, BLOCK_K, D)
    for g in range(GROUP):
        head = kv_head * GROUP + g
        for start in range(first, N, BLOCK_Q):
            queries, q_offsets, q, do, lse2, delta = _query_block(Q, DO, LSE2, DELTA, head, start,
                                                                  cols, N, D, BLOCK_Q)
            st = tl.dot(k, tl.trans(q))
            pt = tl.math.exp2(st * qk_scale - lse2[None, :])
            if start < full:
                pt = tl.where(keys[:, None] <= queries[None, :], pt, 0.0)
            dv = tl.dot(pt.to(do.dtype), do, acc=dv)
            dpt = tl.dot(v, tl.trans(do))
            dst = (pt * (dpt - delta[None, :])).to(q.dtype)
            dk = tl.dot(dst, q, acc=dk)
            dq = tl.dot(tl.trans(dst), k) * sm_scale
            tl.atomic_add(DQ + q_offsets, dq, sem="relaxed")
    tl.store(DK + kv_offsets, (dk * sm_scale).to(DK.dtype.element_ty))
    tl.store(DV + kv_offsets, dv.to(DV.dtype.element_ty))


CONFIGS = [(64, 32, 4, 3), (64, 64, 4, 2), (128, 32, 8, 3), (128, 64, 8, 2), (128, 32, 8, 2),
           (128, 64, 8, 3), (128, 32, 4, 3), (64, 32, 4, 2)]
VARIANTS = {
    "transposed": (False, True, False),
    "natural": (True, True, False),
}
"""name -> (NATURAL, FOLD, SPLIT), or None for the tensor-descriptor kernel."""
ABLATION = {
    "transposed": (False, True, False),
    "transposed-unfolded": (False, False, False),
    "transposed-split": (False, True, True),
    "transposed-unfolded-split": (False, False, True),
    "transposed-split-tma": None,
    "atomic-dq": "atomic",
}
"""The transposed kernel stepped towards the compiler's (scale not folded into the exponent,
separate diagonal and full loops), to find which difference costs time; the split kernel
with q and dO read through tensor descriptors (TMA), which hold no per-element addresses in
registers; and the atomic-dQ kernel, timed with its dQ zeroing and bf16 conversion and set
beside the compiler's dK/dV + dQ."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--ablation", action="store_true",
                        help="compare the transposed kernel's steps towards the compiler's instead")
    parser.add_argument("--configs", help="block_k,block_q,warps,stages;... (default: all)")
    args = parser.parse_args()
    variants = ABLATION if args.ablation else VARIANTS
    configs = CONFIGS if not args.configs else [
        tuple(int(x) for x in c.split(",")) for c in args.configs.split(";")]
    n, d, hq, hkv = args.seq_len, 128, 32, 8
    torch.manual_seed(0)
    q = torch.randn(1, hq, n, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, hkv, n, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, hkv, n, d, device="cuda", dtype=torch.bfloat16)
    grad_out = torch.randn_like(q)
    spec = af.attention(af.causal())
    flops = 4 * 2 * hq * n * n * d / 2
    sm_scale = d ** -0.5
    for bm, bn, warps, stages in configs:
        fn = af.compile(spec, config=af.TileConfig(128, 64, 8, 3, 64, 64, 4, 2, bm, bn, warps, stages))
        plan = fn.plan(q, k, v)
        out, lse = fn.forward(plan, {}, q, k, v)
        delta = (out.float() * grad_out.float()).sum(-1)
        tensors = {"q": q, "k": k, "v": v, "o": out, "lse": lse, "do": grad_out, "delta": delta,
                   "dq": torch.empty_like(q), "dk": torch.empty_like(k), "dv": torch.empty_like(v)}
        ours = next(launch for launch in plan.launches if launch.info.name == "attention_bwd_dkdv")
        line = [f"cfg=({bm},{bn},{warps},{stages})"]
        ours_dq = next(launch for launch in plan.launches if launch.info.name == "attention_bwd_dq")
        try:
            ours(tensors)
            ours_dq(tensors)
            ms = triton.testing.do_bench(lambda: ours(tensors), warmup=10, rep=50, return_mode="median")
            ms_dq = triton.testing.do_bench(lambda: ours_dq(tensors), warmup=10, rep=50, return_mode="median")
            compiled = ours.launch_jit(ours.arguments(tensors)[0], ours.shares_offsets(tensors))
            line.append(f"compiler {ms:.4f} ms {flops / ms / 1e9:.0f} TF/s {compiled.n_regs}r/{compiled.n_spills}s"
                        f" (+ dQ {ms_dq:.4f} = {ms + ms_dq:.4f})")
        except Exception as err:  # a configuration that does not fit
            line.append(f"compiler failed ({type(err).__name__})")
        lse2 = (lse * LOG2E).contiguous()
        for name, flags in variants.items():
            dk, dv = torch.empty_like(k), torch.empty_like(v)
            if flags == "atomic":
                dq32, dq = torch.empty(q.shape, device="cuda"), torch.empty_like(q)

                def run(dk=dk, dv=dv, dq32=dq32, dq=dq):
                    dq32.zero_()
                    compiled = dkdv_atomic_dq_kernel[(hkv, n // bm)](
                        q, k, v, grad_out, lse2, delta, dk, dv, dq32, sm_scale * LOG2E, sm_scale,
                        n, GROUP=hq // hkv, BLOCK_K=bm, BLOCK_Q=bn, D=d, num_warps=warps,
                        num_stages=stages)
                    dq.copy_(dq32)
                    return compiled
            elif flags is None:  # tensor descriptors for q and dO
                q_desc = TensorDescriptor.from_tensor(q.view(hq * n, d), [bn, d])
                do_desc = TensorDescriptor.from_tensor(grad_out.view(hq * n, d), [bn, d])

                def run(dk=dk, dv=dv, q_desc=q_desc, do_desc=do_desc):
                    return dkdv_tma_kernel[(hkv, n // bm)](
                        q_desc, k, v, do_desc, lse2, delta, dk, dv, sm_scale * LOG2E, sm_scale,
                        n, GROUP=hq // hkv, BLOCK_K=bm, BLOCK_Q=bn, D=d, num_warps=warps,
                        num_stages=stages)
            else:
                natural, fold, split = flags

                def run(natural=natural, fold=fold, split=split, dk=dk, dv=dv):
                    return dkdv_kernel[(hkv, n // bm)](
                        q, k, v, grad_out, lse2, delta, dk, dv, sm_scale * LOG2E, sm_scale, n,
                        GROUP=hq // hkv, BLOCK_K=bm, BLOCK_Q=bn, D=d, NATURAL=natural,
                        FOLD=fold, SPLIT=split, num_warps=warps, num_stages=stages)
            try:
                compiled = run()
                ms = triton.testing.do_bench(run, warmup=10, rep=50, return_mode="median")
                pairs = [(dk, tensors["dk"]), (dv, tensors["dv"])]
                if flags == "atomic":
                    pairs.append((dq, tensors["dq"]))
                err = max(((a.float() - b.float()).norm() / b.float().norm()).item()
                          for a, b in pairs)
                line.append(f"{name} {ms:.4f} ms {flops / ms / 1e9:.0f} TF/s "
                            f"{compiled.n_regs}r/{compiled.n_spills}s err {err:.1e}")
            except Exception as err:
                line.append(f"{name} failed ({type(err).__name__}: {str(err)[:80]})")
        print(" | ".join(line), flush=True)


if __name__ == "__main__":
    main()

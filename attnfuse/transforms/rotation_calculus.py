"""The Rotation Calculus: should a RoPE rotation run inside the fused kernel?

A rotation fused into the attention kernel costs arithmetic each time a program rotates a
block; a pre-rotation costs one extra pass over the operand through memory (read it, write the
rotated copy), the rotation itself once, and a launch. The query block is loaded once per
program, so a fused query rotation is done exactly once per element: it always beats a memory
pass. A key block is loaded, and so rotated, once per *query block* of every query head that
reads it. In FLOP-equivalents (bytes are converted at the GPU's `flops_per_byte`):

    fused   = ceil(Nq / block_m) * (B * Hq) * Nk * r/2 * ROTATE_FLOPS_PER_PAIR
    pre     = flops_per_byte * (2 * (B * Hkv) * Nk * D * elem_bytes + LAUNCH_SECONDS * bandwidth)
              + (B * Hkv) * Nk * r/2 * ROTATE_FLOPS_PER_PAIR
    fuse K  iff  fused <= pre

`flops_per_byte` is the GPU's CUDA-core (not tensor-core) arithmetic rate over its memory
bandwidth: the rotation runs on the CUDA cores and the special-function units. The constants
are estimates; the benchmarks (`attnfuse-bench --placement ...`) are where they are checked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ROTATE_FLOPS_PER_PAIR = 40.0
"""What rotating one pair in registers costs, in fp32 FLOP-equivalents: two table loads (cos,
sin; L2-resident), four multiplies, two adds, the conversions. Measured on the H200: fusing
the key rotation added 0.128 ms over pre-rotating it for causal B=4 H=12 N=4096 D=64 fp16,
i.e. 201M extra pair rotations at ~0.64 ns each, ~43 FLOP at 67 TFLOP/s
(bench/results/*-placement-*.md)."""

LAUNCH_SECONDS = 4e-6
"""What one extra kernel launch costs on the critical path."""


@dataclass(frozen=True)
class RotationProblem:
    """The shape facts the decision depends on."""

    batch_heads_q: int
    batch_heads_kv: int
    seq_len_q: int
    seq_len_k: int
    rotary_dim: int
    head_dim: int
    elem_bytes: int
    block_m: int


@dataclass(frozen=True)
class GpuRates:
    """What the decision needs to know about a GPU."""

    flops_per_byte: float
    """CUDA-core fp32 rate over memory bandwidth (H200: ~67 TFLOP/s over ~4.8 TB/s)."""
    bytes_per_second: float
    """Memory bandwidth achieved by a device-to-device copy (H200: ~4.3e12 measured here)."""


H200 = GpuRates(flops_per_byte=14.0, bytes_per_second=4.3e12)
"""Rates of the GPU the defaults were chosen on."""


QUERY_PRE_ROTATION_MIN_SEQ = 8192
"""From this query length on, the query is pre-rotated too (when the key is). Measured on the
H200 (causal B=4 H=12 D=64 fp16, bench/results/20261129T1051*-placement-*.md): rotating the
query in registers ties pre-rotation at N=4096 (0.369 vs 0.369 ms) but costs 4% at N=16384
(4.68 vs 4.50 ms), although it is done once per program: the slowdown is in the key loop
(the fused variant's generated code, not its arithmetic), which this model does not capture."""


def fuse_query_rotation(problem: RotationProblem, key_fused: bool) -> bool:
    """True when rotating Q inside the kernel is expected to pay (see
    `QUERY_PRE_ROTATION_MIN_SEQ`): always when K is rotated in the kernel anyway."""
    return key_fused or problem.seq_len_q < QUERY_PRE_ROTATION_MIN_SEQ


def fused_key_rotation_cost(problem: RotationProblem) -> float:
    """FLOPs spent rotating K inside the kernel: every query block rotates every key pair."""
    query_blocks = math.ceil(problem.seq_len_q / problem.block_m)
    pairs = problem.batch_heads_q * problem.seq_len_k * problem.rotary_dim / 2
    return query_blocks * pairs * ROTATE_FLOPS_PER_PAIR


def pre_rotation_cost(problem: RotationProblem, rates: GpuRates) -> float:
    """The same cost, in FLOP-equivalents, of rotating K once in its own pass: read and write
    every key element (the kernel then reads the rotated copy instead of the original), the
    rotation itself, and a launch."""
    elements = problem.batch_heads_kv * problem.seq_len_k * problem.head_dim
    traffic = 2 * elements * problem.elem_bytes
    launch = LAUNCH_SECONDS * rates.bytes_per_second
    rotate = problem.batch_heads_kv * problem.seq_len_k * problem.rotary_dim / 2
    return rates.flops_per_byte * (traffic + launch) + rotate * ROTATE_FLOPS_PER_PAIR


def fuse_key_rotation(problem: RotationProblem, rates: GpuRates = H200) -> bool:
    """True when rotating K inside the fused kernel is expected to be the faster placement."""
    return fused_key_rotation_cost(problem) <= pre_rotation_cost(problem, rates)

"""Per-device, per-shape choice of tile configuration and RoPE placement (the dispatcher)."""

from __future__ import annotations

import operator
import os
from dataclasses import dataclass, fields

import torch

from attnfuse.errors import ArgumentError
from attnfuse.runtime.inputs import Problem
from attnfuse.runtime.kv_cache import CacheLayout, decode_block_m
from attnfuse.transforms.place_rope import PlaceRopePass


@dataclass(frozen=True)
class TileConfig:
    """Tuning parameters of the kernels (attributes of `tile.kernel`).

    `block_m` / `block_n` are the rows a forward program owns and the key rows per loop step.
    The `bwd_*` fields tune the backward kernels (rows a dQ or dK/dV program owns, rows per
    loop step, warps, stages); None takes the forward's value. The `dkdv_*` fields override
    them for the dK/dV kernel alone."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    bwd_block_m: int | None = None
    bwd_block_n: int | None = None
    bwd_num_warps: int | None = None
    bwd_num_stages: int | None = None
    dkdv_block_m: int | None = None
    dkdv_block_n: int | None = None
    dkdv_num_warps: int | None = None
    dkdv_num_stages: int | None = None
    merge_stages: int = 1
    """The software-pipelining depth of the split decode's merge kernel's loop over the
    splits (lower-to-tile's `merge-stages`; 1, not pipelined)."""
    page_lookahead: int = 1
    """A paged cache's key loops read the block-table entries of the step this many steps
    ahead (lower-to-tile's `page-lookahead`): 1, the next step's during a step, so the K/V
    loads software-pipeline as deep as a contiguous cache's; 0, each step its own (then
    Triton's pipeliner spends a stage on the table load and K/V get one fewer)."""
    hoist_page_rows: int = 1
    """A paged cache's key loops compute each key's row in its page once, before the loop,
    where a step's keys start pages or lie in one (lower-to-tile's `hoist-page-rows`): 1, so
    a step spends no division or remainder per key, and a step inside one page adds one page
    offset to loop-invariant row offsets; 0, every step derives each key's page index and row
    from its position (the earlier form; `ATTNFUSE_HOIST_PAGE_ROWS=0` selects it for the
    decode configurations, to compare the two)."""

    def __post_init__(self) -> None:
        # Checked when made, so that a mistake is named here and not by a pass option, a
        # JSON encoder or a block list's division later. Integers of other libraries (numpy
        # sweeps) are taken as the ints they stand for.
        for spec in fields(self):
            value = getattr(self, spec.name)
            optional = spec.default is None
            if value is None and optional:
                continue
            kind = "a positive integer or None" if optional else "an integer"
            if isinstance(value, bool) or getattr(value, "dtype", None) in (torch.bool, bool):
                raise ArgumentError(f"TileConfig.{spec.name} must be {kind}, got {value!r}")
            try:
                value = operator.index(value)  # an int, or an integer of numpy or torch
            except TypeError:
                raise ArgumentError(f"TileConfig.{spec.name} must be {kind}, got {value!r}") from None
            object.__setattr__(self, spec.name, value)
            if spec.name in ("page_lookahead", "hoist_page_rows"):
                if value not in (0, 1):
                    raise ArgumentError(f"TileConfig.{spec.name} must be 0 or 1, got {value}")
            elif value < 1:
                raise ArgumentError(f"TileConfig.{spec.name} must be positive"
                                    f"{' (None: as the forward or backward)' if optional else ''}, got {value}")

    def dkdv(self) -> tuple[int, int, int, int]:
        """The dK/dV kernel's (block_m, block_n, num_warps, num_stages): its programs own
        `block_m` keys and step over `block_n` queries; None takes the `bwd_*` value."""
        bm, bn, warps, stages = self.backward()
        return (
            bm if self.dkdv_block_m is None else self.dkdv_block_m,
            bn if self.dkdv_block_n is None else self.dkdv_block_n,
            warps if self.dkdv_num_warps is None else self.dkdv_num_warps,
            stages if self.dkdv_num_stages is None else self.dkdv_num_stages,
        )

    def backward(self) -> tuple[int, int, int, int]:
        """The backward kernels' (block_m, block_n, num_warps, num_stages)."""
        return (
            self.block_m if self.bwd_block_m is None else self.bwd_block_m,
            self.block_n if self.bwd_block_n is None else self.bwd_block_n,
            self.num_warps if self.bwd_num_warps is None else self.bwd_num_warps,
            self.num_stages if self.bwd_num_stages is None else self.bwd_num_stages,
        )


FORWARD_HOPPER = (64, 64, 4, 3)
"""Forward (block_m, block_n, num_warps, num_stages) on Hopper, fp16/bf16, from
bench/forward_kernels.py (bench/results/20261129T1710Z-forward_kernels.log). D=128 (Llama-3-8B geometry, causal and
RoPE + causal): the best or within 1.5% of the best at N=2048-8192, and 3% slower per kernel
(1% per call) than (128, 128, 8, 3) at N=16384; 6-16% less time than the previous
(128, 64, 8, 3) below N=8192. D=64 (paper shape) up to N=4096: within 2.5% of the best for
causal, the best by 20% for RoPE + causal; 4-9% less time than the previous (128, 64, 4, 3).
Logs: bench/results/20261129T1710Z-forward_kernels.log (head-major grid),
20261129T1705Z-forward_kernels-lpt.log and 20261129T1715Z-forward_kernels-long.log
(block-major grid)."""

FORWARD_HOPPER_D64_LONG = (128, 64, 8, 3)
"""The D=64 forward from FORWARD_HOPPER_D64_LONG_FROM query rows on. At N=16384 (paper
shape) 64-row kernels took 14% longer for causal (4.91 against 4.31 ms) and 9% for RoPE +
causal (4.71 against 4.31). At N=4096 the 64-row ones stay: within 2.5% for causal, and
RoPE + causal takes 23-25% longer with 128 rows and 8 warps."""

FORWARD_HOPPER_D64_LONG_FROM = 8192
"""First query length on the 128-row D=64 forward: 64 rows were measured better at 4096
and worse at 8192 and 16384. At N=8192 (paper shape) the 128-row kernel took 1.0356 ms
against 1.1710 (causal) and 1.0460 against 1.1710 (RoPE + causal); whole calls 1.0278
against 1.0794 and 1.0635 against 1.1116 (bench/results/20261129T1904Z-forward_kernels-
d64-8192.log). Between 4096 and 8192 the crossover is not measured.

A band mask (a sliding window) that keeps fewer keys per row counts as that many rows: with
a 1024- or 4096-key causal window at N=8192 and 16384, 64-row programs took 9-35% less time
than 128-row ones (bench/results/20261129T2250Z-window-configs.log), because a program's
rows then span the window, not the sequence. Windows between 4097 and 8191 keys, and windows
without causal (2 * window - 1 keys per row), follow the same rule unmeasured."""

FORWARD_HOPPER_D128_BIAS = (128, 64, 8, 3)
"""The D=128 forward of a spec with `additive_bias`: 128-row programs with two warpgroups.
The bias is a second stream as large as the scores, and with 8 warps per program more of it
is in flight. For a [1, Hq, N, N] bf16 bias at Llama-3-8B's geometry, causal, the call took
22-27% less time than with FORWARD_HOPPER: 0.3760 / 0.3960 against 0.5143 / 0.5099 ms at
N=4096 (two runs), 0.1148 against 0.1526 at N=2048 (bench/results/20261129T2308Z-bias-
configs.log). A broadcast [B, 1, 1, N] bias gained as much (0.4786 against 0.6052 ms at
N=4096; 20261129T2311Z-bias-configs.log). At D=64 (paper shape) the reverse holds: 64-row
programs are faster with a bias, at N=8192 too, where plain attention switches to 128 rows
(FORWARD_HOPPER_D64_LONG): 1.5313 against 1.8782 ms for a full bias, 1.7051 against 1.8490
for a broadcast one. So at D=64 a bias keeps FORWARD_HOPPER at every length."""

FORWARD_HOPPER_D128_BIAS_FROM = 2048
"""First query length on FORWARD_HOPPER_D128_BIAS: the shortest measured."""

LISTED_GLUON_FORWARD = (128, 128, 8, 2)
"""The forward tiles of a block-sparse call on Hopper's Gluon target
(`gluon_forward.takes_listed_gluon`): two consumer warpgroups of 64 rows and 128-key blocks,
what the dense Gluon forward runs at head dim 128; its block lists are built for them."""

BACKWARD_HOPPER_D64 = (64, 32, 4, 3, 64, 64, 4, 3)
BACKWARD_HOPPER_D128 = (64, 64, 4, 2, 64, 32, 4, 3)
"""Backward (block_m, block_n, num_warps, num_stages) on Hopper, fp16/bf16: for dQ (and the
preprocess), then for dK/dV. Each is the per-kernel optimum of bench/backward_kernels.py for
RoPE + causal at N=4096, Hq=32, Hkv=8 (D=128: bench/results/20261129T1255Z-backward_kernels.log
and 20261129T1500Z-backward_kernels-d128.log; D=64: 20261129T1521Z-backward_kernels-d64.log,
where they beat the previous untuned (128, 64, 8, 3) by 13% for dQ and 19% for dK/dV)."""


LISTED_FORWARD_HOPPER_D64 = (64, 64, 4, 2)
"""The portable forward of a block-sparse call (`block_sparse`: its programs walk block
lists) at head dim <= 64 on Hopper, fp16/bf16. Its programs are short at low density: two
pipeline stages beat three, and 64-row tiles beat 128-row ones. On an H100 (B=4, H=12,
N=4096, D=64, layouts of 128-key blocks, block-major grid; `python3
bench/block_sparse_tiles.py`): at 10% density 0.0866 / 0.0926 / 0.0926 ms against 0.1004 /
0.1047 for three stages and 0.0969 / 0.1027 for (128, 64, 8, 2)
(bench/results/20261204T203119Z-, 20261205T142622Z-, 20261205T161325Z-block-sparse-tiles.md);
on the head-major grid (`tile.kernel`'s `head_major`) 0.0832 ms, 0.189 of the dense call
(20261205T164348Z-block-sparse-grid-probe.md; the dense call 0.4392 ms in
20261205T165414Z-block-sparse.md). Measured at N=4096 only."""


def choose_tile_config(
    problem: Problem,
    capability: tuple[int, int] | None = None,
    keys_per_row: int | None = None,
    reads_bias: bool = False,
    block_sparse: bool = False,
) -> TileConfig:
    """Block sizes, warps and stages for a problem on its device, or, given a CUDA compute
    `capability`, on a GPU of that capability (what tools that compile for a GPU on a
    machine without one ask, bench/kernel_resources.py). `keys_per_row`: the most keys a
    query row keeps when a band mask bounds it (a sliding window), None when unbounded.
    `reads_bias`: the kernels read an additive bias (`additive_bias`). `block_sparse`: the
    forward walks a block-sparse layout's lists (`LISTED_FORWARD_HOPPER_D64`)."""
    if capability is None and problem.device.type != "cuda":
        # The interpreter runs each program in numpy: small blocks keep edge cases
        # (ragged blocks, diagonal blocks) exercised at test sizes.
        return TileConfig(32, 32, 4, 1, 32, 16, 4, 1, 16, 32, 4, 1)
    major, _ = capability or torch.cuda.get_device_capability(problem.device)
    d = max(problem.head_dim, problem.head_dim_v)
    big_elem = problem.dtype == torch.float32
    if major >= 9:  # Hopper
        # Programs own 64 rows (queries; keys for dK/dV) and step over 32-64 with one
        # warpgroup: in the backward this keeps the dK, dV (or dQ) accumulators and the
        # loop's operands within the register file; in the forward it measured faster than
        # 128-row programs with two warpgroups (FORWARD_HOPPER), except for D=64 at long
        # sequences (FORWARD_HOPPER_D64_LONG).
        if d <= 64:
            row_length = problem.seq_q if keys_per_row is None else min(problem.seq_q, keys_per_row)
            # A bias keeps 64-row programs at every length (FORWARD_HOPPER_D128_BIAS).
            long_sequence = row_length >= FORWARD_HOPPER_D64_LONG_FROM and not reads_bias
            forward = FORWARD_HOPPER_D64_LONG if long_sequence else FORWARD_HOPPER
            if block_sparse:
                forward = LISTED_FORWARD_HOPPER_D64
            return (TileConfig(*forward, *BACKWARD_HOPPER_D64) if not big_elem
                    else TileConfig(64, 32, 4, 2, 64, 32, 4, 2))
        if d <= 128:
            # Measured for D=128 from 2048 query rows; short or odd-sized problems keep the
            # default rather than pad 128-row programs.
            bias_stream = reads_bias and d == 128 and problem.seq_q >= FORWARD_HOPPER_D128_BIAS_FROM
            forward = FORWARD_HOPPER_D128_BIAS if bias_stream else FORWARD_HOPPER
            return (TileConfig(*forward, *BACKWARD_HOPPER_D128) if not big_elem
                    else TileConfig(64, 32, 4, 2, 64, 32, 4, 2))
        return TileConfig(64, 32, 4, 2, 64, 32, 4, 1)
    if d <= 64:
        return TileConfig(64, 64, 4, 3, 64, 32, 4, 2) if not big_elem else TileConfig(64, 32, 4, 2, 32, 32, 4, 2)
    if d <= 128:
        return TileConfig(64, 64, 4, 2, 64, 32, 4, 2) if not big_elem else TileConfig(32, 32, 4, 2, 32, 32, 4, 1)
    return TileConfig(32, 32, 4, 2, 32, 32, 4, 1)


def decode_tile_config(problem: Problem, paged: bool = False) -> TileConfig:
    """The split-KV decode kernel's configuration: programs own the (query head, query)
    rows of one key/value head (`kv_cache.decode_block_m`) and stream its keys, on a GPU:

    - in blocks of 64 keys, pipelined three deep (128 from DECODE_LONG_CACHE keys): at D=128
      on the H200 the best, or within 3% of it, of block_n 32/64/128 x 2-4 stages x 2/4/8
      warps at every contiguous cache of bench/decode_tune.py, except the 32k one, where
      128-key blocks took 6% less time (42.4 against 45.2 µs)
      (bench/results/20261201T1300Z-decode_tune.md);
    - a paged cache the same: its steps read their page ids a step ahead (`page_lookahead`
      1), so its K/V loads pipeline as a contiguous cache's do (compiled for sm_90 by Triton
      3.6, the H200's, and 3.9, both get the same K/V buffers at every stage count). Read in
      their own step, the ids cost a pipeline stage: 128 keys two deep was then the best
      paged configuration, 15-30% faster than 64/3, and still 1.10-1.17x the contiguous
      cache at B=1
      (bench/results/20261201T1316Z-decode_tune-paged.md). The same configuration for both
      is not measured yet (bench/decode_tune.py --paged 16,64 sweeps it).

    Past a head dim of 128, blocks of 32 keys, two deep (not measured). On the
    interpreter, 32-key blocks: pages of 16 then take the per-key table path and pages of 32
    or more the per-step one, both exercised at test sizes (`kv_cache.split_plan` makes two
    splits there from two key blocks on, so short caches still merge splits)."""
    del paged  # the same configuration (see above); kept for callers that tune paged calls apart
    block_m = decode_block_m(problem)
    hoist = hoist_page_rows()
    if problem.device.type != "cuda":
        # The pipelined merge's code path.
        return TileConfig(block_m, 32, 4, 1, merge_stages=2, hoist_page_rows=hoist)
    d = max(problem.head_dim, problem.head_dim_v)
    if d > 128:
        return TileConfig(block_m, 32, 4, 2, merge_stages=DECODE_MERGE_STAGES, hoist_page_rows=hoist)
    if problem.seq_k >= DECODE_LONG_CACHE:
        return TileConfig(block_m, 128, 4, 3, merge_stages=DECODE_MERGE_STAGES, hoist_page_rows=hoist)
    return TileConfig(block_m, 64, 4, 3, merge_stages=DECODE_MERGE_STAGES, hoist_page_rows=hoist)


HOIST_PAGE_ROWS_ENV = "ATTNFUSE_HOIST_PAGE_ROWS"
"""The environment variable that, set to 0 when a call's plan is made, gives the decode
configurations `hoist_page_rows=0` (the earlier paged addressing), so one process can time
both forms (bench/decode.py's `attnfuse-paged<P>-unhoisted` rows)."""


def hoist_page_rows() -> int:
    """`TileConfig.hoist_page_rows` for the decode configurations: 1 unless
    `ATTNFUSE_HOIST_PAGE_ROWS` is "0" (then 0); any other value is an `ArgumentError`."""
    value = os.environ.get(HOIST_PAGE_ROWS_ENV, "1")
    if value not in ("0", "1"):
        raise ArgumentError(f"{HOIST_PAGE_ROWS_ENV} must be 0 or 1, got {value!r}")
    return int(value)


DECODE_PDL_ENV = "ATTNFUSE_DECODE_PDL"
"""The environment variable that, set to 0 when a call's plan is made, launches a split
decode's merge after the split kernel as an ordinary launch instead of as its programmatic
dependent (lower-to-tile `decode-pdl=0`), so one process can time both (bench/decode.py
`--pdl-forms on,off`)."""


def decode_pdl_requested() -> bool:
    """Whether `ATTNFUSE_DECODE_PDL` leaves programmatic dependent launch on: True unless it
    is "0"; any value other than "0" or "1" is an `ArgumentError`."""
    value = os.environ.get(DECODE_PDL_ENV, "1")
    if value not in ("0", "1"):
        raise ArgumentError(f"{DECODE_PDL_ENV} must be 0 or 1, got {value!r}")
    return value == "1"


def takes_decode_pdl(problem: Problem, interpreted: bool) -> bool:
    """Whether a split decode's kernels are compiled with programmatic dependent launch
    (`CompileKey.decode_pdl`): unless `ATTNFUSE_DECODE_PDL=0`, on a CUDA GPU of compute
    capability 9.0 or more (PDL and its `griddepcontrol` instructions are Hopper's; ROCm has
    neither, and its MI200 reports 9.0 too), and on the CPU interpreter (`interpreted`),
    whose printed kernels leave the PDL calls out (`KernelEmitter.pdl`), so its compile key
    is the GPU's. The variable is read, and checked, for every decode plan."""
    if not decode_pdl_requested():
        return False
    if interpreted:
        return True
    if problem.device.type != "cuda" or not torch.cuda.is_available() or torch.version.hip is not None:
        return False
    return torch.cuda.get_device_capability(problem.device) >= (9, 0)


DECODE_MERGE_STAGES = 1
"""The split merge's loop over its steps, unpipelined. A step holds all of a decode's splits
(up to 64 at head dim 128, `lowering/triton/splits.py`'s `splits_per_step`), so the loop runs once
and a pipeline only routes the loads through shared memory: on the H200 the merge kernel took
2.14 / 2.18 / 2.40 / 2.98 µs unpipelined against 3.23 / 3.23 / 3.30 / 5.22 three deep at the
4k / 16k / 32k / B=8 x 8k caches (one split per step, three deep, it took 4.4 µs at 16k:
bench/results/20261201T194551Z-decode_profile.md, 20261201T191104Z-decode_profile.md)."""


DECODE_LONG_CACHE = 32768
"""The cache length from which contiguous decoding steps over 128-key blocks (measured
better at 32768, equal at 16384, worse at B=8 x 8192: decode_tile_config)."""


PLACEMENT_ALIASES = {
    "fused": ("fused", "fused"),
    "pre_rotated": ("pre_rotated", "pre_rotated"),
    "q_fused": ("fused", "pre_rotated"),
    "auto": ("auto", "auto"),
}

QUERY_PLACEMENTS = ("auto", "fused", "pre_rotated")
"""What the query of a (query, key) `rope_placement=` pair takes."""

KEY_PLACEMENTS = (*QUERY_PLACEMENTS, "given")
"""What the key of a pair takes: also "given", keys the caller passes rotated (a KV cache)."""

KEY_POSITIONS_WITH_GIVEN_KEY = (
    "k_positions= has no effect with a given key rotation (rope_placement=(..., 'given')): "
    "the keys arrive rotated; rotate them where they are written, with "
    "fn.rotate_keys(k, k_positions=...)"
)
"""The error for key positions passed to a call whose keys arrive rotated."""


def check_placement_request(requested: object) -> tuple[str, str]:
    """The (query, key) placements a `rope_placement=` argument asks for, checked."""
    if isinstance(requested, str) and requested in PLACEMENT_ALIASES:
        return PLACEMENT_ALIASES[requested]
    if isinstance(requested, tuple) and len(requested) == 2:
        query, key = requested
        if query == "given":
            raise ArgumentError(
                "rope_placement query cannot be 'given': only keys arrive rotated (a KV cache "
                "stores them so); the query is rotated by the kernels, give auto, fused or "
                "pre_rotated"
            )
        for which, choice, choices in (("query", query, QUERY_PLACEMENTS),
                                       ("key", key, KEY_PLACEMENTS)):
            if choice not in choices:
                raise ArgumentError(
                    f"rope_placement {which} must be {', '.join(choices[:-1])} or "
                    f"{choices[-1]}, got {choice!r}"
                )
        return requested
    raise ArgumentError(
        f"rope_placement must be one of {', '.join(PLACEMENT_ALIASES)} or a (query, key) "
        f"pair, got {requested!r}"
    )


def automatic_placement(requested: str | tuple[str, str]) -> bool:
    """Whether a `rope_placement=` request leaves every performance choice to AttnFuse: the
    query placement is "auto", and the key's "auto" or "given" (which is no choice: it says
    what the key input is). The backward then pre-rotates (`CompiledAttention.compile_key`)."""
    query, key = check_placement_request(requested)
    return query == "auto" and key in ("auto", "given")


def cache_placement_request(
    requested: tuple[str, str], decode: bool, cache: CacheLayout | None
) -> tuple[str, str]:
    """The (query, key) request for a decode or cache call, narrowed to what its kernels can
    run: a query with per-sequence lengths sits at its sequence's positions, which only the
    attention kernels know (they read `kv_lens`), so it rotates in-kernel; a decode step reads
    each key once (pre-rotating would rewrite the cache every step) and a page pool's rows are
    not positions, so the key rotates in-kernel too. "auto" becomes "fused" there; an explicit
    request that cannot hold is an `ArgumentError`."""
    query, key = requested
    kv_lens = cache is not None and cache.kv_lens
    paged = cache is not None and cache.page_size > 0
    if kv_lens and query != "fused":
        if query == "pre_rotated":
            raise ArgumentError(
                "rope_placement query 'pre_rotated' cannot take kv_lens=: the rotation "
                "kernel does not know each sequence's positions; use 'fused' or 'auto'"
            )
        query = "fused"
    if paged and key == "pre_rotated":
        raise ArgumentError(
            "rope_placement key 'pre_rotated' cannot take a paged cache (block_table=): "
            "a page pool's rows are not positions; use 'fused', 'given' or 'auto'"
        )
    if (decode or paged) and key == "auto":
        key = "fused"
    return query, key


def rope_placement(
    has_rope: bool, rotary_dim: int | None, problem: Problem, config: TileConfig,
    requested: str | tuple[str, str], decode: bool = False, cache: CacheLayout | None = None,
) -> tuple[str, str] | None:
    """The (query, key) placement of a variant's rotation (of explicit width `rotary_dim`, or
    the head dim) for this call, or None without rope (`has_rope` false).

    `requested` is "auto" (the Rotation Calculus decides), "fused", "pre_rotated",
    "q_fused" (query in-kernel, key pre-rotated) or a (query, key) pair, whose key may be
    "given" (the caller passes keys rotated; the query is then placed as asked). A split
    decode (`decode`) and a KV-cache layout (`cache`) narrow what the calculus may choose
    (`cache_placement_request`).
    """
    if not has_rope:
        return None
    query, key = cache_placement_request(check_placement_request(requested), decode, cache)
    elem_bytes = torch.tensor([], dtype=problem.dtype).element_size()
    decision = PlaceRopePass(
        query=query,
        key=key,
        batch_heads=problem.batch * problem.heads_q,
        kv_heads_ratio=problem.group_size,
        seq_len_q=problem.seq_q,
        seq_len_k=problem.seq_k,
        head_dim=problem.head_dim,
        rotary_dim=rotary_dim or problem.head_dim,
        block_m=config.block_m,
        elem_bytes=elem_bytes,
    )
    return decision.decide()

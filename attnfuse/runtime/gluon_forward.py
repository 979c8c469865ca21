"""Which forward a Hopper GPU runs: the Gluon target's warp-specialized kernel
(`lowering/gluon.py`) where it lowers the variant and measured faster, else the portable one.

The choice is per plan (shape) and, for what depends on the tensors themselves (strides,
alignment), per call: a call whose tensors a TMA descriptor cannot cover runs the portable
kernel of the same plan. `ATTNFUSE_FORWARD_TARGET` forces it: `triton` (never Gluon), `gluon`
(Gluon wherever it lowers and the shapes fit, whatever the measurements say), `auto` (the
default: `prefers_gluon` by size, `AUTO_VARIANT_CLASSES` by variant class). The schedule's options come per head dim from `SCHEDULES`;
`ATTNFUSE_GLUON_CONSUMERS` forces the consumer count and `ATTNFUSE_GLUON_PERSISTENT` the
persistent grid (to measure one against another).
Both are read when a plan is made: a compiled function keeps the plans it has made.
"""

from __future__ import annotations

import hashlib
import re
import os
from dataclasses import dataclass
from functools import cache, cached_property
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from xdsl.dialects.builtin import ModuleOp
from xdsl.utils.exceptions import VerifyException

from attnfuse.dialects import make_context, tile
from attnfuse.dialects.flash_shape import HEAD_DIMS, NotFlashShaped, flash_kernel
from attnfuse.errors import ArgumentError
from attnfuse.runtime import cache as kernel_cache
from attnfuse.runtime.config import LISTED_GLUON_FORWARD
from attnfuse.runtime.inputs import Problem
from attnfuse.runtime.interpreter import runs_interpreted
from attnfuse.runtime.gluon_launch import GluonRunner, call_key, pointer_arguments, specialization_of
from attnfuse.runtime.launch import KernelLaunch, check_row_blocks

if TYPE_CHECKING:
    from attnfuse.lowering.gluon import GluonKernel
    from attnfuse.runtime.program import Canonical

TARGETS = ("auto", "gluon", "triton")

GLUON_MIN_WORK = {128: 8 * 1024 * 1024, 64: 16 * 1024 * 1024, 256: 8 * 1024 * 1024}
"""`auto` takes the Gluon forward at a head dim of this table from this many (query, key)
pairs per head (half of Nq x Nk under a causal band). On the H200 (Triton 3.6,
bench/results/20261201T200916Z-gluon-forward.md, ms):

- head dim 128 (Llama-3-8B heads, bf16), from causal 4096: two consumers took 0.234 / 0.859
  causal at 4096 / 8192 against the portable kernel's 0.288 / 1.214 and cuDNN's 0.258 / 0.896,
  0.427 / 1.789 dense against 0.540 / 2.396 (cuDNN 0.414 / 1.744);
- head dim 64 (B=4 H=12, fp16), from 16M pairs (causal 5793 or dense 4096; measured at causal 8192 and dense 4096): three consumers took 0.878 /
  3.783 causal at 8192 / 16384 against the portable 0.928 / 4.281 and cuDNN's 0.917 / 3.827,
  0.427 dense at 4096 against 0.510 (cuDNN 0.435); at causal 4096 (8M pairs) 0.261 against
  the portable 0.252, so the portable kernel keeps it;
- head dim 256 (B=2, 16 heads, bf16; bench/results/20261203T132416Z-gluon-forward.md), from
  causal 4096: 0.435 / 1.794 causal at 4096 / 8192 against the portable 0.724 / 3.315 (cuDNN
  0.452 / 1.615), 0.821 / 3.658 dense against 1.362 / 6.374 (cuDNN 0.747 / 3.309).

Smaller calls are not measured (but see `SOFTMAX_MIN_WORK`); other head dims never take Gluon
under `auto`."""

SOFTMAX_MIN_WORK = {**GLUON_MIN_WORK, 128: 2 * 1024 * 1024}
"""`GLUON_MIN_WORK` for a plain softmax variant (`variant_classes` is `("softmax",)`: causal,
dense, RoPE, ALiBi, windows, soft-capping), measured further down at head dim 128: on an H100
(Triton 3.6, bench/results/20261205T214742Z- and 20261205T214800Z-llama3-8b-custom-fwd.md,
`ATTNFUSE_FORWARD_TARGET=gluon|triton python3 -m attnfuse.tools.bench --preset llama3-8b
--dtype bf16 --mode fwd --variants causal,rope_causal --seq-lens 1024,2048,3072,4093`; the
whole sweep is `bash bench/gpu_session.sh gluon-sizes`), ms,
Gluon / portable: causal 0.0280 / 0.0315, 0.0727 / 0.0876, 0.1400 / 0.1740, 0.2294 / 0.3238 at
N = 1024 / 2048 / 3072 / 4093; RoPE + causal (pre-rotated for Gluon, fused for the portable
kernel) 0.0414 / 0.0408, 0.0936 / 0.1048, 0.1694 / 0.2007, 0.2664 / 0.3315. From causal 2048
(2M pairs) the Gluon kernel is 11-29% faster; at 1024 it is level with RoPE, so the rule stops
there. Only causal and RoPE + causal were timed below 4096; the rest of the class
(dense, ALiBi, soft-capping, windows: the same kernel with other score ops, each measured
faster than the portable one from 4096) takes the same sizes. The other classes keep
`GLUON_MIN_WORK`: measured from 4096 only."""


@dataclass(frozen=True)
class GluonSchedule:
    """The options `warp-specialize` gets for one head dim (`SCHEDULES`)."""

    consumers: int
    """Consumer warpgroups of 64 query rows each."""
    block_n: dict[int, int]
    """Keys per step by consumer count: the counts it has are those `ATTNFUSE_GLUON_CONSUMERS`
    may force."""
    heavy_step_consumers: int
    """The consumer count of a kernel with ALiBi or an additive bias (its score step needs more
    registers: three consumers' 160 spill 176-360 bytes with a bias at head dim 64, none with two)."""
    persistent: bool = False
    """One program per SM walking the tiles (`lowering/gluon_persistent.py`), for kernels whose
    tiles differ in work (a causal band or window trims their key loops)."""
    persistent_uniform: bool = False
    """The same for kernels whose tiles all do the same work (`uniform_tiles`: dense)."""

    def options(self, consumers: int, persistent: bool | None = None,
                uniform: bool = False) -> dict[str, int | bool]:
        if persistent is None:
            persistent = self.persistent_uniform if uniform else self.persistent
        return {"consumers": consumers, "block_n": self.block_n[consumers], "persistent": persistent}


SCHEDULES = {
    128: GluonSchedule(2, {1: 128, 2: 128, 3: 64}, heavy_step_consumers=2, persistent_uniform=True),
    64: GluonSchedule(3, {1: 128, 2: 128, 3: 128}, heavy_step_consumers=2),
    256: GluonSchedule(2, {1: 64, 2: 64}, heavy_step_consumers=2),
}
"""The Gluon forward's schedule per head dim, as measured on the H200 (Triton 3.6,
bench/results/20261201T200916Z-gluon-forward.md; `GLUON_MIN_WORK` has the times against the
portable kernel and cuDNN):

- head dim 128: two consumers of 128-key blocks. Three (64-key blocks: with 128 their 160
  registers spill 208-264 bytes) took 0.260 / 0.924 ms causal at 4096 / 8192 against two's
  0.234 / 0.858, and 0.491 / 1.875 dense against 0.430 / 1.748;
- head dim 64: three consumers (FA3's shape, 192 query rows a program) of 128-key blocks:
  0.262 / 0.905 / 3.773 ms causal at 4096 / 8192 / 16384 against two's 0.273 / 1.022 / 4.242,
  0.428 dense at 4096 against 0.484. The printed kernel compiles for sm_90 without spills
  (test/python/lowering/test_gluon_target.py);
- a kernel with ALiBi keeps two consumers: with three, its step spills (48 bytes causal, 88
  with a window, 192 with soft-capping too; Triton 3.6), where plain, windowed, soft-capped and
  statically scaled kernels spill none (the ALiBi kernels' speed is not measured);
- head dim 256: two consumers of 64-key blocks (192 KB of shared memory; 128-key blocks
  would need 320 KB), compiled for sm_90 without spills (Triton 3.6,
  test/python/lowering/test_gluon_target.py; with 3.9.0 a forced bias variant spills 48-184
  bytes, and `auto` never takes bias); not persistent: its own output buffer would
  take it to 256 KB (one consumer's fits, 192 KB). Three consumers are refused: their 160 registers a thread cannot hold a
  64 x 256 fp32 accumulator beside the scores (ptxas: "Insufficient registers", Triton 3.6 on
  the H200). 1.65-1.85x the portable kernel's speed (`GLUON_MIN_WORK`);
- the persistent grid (`ATTNFUSE_GLUON_PERSISTENT=1`) against one program per tile, in
  interleaved rounds (bench/gluon_persistent_ab.py, bench/results/20261203T131515Z-gluon-
  persistent-ab.md; median of the per-round ratios, persistent / plain): dense 0.966 / 0.986 at
  N=4096 / 8192 and causal 1.044 / 1.031 at head dim 128; dense 1.071 / 1.071 and causal
  1.113 / 1.145 at head dim 64. So it is taken for kernels of uniform tiles (`uniform_tiles`)
  at head dim 128 only."""

CONSUMER_COUNTS = (1, 2, 3)


def forced_consumers() -> int | None:
    """`ATTNFUSE_GLUON_CONSUMERS` (one of `CONSUMER_COUNTS`, checked), or None when unset."""
    forced = os.environ.get("ATTNFUSE_GLUON_CONSUMERS", "")
    if not forced:
        return None
    if forced not in {str(c) for c in CONSUMER_COUNTS}:
        raise ArgumentError(f"ATTNFUSE_GLUON_CONSUMERS={forced!r}: expected one of "
                            f"{', '.join(map(str, CONSUMER_COUNTS))} (or unset: by head dim)")
    return int(forced)


def gluon_consumers(head_dim: int, heavy_step: bool = False) -> int:
    """The consumer count of the Gluon forward at `head_dim` (of a kernel with ALiBi or a
    bias if `heavy_step`): `ATTNFUSE_GLUON_CONSUMERS` if set (checked, also against the counts the head
    dim's schedule takes), else `SCHEDULES`'."""
    forced = forced_consumers()
    schedule = SCHEDULES[head_dim]
    if forced is None:
        return schedule.heavy_step_consumers if heavy_step else schedule.consumers
    if forced not in schedule.block_n:
        raise ArgumentError(f"ATTNFUSE_GLUON_CONSUMERS={forced}: the Gluon forward at head dim {head_dim} "
                            f"takes {', '.join(map(str, schedule.block_n))} consumer warpgroups "
                            "(more do not fit the output accumulator in registers)")
    return forced


def gluon_persistent() -> bool | None:
    """`ATTNFUSE_GLUON_PERSISTENT` (`0` or `1`, checked), or None when unset (`SCHEDULES`')."""
    forced = os.environ.get("ATTNFUSE_GLUON_PERSISTENT", "")
    if not forced:
        return None
    if forced not in ("0", "1"):
        raise ArgumentError(f"ATTNFUSE_GLUON_PERSISTENT={forced!r}: expected 0 or 1 (or unset: by head dim)")
    return forced == "1"


def uniform_tiles(module: ModuleOp) -> bool:
    """Whether every tile (block of query rows) of the forward kernel in `module` does the same
    work: its key loop is bounded by no band (no causal or window mask trims it), skips no
    blocks (no block list, no documents) and runs to the same length in every sequence (no
    per-sequence `kv_lens`)."""
    forward = _forward_kernel(module)
    if forward is None or "kv_lens" in forward.roles:
        return False
    for op in forward.walk():
        if isinstance(op, (tile.SparseKVLoopOp, tile.DocumentMaskOp)):
            return False
        if isinstance(op, tile.KVBoundsOp) and op.band.bounds != (None, None):
            return False
    return True


def schedule_options(head_dim: int, module: ModuleOp | None = None) -> dict[str, int | bool]:
    """`warp-specialize`'s options for the Gluon forward at `head_dim`, of the forward kernel in
    `module` when given (ALiBi or a bias or neither, uniform tiles or not; without one: neither)."""
    # ALiBi and an additive bias make the score step heavier (its slope, or the bias block
    # loaded beside the scores): such kernels take the schedule's `heavy_step_consumers`.
    forward = _forward_kernel(module) if module is not None else None
    if forward is not None and any(isinstance(op, tile.SparseKVLoopOp) for op in forward.walk()):
        # Block lists name the lowered tiles (`config.LISTED_GLUON_FORWARD`): a consumer per 64
        # rows of them, their keys per step, no persistent grid (`warp_specialize.listed_schedule`);
        # the consumer and persistent settings do not apply.
        return {"consumers": forward.get("block_m") // 64, "block_n": forward.get("block_n"), "persistent": False}
    heavy_step = module is not None and any(isinstance(op, (tile.AlibiOp, tile.AddBiasOp)) for op in module.walk())
    uniform = module is not None and uniform_tiles(module)
    return SCHEDULES[head_dim].options(gluon_consumers(head_dim, heavy_step), gluon_persistent(), uniform)


def forward_target() -> str:
    """The user's choice (`ATTNFUSE_FORWARD_TARGET`), checked."""
    target = os.environ.get("ATTNFUSE_FORWARD_TARGET", "auto")
    if target not in TARGETS:
        raise ArgumentError(f"ATTNFUSE_FORWARD_TARGET={target!r}: expected one of {', '.join(TARGETS)}")
    return target


MEASURED_TRITON_ONLY = {64: {(3, 6)}}
"""Head dims whose `auto` rule holds only for the Triton releases it was measured with: the
three-consumer head-dim-64 kernel spills none with 3.6 (the H200's) and with 3.9.0 184 bytes of
stack causal, 216 with a window (372-488 bytes of spill stores; an offline sm_90 sweep,
bench/results/20261205T1230Z-gluon-sm90-spill-sweep.md), so elsewhere `auto` keeps the
portable kernel."""


@cache
def triton_release() -> tuple[int, int]:
    """The installed Triton's (major, minor)."""
    import triton

    return tuple(int(part) for part in re.findall(r"\d+", triton.__version__)[:2])  # type: ignore[return-value]


MIN_TRITON = (3, 6)
"""The oldest Triton whose Gluon the printed kernels are written for (`gl.warp_specialize`
takes a list of (function, arguments) pairs from 3.6 on; 3.6 and 3.9 are tested)."""


@cache
def gluon_importable() -> bool:
    """Whether this Triton has Gluon's Hopper language (TMA, mbarrier, warpgroup MMA) in the
    form the Gluon target prints (`MIN_TRITON`)."""
    if triton_release() < MIN_TRITON:
        return False
    try:
        from triton.experimental.gluon.language.nvidia import hopper  # noqa: F401
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: F401
    except ImportError:
        return False
    return True


AUTO_VARIANT_CLASSES = {"softmax": (64, 128, 256), "relu": (64, 128), "pointwise": (128,), "bias": (),
                        "listed": (128,), "document": (64, 128), "outside": ()}
"""Head dims at which `auto` takes the Gluon forward, per variant class (`variant_class`), from
the sizes `GLUON_MIN_WORK` gives. On the H200 (bench/results/20261203T174400Z-gluon-variants.md,
`python3 bench/gluon_variants.py`, ms, Gluon / portable):

- ReLU (dense): head dim 64 0.380 / 0.429 and 1.575 / 1.618 at N=4096 / 8192; head dim 128
  0.350 / 0.471 and 1.489 / 2.129;
- sigmoid + causal (`pointwise`): head dim 128 0.312 / 0.323 and 1.167 / 1.228; at head dim 64
  the Gluon kernel is slower, 0.531 / 0.326 and 1.859 / 1.288;
- an additive bias + causal (`bias`): slower at both, 0.464 / 0.324 and 1.751 / 1.282 at head
  dim 64, 0.414 / 0.365 and 1.547 / 1.404 at 128 (bench/results/20261203T175822Z-gluon-variants.md:
  the consumer loads each bias block in the MMA layout beside the block's product; the
  portable kernel pipelines coalesced loads);
- plain softmax kernels (ALiBi, soft-capping, windows among them): `SOFTMAX_MIN_WORK`'s rows;
- block-sparse kernels (`listed`, a class every block-sparse kernel has besides its own,
  `variant_classes`: a block-sparse bias kernel is never taken, a sigmoid one at 128 only;
  measured as plain softmax kernels on 128 x 128 Gluon tiles against the portable 64 x 64 ones,
  layouts of 128-key blocks at densities 0.1 / 0.25 / 0.5 / 1.0; bench/results/20261204T035936Z-,
  20261204T040018Z- (head dim 64: B=4, 12 heads, N=4096, fp16), 20261204T040000Z- and
  20261204T040039Z-block-sparse-*.md (head dim 128: B=1, 32 heads, N=8192)): head dim 64
  0.096 / 0.168 / 0.294 / 0.546 against 0.098 / 0.196 / 0.366 / 0.681; head dim 128 0.278 /
  0.621 / 1.159 / 2.074 against 0.394 / 0.917 / 1.778 / 2.874. Taken from `GLUON_MIN_WORK`'s
  dense pair counts (the layout, and so the density, is call-time data) at head dim 128 only:
  at 64 the portable kernel on its head-major grid and `config.LISTED_FORWARD_HOPPER_D64`'s
  tiles was faster at the densities block sparsity is used at (on H100s, densities 0.05 / 0.1 /
  0.25 / 0.5: 0.0607 / 0.0832 / 0.1654 / 0.3002 ms for that kernel launched alone,
  bench/results/20261205T164348Z-block-sparse-grid-probe.md, against the Gluon kernel's whole
  calls, 0.0777 / 0.1039 / 0.1738 / 0.2875, in the session's next call,
  20261205T165414Z-block-sparse.md: faster at 5% and 10%, level at 25% (the portable kernel's
  whole call with three stages took 0.1813 there, 20261205T165439Z-block-sparse-tl.md), slower
  from 50%; the new choice is not yet timed as a whole call);
- document ids (`document`: packed sequences, a class a document kernel has besides its
  own), measured as the Gluon kernel on 128 x 128 tiles walking the document lists against the
  portable kernel on its own tiles (`python3 bench/document.py`, documents of 256-4096 tokens;
  bench/results/20261204T173918Z- (head dim 128: B=1, 32/8 heads, bf16), 20261204T174127Z-
  (head dim 64: B=4, 12 heads, fp16) and 20261204T174216Z-document.md), forward ms at N=8192 /
  16384: head dim 128 causal 0.428 / 0.843 against 0.546 / 1.066, bidirectional 0.747 / 1.442
  against 1.028 / 1.980; head dim 64 causal 0.514 / 1.012 against 0.808 / 1.549,
  bidirectional 0.851 / 1.765 against 1.487 / 2.828. Taken from `GLUON_MIN_WORK`'s dense pair
  counts.
Head dim 256 is measured for the softmax class only. A variant with an op of a block module
outside the package (`outside`) is measured by nobody: `auto` keeps the portable kernels
(`ATTNFUSE_FORWARD_TARGET=gluon` takes the Gluon forward where it lowers). Compiled for sm_90
with Triton 3.9, FIRE's position-aware map (test/python/blocks/fire_block.py) spills 440-1104
bytes per thread at every schedule, where the plain causal kernel spills none at two consumers
(bench/results/20261205T1100Z-gluon-index-tile-spills.md; no GPU timing yet)."""


def variant_class(variant: Canonical) -> str:
    """The class of a variant's forward that `AUTO_VARIANT_CLASSES` was measured by: `bias` for
    any variant reading an additive bias (whatever its normalizer: the bias's loads set its
    pace), else `relu` or `pointwise` (another pointwise normalizer, sigmoid) without the
    softmax, else `softmax`. Read from the variant, so that the runtime can decide before
    lowering (the tiles of a block-sparse call, `takes_listed_gluon`)."""
    if variant.reads("bias"):
        return "bias"
    if variant.normalizer_name == "relu":
        return "relu"
    return "softmax" if variant.normalizer_name == "softmax" else "pointwise"


def variant_classes(variant: Canonical) -> tuple[str, ...]:
    """Every class of `AUTO_VARIANT_CLASSES` a variant's forward belongs to: its
    `variant_class`, `listed` for a block-sparse layout (its own tiles and per-step list
    reads), `document` for document ids (lists too, and the ids read in partial blocks) and
    `outside` for an op of a block module outside the package (unmeasured).
    `auto` takes the Gluon forward at a head dim only where every one of them was measured
    faster (`auto_takes`)."""
    classes = [variant_class(variant)]
    if variant.outside_ops:
        classes.append("outside")
    if variant.block_size is not None:
        classes.append("listed")
    if variant.reads("doc_ids"):
        classes.append("document")
    return tuple(classes)


def auto_takes(problem: Problem, variant: Canonical) -> bool:
    """Whether the user's choice (`ATTNFUSE_FORWARD_TARGET`) or, under `auto`, the variant's
    classes allow the Gluon forward at this head dim (the size rule is `takes_gluon`'s)."""
    if forward_target() == "gluon":
        return True
    return all(problem.head_dim in AUTO_VARIANT_CLASSES[c] for c in variant_classes(variant))


def prefers_gluon(problem: Problem, causal: bool, table: dict[int, int] = GLUON_MIN_WORK) -> bool:
    """`auto`'s measured rule: at least `table`'s (query, key) pairs per head at the head dim
    (`GLUON_MIN_WORK`, or `SOFTMAX_MIN_WORK` for a plain softmax variant)."""
    work = problem.seq_q * problem.seq_k * (0.5 if causal else 1.0)
    least = table.get(problem.head_dim)
    if problem.head_dim in MEASURED_TRITON_ONLY and triton_release() not in MEASURED_TRITON_ONLY[problem.head_dim]:
        return False
    return least is not None and work >= least


def takes_gluon(problem: Problem, causal: bool, table: dict[int, int] = GLUON_MIN_WORK) -> bool:
    """Whether a forward of this shape runs on the Gluon target, where the variant lowers to it:
    an sm_90 GPU whose Triton has Gluon, a shape the schedule covers, and the user's choice
    (`ATTNFUSE_FORWARD_TARGET`) or `auto`'s rule (`prefers_gluon` with `table`)."""
    target = forward_target()
    if target == "triton" or not hopper(problem) or not fits(problem):
        return False
    return target == "gluon" or prefers_gluon(problem, causal, table)


def takes_gluon_forward(problem: Problem, variant: Canonical) -> bool:
    """Whether the variant's forward of this shape runs on the Gluon target where it lowers:
    `takes_gluon`'s GPU, shape and size rule (`SOFTMAX_MIN_WORK`'s sizes for a plain softmax
    variant), and the variant's classes (`auto_takes`)."""
    table = SOFTMAX_MIN_WORK if variant_classes(variant) == ("softmax",) else GLUON_MIN_WORK
    return takes_gluon(problem, variant.band[1] is not None, table) and auto_takes(problem, variant)


LISTED_GLUON_TILES = LISTED_GLUON_FORWARD[:2]
"""The (block_m, block_n) a block-sparse forward runs on the Gluon target with: a kernel lowered
with other tiles (a user's `config=`) keeps the portable one."""

LISTED_HEAD_DIMS = (64, 128)
"""Head dims at which a block-sparse forward keeps 128 x 128 tiles on the Gluon target
(`warp_specialize.listed_schedule`; 256 would need 64-key tiles)."""


def takes_listed_gluon(problem: Problem, variant: Canonical) -> bool:
    """Whether a call walking block lists (a block-sparse layout, document ids) runs its
    forward on the Gluon target: then its plan is lowered with `config.LISTED_GLUON_FORWARD`'s
    128 x 128 tiles (its block lists name the tiles, so they are chosen before lowering). A
    layout whose blocks are a multiple of 128 (documents fit any tiles), a head dim of
    `LISTED_HEAD_DIMS`, and `takes_gluon`'s rule with the variant's classes (`auto_takes`: the
    `listed` or `document` class and its own; a bias, say, is never taken)."""
    size, documents = variant.block_size, variant.reads("doc_ids")
    if size is None and not documents:
        return False
    if (size is not None and size % 128) or problem.head_dim not in LISTED_HEAD_DIMS:
        return False
    return takes_gluon_forward(problem, variant)


def hopper(problem: Problem) -> bool:
    """Whether the problem's device is an sm_90 CUDA GPU whose Triton has the Gluon the target
    prints (`gluon_importable`), the kernels not interpreted."""
    if problem.device.type != "cuda" or not gluon_importable():
        return False
    # The interpreter runs every kernel when asked to (`TRITON_INTERPRET=1`); Gluon's JIT
    # would compile for the GPU regardless.
    if runs_interpreted(problem.device):
        return False
    # A CUDA problem on a machine without CUDA (the GPU source printed for inspection), or a
    # ROCm GPU, whose MI200 also reports capability 9.0.
    if not torch.cuda.is_available() or torch.version.hip is not None:
        return False
    return torch.cuda.get_device_capability(problem.device) == (9, 0)


def fits(problem: Problem) -> bool:
    """Whether the schedule covers this shape: a head dim it is made for and 16-bit inputs
    (any sequence lengths: the 4-D descriptors zero-fill loads and clip stores at a sequence's
    end)."""
    return (problem.head_dim in HEAD_DIMS and problem.head_dim_v == problem.head_dim
            and problem.dtype in (torch.float16, torch.bfloat16))


def _forward_kernel(module: ModuleOp) -> tile.KernelOp | None:
    """The plan's forward kernel (`attention_fwd`) in its tile IR, if it has one."""
    return next((op for op in module.ops
                 if isinstance(op, tile.KernelOp) and op.sym_name.data == "attention_fwd"), None)


@cache
def _gluon_module(source: str) -> Any:
    """The generated Gluon source, stored in the kernel cache directory and imported as the
    portable target's modules are (`cache.load_module`: Gluon's JIT, like Triton's, reads a
    kernel's source from its file)."""
    digest = hashlib.sha256(source.encode()).hexdigest()
    path = kernel_cache.cache_dir() / f"gluon_{digest[:32]}.py"
    if not path.exists() or path.read_text() != source:
        kernel_cache._atomic_write(path, source)
    return kernel_cache.load_module(path, f"gluon_{digest}", interpret=False)


@dataclass
class GluonLaunch:
    """The forward launch of a plan on the Gluon target; `portable` runs calls whose tensors a
    descriptor cannot cover. Shaped like `KernelLaunch` where the runtime reads it (`info`,
    `check_grid`, calling it with the call's tensors)."""

    portable: KernelLaunch
    kernel: Any
    launch: GluonKernel
    problem: Problem
    sm_scale: float
    operands: tuple[str, str, str, str]
    """The roles read and written through descriptors: q (or q_rot), k (or k_rot), v, o."""

    allocates: ClassVar[bool] = False
    """As `KernelLaunch.allocates`: only a call a descriptor cannot cover copies its inputs,
    which the launch graph's capture sees and drops."""

    @property
    def info(self):
        return self.portable.info

    def check_grid(self) -> None:
        # Both grids: the portable kernel's (head-major for a listed kernel: no blocks on axis
        # 1) and this kernel's own, whose blocks are on axis 1 unless it is persistent.
        self.portable.check_grid()
        if not self.launch.persistent:
            p = self.problem
            check_row_blocks(self.info.name, "query_blocks", -(-p.seq_q // self.launch.block_m), self.launch.block_m)

    def __call__(self, tensors: dict[str, torch.Tensor]) -> None:
        # The same tensors as a call before: its encoded descriptors again, no checks (the key
        # determines what they found; gluon_launch.GluonRunner.replay).
        pointers, pointed = pointer_arguments(self.launch.roles, set(self.operands), tensors)
        key = call_key([tensors[role] for role in self.keyed_roles])
        if self.runner.replay(key, pointers):
            return
        q, k, v, o = (tensors[role] for role in self.operands)
        # o too: it is allocated in q's memory order (`layout.empty_in_layout_of`), which a
        # descriptor covers wherever q's does, but the check costs nothing beside q's.
        if not all(_descriptor_ready(t) for t in (q, k, v, o)):
            self.portable(tensors)
            return
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        (row_block, row_layout), (key_block, key_layout) = _forward_layouts(
            q.dtype == torch.float16, self.problem.head_dim, self.launch.block_n)
        descs = [TensorDescriptor(t, list(t.shape), list(t.stride()), block, layout)
                 for t, block, layout in ((q, row_block, row_layout), (k, key_block, key_layout),
                                          (v, key_block, key_layout), (o, row_block, row_layout))]
        self.runner([*descs, *pointers], self.scalars, specialization_of([q, k, v, o], pointed),
                    descriptors=len(descs), key=key)

    @cached_property
    def keyed_roles(self) -> tuple[str, ...]:
        """Every tensor role of the launch, those behind descriptors first (`call_key`)."""
        return (*self.operands, *(role for role in self.launch.roles if role not in self.operands))

    @cached_property
    def scalars(self) -> tuple[object, ...]:
        p = self.problem
        scalars: tuple[object, ...] = (self.sm_scale, p.seq_q, p.seq_k, p.heads_q, p.group_size)
        return (*scalars, p.batch * p.heads_q) if self.launch.persistent else scalars

    @cached_property
    def runner(self) -> GluonRunner:
        """The kernel's launches over this plan's grid: one program per (batch x head, query
        block), or with `persistent` one per SM (at most one per tile), each walking tiles
        pid, pid + G, ..."""
        p = self.problem
        if self.launch.persistent:
            tiles = p.batch * p.heads_q * -(-p.seq_q // self.launch.block_m)
            grid: tuple[int, ...] = (max(1, min(tiles, _sm_count(p.device))),)
        else:
            grid = (p.batch * p.heads_q, -(-p.seq_q // self.launch.block_m))
        return GluonRunner(self.kernel, grid, self.launch.num_warps)


@cache
def _forward_layouts(fp16: bool, dim: int, block_n: int) -> tuple[tuple[list[int], Any], tuple[list[int], Any]]:
    """The block shapes and shared layouts of the forward's descriptors, q's and o's (one block
    of 64 rows per consumer warpgroup) and k's and v's: made once per shape (host time)."""
    from triton.experimental.gluon import language as gl

    dtype = gl.float16 if fp16 else gl.bfloat16
    row_block, key_block = [1, 1, 64, dim], [1, 1, block_n, dim]
    return ((row_block, gl.NVMMASharedLayout.get_default_for(row_block, dtype)),
            (key_block, gl.NVMMASharedLayout.get_default_for(key_block, dtype)))


@cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _descriptor_ready(t: torch.Tensor) -> bool:
    """Whether a TMA descriptor covers `t` as it is: rows contiguous, every other stride and
    the base 16-byte aligned (a model's `[B, N, H, D]` projection viewed as `[B, H, N, D]`
    qualifies; an expanded one, with a 0 stride, does not)."""
    size = t.element_size()
    return (t.stride(-1) == 1 and t.data_ptr() % 16 == 0
            and all(stride > 0 and stride * size % 16 == 0 for stride in t.stride()[:-1]))


def gluon_forward(
    launches: list[KernelLaunch], problem: Problem, sm_scale: float,
    tile_module: Callable[[], ModuleOp], variant: Canonical,
) -> list[Any]:
    """`launches` with the forward replaced by its Gluon launch where this GPU, the user's
    choice, the shape and the variant (`auto_takes`) allow it (unchanged otherwise).
    `tile_module` gives the plan's tile IR (built only when everything else allows Gluon)."""
    if not takes_gluon_forward(problem, variant):
        return launches
    from attnfuse.lowering.gluon import GluonUnsupported, emit_gluon_kernel
    from attnfuse.transforms.warp_specialize import WarpSpecializePass

    forced_consumers()  # the user's choices, checked before any lowering
    gluon_persistent()
    module = tile_module()
    forward = _forward_kernel(module)
    if forward is None:
        return launches
    try:
        parts = flash_kernel(forward)
    except NotFlashShaped:
        return launches  # the portable kernel covers every variant
    if parts.listed and (forward.get("block_m"), forward.get("block_n")) != LISTED_GLUON_TILES:
        # Block lists keep the tiles they were built for: only the measured and tested ones
        # (`takes_listed_gluon` lowers such calls with them) go to the Gluon kernel.
        return launches
    WarpSpecializePass(**schedule_options(problem.head_dim, module)).apply(make_context(), module)
    if forward.schedule is None:
        return launches
    try:
        forward.verify_forward_resources()
    except VerifyException as err:  # the table's schedules fit (test_gluon_target.py): forced ones may not
        forced = {name: os.environ[name] for name in ("ATTNFUSE_GLUON_CONSUMERS", "ATTNFUSE_GLUON_PERSISTENT")
                  if os.environ.get(name)}
        if not forced:
            raise
        settings = ", ".join(f"{name}={value}" for name, value in forced.items())
        raise ArgumentError(f"the Gluon forward at head dim {problem.head_dim} with {settings}: {err}") from None
    try:
        program = emit_gluon_kernel(forward)
    except GluonUnsupported:
        return launches
    kernel = getattr(_gluon_module(program.source), "attention_fwd")
    info = program.kernels[0]
    return [GluonLaunch(launch, kernel, info, problem, sm_scale, info.operands) if launch.info.name == "attention_fwd"
            else launch for launch in launches]


__all__ = ["AUTO_VARIANT_CLASSES", "GLUON_MIN_WORK", "SOFTMAX_MIN_WORK", "LISTED_HEAD_DIMS", "takes_listed_gluon", "SCHEDULES", "GluonLaunch", "GluonSchedule", "forced_consumers", "forward_target",
           "gluon_consumers", "gluon_forward", "gluon_persistent", "prefers_gluon", "schedule_options", "takes_gluon", "takes_gluon_forward", "variant_class", "variant_classes", "auto_takes",
           "uniform_tiles"]

"""Print `tile` kernels as Triton source.

Each `tile.kernel` becomes one `@triton.jit` function; each tile op becomes a few lines under
a comment naming the op, with values named after the IR's (`q_lo`, `scores`, `row_max`).
Alongside the source, `KernelInfo` tells the runtime how to call each kernel: its tensor
roles in order, its grid and its launch parameters.

The kernel ABI is uniform so the runtime can launch any kernel from its `KernelInfo`:

    kernel(<for each role: {role}_ptr, then one stride per axis of tile.role_axes(role)>,
           sm_scale, n_q, n_k, num_heads, group_size,
           [num_splits, split_len,]   # kernels of a split decode (`KernelInfo.splits`)
           [num_pages,]               # kernels reading or writing page pools (`KernelInfo.paged`)
           <constexprs with defaults: block sizes and static dims>)

`num_heads` is the count of the heads the grid's programs own: query heads on
`query_blocks`, key/value heads on `key_blocks` and `kv_splits`. `n_k` is the key count (the
cache's capacity where the kernel reads `kv_lens`).

The printer translates; the decisions are the passes', visible in the tile IR: whether the
score scale is folded into the exponential (`fold-scale-into-exp`: `unscaled` scores), the
order of the row blocks (`block_order`), which loads may share offsets (`share-offsets`).
Facts of the generated code, not of the IR: `exp` is computed as `exp2` of the scores times
log2(e) (one FMA with the row max), f32 operands of a 16-bit kernel's product are split into
half-precision parts (`split_products`), and static dims are padded to powers of two (at
least 16, the smallest `tl.dot` operand) with masked loads and stores.

The printer is split by group of tile ops, as the dialect is (`attnfuse/dialects/tile/`):
`core` (signature, prologue, addressing), `memory`, `scores`, `loops`, `splits`,
`normalizers`, `backward` and `elementwise` each print their ops as methods of a part of
`KernelEmitter` (`emitter`, with the op-to-handler table `HANDLERS`); `scalars` holds the
`tile.map` body rules, `program` what the runtime reads (`KernelInfo`, `TritonProgram`), and
`module` prints whole modules (`emit_module`, the `-t triton` target).
"""

from __future__ import annotations

from attnfuse.lowering.triton.backward import BackwardEmitter
from attnfuse.lowering.triton.core import COLUMN_COMMENT, TRITON_TYPES, EmitterCore, LoopRows
from attnfuse.lowering.triton.elementwise import ElementwiseEmitter
from attnfuse.lowering.triton.emitter import KernelEmitter
from attnfuse.lowering.triton.loops import LoopEmitter
from attnfuse.lowering.triton.memory import MemoryEmitter
from attnfuse.lowering.triton.module import GDC_IMPORT, HEADER, TritonTarget, emit_module
from attnfuse.lowering.triton.names import Namer
from attnfuse.lowering.triton.normalizers import NormalizerEmitter
from attnfuse.lowering.triton.program import (
    GDC_FUNCTIONS,
    LN2,
    LOG2E,
    MAX_SPLITS_PER_STEP,
    MERGE_STEP_VALUES,
    KernelInfo,
    TritonProgram,
    padded,
    plus,
    scale_expression,
)
from attnfuse.lowering.triton.scalars import (
    BINARY_OPERATORS,
    CALLS,
    COMPARISONS,
    HELPERS,
    SCALAR_RULES,
    scalar_expression,
)
from attnfuse.lowering.triton.scores import ScoreEmitter
from attnfuse.lowering.triton.splits import SplitEmitter

__all__ = [
    "BINARY_OPERATORS",
    "BackwardEmitter",
    "CALLS",
    "COLUMN_COMMENT",
    "COMPARISONS",
    "ElementwiseEmitter",
    "EmitterCore",
    "GDC_FUNCTIONS",
    "GDC_IMPORT",
    "HEADER",
    "HELPERS",
    "KernelEmitter",
    "KernelInfo",
    "LN2",
    "LOG2E",
    "LoopEmitter",
    "LoopRows",
    "MAX_SPLITS_PER_STEP",
    "MERGE_STEP_VALUES",
    "MemoryEmitter",
    "Namer",
    "NormalizerEmitter",
    "SCALAR_RULES",
    "ScoreEmitter",
    "SplitEmitter",
    "TRITON_TYPES",
    "TritonProgram",
    "TritonTarget",
    "emit_module",
    "padded",
    "plus",
    "scalar_expression",
    "scale_expression",
]

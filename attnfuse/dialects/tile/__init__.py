"""The `tile` dialect: *how* one fused kernel computes an attention variant.

A `tile.kernel` is one GPU program launched over a grid. Each program owns a block of rows
(`block_m` query rows for a forward kernel) of one (batch, head) pair, loads blocks of the
operands into registers, loops over key blocks (`tile.kv_loop`), and stores its results:

    tile.kernel @attention_fwd(%q: !tile.tensor<q>, %k: !tile.tensor<k>, ...)
        attributes {grid = "query_blocks", block_m = 64 : i64, block_n = 64 : i64, ...} {
      %q_lo = tile.load %q[program, half_lo] : !tile.tensor<q> -> !tile.tile<m x half x f16>
      ...
      %start, %full_start, %full_end, %end = tile.kv_bounds {band = #attn.band<upper = 0>}
      %acc, %row_max, %row_sum = tile.kv_loop %full_end to %end masked iter_args(...) {
        ...
      }
      tile.store %out, %o[program, all] : ...
      tile.return
    }

Tile types name their dimensions symbolically: `m` (the program's rows, `block_m`), `n` (the
key rows of one loop step, `block_n`), `d` / `dv` (the query-key and value head dims), `half`
(half the rotary width) and `pass` (the dims after the rotary width). Block shapes, warps and
pipeline stages are kernel attributes, so a tuner sets them without touching the program.

The dialect is general enough for the kernels AttnFuse needs: a forward kernel, the
pre-rotation kernels (`grid = "query_blocks"` or `"key_blocks"`, no loop), and, with new
grids, backward kernels that own key blocks and split-KV decode kernels that own key ranges.
Nothing in it is Triton syntax: `attnfuse.lowering.triton` prints it as Triton.

The dialect is defined across this package's modules, one group of ops each, as MLIR splits a
dialect's op definitions: `types` (types, enum attributes, tensor roles), `kernel`, `memory`
(loads, stores, RoPE), `scores` (scores, filters, score modifiers), `loops`, `splits`
(split-KV decoding), `normalizers`, `backward` and `elementwise` (`tile.map`); `traits` and
`checks` hold what their verifiers share. Everything is importable from
`attnfuse.dialects.tile`.
"""

from __future__ import annotations

from xdsl.ir import Dialect

from attnfuse.dialects.tile.backward import (
    ApplyScaleOp,
    DotLhsTransposedOp,
    DotTransposedOp,
    RecomputeProbsOp,
    ReluGradOp,
    RowDotOp,
    SoftmaxGradOp,
    StoreAddOp,
    StoreScoresOp,
)
from attnfuse.dialects.tile.elementwise import (
    APPROXIMATE,
    APPROXIMATE_DIVISION,
    MAP_BODY_OPS,
    MAP_COMPARISONS,
    MapOp,
    MapYieldOp,
    PairPositionOp,
    QueryHeadOp,
    SeqLenOp,
)
from attnfuse.dialects.tile.kernel import (
    GRIDS,
    HOPPER_SHARED_BYTES,
    KernelOp,
    ReturnOp,
)
from attnfuse.dialects.tile.loops import (
    KEY_LOOP_OPS,
    LOOP_OPS,
    QUERY_LOOP_OPS,
    KVBoundsOp,
    KVLoopOp,
    QBoundsOp,
    QLoopOp,
    SparseKVLoopOp,
    SparseQLoopOp,
    YieldOp,
)
from attnfuse.dialects.tile.memory import (
    COLUMN_PARTS,
    PAIR_LAYOUTS,
    ROW_SOURCES,
    VALUE_WIDTH_ROLES,
    BlockWrite,
    JoinOp,
    LoadOp,
    RotateOp,
    SplitOp,
    StoreOp,
    expected_tile_shape,
    pairs_fill_tiles,
)
from attnfuse.dialects.tile.normalizers import (
    AccumulateOp,
    ReluProbsOp,
    SoftmaxFinalizeOp,
    SoftmaxInitOp,
    SoftmaxUpdateOp,
    ZerosOp,
)
from attnfuse.dialects.tile.scores import (
    FILTER_OPS,
    AddBiasOp,
    AlibiOp,
    DocumentMaskOp,
    MaskOp,
    ScoresOp,
    scale_consumers,
)
from attnfuse.dialects.tile.splits import (
    KVSplitOp,
    MergeLastSplitOp,
    MergeSplitsOp,
)
from attnfuse.dialects.tile.traits import (
    BlockLoop,
    ExponentiatesScores,
)
from attnfuse.dialects.tile.types import (
    BLOCK_LIST_ROLES,
    BLOCK_ROLES,
    ELEMENT_TYPES,
    FP32_ROLES,
    INDEXED_ROLES,
    KEY_ROW_ROLES,
    QUERY_ROW_ROLES,
    TENSOR_AXES,
    TENSOR_ROLES,
    TILE_DIMS,
    WIDENABLE_ROLES,
    BlockOrder,
    BlockOrderAttr,
    Columns,
    ColumnsAttr,
    Grid,
    GridAttr,
    Pairs,
    PairsAttr,
    Rows,
    RowsAttr,
    Schedule,
    ScheduleAttr,
    SeqAxis,
    SeqAxisAttr,
    TensorType,
    TileDim,
    TileDimAttr,
    TileType,
    element_type_name,
    role_axes,
    role_kind,
    rows_axis,
)

Tile = Dialect(
    "tile",
    [
        KernelOp,
        ReturnOp,
        LoadOp,
        StoreOp,
        RotateOp,
        ScoresOp,
        MaskOp,
        DocumentMaskOp,
        KVBoundsOp,
        KVSplitOp,
        KVLoopOp,
        MergeSplitsOp,
        MergeLastSplitOp,
        YieldOp,
        SoftmaxInitOp,
        SoftmaxUpdateOp,
        AccumulateOp,
        SoftmaxFinalizeOp,
        SparseKVLoopOp,
        AlibiOp,
        AddBiasOp,
        ReluProbsOp,
        ZerosOp,
        JoinOp,
        SplitOp,
        QBoundsOp,
        QLoopOp,
        SparseQLoopOp,
        RowDotOp,
        DotTransposedOp,
        DotLhsTransposedOp,
        StoreAddOp,
        RecomputeProbsOp,
        SoftmaxGradOp,
        ReluGradOp,
        ApplyScaleOp,
        StoreScoresOp,
        SeqLenOp,
        PairPositionOp,
        QueryHeadOp,
        MapOp,
        MapYieldOp,
    ],
    [TileType, TensorType, TileDimAttr, GridAttr, BlockOrderAttr, ScheduleAttr, RowsAttr, ColumnsAttr, SeqAxisAttr, PairsAttr],
)
"""The tile dialect."""

__all__ = [
    "APPROXIMATE",
    "APPROXIMATE_DIVISION",
    "AccumulateOp",
    "AddBiasOp",
    "AlibiOp",
    "ApplyScaleOp",
    "BLOCK_LIST_ROLES",
    "BLOCK_ROLES",
    "BlockLoop",
    "BlockOrder",
    "BlockOrderAttr",
    "BlockWrite",
    "COLUMN_PARTS",
    "Columns",
    "ColumnsAttr",
    "DocumentMaskOp",
    "DotLhsTransposedOp",
    "DotTransposedOp",
    "ELEMENT_TYPES",
    "ExponentiatesScores",
    "FILTER_OPS",
    "FP32_ROLES",
    "GRIDS",
    "Grid",
    "GridAttr",
    "HOPPER_SHARED_BYTES",
    "INDEXED_ROLES",
    "JoinOp",
    "KEY_LOOP_OPS",
    "KEY_ROW_ROLES",
    "KVBoundsOp",
    "KVLoopOp",
    "KVSplitOp",
    "KernelOp",
    "LOOP_OPS",
    "LoadOp",
    "MAP_BODY_OPS",
    "MAP_COMPARISONS",
    "MapOp",
    "MapYieldOp",
    "MaskOp",
    "MergeLastSplitOp",
    "MergeSplitsOp",
    "PAIR_LAYOUTS",
    "PairPositionOp",
    "Pairs",
    "PairsAttr",
    "QBoundsOp",
    "QLoopOp",
    "QUERY_LOOP_OPS",
    "QUERY_ROW_ROLES",
    "QueryHeadOp",
    "ROW_SOURCES",
    "RecomputeProbsOp",
    "ReluGradOp",
    "ReluProbsOp",
    "ReturnOp",
    "RotateOp",
    "RowDotOp",
    "Rows",
    "RowsAttr",
    "Schedule",
    "ScheduleAttr",
    "ScoresOp",
    "SeqAxis",
    "SeqAxisAttr",
    "SeqLenOp",
    "SoftmaxFinalizeOp",
    "SoftmaxGradOp",
    "SoftmaxInitOp",
    "SoftmaxUpdateOp",
    "SparseKVLoopOp",
    "SparseQLoopOp",
    "SplitOp",
    "StoreAddOp",
    "StoreOp",
    "StoreScoresOp",
    "TENSOR_AXES",
    "TENSOR_ROLES",
    "TILE_DIMS",
    "TensorType",
    "Tile",
    "TileDim",
    "TileDimAttr",
    "TileType",
    "VALUE_WIDTH_ROLES",
    "WIDENABLE_ROLES",
    "YieldOp",
    "ZerosOp",
    "element_type_name",
    "expected_tile_shape",
    "pairs_fill_tiles",
    "role_axes",
    "role_kind",
    "rows_axis",
    "scale_consumers",
]

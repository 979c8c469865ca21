"""What every `lower-to-tile` kernel builder shares: the facts read off an `attn.variant`,
the kernels' static configuration, and a builder that appends named tile ops to a kernel."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import GeneratorType

from xdsl.builder import Builder
from xdsl.dialects import arith
from xdsl.dialects.builtin import f32
from xdsl.ir import Block, Operation, Region, SSAValue
from xdsl.rewriter import InsertPoint
from xdsl.utils.exceptions import VerifyException

from attnfuse.dialects import attn, tile
from attnfuse.errors import IRError
from attnfuse.dialects.interfaces import (
    KeyFilter,
    Normalizer,
    ScoreModifier,
    normalizer_semantics,
    score_semantics,
)


@dataclass(frozen=True)
class Rotation:
    """One RoPE rotation and where it runs."""

    theta: float
    rotary_dim: int | None
    interleaved: bool
    fused: bool
    given_positions: bool = False
    """Positions come from a call-time tensor rather than the row index."""


@dataclass(frozen=True)
class VariantFacts:
    """What the kernels' structure needs from an `attn.variant`, read off its ops; the score
    arithmetic itself is left to the ops (`modifiers`, `normalizer`), which lower themselves."""

    query_rotation: Rotation | None
    key_rotation: Rotation | None
    band: attn.BandAttr
    scale: float | None
    """The static score scale, or None for the kernel's `sm_scale` argument (1/sqrt(D))."""
    modifiers: tuple[Operation, ...]
    """The score modifiers on the path from the scores to the normalizer, in program order."""
    normalizer: Operation
    data_roles: dict[tuple[Operation, str], str]
    """The kernel argument (role) bound to each (op, data kind) the modifiers and filters
    read."""
    sparse_block_size: int | None = None
    """The block-sparse layout's block size, when the variant has one (no kernel block may
    be larger)."""
    filters: tuple[Operation, ...] = ()
    """The filters other than the band, in program order: each lowers its own per-entry test
    in partial blocks (`KeyFilter.lower`; block-granular ones need none)."""
    listed: bool = False
    """The loops walk block lists the runtime builds (`KeyFilter.lists`: block sparsity,
    documents) instead of the band's block ranges."""
    elementwise: bool = False
    """A filter with neither band nor block lists drops entries by a per-entry test
    (`KeyFilter.lower`, an element-wise mask over positions, say): no block the loops visit
    is full, so every one is masked."""
    exact_scores: bool = False
    """q and k are read widened to fp32 (and rotated in registers), so that their scores are
    products of the unrounded operands (to about 2^-16 |q| |k| in bf16) rather than of
    operands rounded to the element type."""

    @property
    def rotation(self) -> Rotation | None:
        return self.query_rotation or self.key_rotation

    @property
    def any_fused(self) -> bool:
        return any(r is not None and r.fused for r in (self.query_rotation, self.key_rotation))

    @property
    def normalizer_semantics(self) -> Normalizer:
        return normalizer_semantics(self.normalizer)

    @property
    def has_lse(self) -> bool:
        """Whether the normalizer has a log-sum-exp (and the backward a `delta`)."""
        return self.normalizer_semantics.has_lse

    def data_arguments(self) -> list[str]:
        """The modifiers' and filters' data roles, in order, each once."""
        return list(dict.fromkeys(self.data_roles.values()))

    def data_gradient_roles(self) -> list[str]:
        """The gradient roles (`dbias`) the modifiers' data have (`DataUse.gradient`), each
        once."""
        return list(dict.fromkeys(role for op in self.modifiers for role in _gradient_roles(op)))


def assign_data_roles(ops: Sequence[Operation]) -> dict[tuple[Operation, str], str]:
    """The kernel argument each (op, data kind) is bound to: uses with equal keys share one
    argument (two default-slope ALiBis read one slopes tensor); the first argument of a kind
    is named after it, the next `kind_1`, `kind_2`, ... (`tile.INDEXED_ROLES`)."""
    roles: dict[tuple[Operation, str], str] = {}
    by_key: dict[tuple[str, object], str] = {}
    count: dict[str, int] = {}
    for op in ops:
        trait = score_semantics(op)
        assert trait is not None
        for use in trait.data(op):
            if use.kind not in tile.TENSOR_AXES:
                continue  # data the runtime turns into other tensors (a block layout's lists)
            shared = by_key.get((use.kind, use.key))
            if shared is None:
                n = count.get(use.kind, 0)
                shared = use.kind if n == 0 else f"{use.kind}_{n}"
                count[use.kind] = n + 1
                by_key[(use.kind, use.key)] = shared
            roles[(op, use.kind)] = shared
    return roles


@dataclass(frozen=True)
class KernelConfig:
    """Static facts and tuning parameters shared by the kernels of one variant."""

    head_dim: int
    head_dim_v: int
    element_type: str
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    bwd_block_m: int = 64
    """Backward kernels: rows a program owns (queries for dQ, keys for dK/dV)."""
    bwd_block_n: int = 32
    """Backward kernels: rows per loop step (keys for dQ, queries for dK/dV)."""
    bwd_num_warps: int = 4
    bwd_num_stages: int = 2
    dkdv_block_m: int = 64
    """The dK/dV kernel's program rows (keys)."""
    dkdv_block_n: int = 32
    """The dK/dV kernel's loop rows (queries)."""
    dkdv_num_warps: int = 4
    dkdv_num_stages: int = 2
    backward: bool = True
    """Whether to build the backward kernels too."""
    bwd_rope: str = "pre_rotated"
    """Where the backward kernels rotate q and k: "pre_rotated" (read the rotation kernels'
    copies) or "as_forward" (the forward's placement)."""
    decode: bool = False
    """Build the split-KV decode kernels (`attention_decode` on the `kv_splits` grid and
    `attention_merge`) instead of the forward kernel; no backward."""
    kv_lens: bool = False
    """The attention kernels read per-sequence key counts (`kv_lens`)."""
    page_size: int = 0
    """The key/value cache is paged with pages of this many rows (`block_table`); 0: a
    contiguous cache."""
    append: bool = False
    """Build the cache append kernel (`append_kv`) alone."""
    decode_merge: str = "kernel"
    """Where a split decode merges its partials: "kernel" (a second kernel,
    `attention_merge`) or "last-split" (the last split program of each row block,
    `tile.merge_last_split`)."""
    page_lookahead: int = 1
    """Steps ahead at which a paged kernel's key loops read block-table entries (the
    kernel attribute `page_lookahead`): 1 reads the next step's pages during a step, 0 the
    step's own."""
    merge_stages: int = 1
    """The software-pipelining depth of a split merge's loop over the splits (the kernel
    attribute `merge_stages` of kernels that merge): 1, not pipelined."""
    bwd_dq: str = "separate"
    """How the backward computes dQ: "separate" (FlashAttention-2's dQ kernels), "fused"
    (the dK/dV kernel adds dQ parts into `dq_acc`; `attention_bwd_dq_finish`) or "ordered"
    (fused, the adds in key-block order: deterministic)."""
    hoist_page_rows: int = 1
    """A paged kernel's key loops compute each key's row in its page once, before the loop,
    where a step's keys start pages or lie in one (the kernel attribute `hoist_page_rows`);
    0: from each key's position in every step."""
    decode_pdl: int = 1
    """A split decode merged by a second kernel overlaps the two through programmatic
    dependent launch (the kernel attribute `pdl` on both); 0: ordinary launches."""

    def for_backward(self) -> KernelConfig:
        """The configuration the dQ and preprocess kernels are built with."""
        return KernelConfig(self.head_dim, self.head_dim_v, self.element_type, self.bwd_block_m,
                            self.bwd_block_n, self.bwd_num_warps, self.bwd_num_stages)

    def for_dkdv(self) -> KernelConfig:
        """The configuration the dK/dV kernel is built with."""
        return KernelConfig(self.head_dim, self.head_dim_v, self.element_type, self.dkdv_block_m,
                            self.dkdv_block_n, self.dkdv_num_warps, self.dkdv_num_stages)

    def attributes(self, rotary_dim: int | None) -> dict[str, int]:
        attrs = {
            "block_m": self.block_m,
            "block_n": self.block_n,
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
            "head_dim": self.head_dim,
            "head_dim_v": self.head_dim_v,
        }
        if rotary_dim is not None:
            attrs["rotary_dim"] = rotary_dim
        return attrs

    def cache_roles(self) -> list[str]:
        """The parameters an attention kernel takes for the KV cache's layout."""
        return (["kv_lens"] if self.kv_lens else []) + (["block_table"] if self.page_size else [])


def column_parts(rotation: Rotation | None, head_dim: int) -> list[str]:
    """How q and k are split into column tiles: one tile, or the rotary pairs' two elements
    plus the pass-through dims."""
    if rotation is None:
        return ["all"]
    parts = ["even", "odd"] if rotation.interleaved else ["half_lo", "half_hi"]
    rotary_dim = rotation.rotary_dim or head_dim
    if rotary_dim < head_dim:
        parts.append("pass")
    return parts


class KernelBuilder:
    """Builds one `tile.kernel`, naming values so that the emitted code reads well."""

    def __init__(self, name: str, roles: Sequence[str], grid: str, config: KernelConfig,
                 rotary_dim: int | None,
                 data_roles: dict[tuple[Operation, str], str] | None = None):
        self.config = config
        self.data_roles = data_roles or {}
        self.elem = tile.ELEMENT_TYPES[config.element_type]
        attributes = config.attributes(rotary_dim)
        if "block_table" in roles:
            attributes["page_size"] = config.page_size
            attributes["page_lookahead"] = config.page_lookahead
            attributes["hoist_page_rows"] = config.hoist_page_rows
        self.kernel = tile.KernelOp(
            name, roles, grid=grid, element_type=self.elem, config=attributes,
        )
        if grid == "query_blocks":
            # Longest programs first: under a causal mask the last query blocks visit the
            # most key blocks (on the H200 7% less time for the forward, 10% for dQ than
            # ascending; dK/dV's longest programs, the first key blocks, come first anyway).
            self.kernel.attributes["block_order"] = tile.BlockOrderAttr(tile.BlockOrder.DESCENDING)
        self.builder = Builder(InsertPoint.at_end(self.kernel.body.block))

    def inside(self, block: Block) -> KernelBuilder:
        """A builder for the same kernel that appends to `block` (a loop body)."""
        nested = copy.copy(self)
        nested.builder = Builder(InsertPoint.at_end(block))
        return nested

    def arg(self, role: str) -> SSAValue:
        return self.kernel.argument(role)

    def data_arg(self, op: Operation, kind: str) -> SSAValue:
        """The kernel argument bound to `op`'s call-time data of `kind` (`DataUse`)."""
        return self.arg(self.data_roles[(op, kind)])

    def writes(self, role: str) -> bool:
        """Whether the kernel has a tensor parameter of `role`."""
        return role in self.kernel.roles

    @property
    def grid(self) -> str:
        """The kernel's launch grid (`tile.GRIDS`)."""
        return self.kernel.grid

    def scalar_map(self, inputs: Sequence[SSAValue], name: str,
                   body: Callable[[Builder, Sequence[SSAValue]], SSAValue]) -> SSAValue:
        """A `tile.map` over `inputs` whose body `body(builder, args)` builds from the f32
        block arguments (with arith/math ops) and returns the entry's value."""
        shape = next(v.type for v in inputs if isinstance(v.type, tile.TileType))
        block = Block(arg_types=[f32] * len(inputs))
        value = body(Builder(InsertPoint.at_end(block)), block.args)
        Builder(InsertPoint.at_end(block)).insert(tile.MapYieldOp(value))
        assert isinstance(shape, tile.TileType)
        result_type = tile.TileType(shape.shape, f32)
        mapped = tile.MapOp(inputs, Region(block), result_type)
        # Checked as it is made, so a body the targets cannot print is reported at the block
        # op whose lowering built it (`call_block`), not at the end of the pass.
        mapped.verify()
        return self.add(mapped, name).results[0]

    def pair_position(self, axis: str) -> SSAValue:
        """Each entry's query (`axis="query"`) or key position in the current key block, an
        f32 tile for `scalar_map` (`tile.pair_position`): what a block that depends on
        positions (a distance bias) maps with the scores."""
        return self.add(tile.PairPositionOp(axis), f"{axis[0]}_position").results[0]

    def query_head(self) -> SSAValue:
        """Each entry's query head index in the current key block, an f32 tile for
        `scalar_map` (`tile.query_head`): what a per-head block maps with the scores."""
        return self.add(tile.QueryHeadOp(), "query_head").results[0]

    def add(self, op: Operation, *names: str) -> Operation:
        self.builder.insert(op)
        for result, name in zip(op.results, names):
            result.name_hint = name
        return op

    def load(
        self, role: str, rows: str, cols: str, name: str, source: str | None = None, widen: bool = False
    ) -> SSAValue:
        """Loads a block of `source` (default `role`) into a tile named `name`; `widen` reads
        it as f32."""
        shape = tile.expected_tile_shape(role, rows, cols)
        elem = f32 if role in tile.FP32_ROLES or widen else self.elem
        load = tile.LoadOp(self.arg(source or role), rows, cols, tile.TileType(shape, elem))
        return self.add(load, name).results[0]

    def finish(self) -> tile.KernelOp:
        self.builder.insert(tile.ReturnOp())
        return self.kernel


PART_SUFFIX = {"all": "", "half_lo": "_lo", "half_hi": "_hi", "even": "_even", "odd": "_odd", "pass": "_pass"}




def load_operand(
    k: KernelBuilder,
    operand: str,
    source: str,
    rows: str,
    parts: Sequence[str],
    rotation: Rotation | None,
    positions: str,
    widen: bool = False,
) -> list[SSAValue]:
    """Loads `operand`'s column parts (widened to f32 with `widen`), rotating them in
    registers if its rotation is fused."""
    values = [k.load(operand, rows, p, f"{operand}{PART_SUFFIX[p]}", source=source, widen=widen)
              for p in parts]
    if rotation is not None and rotation.fused:
        given = k.arg(f"{operand}_positions") if rotation.given_positions else None
        rotate = k.add(tile.RotateOp(values[0], values[1], k.arg("rope_table"), positions, given),
                       f"{operand}{PART_SUFFIX[parts[0]]}_rot", f"{operand}{PART_SUFFIX[parts[1]]}_rot")
        values[:2] = rotate.results
    return values


ChainInputs = list[tuple[Operation, SSAValue]]
"""Each modifier of a score chain with the scores it read: what the backward's VJPs need."""


def call_block(interface: object, method: str, op: Operation, *args: object) -> object:
    """`interface.method(op, *args)`: a block's interface method (`lower`, `vjp`, a
    normalizer's `step`, ...) as the passes call it. A tile op it builds that fails its
    verifier (a `tile.map` body op no target prints) is an `IRError` at `op` naming the method:
    an out-of-tree block's mistake, located where the block is used, not at the kernel the
    pass made. A generator's values are built here, inside that check."""
    try:
        result = getattr(interface, method)(op, *args)
        return list(result) if isinstance(result, GeneratorType) else result
    except VerifyException as err:
        raise IRError(f"'{op.name}': its interface's {method}() built an invalid tile op: {err}", op) from err


def block_value(interface: object, method: str, op: Operation, *args: object) -> SSAValue:
    """`call_block`'s result, checked to be the tile value it computes (an `IRError` at the
    op otherwise: an out-of-tree block's omission, named where it is made)."""
    return checked_value(op, method, call_block(interface, method, op, *args))


def block_values(interface: object, method: str, op: Operation, *args: object, count: int) -> list[SSAValue]:
    """`block_value` for a method returning `count` tile values (a normalizer's state)."""
    values = call_block(interface, method, op, *args)
    if not isinstance(values, (list, tuple)) or len(values) != count:
        raise IRError(f"'{op.name}': its interface's {method}() returned {type(values).__name__}, "
                      f"expected {count} tile values", op)
    return [checked_value(op, method, value) for value in values]


def checked_value(op: Operation, method: str, value: object) -> SSAValue:
    """`value`, which `op`'s interface method `method` returned, if it is a tile value (an
    `IRError` at the op otherwise)."""
    if not isinstance(value, SSAValue):
        raise IRError(f"'{op.name}': its interface's {method}() returned {type(value).__name__}, expected the "
                      "tile value it computes (the SSAValue of the op it added)", op)
    return value


def lower_score_chain(
    k: KernelBuilder, facts: VariantFacts, scores: SSAValue, masked: bool
) -> tuple[SSAValue, ChainInputs]:
    """Applies the variant's score modifiers to a block of scores, each lowered by its op in
    program order (an op that appears twice is applied twice), then, in a partial block, the
    mask and each other filter's per-entry test: filters commute with every modifier (a dropped entry stays dropped), so they are
    applied last, where -inf cannot be turned back into a finite score (as soft-capping
    would). Returns the final scores and each modifier's input."""
    inputs: ChainInputs = []
    for op in facts.modifiers:
        inputs.append((op, scores))
        trait = op.get_trait(ScoreModifier)
        assert trait is not None
        scores = block_value(trait, "lower", op, k, scores)
    if masked:
        scores = k.add(tile.MaskOp(scores, facts.band), "scores").results[0]
        for op in facts.filters:
            trait = op.get_trait(KeyFilter)
            assert trait is not None
            scores = block_value(trait, "lower", op, k, scores)
    return scores, inputs


def lower_chain_vjp(k: KernelBuilder, inputs: ChainInputs, grad: SSAValue) -> SSAValue:
    """The gradient of the raw scores from that of the final ones: each modifier's VJP in
    reverse program order. The call-time data gradients the modifiers give (`dbias`) are
    summed per role and stored where the kernel writes that role, as soon as the last op
    declaring the role (`DataUse.gradient`; the first in program order) has given its
    contributions, before the VJPs further down the chain: the stored tile is then the
    gradient tile of that point, which a schedule refining one gradient tile in place
    (`backward_shape`) can store as it goes."""
    last_declaring: dict[str, Operation] = {}
    for op, _scores_in in inputs:
        for role in _gradient_roles(op):
            last_declaring.setdefault(role, op)
    data_grads: dict[str, list[SSAValue]] = {}
    for op, scores_in in reversed(inputs):
        trait = op.get_trait(ScoreModifier)
        assert trait is not None
        for role, value in call_block(trait, "data_gradient", op, k, grad):
            data_grads.setdefault(role, []).append(value)
        for role in _gradient_roles(op):
            if last_declaring[role] is op and role in data_grads and k.writes(role):
                _store_data_gradient(k, role, data_grads.pop(role))
        grad = block_value(trait, "vjp", op, k, scores_in, grad)
    for role, values in data_grads.items():
        # A role no op declared (a block's data_gradient beyond its DataUses): stored at the end.
        if k.writes(role):
            _store_data_gradient(k, role, values)
    return grad


def _gradient_roles(op: Operation) -> list[str]:
    """The gradient roles a modifier's data declare (`DataUse.gradient`), each once."""
    trait = op.get_trait(ScoreModifier)
    assert trait is not None
    return list(dict.fromkeys(use.gradient for use in trait.data(op) if use.gradient is not None))


def _store_data_gradient(k: KernelBuilder, role: str, values: list[SSAValue]) -> None:
    """Stores the sum of a data role's gradient contributions where the kernel writes it."""
    total = values[0]
    for value in values[1:]:
        total = k.scalar_map([total, value], f"grad_{role}",
                             lambda b, args: b.insert(arith.AddfOp(*args)).result)
    # s = scale * q.k + ...: the gradient of data added to the scores is dS itself.
    k.builder.insert(tile.StoreScoresOp(total, k.arg(role)))


Body = Callable[[Block, bool], None]
"""Fills one loop body; the flag says whether the loop's blocks are partial (masked)."""


def build_band_loops(
    k: KernelBuilder,
    facts: VariantFacts,
    state: Sequence[SSAValue],
    names: Sequence[str],
    body: Body,
    over: str,
    ranked: bool = False,
) -> Sequence[SSAValue]:
    """The loops over the blocks a program visits, carrying `state`; returns the final state.

    `over` is "keys" (a `query_blocks` kernel: forward, dQ) or "queries" (a `key_blocks`
    kernel: dK/dV). Dense variants get up to three loops from the mask band's bounds: partial
    blocks before the full ones, full blocks (no mask work), partial blocks after them (which
    also cover a ragged last block). Variants with a listed filter (block sparsity,
    documents) walk the runtime's lists: full blocks, then partial ones. Blocks outside the
    band, or that a listed filter leaves empty, are never visited. In a `kv_splits` kernel
    the bounds are clipped to the program's split (`tile.kv_split`), and a variant with a
    listed filter walks its split's blocks as partial ones, testing each entry. With an
    element-wise filter (`VariantFacts.elementwise`) no block is full: one masked loop over
    the band's blocks (or every listed block masked). With `ranked` (a dK/dV kernel adding dQ
    in key-block order) the query lists' loops read their entries' ranks (`*_q_rank`).
    """
    keys = over == "keys"
    split = k.grid == "kv_splits"

    def new_body(masked: bool) -> Region:
        block = Block(arg_types=[v.type for v in state])
        for arg, name in zip(block.args, names):
            arg.name_hint = name
        body(block, masked)
        return Region(block)

    if facts.listed and not split:
        suffix = "" if keys else "_q"
        # The lists' full blocks are full for the listed filters; an element-wise one tests them too.
        for prefix, masked in (("full", facts.elementwise), ("partial", True)):
            blocks, count = k.arg(f"{prefix}{suffix}_blocks"), k.arg(f"{prefix}{suffix}_count")
            if keys:
                loop: Operation = tile.SparseKVLoopOp(blocks, count, state, new_body(masked), masked)
            else:
                ranks = k.arg(f"{prefix}_q_rank") if ranked else None
                loop = tile.SparseQLoopOp(blocks, count, state, new_body(masked), masked, ranks)
            state = k.add(loop, *names).results
        return state
    bounds_op = tile.KVBoundsOp(facts.band) if keys else tile.QBoundsOp(facts.band)
    prefix = "kv" if keys else "q"
    bounds = k.add(bounds_op, f"{prefix}_start", "full_start", "full_end", f"{prefix}_end")
    start, full_start, full_end, end = bounds.results
    if split:
        # A split kernel's program visits its split of the key range only.
        clipped = k.add(tile.KVSplitOp(start, full_start, full_end, end),
                        "split_start", "split_full_start", "split_full_end", "split_end")
        start, full_start, full_end, end = clipped.results
        if facts.listed or facts.elementwise:
            # No block lists (they are per query block): every block is partial, and each
            # filter applies its per-entry test (`KeyFilter.lower`) to all of them.
            return k.add(tile.KVLoopOp(start, end, state, new_body(True), True), *names).results
    if facts.elementwise:
        # An element-wise filter may drop entries of any block in the band: one loop over
        # them all, each block masked and tested.
        loop_type = tile.KVLoopOp if keys else tile.QLoopOp
        return k.add(loop_type(start, end, state, new_body(True), True), *names).results
    lower, upper = facts.band.bounds
    # Keys: a lower band edge leaves partial key blocks before the full ones. Queries: an
    # upper edge leaves partial query blocks before the full ones (the rows just above the
    # diagonal for causal). The trailing partial loop always exists: it covers a ragged end.
    leading = (lower if keys else upper) is not None
    loops = ([(start, full_start, True)] if leading else []) + [
        (full_start if leading else start, full_end, False),
        (full_end, end, True),
    ]
    loop_type = tile.KVLoopOp if keys else tile.QLoopOp
    for lo, hi, masked in loops:
        state = k.add(loop_type(lo, hi, state, new_body(masked), masked), *names).results
    return state

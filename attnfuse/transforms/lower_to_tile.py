"""`lower-to-tile`: turn each `attn.variant` into the `tile.kernel`s that compute it.

The forward kernel is FlashAttention-2's: a program owns `block_m` query rows of one
(batch, head); it loads them once (rotating them in registers if the query rotation is
fused), then walks the key blocks that the mask band leaves non-empty, in up to three loops:
partial blocks before the full ones, full blocks (no mask work, no bounds checks), partial
blocks after them. Each step computes scores, masks them if the block is partial, updates the
online softmax and accumulates `p @ v`. At the end it normalizes and stores the output and
the per-row log-sum-exp.

When a rotation is fused, q and k are loaded as the two elements of each rotary pair (the
first and second half of the rotary dims, or even and odd dims when interleaved) plus the
pass-through dims, as separate tiles: the rotation is then elementwise arithmetic, with no
register shuffles, and the scores are the sum of one matrix product per part. A pre-rotated
operand gets a kernel of its own (`rotate_query` / `rotate_key`) that writes the rotated copy
the attention kernel then reads.

Options set the kernel's static facts and tuning: `head-dim`, `head-dim-v` (0: the head dim),
`element-type` (f16, bf16, f32), `block-m`, `block-n`, `num-warps`, `num-stages`.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.builder import Builder
from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, f32
from xdsl.ir import Block, Operation, Region, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)
from xdsl.rewriter import InsertPoint

from attnfuse.dialects import attn, tile
from attnfuse.errors import IRError, PassOptionError

# --------------------------------------------------------------------------------------------
# What the attn program asks for
# --------------------------------------------------------------------------------------------


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
    """Everything the kernels need from an `attn.variant`, read off its ops."""

    query_rotation: Rotation | None
    key_rotation: Rotation | None
    band: attn.BandAttr
    scale: float | None
    """The static score scale, or None for the kernel's `sm_scale` argument (1/sqrt(D))."""
    alibi: bool = False
    bias: bool = False
    sparse_block_size: int | None = None
    """The block-sparse layout's block size, when the variant has one."""
    normalizer: str = "softmax"
    """softmax or relu."""

    @property
    def rotation(self) -> Rotation | None:
        return self.query_rotation or self.key_rotation

    @property
    def any_fused(self) -> bool:
        return any(r is not None and r.fused for r in (self.query_rotation, self.key_rotation))


def _fail(op: Operation, message: str) -> IRError:
    return IRError(f"lower-to-tile: {message}", op)


def read_variant(variant: attn.VariantOp) -> VariantFacts:
    """Checks that the variant is ready to lower and collects what the kernels need."""
    rotations: dict[type, Rotation] = {}
    band = attn.BandAttr(None, None)
    scale = None
    masks = 0
    alibi = bias = False
    sparse: int | None = None
    normalizer = "softmax"
    for op in variant.body.block.ops:
        if isinstance(op, attn.ScoresOp) and op.scale is not None:
            scale = op.scale.value.data
        elif isinstance(op, attn.RopeOp):
            if op.placement is None:
                raise _fail(op, "rotation has no placement; run place-rope first")
            theta, dim, interleaved, _scaling = op.rope_key
            rotations[type(op.input.type)] = Rotation(
                theta, dim, interleaved, op.placement.data == "fused", op.positions is not None
            )
            if op.input != (variant.query if isinstance(op.input.type, attn.QueryType) else variant.key):
                raise _fail(op, "rotations must apply to the variant's q or k arguments")
        elif isinstance(op, attn.MaskOp):
            masks += 1
            if op.band is None:
                raise _fail(op, "mask has no band; run analyze-masks first")
            if masks > 1:
                raise _fail(op, "more than one mask; run canonicalize-attn first")
            for predicate in op.predicate_list:
                if predicate.band() is None:
                    raise _fail(op, f"cannot lower mask predicate {predicate}: only bands are supported")
            band = op.band
        elif isinstance(op, attn.AlibiOp):
            alibi = True
        elif isinstance(op, attn.AddBiasOp):
            bias = True
        elif isinstance(op, attn.BlockSparseOp):
            sparse = op.block_size.value.data
        elif isinstance(op, attn.ReluOp):
            normalizer = "relu"
    return VariantFacts(
        rotations.get(attn.QueryType), rotations.get(attn.KeyType), band, scale,
        alibi, bias, sparse, normalizer,
    )


# --------------------------------------------------------------------------------------------
# Building kernels
# --------------------------------------------------------------------------------------------


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
                 rotary_dim: int | None):
        self.config = config
        self.elem = tile.ELEMENT_TYPES[config.element_type]
        self.kernel = tile.KernelOp(
            name, roles, grid=grid, element_type=self.elem,
            config=config.attributes(rotary_dim),
        )
        self.builder = Builder(InsertPoint.at_end(self.kernel.body.block))

    def inside(self, block: Block) -> KernelBuilder:
        """A builder for the same kernel that appends to `block` (a loop body)."""
        nested = copy.copy(self)
        nested.builder = Builder(InsertPoint.at_end(block))
        return nested

    def arg(self, role: str) -> SSAValue:
        return self.kernel.argument(role)

    def add(self, op: Operation, *names: str) -> Operation:
        self.builder.insert(op)
        for result, name in zip(op.results, names):
            result.name_hint = name
        return op

    def load(self, role: str, rows: str, cols: str, name: str, source: str | None = None) -> SSAValue:
        shape = tile.expected_tile_shape(role, rows, cols)
        load = tile.LoadOp(self.arg(source or role), rows, cols, tile.TileType(shape, self.elem))
        return self.add(load, name).results[0]

    def finish(self) -> tile.KernelOp:
        self.builder.insert(tile.ReturnOp())
        return self.kernel


PART_SUFFIX = {"all": "", "half_lo": "_lo", "half_hi": "_hi", "even": "_even", "odd": "_odd", "pass": "_pass"}


def build_rotation_kernel(operand: str, rotation: Rotation, config: KernelConfig) -> tile.KernelOp:
    """A kernel that writes `R(pos) x` for x = q (`operand == "q"`) or k into `{x}_rot`."""
    grid = "query_blocks" if operand == "q" else "key_blocks"
    positions = "query" if operand == "q" else "key"
    position_role = [f"{operand}_positions"] if rotation.given_positions else []
    k = KernelBuilder(f"rotate_{positions}", [operand, f"{operand}_rot", "rope_table", *position_role],
                      grid, config, rotation.rotary_dim)
    parts = column_parts(rotation, config.head_dim)
    lo = k.load(operand, "program", parts[0], f"{operand}{PART_SUFFIX[parts[0]]}")
    hi = k.load(operand, "program", parts[1], f"{operand}{PART_SUFFIX[parts[1]]}")
    given = k.arg(position_role[0]) if position_role else None
    rotate = k.add(tile.RotateOp(lo, hi, k.arg("rope_table"), positions, given),
                   f"{operand}{PART_SUFFIX[parts[0]]}_rot", f"{operand}{PART_SUFFIX[parts[1]]}_rot")
    for value, part in zip(rotate.results, parts[:2]):
        k.builder.insert(tile.StoreOp(value, k.arg(f"{operand}_rot"), "program", part))
    if "pass" in parts:
        passed = k.load(operand, "program", "pass", f"{operand}_pass")
        k.builder.insert(tile.StoreOp(passed, k.arg(f"{operand}_rot"), "program", "pass"))
    return k.finish()


def forward_roles(facts: VariantFacts) -> list[str]:
    """The forward kernel's tensor parameters, in order."""
    q_rot, k_rot = facts.query_rotation, facts.key_rotation
    roles = [
        "q_rot" if q_rot is not None and not q_rot.fused else "q",
        "k_rot" if k_rot is not None and not k_rot.fused else "k",
        "v",
        "o",
    ]
    if facts.normalizer == "softmax":
        roles.append("lse")
    if facts.any_fused:
        roles.append("rope_table")
    for operand, rotation in (("q", q_rot), ("k", k_rot)):
        if rotation is not None and rotation.fused and rotation.given_positions:
            roles.append(f"{operand}_positions")
    if facts.alibi:
        roles.append("slopes")
    if facts.bias:
        roles.append("bias")
    if facts.sparse_block_size is not None:
        roles += ["full_blocks", "full_count", "partial_blocks", "partial_count"]
    return roles


def joins_query(facts: VariantFacts, head_dim: int) -> bool:
    """Whether the rotated query is reassembled to full width (`tile.join`): when only the
    query rotation is fused and its halves fill their tiles exactly, so that each key step
    does one full-width product instead of one per part."""
    q_rot, k_rot = facts.query_rotation, facts.key_rotation
    if q_rot is None or not q_rot.fused or (k_rot is not None and k_rot.fused):
        return False
    full_width = q_rot.rotary_dim in (None, head_dim)
    return full_width and head_dim >= 32 and head_dim & (head_dim - 1) == 0


STATE_NAMES = {"softmax": ("acc", "row_max", "row_sum"), "relu": ("acc",)}
"""The values each normalizer carries across key blocks."""


def build_forward_kernel(facts: VariantFacts, config: KernelConfig) -> tile.KernelOp:
    """The fused attention forward kernel (see the module docstring)."""
    rotation = facts.rotation
    q_rot, k_rot = facts.query_rotation, facts.key_rotation
    roles = forward_roles(facts)
    q_source, k_source = roles[0], roles[1]
    k = KernelBuilder("attention_fwd", roles, "query_blocks", config,
                      rotation.rotary_dim if rotation else None)
    # Split q and k into column parts only when some rotation runs in registers.
    parts = column_parts(rotation if facts.any_fused else None, config.head_dim)
    join = joins_query(facts, config.head_dim)

    # Load the program's query block once; rotate it here if that rotation is fused.
    q_parts = [k.load("q", "program", p, f"q{PART_SUFFIX[p]}", source=q_source) for p in parts]
    if q_rot is not None and q_rot.fused:
        given = k.arg("q_positions") if q_rot.given_positions else None
        rotate = k.add(tile.RotateOp(q_parts[0], q_parts[1], k.arg("rope_table"), "query", given),
                       f"q{PART_SUFFIX[parts[0]]}_rot", f"q{PART_SUFFIX[parts[1]]}_rot")
        q_parts[:2] = rotate.results
        if join:
            pairs = "interleaved" if q_rot.interleaved else "half"
            q_parts = [k.add(tile.JoinOp(*rotate.results, pairs), "q_rot").results[0]]
            # The key is rotated outside: its full width pairs with the joined query.
            parts = ["all"]

    names = STATE_NAMES[facts.normalizer]
    if facts.normalizer == "softmax":
        state: Sequence[SSAValue] = k.add(tile.SoftmaxInitOp(), *names).results
    else:
        state = k.add(tile.ZerosOp(tile.TileType(("m", "dv"), f32)), *names).results

    def body(block: Block, masked: bool) -> None:
        inner = k.inside(block)
        k_parts = [inner.load("k", "loop", p, f"k{PART_SUFFIX[p]}", source=k_source) for p in parts]
        if k_rot is not None and k_rot.fused:
            given = k.arg("k_positions") if k_rot.given_positions else None
            rotate = inner.add(tile.RotateOp(k_parts[0], k_parts[1], k.arg("rope_table"), "key", given),
                               f"k{PART_SUFFIX[parts[0]]}_rot", f"k{PART_SUFFIX[parts[1]]}_rot")
            k_parts[:2] = rotate.results
        scores = inner.add(tile.ScoresOp(q_parts, k_parts, facts.scale), "scores").results[0]
        # Score modifications come before the mask: a dropped key stays dropped.
        if facts.alibi:
            scores = inner.add(tile.AlibiOp(scores, k.arg("slopes")), "scores").results[0]
        if facts.bias:
            scores = inner.add(tile.AddBiasOp(scores, k.arg("bias")), "scores").results[0]
        if masked:
            scores = inner.add(tile.MaskOp(scores, facts.band), "scores").results[0]
        v = inner.load("v", "loop", "all", "v")
        if facts.normalizer == "softmax":
            acc, row_max, row_sum = block.args
            update = inner.add(tile.SoftmaxUpdateOp(scores, row_max, row_sum),
                               "probs", "row_max", "row_sum", "alpha")
            probs, new_max, new_sum, alpha = update.results
            new_acc = inner.add(tile.AccumulateOp(acc, probs, v, alpha), "acc").results[0]
            inner.builder.insert(tile.YieldOp([new_acc, new_max, new_sum]))
        else:
            (acc,) = block.args
            probs = inner.add(tile.ReluProbsOp(scores), "probs").results[0]
            new_acc = inner.add(tile.AccumulateOp(acc, probs, v), "acc").results[0]
            inner.builder.insert(tile.YieldOp([new_acc]))

    def new_body() -> Block:
        block = Block(arg_types=[v.type for v in state])
        for arg, name in zip(block.args, names):
            arg.name_hint = name
        return block

    if facts.sparse_block_size is not None:
        # The layout's listed key blocks: first those every row keeps whole (no mask work),
        # then those the band or the sequence end cuts (masked). Unlisted blocks are empty.
        for prefix, masked in (("full", False), ("partial", True)):
            block = new_body()
            body(block, masked)
            loop = tile.SparseKVLoopOp(k.arg(f"{prefix}_blocks"), k.arg(f"{prefix}_count"),
                                       state, Region(block), masked)
            state = k.add(loop, *names).results
    else:
        bounds = k.add(tile.KVBoundsOp(facts.band), "kv_start", "full_start", "full_end", "kv_end")
        start, full_start, full_end, end = bounds.results
        lower, _upper = facts.band.bounds
        # Partial blocks before the full ones exist only when the band has a lower edge; the
        # trailing partial loop always exists, since it also covers a ragged last key block.
        loops = ([(start, full_start, True)] if lower is not None else []) + [
            (full_start if lower is not None else start, full_end, False),
            (full_end, end, True),
        ]
        for lo, hi, masked in loops:
            block = new_body()
            body(block, masked)
            state = k.add(tile.KVLoopOp(lo, hi, state, Region(block), masked), *names).results

    if facts.normalizer == "softmax":
        final = k.add(tile.SoftmaxFinalizeOp(*state), "out", "lse")
        k.builder.insert(tile.StoreOp(final.results[0], k.arg("o"), "program", "all"))
        k.builder.insert(tile.StoreOp(final.results[1], k.arg("lse"), "program", None))
    else:
        # ReLU weights are already normalized (by 1/Nk): the accumulator is the output.
        k.builder.insert(tile.StoreOp(state[0], k.arg("o"), "program", "all"))
    return k.finish()


# --------------------------------------------------------------------------------------------
# The pass
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LowerVariant(RewritePattern):
    """`attn.variant` -> its pre-rotation kernels (if any) and its forward kernel."""

    config: KernelConfig

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: attn.VariantOp, rewriter: PatternRewriter) -> None:
        facts = read_variant(op)
        bs = facts.sparse_block_size
        if bs is not None and max(self.config.block_m, self.config.block_n) > bs:
            raise _fail(
                op,
                f"block-m ({self.config.block_m}) and block-n ({self.config.block_n}) must not "
                f"exceed the block_sparse block size ({bs})",
            )
        rotation = facts.rotation
        if rotation is not None and rotation.rotary_dim is not None:
            if rotation.rotary_dim > self.config.head_dim:
                raise _fail(op, f"rotary_dim {rotation.rotary_dim} exceeds head-dim {self.config.head_dim}")
        kernels: list[Operation] = []
        for operand, rot in (("q", facts.query_rotation), ("k", facts.key_rotation)):
            if rot is not None and not rot.fused:
                kernels.append(build_rotation_kernel(operand, rot, self.config))
        kernels.append(build_forward_kernel(facts, self.config))
        rewriter.insert(kernels, InsertPoint.before(op))
        rewriter.erase(op)


def _power_of_two(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


@dataclass(frozen=True)
class LowerToTilePass(ModulePass):
    """Lowers every `attn.variant` to `tile.kernel`s (see the module docstring)."""

    name = "lower-to-tile"

    head_dim: int = 64
    head_dim_v: int = 0
    """0 means the same as head-dim."""
    element_type: str = "f16"
    block_m: int = 64
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2

    def config(self) -> KernelConfig:
        """The options, checked."""
        if self.element_type not in tile.ELEMENT_TYPES:
            raise PassOptionError(
                f"lower-to-tile: element-type must be f16, bf16 or f32, got '{self.element_type}'"
            )
        for key, value in (("block-m", self.block_m), ("block-n", self.block_n)):
            if not (_power_of_two(value) and value >= 16):
                raise PassOptionError(f"lower-to-tile: {key} must be a power of two >= 16, got {value}")
        head_dim_v = self.head_dim_v or self.head_dim
        for key, value in (("head-dim", self.head_dim), ("head-dim-v", head_dim_v)):
            if not 1 <= value <= 256:
                raise PassOptionError(f"lower-to-tile: {key} must be in [1, 256], got {value}")
        return KernelConfig(self.head_dim, head_dim_v, self.element_type, self.block_m,
                            self.block_n, self.num_warps, self.num_stages)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        PatternRewriteWalker(LowerVariant(self.config()), apply_recursively=False).rewrite_module(op)


__all__ = ["KernelConfig", "LowerToTilePass", "read_variant"]

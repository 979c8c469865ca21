"""`lower-to-tile`: turn each `attn.variant` into the `tile.kernel`s that compute it.

The forward kernel is FlashAttention-2's: a program owns `block_m` query rows of one
(batch, head); it loads them once (rotating them in registers if the query rotation is
fused), then walks the key blocks that the mask band leaves non-empty, in up to three loops:
partial blocks before the full ones, full blocks (no mask work, no bounds checks), partial
blocks after them. Each step computes the scores, then lowers the variant's score chain op by
op along its data flow (`attn.score_chain`: each modifier where the program puts it, as often
as it appears, through its `ScoreModifier.lower`; ops off the path take no part), masks the
scores if the block is partial (filters last: a dropped key stays dropped), and hands them to
the normalizer's `step` (the online softmax, or a pointwise normalizer's `p @ v`). At the end
the normalizer's `finalize` gives the output (and, for softmax, the per-row log-sum-exp).

When a rotation is fused, q and k are loaded as the two elements of each rotary pair (the
first and second half of the rotary dims, or even and odd dims when interleaved) plus the
pass-through dims, as separate tiles: the rotation is then elementwise arithmetic, with no
register shuffles, and the scores are the sum of one matrix product per part. A pre-rotated
operand gets a kernel of its own (`rotate_query` / `rotate_key`) that writes the rotated copy
the attention kernel then reads. A key rotation placed `given` runs nowhere: the key arrives
rotated, and every kernel reads it, and returns its gradient, as an unrotated operand.

Options set the kernel's static facts and tuning: `head-dim`, `head-dim-v` (0: the head dim),
`element-type` (f16, bf16, f32), `block-m`, `block-n`, `num-warps`, `num-stages`.

Decoding (`decode=true`) builds the same program on the `kv_splits` grid instead
(`attention_decode`): a program owns every query row of the query heads that share one
key/value head (so K and V are read once per group) and one split of the key range; its
bounds are clipped to the split (`tile.kv_split`), and it stores a partial output and
log-sum-exp that `attention_merge` combines exactly (`tile.merge_splits`). `kv-lens=true`
gives the attention kernels per-sequence key counts, and `page-size=P` a paged cache
(`block_table`); all three are inference-only (no backward kernels). `append=true` (with
`kv-lens=true`) builds the cache append kernel alone (`append_kv`, `appended_keys` grid): new
keys and values written at each sequence's end, the keys rotated at their positions when the
variant's key rotation is `given` (its cache stores keys rotated).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from xdsl.context import Context
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, i64
from xdsl.ir import Block, Operation, SSAValue
from xdsl.pattern_rewriter import (
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)
from xdsl.rewriter import InsertPoint

from attnfuse.dialects import attn, tile
from attnfuse.dialects.interfaces import KeyFilter, partials_merge
from attnfuse.errors import IRError, PassOptionError
from attnfuse.transforms.kernel_builder import (
    PART_SUFFIX,
    KernelBuilder,
    KernelConfig,
    Rotation,
    VariantFacts,
    assign_data_roles,
    block_values,
    call_block,
    checked_value,
    build_band_loops,
    column_parts,
    load_operand,
    lower_score_chain,
)
from attnfuse.transforms.lower_backward import (
    backward_facts,
    build_backward_kernels,
)
from attnfuse.transforms.pass_options import TypedOptionsPass

# --------------------------------------------------------------------------------------------
# What the attn program asks for
# --------------------------------------------------------------------------------------------


def _fail(op: Operation, message: str) -> IRError:
    return IRError(f"lower-to-tile: {message}", op)


def check_listed_filters(chain: Sequence[Operation]) -> None:
    """Raises unless each listed filter (block sparsity, documents) appears at most once on
    the score chain: two would intersect their lists, but their data would share one kernel
    argument. Run by `read_variant`, and by the runtime when a program is compiled, so a
    hand-written program is refused where it is compiled, not at its first call."""
    seen: set[str] = set()
    for op in chain:
        trait = op.get_trait(KeyFilter)
        if trait is None or trait.band(op) is not None or not trait.lists(op):
            continue
        if op.name in seen:
            raise _fail(op, f"more than one {op.name.removeprefix('attn.')} in one variant")
        seen.add(op.name)


def read_variant(variant: attn.VariantOp) -> VariantFacts:
    """Checks that the variant is ready to lower and collects what the kernels' structure
    needs. Only the ops on the path from the scores to the normalizer take part (an op whose
    result nothing reads computes nothing); each is lowered as often as it appears."""
    scores, chain, normalizer = attn.score_chain(variant)
    check_listed_filters(chain)
    rotations: dict[type, Rotation] = {}
    # The rotations the scores read (a rotation whose result nothing reads rotates nothing).
    for operand, kind in ((scores.query, attn.QueryType), (scores.key, attn.KeyType)):
        op = operand.owner
        if not isinstance(op, attn.RopeOp):
            if operand not in (variant.query, variant.key):
                raise _fail(scores, "attn.scores must read the variant's q and k or their rotations")
            continue
        if op.placement is None:
            raise _fail(op, "rotation has no placement; run place-rope first")
        if op.input != (variant.query if kind is attn.QueryType else variant.key):
            raise _fail(op, "rotations must apply to the variant's q or k arguments")
        if op.given:
            # The caller passes the key rotated (a KV cache's keys): the kernels read it as
            # an unrotated operand, and its gradient is that of the k passed.
            continue
        theta, dim, interleaved, _scaling = op.rope_key
        rotations[kind] = Rotation(
            theta, dim, interleaved, op.placement.data == "fused", op.positions is not None
        )
    band = attn.BandAttr(None, None)
    masks = 0
    sparse: int | None = None
    modifiers: list[Operation] = []
    filters: list[Operation] = []
    listed = elementwise = False
    for op in chain:
        filter_trait = op.get_trait(KeyFilter)
        if filter_trait is None:
            modifiers.append(op)
            continue
        op_band = filter_trait.band(op)
        if op_band is not None:
            masks += 1
            recorded = op.properties.get("band")
            if not isinstance(recorded, attn.BandAttr):
                if op.name != "attn.mask":
                    raise _fail(op, f"{op.name} says it is a band (KeyFilter.band), but a band is an attn.mask "
                                    "predicate (a MaskPredicate attribute, which analyze-masks reads): build "
                                    "attn.mask with it, or drop entries in KeyFilter.lower")
                raise _fail(op, "mask has no band; run analyze-masks first")
            if masks > 1:
                raise _fail(op, "more than one mask; run canonicalize-attn first")
            band = recorded
            continue
        lists = filter_trait.lists(op)
        if not lists and not filter_trait.tests_entries:
            raise _fail(op, f"cannot lower {op.name}: a filter must be a band, have block lists or test "
                            "each entry (KeyFilter.lower)")
        listed, elementwise = listed or lists, elementwise or not lists
        block_size = filter_trait.block_size(op)
        if block_size is not None:
            sparse = block_size
        filters.append(op)
    return VariantFacts(
        rotations.get(attn.QueryType), rotations.get(attn.KeyType), band,
        scores.scale.value.data if scores.scale is not None else None,
        tuple(modifiers), normalizer, assign_data_roles([*modifiers, *filters]), sparse,
        tuple(filters), listed, elementwise=elementwise,
    )


# --------------------------------------------------------------------------------------------
# Building kernels
# --------------------------------------------------------------------------------------------


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


def forward_roles(facts: VariantFacts, config: KernelConfig | None = None) -> list[str]:
    """The forward (or, with `config.decode`, the split decode) kernel's tensor parameters,
    in order."""
    decode = config is not None and config.decode
    q_rot, k_rot = facts.query_rotation, facts.key_rotation
    roles = [
        "q_rot" if q_rot is not None and not q_rot.fused else "q",
        "k_rot" if k_rot is not None and not k_rot.fused else "k",
        "v",
        "o_part" if decode else "o",
    ]
    if decode:
        roles.append("lse_part")  # a pointwise normalizer's partials have none: never written
        if config.decode_merge == "last-split":
            roles += ["o", *(["lse"] if facts.has_lse else []), "split_counts"]
    elif facts.has_lse:
        roles.append("lse")
    if facts.any_fused:
        roles.append("rope_table")
    for operand, rotation in (("q", q_rot), ("k", k_rot)):
        if rotation is not None and rotation.fused and rotation.given_positions:
            roles.append(f"{operand}_positions")
    roles += facts.data_arguments()
    if facts.listed and not decode:
        roles += ["full_blocks", "full_count", "partial_blocks", "partial_count"]
    if config is not None:
        roles += config.cache_roles()
    return roles


def joins_query(facts: VariantFacts, head_dim: int) -> bool:
    """Whether the rotated query is reassembled to full width (`tile.join`): when only the
    query rotation is fused and its halves fill their tiles exactly, so that each key step
    does one full-width product instead of one per part."""
    q_rot, k_rot = facts.query_rotation, facts.key_rotation
    if q_rot is None or not q_rot.fused or (k_rot is not None and k_rot.fused):
        return False
    return tile.pairs_fill_tiles(q_rot.rotary_dim, head_dim)


def build_forward_kernel(facts: VariantFacts, config: KernelConfig) -> tile.KernelOp:
    """The fused attention forward kernel (see the module docstring); with `config.decode`,
    the split decode kernel: the same program on the `kv_splits` grid, storing each split's
    partial output and log-sum-exp."""
    rotation = facts.rotation
    q_rot, k_rot = facts.query_rotation, facts.key_rotation
    roles = forward_roles(facts, config)
    q_source, k_source = roles[0], roles[1]
    name, grid = ("attention_decode", "kv_splits") if config.decode else ("attention_fwd", "query_blocks")
    k = KernelBuilder(name, roles, grid, config,
                      rotation.rotary_dim if rotation else None, facts.data_roles)
    if facts.sparse_block_size is not None and facts.band.bounds == (None, None) and not config.decode:
        # A block-sparse forward's programs each read a few key blocks of their head: on a grid
        # walking heads fastest, the programs running at once are one query block of many
        # heads and their keys and values come from HBM more than from L2. Head-major, they are
        # neighbouring blocks of a few heads, which share them. (H100, D=64, B=4 H=12 N=4096,
        # tiles 64 x 64: 10% less time at densities 0.1-0.5, 3% at 0.05;
        # bench/results/20261205T164348Z-block-sparse-grid-probe.md.) Not under a band, whose
        # longest programs go first on the block-major grid (`block_order`), nor for document
        # ids alone: unmeasured.
        k.kernel.attributes["head_major"] = IntegerAttr(1, i64)
    # Split q and k into column parts only when some rotation runs in registers.
    parts = column_parts(rotation if facts.any_fused else None, config.head_dim)
    join = joins_query(facts, config.head_dim)

    # Load the program's query block once; rotate it here if that rotation is fused.
    q_parts = load_operand(k, "q", q_source, "program", parts, q_rot, "query")
    if join:
        assert q_rot is not None
        pairs = "interleaved" if q_rot.interleaved else "half"
        q_parts = [k.add(tile.JoinOp(*q_parts[:2], pairs), "q_rot").results[0]]
        # The key is rotated outside: its full width pairs with the joined query.
        parts = ["all"]

    normalizer, norm = facts.normalizer, facts.normalizer_semantics
    names = norm.state_names(normalizer)
    state: Sequence[SSAValue] = block_values(norm, "init_state", normalizer, k, count=len(names))

    def body(block: Block, masked: bool) -> None:
        inner = k.inside(block)
        k_parts = load_operand(inner, "k", k_source, "loop", parts, k_rot, "key")
        scores = inner.add(tile.ScoresOp(q_parts, k_parts, facts.scale), "scores").results[0]
        scores, _inputs = lower_score_chain(inner, facts, scores, masked)
        v = inner.load("v", "loop", "all", "v")
        stepped = block_values(norm, "step", normalizer, inner, block.args, scores, v, count=len(names))
        inner.builder.insert(tile.YieldOp(stepped))

    state = build_band_loops(k, facts, state, names, body, over="keys")

    finalized = call_block(norm, "finalize", normalizer, k, state)
    if not isinstance(finalized, tuple) or len(finalized) != 2:
        raise IRError(f"'{normalizer.name}': its interface's finalize() returned {type(finalized).__name__}, "
                      "expected (the output tile, the lse tile or None)", normalizer)
    out = checked_value(normalizer, "finalize", finalized[0])
    lse = None if finalized[1] is None else checked_value(normalizer, "finalize", finalized[1])
    out_role, lse_role = ("o_part", "lse_part") if config.decode else ("o", "lse")
    k.builder.insert(tile.StoreOp(out, k.arg(out_role), "program", "all"))
    if lse is not None:
        k.builder.insert(tile.StoreOp(lse, k.arg(lse_role), "program", None))
    if takes_pdl(config):
        k.kernel.attributes["pdl"] = IntegerAttr(1, i64)
    if config.decode and config.decode_merge == "last-split":
        # Its merge stays unpipelined: the partials other programs wrote are read past L1
        # (.cg), which Triton's asynchronous copies do not promise for every load width.
        k.builder.insert(tile.MergeLastSplitOp(
            k.arg("o_part"), k.arg("lse_part"), k.arg("split_counts"), k.arg("o"),
            k.arg("lse") if facts.has_lse else None, facts.has_lse))
    return k.finish()


def takes_pdl(config: KernelConfig) -> bool:
    """Whether a split decode's kernels get `pdl = 1`: decoding, merged by a second kernel
    (the last-split merge is one kernel, with nothing to overlap), `decode-pdl=1`."""
    return config.decode and config.decode_merge == "kernel" and bool(config.decode_pdl)


def build_merge_kernel(facts: VariantFacts, config: KernelConfig) -> tile.KernelOp:
    """The split decode's second kernel: per query row, the splits' partial results merged
    exactly (`tile.merge_splits`: through their log-sum-exps for softmax, summed for a
    pointwise normalizer), stored as the output (and lse)."""
    roles = ["o_part", "lse_part", "o"] + (["lse"] if facts.has_lse else [])
    merge_config = replace(config, block_m=MERGE_BLOCK_M, num_warps=MERGE_NUM_WARPS, num_stages=1)
    k = KernelBuilder("attention_merge", roles, "query_blocks", merge_config, None)
    k.kernel.attributes["merge_stages"] = IntegerAttr(config.merge_stages, i64)
    if takes_pdl(config):
        k.kernel.attributes["pdl"] = IntegerAttr(1, i64)
    merged = k.add(tile.MergeSplitsOp(k.arg("o_part"), k.arg("lse_part"), facts.has_lse), "out", "lse")
    k.builder.insert(tile.StoreOp(merged.results[0], k.arg("o"), "program", "all"))
    if facts.has_lse:
        k.builder.insert(tile.StoreOp(merged.results[1], k.arg("lse"), "program", None))
    return k.finish()


def append_rotation(variant: attn.VariantOp) -> Rotation | None:
    """The key rotation a cache for this variant stores keys with: the rotation the scores
    read the key through when it is `given` (its kernels read keys rotated), else none (they
    rotate keys themselves, or there is none; a rotation nothing reads rotates nothing)."""
    scores, _chain, _normalizer = attn.score_chain(variant)
    op = scores.key.owner
    if isinstance(op, attn.RopeOp) and op.input == variant.key and op.given:
        theta, dim, interleaved, _scaling = op.rope_key
        return Rotation(theta, dim, interleaved, True)
    return None


def build_append_kernel(rotation: Rotation | None, config: KernelConfig) -> tile.KernelOp:
    """The cache append: each new key (rotated at its cache position when the cache stores
    keys rotated) and value, written at its sequence's end, `kv_lens[b] + i`, of a
    contiguous or paged cache, in one kernel on the `appended_keys` grid."""
    roles = ["k", "v", "k_cache", "v_cache", *config.cache_roles()]
    if rotation is not None:
        roles.append("rope_table")
    k = KernelBuilder("append_kv", roles, "appended_keys", config,
                      rotation.rotary_dim if rotation else None)
    parts = column_parts(rotation, config.head_dim)
    values = load_operand(k, "k", "k", "program", parts, rotation, "key")
    for value, part in zip(values, parts):
        k.builder.insert(tile.StoreOp(value, k.arg("k_cache"), "program", part))
    value = k.load("v", "program", "all", "v")
    k.builder.insert(tile.StoreOp(value, k.arg("v_cache"), "program", "all"))
    return k.finish()


MERGE_BLOCK_M = 1
"""Query rows per merge program: one, so that a program loads all the splits of its row in one
step (`lowering/triton/splits.py`'s `splits_per_step`: 64 at head dim 128), one round trip to L2.
With 16 rows a program (Nq = 1 fills one of them) merged one split per step, pipelined three
deep, and took 4.4 µs of a 16k decode's 26 (bench/results/20261201T191104Z-decode_profile.md)."""
MERGE_NUM_WARPS = 4


# --------------------------------------------------------------------------------------------
# The pass
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LowerVariant(RewritePattern):
    """`attn.variant` -> its pre-rotation kernels (if any) and its forward kernel."""

    config: KernelConfig

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: attn.VariantOp, rewriter: PatternRewriter) -> None:
        if self.config.append:
            if not self.config.kv_lens:
                raise _fail(op, "append=true needs kv-lens=true: the new keys go after each sequence's cached ones")
            rewriter.insert(build_append_kernel(append_rotation(op), self.config), InsertPoint.before(op))
            rewriter.erase(op)
            return
        facts = read_variant(op)
        bs = facts.sparse_block_size
        c = self.config
        if bs is not None and max(c.block_m, c.block_n) > bs:
            raise _fail(
                op,
                f"block-m ({c.block_m}) and block-n ({c.block_n}) must not "
                f"exceed the block_sparse block size ({bs})",
            )
        if bs is not None and c.backward:
            for prefix, sizes in (("bwd", (c.bwd_block_m, c.bwd_block_n)),
                                  ("dkdv", (c.dkdv_block_m, c.dkdv_block_n))):
                if max(sizes) > bs:
                    raise _fail(
                        op,
                        f"{prefix}-block-m ({sizes[0]}) and {prefix}-block-n ({sizes[1]}) must "
                        f"not exceed the block_sparse block size ({bs})",
                    )
        rotation = facts.rotation
        if rotation is not None and rotation.rotary_dim is not None:
            if rotation.rotary_dim > self.config.head_dim:
                raise _fail(op, f"rotary_dim {rotation.rotary_dim} exceeds head-dim {self.config.head_dim}")
        elif rotation is not None and self.config.head_dim % 2:
            # The rotation pairs the whole head: an odd dim would be left out of every pair,
            # and of the scores (they are summed over the pairs' halves).
            raise _fail(op, f"the rotation covers the whole head (no rotary_dim), and head-dim "
                            f"{self.config.head_dim} is odd: give an even rotary_dim")
        if c.decode:
            check_decodable(op, facts)
        if c.kv_lens and facts.query_rotation is not None and not facts.query_rotation.fused:
            raise _fail(op, "a query with per-sequence lengths (kv-lens=true) cannot be "
                            "pre-rotated (its positions depend on kv_lens): place it fused")
        if c.page_size and facts.key_rotation is not None and not facts.key_rotation.fused:
            raise _fail(op, "the key of a paged cache cannot be pre-rotated (its rows are pages, "
                            "not positions): place the key rotation fused or given")
        # The backward may place rotations differently from the forward; the rotation kernels
        # of both come first, each built once.
        # Decoding and cache layouts are inference-only: no backward kernels for them.
        wants_backward = c.backward and not (c.decode or c.kv_lens or c.page_size)
        backward = backward_facts(facts, c.bwd_rope, c.element_type) if wants_backward else None
        kernels: list[Operation] = []
        for operand, fwd, bwd in (
            ("q", facts.query_rotation, backward and backward.query_rotation),
            ("k", facts.key_rotation, backward and backward.key_rotation),
        ):
            pre_rotated = [r for r in (fwd, bwd) if r is not None and not r.fused]
            if pre_rotated:
                kernels.append(build_rotation_kernel(operand, pre_rotated[0], c))
        kernels.append(build_forward_kernel(facts, c))
        if c.decode and c.decode_merge == "kernel":
            kernels.append(build_merge_kernel(facts, c))
        if backward is not None:
            kernels += build_backward_kernels(backward, c.for_backward(), c.for_dkdv(), c.bwd_dq)
        rewriter.insert(kernels, InsertPoint.before(op))
        rewriter.erase(op)


def check_decodable(op: Operation, facts: VariantFacts) -> None:
    """Raises unless the variant can be split: its normalizer's partials over disjoint key
    sets merge exactly (`Normalizer.merges_splits`), and every filter tests single entries (a
    split kernel has no per-query-block lists, so a block-granular filter, block sparsity,
    cannot run there)."""
    normalizer = facts.normalizer
    if not partials_merge(facts.normalizer_semantics):
        raise _fail(normalizer, f"{normalizer.name} does not say its outputs over disjoint key sets "
                                "merge exactly (Normalizer.merges_splits), so decode kernels "
                                "(decode=true), which split the keys, cannot compute it")
    for filter_op in facts.filters:
        trait = filter_op.get_trait(KeyFilter)
        assert trait is not None
        if trait.block_size(filter_op) is not None:
            raise _fail(filter_op, f"{filter_op.name} keeps whole blocks from per-query-block "
                                   "lists, which decode kernels (decode=true) do not have")


MAX_BLOCK = 1024
"""The largest tile side the options take: a program's tiles past it exceed any GPU's
registers and shared memory (Triton's blocks hold at most 2^20 elements)."""

NUM_WARPS = (1, 2, 4, 8, 16)
"""Warps a program may have (`tile.kernel`'s verifier takes the same)."""


def _power_of_two(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


@dataclass(frozen=True)
class LowerToTilePass(TypedOptionsPass):
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
    backward: bool = True
    """Also build the backward kernels (preprocess, dQ forming delta, dK/dV, dQ, and dQ with
    the bias gradient where there is a bias). Decode and append kernels (decode=true,
    append=true) have no backward: there it changes nothing."""
    bwd_block_m: int = 0
    """Backward kernels' program rows; 0: block-m."""
    bwd_block_n: int = 0
    """Backward kernels' loop rows; 0: block-n."""
    bwd_num_warps: int = 0
    """0: num-warps."""
    bwd_num_stages: int = 0
    """0: num-stages."""
    dkdv_block_m: int = 0
    """The dK/dV kernel's program rows (keys); 0: bwd-block-m."""
    dkdv_block_n: int = 0
    """The dK/dV kernel's loop rows (queries); 0: bwd-block-n."""
    dkdv_num_warps: int = 0
    """0: bwd-num-warps."""
    dkdv_num_stages: int = 0
    """0: bwd-num-stages."""
    bwd_rope: str = "pre_rotated"
    """pre_rotated: the backward reads rotated copies of q and k (each backward kernel loops
    over one of them, so an in-loop rotation would be paid once per program for both);
    as_forward: the forward's placement."""
    bwd_dq: str = "separate"
    """separate: dQ by its own kernels (`attention_bwd_dq_delta` / `attention_bwd_dq`,
    deterministic); fused: the dK/dV kernel also adds each block pair's dQ part into an fp32
    `dq_acc` (`attention_bwd_dkdv_dq`, unordered atomics, not deterministic) and
    `attention_bwd_dq_finish` scales it (not for a variant with a bias gradient); ordered: as
    fused, the adds made in key-block order (`tile.store_add ... in_order`, deterministic)."""
    decode: bool = False
    """Split-KV decoding: `attention_decode` (programs own a split of the keys for all the
    query heads of one key/value head) and `attention_merge` replace `attention_fwd`; no
    backward."""
    kv_lens: bool = False
    """The attention kernels take per-sequence key counts (`kv_lens`)."""
    page_size: int = 0
    """A paged cache with pages of this many rows (`block_table`, needs kv-lens); 0: a
    contiguous cache."""
    append: bool = False
    """Build only the cache append kernel (`append_kv`, needs kv-lens): new keys (rotated by
    the variant's key rotation when that is `given`) and values written at each sequence's
    end."""
    decode_merge: str = "kernel"
    """kernel: the split decode's partials are merged by a second kernel (`attention_merge`);
    last-split: by the last split program of each row block (`tile.merge_last_split`)."""
    merge_stages: int = 1
    """The software-pipelining depth of `attention_merge`'s loop over the splits: 1, not
    pipelined (each split's partials are read after the previous split's are merged). The
    last-split merge is never pipelined (it reads other programs' stores past L1)."""
    page_lookahead: int = 1
    """A paged cache's key loops read the block-table entries of the step this many steps
    ahead: 1 (the next step's, during a step: no K/V address waits on a table load of its
    own step, so Triton pipelines the K/V loads as deep as a contiguous cache's) or 0 (the
    step's own)."""
    hoist_page_rows: int = 1
    """1: a paged cache's key loops compute each key's row in its page once, before the
    loop, where a step's keys start pages (the page size divides block-n) or lie in one (it
    is a multiple of block-n), and index a step's table entries from its first key: per step
    no division or remainder per key, and with whole-page steps one page offset per step. 0:
    both from each key's position in every step (the form before; kept to compare)."""
    decode_pdl: int = 1
    """1: with decode=true and decode-merge=kernel, the split kernel and the merge kernel get
    `pdl = 1` (programmatic dependent launch: the merge launches while the split kernel runs
    and waits for it before reading the partials; printed for GPUs only, and launched so by
    the runtime on CUDA GPUs of capability 9.0 and up). 0: ordinary launches, one after the
    other."""

    def config(self) -> KernelConfig:
        """The options, checked."""
        if self.element_type not in tile.ELEMENT_TYPES:
            raise self.option_error("element-type", "f16, bf16 or f32", self.element_type)
        bwd_block_m = self.bwd_block_m or self.block_m
        bwd_block_n = self.bwd_block_n or self.block_n
        bwd_num_warps = self.bwd_num_warps or self.num_warps
        bwd_num_stages = self.bwd_num_stages or self.num_stages
        dkdv = (self.dkdv_block_m or bwd_block_m, self.dkdv_block_n or bwd_block_n,
                self.dkdv_num_warps or bwd_num_warps, self.dkdv_num_stages or bwd_num_stages)
        for key, value in (("block-m", self.block_m), ("block-n", self.block_n),
                           ("bwd-block-m", bwd_block_m), ("bwd-block-n", bwd_block_n),
                           ("dkdv-block-m", dkdv[0]), ("dkdv-block-n", dkdv[1])):
            if not (_power_of_two(value) and 16 <= value <= MAX_BLOCK):
                raise self.option_error(key, f"a power of two in [16, {MAX_BLOCK}]", value)
        for key, value in (("num-warps", self.num_warps), ("bwd-num-warps", bwd_num_warps),
                           ("dkdv-num-warps", dkdv[2])):
            if value not in NUM_WARPS:
                raise self.option_error(key, f"one of {', '.join(map(str, NUM_WARPS))}", value)
        for key, value in (("num-stages", self.num_stages), ("bwd-num-stages", bwd_num_stages),
                           ("dkdv-num-stages", dkdv[3])):
            if value < 1:
                raise self.option_error(key, ">= 1", value)
        head_dim_v = self.head_dim_v or self.head_dim
        for key, value in (("head-dim", self.head_dim), ("head-dim-v", head_dim_v)):
            if not 1 <= value <= 256:
                raise self.option_error(key, "in [1, 256]", value)
        if self.bwd_rope not in ("pre_rotated", "as_forward"):
            raise self.option_error("bwd-rope", "pre_rotated or as_forward", self.bwd_rope)
        if self.bwd_dq not in ("separate", "fused", "ordered"):
            raise self.option_error("bwd-dq", "separate, fused or ordered", self.bwd_dq)
        if self.decode_merge not in ("kernel", "last-split"):
            raise self.option_error("decode-merge", "kernel or last-split", self.decode_merge)
        if self.page_size < 0:
            raise self.option_error("page-size", ">= 0 (0: a contiguous cache)", self.page_size)
        if self.merge_stages < 1:
            raise self.option_error("merge-stages", ">= 1", self.merge_stages)
        if self.page_lookahead not in (0, 1):
            raise self.option_error("page-lookahead", "0 or 1", self.page_lookahead)
        if self.hoist_page_rows not in (0, 1):
            raise self.option_error("hoist-page-rows", "0 or 1", self.hoist_page_rows)
        if self.decode_pdl not in (0, 1):
            raise self.option_error("decode-pdl", "0 or 1", self.decode_pdl)
        if self.page_size and not self.kv_lens:
            raise PassOptionError(
                self.name, "page-size", f"page-size={self.page_size} needs kv-lens=true: the pages do not "
                "say how many keys each sequence has"
            )
        return KernelConfig(self.head_dim, head_dim_v, self.element_type, self.block_m,
                            self.block_n, self.num_warps, self.num_stages, bwd_block_m,
                            bwd_block_n, bwd_num_warps, bwd_num_stages, *dkdv,
                            self.backward, self.bwd_rope, self.decode, self.kv_lens,
                            self.page_size, self.append, self.decode_merge, self.page_lookahead,
                            self.merge_stages, self.bwd_dq, self.hoist_page_rows, self.decode_pdl)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        config = self.config()
        variants = [v for v in op.walk() if isinstance(v, attn.VariantOp)]
        if len(variants) > 1:
            # The kernels' names are fixed (attention_fwd, rotate_key, ...: the runtime and the
            # targets find them by name), so a second variant's would redefine the first's.
            raise _fail(variants[1], f"a module holds one attn.variant, got {len(variants)}: "
                                     f"lower @{variants[1].sym_name.data} from a module of its own")
        PatternRewriteWalker(LowerVariant(config), apply_recursively=False).rewrite_module(op)




@dataclass(frozen=True)
class ConvertAttnToTilePass(LowerToTilePass):
    """`lower-to-tile` under MLIR's A-to-B name, with the same options."""

    name = "convert-attn-to-tile"


__all__ = ["ConvertAttnToTilePass", "KernelConfig", "LowerToTilePass", "read_variant"]

"""The backward kernels `lower-to-tile` builds next to the forward (FlashAttention-2's split).

Given dO, the forward's output O and per-row log-sum-exp, these kernels compute dQ, dK, dV
(and dBias) without ever storing the score matrix; a call launches two or three of them
(`build_backward_kernels`):

- `attention_bwd_preprocess` (query blocks): `delta = rowsum(dO * O)` per query row, the
  softmax backward's correction term. ReLU attention has none and skips it. Usually it is
  not launched: `attention_bwd_dq_delta` computes delta itself (below).
- `attention_bwd_dkdv` (key blocks): a program owns `block_m` keys of one key/value head. It
  loads them once and walks the query blocks (of every query head of its GQA group) that the
  mask band or layout leaves non-empty, recomputing the transposed scores `S^T = K Q^T` and
  probabilities, and accumulating `dV += P^T dO` and `dK += dS^T Q`. Each program owns its
  rows of dK and dV outright, so the GQA sum over query heads needs no atomics.
- `attention_bwd_dq` (query blocks): a program owns `block_m` queries, walks the same key
  blocks as the forward and accumulates `dQ += dS K`. A second copy, `attention_bwd_dq_bias`,
  also writes the full-size bias gradient (the scores' gradient where the bias is added, from
  the modifiers' VJPs); the runtime launches it only when the bias requires a gradient, and
  reduces that gradient over the bias's broadcast dims.
- `attention_bwd_dq_delta` (softmax only): the dQ kernel that forms its rows' `delta` from the
  dO block it loads anyway and an O block, stores it, and uses it. Launched *before* dK/dV,
  which reads the stored delta, it replaces the preprocess: one launch and one pass over O
  and dO fewer. A call with a log-sum-exp gradient (which shifts delta) or a bias gradient
  runs the preprocess and the plain dQ kernel instead.

Every sum runs in a fixed order inside one program: results are bit-for-bit deterministic.

`bwd-dq=fused` (FlashAttention-3's design, `build_fused_backward_kernels`) replaces the two
dQ kernels: `attention_bwd_dkdv_dq` is the dK/dV kernel that also computes each block pair's
dQ part `dS K` (`tile.dot_lhs_transposed`) and adds it into an fp32 `dq_acc`
(`tile.store_add`, atomics: not deterministic), and `attention_bwd_dq_finish` scales it,
applies the rotation's transpose and stores dQ. The scores are formed once per block pair
instead of twice. `bwd-dq=ordered` is the same backward with its adds made in key-block order
(`tile.store_add ... in_order %dq_order`), so dQ is deterministic again; under block lists
(block sparsity, documents) the loops over them read each entry's turn (`*_q_rank`).

RoPE: the kernels see rotated operands (rotated in registers where the forward placement
fused the rotation, read from the pre-rotation kernels' output otherwise) and, at the end,
apply the rotation's transpose (`tile.rotate ... inverse`) to dQ and dK in registers, so they
return gradients of the unrotated q and k. Operands with a rotation are split into the two
elements of each rotary pair plus the pass-through dims, so each gradient part is its own
accumulator and the transpose is elementwise, as in the forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from xdsl.dialects.builtin import f32
from xdsl.ir import Block, SSAValue

from attnfuse.dialects import tile
from attnfuse.transforms.kernel_builder import (
    PART_SUFFIX,
    ChainInputs,
    KernelBuilder,
    KernelConfig,
    Rotation,
    VariantFacts,
    block_value,
    build_band_loops,
    column_parts,
    load_operand,
    lower_chain_vjp,
    lower_score_chain,
)


def _sources(facts: VariantFacts) -> tuple[str, str]:
    """The roles q and k are read from: the pre-rotated copy where the rotation runs outside."""
    q_rot, k_rot = facts.query_rotation, facts.key_rotation
    return (
        "q_rot" if q_rot is not None and not q_rot.fused else "q",
        "k_rot" if k_rot is not None and not k_rot.fused else "k",
    )


def _rotation_roles(facts: VariantFacts) -> list[str]:
    """The table, and call-time positions, that rotations and their transposes read."""
    if facts.rotation is None:
        return []
    roles = ["rope_table"]
    for operand, rotation in (("q", facts.query_rotation), ("k", facts.key_rotation)):
        if rotation is not None and rotation.given_positions:
            roles.append(f"{operand}_positions")
    return roles


def needs_exact_scores(facts: VariantFacts, element_type: str) -> bool:
    """Whether the backward must form scores from unrounded rotated q and k: a normalizer
    whose derivative jumps (`Normalizer.smooth` false: ReLU attention) with RoPE (on either
    operand) in f16/bf16. relu's derivative jumps at s = 0, so rounding a rotated operand to
    the element type moves scores near 0 across the jump and flips their gradient (bf16
    gradients then missed the reference by ~4e-2 on the H200). Smooth normalizers do not
    care, and without RoPE the operands are the inputs themselves, already exact."""
    smooth = facts.normalizer_semantics.smooth
    return not smooth and facts.rotation is not None and element_type != "f32"


def _gradient_kernel_roles(
    facts: VariantFacts, gradients: Sequence[str], list_suffix: str, bias_grad: bool = False,
    computes_delta: bool = False, ranked: bool = False,
) -> list[str]:
    """The parameters of a dK/dV or dQ kernel: q and k (or their rotated copies), v, dO (and
    O with `computes_delta`), the softmax statistics, the `gradients` it writes, then what
    rotations and score modifications read (and `dbias` with `bias_grad`), then the
    block lists it walks (`list_suffix` "_q": lists of query blocks; with `ranked`, each
    list's ranks after it, for adds in key-block order)."""
    q_source, k_source = _sources(facts)
    stats = ["lse", "delta"] if facts.has_lse else []
    grad_out = ["do", "o"] if computes_delta else ["do"]
    roles = [q_source, k_source, "v", *grad_out, *stats, *gradients, *_rotation_roles(facts),
             *facts.data_arguments(), *(facts.data_gradient_roles() if bias_grad else [])]
    if facts.listed:
        parts = ("blocks", "count", "rank") if ranked else ("blocks", "count")
        roles += [f"{kind}{list_suffix}_{what}" for kind in ("full", "partial") for what in parts]
    return roles


def backward_facts(facts: VariantFacts, bwd_rope: str, element_type: str) -> VariantFacts:
    """The variant as the backward kernels see it: with `bwd_rope == "pre_rotated"` every
    rotation reads the rotation kernel's copy (see `LowerToTilePass.bwd_rope`); where
    `needs_exact_scores`, q and k are read widened to fp32 and rotated in registers instead
    (a pre-rotated copy would already be rounded)."""
    if needs_exact_scores(facts, element_type):
        # Both operands are widened (a score's parts share one element type), and each
        # rotation runs in registers on the unrounded input.
        return replace(
            facts,
            query_rotation=facts.query_rotation and replace(facts.query_rotation, fused=True),
            key_rotation=facts.key_rotation and replace(facts.key_rotation, fused=True),
            exact_scores=True,
        )
    if bwd_rope != "pre_rotated":
        return facts
    return replace(
        facts,
        query_rotation=facts.query_rotation and replace(facts.query_rotation, fused=False),
        key_rotation=facts.key_rotation and replace(facts.key_rotation, fused=False),
    )


def splits_gradients(facts: VariantFacts, config: KernelConfig) -> bool:
    """Whether q, k and their gradients stay full width, split into rotary pairs only for the
    final transpose (`tile.split`): when no rotation runs in the loops and the pairs fill
    their tiles exactly (as `tile.join` needs)."""
    rotation = facts.rotation
    if rotation is None or facts.any_fused:
        return False
    return tile.pairs_fill_tiles(rotation.rotary_dim, config.head_dim)


def _parts(facts: VariantFacts, config: KernelConfig) -> list[str]:
    if splits_gradients(facts, config):
        return ["all"]
    return column_parts(facts.rotation, config.head_dim)


def _accumulator_type(part: str) -> tile.TileType:
    """An fp32 accumulator for one column part of the program's rows."""
    return tile.TileType(tile.expected_tile_shape("q", "program", part), f32)


def _store_gradient(
    k: KernelBuilder,
    operand: str,
    grads: Sequence[SSAValue],
    parts: Sequence[str],
    rotation: Rotation | None,
    positions: str,
    scale: float | None,
) -> None:
    """Scales an accumulated q or k gradient, applies the rotation's transpose, stores it."""
    role = f"d{operand}"
    grads = [k.add(tile.ApplyScaleOp(g, scale), f"{role}{PART_SUFFIX[p]}").results[0]
             for g, p in zip(grads, parts)]
    if rotation is not None and parts == ["all"]:
        # Full-width accumulators: split into the rotary pairs for the transpose.
        pairs = "interleaved" if rotation.interleaved else "half"
        split = k.add(tile.SplitOp(grads[0], pairs), f"{role}_lo", f"{role}_hi")
        grads = list(split.results)
        parts = ["even", "odd"] if rotation.interleaved else ["half_lo", "half_hi"]
    if rotation is not None:
        given = k.arg(f"{operand}_positions") if rotation.given_positions else None
        rotate = tile.RotateOp(grads[0], grads[1], k.arg("rope_table"), positions, given, inverse=True)
        grads = [*k.add(rotate, f"{role}{PART_SUFFIX[parts[0]]}",
                        f"{role}{PART_SUFFIX[parts[1]]}").results, *grads[2:]]
    for grad, part in zip(grads, parts):
        k.builder.insert(tile.StoreOp(grad, k.arg(role), "program", part))


def build_preprocess_kernel(config: KernelConfig) -> tile.KernelOp:
    """`delta = rowsum(dO * O)` per query row."""
    k = KernelBuilder("attention_bwd_preprocess", ["o", "do", "delta"], "query_blocks", config, None)
    out = k.load("o", "program", "all", "out")
    grad_out = k.load("do", "program", "all", "grad_out")
    delta = k.add(tile.RowDotOp(grad_out, out), "delta").results[0]
    k.builder.insert(tile.StoreOp(delta, k.arg("delta"), "program", None))
    return k.finish()


def _grad_scores(
    k: KernelBuilder,
    facts: VariantFacts,
    scores: SSAValue,
    inputs: ChainInputs,
    lse: SSAValue | None,
    delta: SSAValue | None,
    grad_probs_of: tuple[SSAValue, SSAValue],
) -> tuple[SSAValue, SSAValue]:
    """(probabilities, gradient of the raw scores) of one block, from its final scores and
    each modifier's input (`lower_score_chain`): the normalizer's score gradient, then the
    modifiers' VJPs in reverse. `grad_probs_of` are the operands of `dP = a @ b^T` in the
    kernel's orientation."""
    normalizer, norm = facts.normalizer, facts.normalizer_semantics
    probs = block_value(norm, "probs", normalizer, k, scores, lse)
    grad_probs = k.add(tile.DotTransposedOp(*grad_probs_of), "grad_probs").results[0]
    grad = block_value(norm, "grad_scores", normalizer, k, scores, probs, grad_probs, delta)
    return probs, lower_chain_vjp(k, inputs, grad)


def build_dkdv_kernel(facts: VariantFacts, config: KernelConfig, fused_dq: bool = False,
                      ordered: bool = False, bias_grad: bool = False) -> tile.KernelOp:
    """dK and dV: programs own key blocks and walk query blocks (see the module docstring).
    With `fused_dq` (`attention_bwd_dkdv_dq`) every block pair also adds its unscaled dQ part
    `dS K` into `dq_acc` (`tile.dot_lhs_transposed`, `tile.store_add`); `ordered` makes those
    adds in key-block order, through `dq_order`'s counters (deterministic). With `bias_grad`
    (fused only: `attention_bwd_dkdv_dq_bias`) the modifiers' VJPs also store the full-size
    bias gradient, each block pair's once, as the separate backward's dQ-bias kernel does."""
    assert fused_dq or not (ordered or bias_grad)
    q_source, k_source = _sources(facts)
    softmax = facts.has_lse
    dq_roles = ["dq_acc", *(["dq_order"] if ordered else [])] if fused_dq else []
    roles = _gradient_kernel_roles(facts, ["dk", "dv", *dq_roles], "_q", bias_grad, ranked=ordered)
    rotation = facts.rotation
    name = "attention_bwd_dkdv" + ("_dq" if fused_dq else "") + ("_bias" if bias_grad else "")
    k = KernelBuilder(name, roles, "key_blocks", config,
                      rotation.rotary_dim if rotation else None, facts.data_roles)
    parts = _parts(facts, config)
    # Program rows are keys: load them (and their values) once.
    key_parts = load_operand(k, "k", k_source, "program", parts, facts.key_rotation, "key",
                              facts.exact_scores)
    value = k.load("v", "program", "all", "v")
    names = [f"dk{PART_SUFFIX[p]}" for p in parts] + ["dv"]
    state: Sequence[SSAValue] = [
        k.add(tile.ZerosOp(_accumulator_type(p)), name).results[0]
        for p, name in zip(parts, names)
    ] + [k.add(tile.ZerosOp(tile.TileType(("m", "dv"), f32)), "dv").results[0]]

    def body(block: Block, masked: bool) -> None:
        inner = k.inside(block)
        query_parts = load_operand(inner, "q", q_source, "loop", parts, facts.query_rotation, "query",
                                    facts.exact_scores)
        grad_out = inner.load("do", "loop", "all", "grad_out")
        lse = inner.load("lse", "loop", None, "lse") if softmax else None
        delta = inner.load("delta", "loop", None, "delta") if softmax else None
        # Transposed scores, key x query: S^T = K Q^T.
        scores = inner.add(tile.ScoresOp(key_parts, query_parts, facts.scale), "scores").results[0]
        scores, inputs = lower_score_chain(inner, facts, scores, masked)
        probs, grad_scores = _grad_scores(inner, facts, scores, inputs, lse, delta, (value, grad_out))
        *dk, dv = block.args
        new_dv = inner.add(tile.AccumulateOp(dv, probs, grad_out), "dv").results[0]
        new_dk = [inner.add(tile.AccumulateOp(acc, grad_scores, q), name).results[0]
                  for acc, q, name in zip(dk, query_parts, names)]
        if fused_dq:
            # The loop's query rows' dQ part, (dS^T)^T K per column part, added into dq_acc
            # unscaled (the finish kernel scales once).
            for key, part in zip(key_parts, parts):
                dq_part = inner.add(tile.DotLhsTransposedOp(grad_scores, key),
                                    f"dq_part{PART_SUFFIX[part]}").results[0]
                order = inner.arg("dq_order") if ordered else None
                inner.builder.insert(tile.StoreAddOp(dq_part, inner.arg("dq_acc"), "loop", part, order))
        inner.builder.insert(tile.YieldOp([*new_dk, new_dv]))

    *dk, dv = build_band_loops(k, facts, state, names, body, over="queries", ranked=ordered)
    _store_gradient(k, "k", dk, parts, facts.key_rotation, "key", facts.scale)
    k.builder.insert(tile.StoreOp(dv, k.arg("dv"), "program", "all"))
    return k.finish()


def build_dq_kernel(
    facts: VariantFacts, config: KernelConfig, bias_grad: bool, computes_delta: bool = False
) -> tile.KernelOp:
    """dQ (and, with `bias_grad`, the full-size dBias): programs own query blocks. With
    `computes_delta` (softmax, no `bias_grad`) the kernel forms and stores its rows' delta
    instead of reading the preprocess's."""
    q_source, k_source = _sources(facts)
    softmax = facts.has_lse
    assert not computes_delta or (softmax and not bias_grad)
    roles = _gradient_kernel_roles(facts, ["dq"], "", bias_grad, computes_delta)
    rotation = facts.rotation
    name = ("attention_bwd_dq_bias" if bias_grad
            else "attention_bwd_dq_delta" if computes_delta else "attention_bwd_dq")
    k = KernelBuilder(name, roles, "query_blocks", config, rotation.rotary_dim if rotation else None,
                      facts.data_roles)
    parts = _parts(facts, config)
    query_parts = load_operand(k, "q", q_source, "program", parts, facts.query_rotation, "query",
                                facts.exact_scores)
    grad_out = k.load("do", "program", "all", "grad_out")
    lse = k.load("lse", "program", None, "lse") if softmax else None
    if computes_delta:
        # What the preprocess would compute for these rows; stored for the dK/dV kernel.
        out = k.load("o", "program", "all", "out")
        delta = k.add(tile.RowDotOp(grad_out, out), "delta").results[0]
        k.builder.insert(tile.StoreOp(delta, k.arg("delta"), "program", None))
    else:
        delta = k.load("delta", "program", None, "delta") if softmax else None
    names = [f"dq{PART_SUFFIX[p]}" for p in parts]
    state: Sequence[SSAValue] = [
        k.add(tile.ZerosOp(_accumulator_type(p)), n).results[0]
        for p, n in zip(parts, names)
    ]

    def body(block: Block, masked: bool) -> None:
        inner = k.inside(block)
        key_parts = load_operand(inner, "k", k_source, "loop", parts, facts.key_rotation, "key",
                                  facts.exact_scores)
        value = inner.load("v", "loop", "all", "v")
        scores = inner.add(tile.ScoresOp(query_parts, key_parts, facts.scale), "scores").results[0]
        scores, inputs = lower_score_chain(inner, facts, scores, masked)
        # With `bias_grad` the VJPs also store the bias gradient (the kernel writes dbias).
        _probs, grad_scores = _grad_scores(inner, facts, scores, inputs, lse, delta, (grad_out, value))
        new_dq = [inner.add(tile.AccumulateOp(acc, grad_scores, key), n).results[0]
                  for acc, key, n in zip(block.args, key_parts, names)]
        inner.builder.insert(tile.YieldOp(new_dq))

    dq = build_band_loops(k, facts, state, names, body, over="keys")
    _store_gradient(k, "q", dq, parts, facts.query_rotation, "query", facts.scale)
    return k.finish()


def build_dq_finish_kernel(facts: VariantFacts, config: KernelConfig) -> tile.KernelOp:
    """`attention_bwd_dq_finish` (the fused backward): dQ from the accumulated `dq_acc`,
    scaled once, through the rotation's transpose where q has one, stored as dq."""
    rotation = facts.rotation
    roles = ["dq_acc", "dq", *_rotation_roles(facts)]
    k = KernelBuilder("attention_bwd_dq_finish", roles, "query_blocks", config,
                      rotation.rotary_dim if rotation else None)
    parts = _parts(facts, config)
    acc = [k.load("dq_acc", "program", p, f"dq_acc{PART_SUFFIX[p]}") for p in parts]
    _store_gradient(k, "q", acc, parts, facts.query_rotation, "query", facts.scale)
    return k.finish()


def build_fused_backward_kernels(
    facts: VariantFacts, config: KernelConfig, dkdv_config: KernelConfig, ordered: bool = False
) -> list[tile.KernelOp]:
    """`bwd-dq=fused` (FlashAttention-3's design): the preprocess (softmax only), the dK/dV
    kernel that also adds each block pair's dQ part into the fp32 `dq_acc` (zeroed by the
    caller first; an unordered reduction, so dQ's last bits vary from run to run), and the
    finish kernel that turns `dq_acc` into dQ. A variant whose data have gradients (a bias)
    gets a second dK/dV kernel, `attention_bwd_dkdv_dq_bias`, that also stores them; the
    runtime launches it in place of the first only when the bias requires a gradient.
    `ordered` (`bwd-dq=ordered`): the adds in key-block order (`dq_order`, zeroed by the caller
    too), so dQ is deterministic. (Block lists are fused either way: ordered, their loops read
    each entry's turn, `*_q_rank`.)"""
    kernels = [build_preprocess_kernel(config)] if facts.has_lse else []
    kernels.append(build_dkdv_kernel(facts, dkdv_config, fused_dq=True, ordered=ordered))
    if facts.data_gradient_roles():
        kernels.append(build_dkdv_kernel(facts, dkdv_config, fused_dq=True, ordered=ordered, bias_grad=True))
    return kernels + [build_dq_finish_kernel(facts, config)]


def build_backward_kernels(
    facts: VariantFacts, config: KernelConfig, dkdv_config: KernelConfig, bwd_dq: str = "separate"
) -> list[tile.KernelOp]:
    """The backward kernels of a variant, in program order, which is the launch order of those
    a call runs: `attention_bwd_dq_delta` and then dK/dV, or the preprocess, dK/dV and a dQ
    kernel (`dkdv_config` tunes the dK/dV kernel, `config` the others). With
    `bwd_dq == "fused"` or `"ordered"`, `build_fused_backward_kernels`' instead."""
    if bwd_dq in ("fused", "ordered"):
        return build_fused_backward_kernels(facts, config, dkdv_config, ordered=bwd_dq == "ordered")
    kernels = []
    if facts.has_lse:
        kernels += [build_preprocess_kernel(config),
                    build_dq_kernel(facts, config, bias_grad=False, computes_delta=True)]
    kernels += [build_dkdv_kernel(facts, dkdv_config), build_dq_kernel(facts, config, bias_grad=False)]
    if facts.data_gradient_roles():
        kernels.append(build_dq_kernel(facts, config, bias_grad=True))
    return kernels


__all__ = ["backward_facts", "build_backward_kernels", "needs_exact_scores"]

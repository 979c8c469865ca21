"""`canonicalize-attn`: bring an attention program to its one canonical form.

Variants that mean the same thing must become the same IR, because the canonical IR is what
the rest of the pipeline (and the kernel cache) sees. The pass asks the ops, never a table of
its own:

- an op whose result nothing reads is erased (it is not part of the computation: an unused
  `attn.alibi` must not put ALiBi into any kernel);
- two adjacent score ops out of their canonical order (`ScoreModifier.rank` /
  `KeyFilter.rank`: additive modifiers, then filters; ties broken by the op's name, then its
  attributes: `interfaces.canonical_order`) are swapped, but only when the first
  says it commutes with the second (`commutes_with`): ALiBi and a bias commute, a soft-cap
  commutes with neither, every filter commutes with every modifier (a dropped key stays
  dropped whatever is added to it);
- the query's rotation is moved above the key's (the two are independent);
- a float property or attribute of an attn op (or a float in an array of them, ALiBi's
  slopes) written at a narrower width (`: f32`) is written at f64, the width the Python API writes: the same number (xDSL rounds a float to its
  attribute's width when it is made, and an f32 is exact in f64), so a hand-written program
  and the DSL's print alike and share kernels; kept where the op's verifier refuses f64;
- every op's own canonicalization patterns (xDSL's `HasCanonicalizationPatternsTrait`) run
  too: `attn.mask` merges adjacent masks, sorts and deduplicates predicates, intersects
  windows and drops an empty mask.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ArrayAttr, FloatAttr, ModuleOp, f64
from xdsl.ir import Attribute, Operation
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
)
from xdsl.rewriter import InsertPoint
from xdsl.traits import HasCanonicalizationPatternsTrait

from attnfuse.dialects.attn import (
    KeyType,
    QueryType,
    RopeOp,
    VariantOp,
    YieldOp,
    is_score_op,
)
from attnfuse.dialects.interfaces import canonical_order, commute
from attnfuse.transforms.pass_options import TypedOptionsPass


class EraseUnusedOp(RewritePattern):
    """Erases an attn op inside a variant whose results nothing reads."""

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> None:
        if isinstance(op, (VariantOp, YieldOp)) or not op.results:
            return
        if not isinstance(op.parent_op(), VariantOp):
            return
        if any(result.uses for result in op.results):
            return
        rewriter.erase(op)


class OrderScoreOps(RewritePattern):
    """`y(x(s))` -> `x(y(s))` for two score ops out of canonical order that commute, when
    `x`'s result feeds only `y`."""

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> None:
        if not is_score_op(op):
            return
        inner = op.operands[0].owner
        if not isinstance(inner, Operation) or not is_score_op(inner):
            return
        order, inner_order = canonical_order(op), canonical_order(inner)
        assert order is not None and inner_order is not None
        if inner_order <= order or not inner.results[0].has_one_use() or not commute(inner, op):
            return
        # Swap the pair in place: op reads the inner op's input, the inner op reads op, and
        # op's readers read the inner op. The ops themselves move (no clones), so a tool
        # keeps their source locations for the diagnostics of later passes.
        rewriter.replace_all_uses_with(op.results[0], inner.results[0])
        op.operands[0] = inner.operands[0]
        inner.operands[0] = op.results[0]
        op.detach()
        rewriter.insert(op, InsertPoint.before(inner))
        rewriter.notify_op_modified(inner)


class OrderRotations(RewritePattern):
    """Moves the query's rotation above the key's: the two are independent, so programs that
    write them in either order are equal and must print alike (the DSL builds the query's
    first)."""

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> None:
        if not isinstance(op, RopeOp) or not isinstance(op.input.type, KeyType):
            return
        block = op.parent_block()
        if block is None or not isinstance(op.parent_op(), VariantOp):
            return
        later = op.next_op
        while later is not None:
            if isinstance(later, RopeOp) and isinstance(later.input.type, QueryType):
                # Its operands are the variant's arguments, so it may move anywhere above
                # (itself, not a clone: its source location stays known).
                later.detach()
                rewriter.insert(later, InsertPoint.before(op))
                return
            later = later.next_op


class WidenFloatAttributes(RewritePattern):
    """Writes an attn op's float properties and attributes of a width below f64 at f64 (see
    the module docstring), one at a time, each kept only if the op still verifies."""

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> None:
        if not isinstance(op.parent_op(), VariantOp):
            return
        changed = False
        for store in (op.properties, op.attributes):
            for name, value in list(store.items()):
                wide = widened(value)
                if wide is None:
                    continue
                store[name] = wide
                try:
                    op.verify(verify_nested_ops=False)
                except Exception:  # noqa: BLE001 - the op wants this width: keep it
                    store[name] = value
                    continue
                changed = True
        if changed:
            rewriter.notify_op_modified(op)


def widened(value: Attribute) -> Attribute | None:
    """`value` with its floats below f64 written at f64 (a float, or an array holding floats:
    ALiBi's slopes), or None if it holds none."""
    if isinstance(value, FloatAttr):
        return None if value.type == f64 else FloatAttr(value.value.data, f64)
    if isinstance(value, ArrayAttr):
        elements = [widened(element) for element in value.data]
        if all(element is None for element in elements):
            return None
        return ArrayAttr([old if new is None else new for old, new in zip(value.data, elements)])
    return None


def op_patterns(ctx: Context) -> list[RewritePattern]:
    """The canonicalization patterns the attn dialect's ops declare."""
    dialect = ctx.get_optional_dialect("attn")
    patterns: list[RewritePattern] = []
    for op_type in dialect.operations if dialect is not None else ():
        trait = op_type.get_trait(HasCanonicalizationPatternsTrait)
        if trait is not None:
            patterns += trait.get_patterns(op_type)
    return patterns


@dataclass(frozen=True)
class CanonicalizeAttnPass(TypedOptionsPass):
    """Rewrites every `attn.variant` into canonical form (see the module docstring)."""

    name = "canonicalize-attn"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        PatternRewriteWalker(
            GreedyRewritePatternApplier(
                [EraseUnusedOp(), OrderScoreOps(), OrderRotations(), WidenFloatAttributes(), *op_patterns(ctx)],
                # The pattern above erases only attn ops; xDSL's DCE would also erase unused
                # ops of any other dialect in the module.
                dce_enabled=False,
            )
        ).rewrite_module(op)

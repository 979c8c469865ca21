"""What the runtime knows of a variant: its attn program, canonical, and what it declares.

A variant comes from the DSL (an `AttentionSpec`) or as attn IR (text or an xDSL module).
Either way the runtime asks the *program* what a call needs, never the DSL: the call-time
tensors its ops read (each op's `DataUse`s and `bind`), whether its normalizer has a
log-sum-exp, its mask band and block size, its rotation. The program is canonicalized
(`canonicalize-attn,analyze-masks`) once per set of call-time position arguments; its text is
the compile cache's key, so equal variants share kernels however they were written.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, cached_property
from typing import Any

from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation
from xdsl.passes import PassPipeline
from xdsl.utils.lexer import Span
from xdsl.utils.exceptions import DiagnosticException, ParseError, PassFailedException, VerifyException

from attnfuse.blocks import unregistered_op_hint
from attnfuse.dialects import attn, make_context
from attnfuse.dialects.diagnostics import OpLocatingParser, innermost_failing_op, location_of
from attnfuse.dialects.interfaces import (
    DataUse,
    KeyFilter,
    Normalizer,
    ScoreModifier,
    normalizer_semantics,
    partials_merge,
    score_semantics,
)
from attnfuse.errors import ArgumentError, AttnFuseError, IRError
from attnfuse.transforms import PASSES
from attnfuse.transforms.kernel_builder import assign_data_roles
from attnfuse.transforms.lower_to_tile import check_listed_filters
from attnfuse.transforms.place_rope import key_rotation

DECLARED_ARGUMENTS = (
    (attn.BiasType(), "bias", "additive_bias()"),
    (attn.LayoutType(), "block_layout", "block_sparse()"),
    (attn.DocIdsType(), "doc_ids", "document()"),
)
"""The variant argument types that are call-time keyword arguments: (type, keyword, the block
that reads it). A call accepts exactly these data keywords (and the positions)."""

DATA_KEYWORDS = {keyword: block for _kind, keyword, block in DECLARED_ARGUMENTS}
"""Each call-time data keyword and the block that reads it."""

FRONT_PIPELINE = "canonicalize-attn,analyze-masks"
"""The passes whose result is the variant's canonical form (before any shape decision)."""


@dataclass(frozen=True)
class DataBinding:
    """A call-time tensor the kernels read: the op that reads it, its use, and the kernel role
    it is bound to (None for data the runtime turns into other tensors, a block layout)."""

    op: Operation
    use: DataUse
    role: str | None

    def bind(self, problem: Any, arguments: dict[str, Any]) -> Any:
        """The tensor for a call of `problem` with keyword `arguments` (checked by the op)."""
        trait = score_semantics(self.op)
        assert trait is not None
        return trait.bind(self.op, self.use, problem, arguments)


def _check_listed_data(chain: list[Operation]) -> None:
    """Raises unless each listed filter (`KeyFilter.lists`) reads call-time data: the runtime
    builds a call's block lists from the tensor the caller passes for it (`block_layout=`,
    `doc_ids=`), so a listed filter without one would lower to kernels whose lists nothing
    makes. Checked where the program is compiled, not at its first call."""
    for op in chain:
        trait = op.get_trait(KeyFilter)
        if trait is None or trait.band(op) is not None or not trait.lists(op):
            continue
        if not any(use.argument is not None for use in trait.data(op)):
            raise IRError(f"{op.name}: a listed filter (KeyFilter.lists) must read call-time data (a DataUse "
                          "with a call keyword), from which the runtime builds its block lists; a filter "
                          "decided by positions alone is element-wise (lists False, a lower that tests "
                          "each entry)", op)


class Canonical:
    """One canonical attn program and the facts the runtime reads off it."""

    def __init__(self, module: ModuleOp):
        self.module = module
        # One variant: `VariantProgram` checked an attn program's, and the DSL builds one.
        self.variant = next(op for op in module.ops if isinstance(op, attn.VariantOp))
        self.scores, self.chain, self.normalizer = attn.score_chain(self.variant)
        check_listed_filters(self.chain)  # what lower-to-tile would refuse at the first call
        _check_listed_data(self.chain)
        self.text = anonymous_text(module)
        # The first score modifier whose backward cannot be lowered (not additive, and no
        # `vjp` of its own: `ScoreModifier.has_derivative`), or None. Such a variant compiles
        # forward kernels only and refuses calls that autograd records. Set here, not as a
        # cached property: a traced call reads it (`training_refusal`), and Dynamo cannot
        # enter the lock a cached property takes on its first read.
        self.underivable: Operation | None = next(
            (op for op in self.chain
             if (trait := op.get_trait(ScoreModifier)) is not None and not trait.has_derivative), None)

    @cached_property
    def normalizer_semantics(self) -> Normalizer:
        return normalizer_semantics(self.normalizer)

    @property
    def has_lse(self) -> bool:
        """Whether the normalizer gives a log-sum-exp (`return_lse=True` is allowed)."""
        return self.normalizer_semantics.has_lse

    @property
    def merges_splits(self) -> bool:
        """Whether split-KV decoding may split the keys (`Normalizer.merges_splits`)."""
        return partials_merge(self.normalizer_semantics)

    def training_refusal(self) -> str:
        """Why a call that autograd records cannot run, for a variant with an `underivable`
        op."""
        assert self.underivable is not None
        name = self.underivable.name
        return (f"'{name}' has no derivative (its ScoreModifier is not additive and defines no vjp): the "
                "variant runs forward only; call it under torch.no_grad() (or with inputs that do not "
                f"require grad), or give {name}'s semantics a vjp")

    @property
    def normalizer_name(self) -> str:
        return self.normalizer.name.removeprefix("attn.")

    @cached_property
    def rope(self) -> attn.RopeOp | None:
        """A rotation the scores read (query and key agree, the verifier checks), or None."""
        for operand in (self.scores.query, self.scores.key):
            if isinstance(operand.owner, attn.RopeOp):
                return operand.owner
        return None

    @cached_property
    def key_given(self) -> bool:
        """Whether the program says its keys arrive rotated (`#attn<placement given>` on the
        key rotation the scores read)."""
        rope = key_rotation(self.variant)
        return rope is not None and rope.given

    @cached_property
    def reads_positions(self) -> tuple[bool, bool]:
        """Whether a rotation the scores read takes call-time query / key positions."""
        reads = [False, False]
        for operand, index in ((self.scores.query, 0), (self.scores.key, 1)):
            op = operand.owner
            if isinstance(op, attn.RopeOp) and op.positions is not None:
                reads[index] = True
        return reads[0], reads[1]

    @property
    def rotary_dim(self) -> int | None:
        """The rotation's explicit rotary width, or None (the head dim, or no rotation)."""
        rope = self.rope
        return None if rope is None or rope.rotary_dim is None else rope.rotary_dim.value.data

    @property
    def scale(self) -> float | None:
        """The static score scale, or None for `1/sqrt(D)`."""
        return None if self.scores.scale is None else self.scores.scale.value.data

    @cached_property
    def band(self) -> tuple[int | None, int | None]:
        """The band of key offsets the program keeps: what analyze-masks recorded on its mask
        (canonicalize-attn has merged the masks into one), unbounded without one."""
        for op in self.chain:
            recorded = op.properties.get("band")
            if isinstance(recorded, attn.BandAttr):
                return recorded.bounds
        return (None, None)

    @cached_property
    def block_size(self) -> int | None:
        """The block-sparse layout's block size, or None."""
        for op in self.chain:
            trait = op.get_trait(KeyFilter)
            if trait is not None and trait.block_size(op) is not None:
                return trait.block_size(op)
        return None

    @cached_property
    def bindings(self) -> tuple[DataBinding, ...]:
        """Every call-time tensor the program's ops read, in program order."""
        # As lower-to-tile assigns them: modifiers, then the filters other than the band.
        modifiers = [op for op in self.chain if op.has_trait(ScoreModifier)]
        filters = [op for op in self.chain if (t := op.get_trait(KeyFilter)) is not None
                   and t.band(op) is None]
        roles = assign_data_roles([*modifiers, *filters])
        result = []
        for op in self.chain:
            trait = score_semantics(op)
            assert trait is not None
            for use in trait.data(op):
                result.append(DataBinding(op, use, roles.get((op, use.kind))))
        return tuple(result)

    @cached_property
    def arguments(self) -> frozenset[str]:
        """The keyword arguments a call may pass for the program's data: those its ops read,
        and those its variant declares (`!attn.bias`: `bias=`, `!attn.layout`:
        `block_layout=`) even where nothing reads them."""
        read = {b.use.argument for b in self.bindings if b.use.argument is not None}
        declared = {name for kind, name, _block in DECLARED_ARGUMENTS
                    if self.variant.argument(kind) is not None}
        return frozenset(read | declared)

    @cached_property
    def listed(self) -> tuple[DataBinding, ...]:
        """The bindings of the filters whose iteration space is block lists
        (`KeyFilter.lists`), from whose data the runtime builds the lists."""
        result = []
        for binding in self.bindings:
            trait = binding.op.get_trait(KeyFilter)
            if trait is not None and trait.lists(binding.op):
                result.append(binding)
        return tuple(result)

    @cached_property
    def outside_ops(self) -> tuple[str, ...]:
        """The names of the score and normalizer ops defined outside the package (a block
        module's, `attnfuse.blocks.register_block_module`): what no measurement of the
        built-in blocks speaks for (`gluon_forward.variant_classes`)."""
        ops = [*self.chain, self.normalizer]
        return tuple(op.name for op in ops if not type(op).__module__.startswith("attnfuse."))

    def reads(self, kind: str) -> bool:
        """Whether some op reads call-time data of `kind` (`bias`, `block_layout`, ...)."""
        return any(b.use.kind == kind for b in self.bindings)

    @property
    def keys_per_row(self) -> int | None:
        """The most keys one query row keeps under the band (a sliding window: `window` with
        causal, `2 * window - 1` without), or None when no band bounds it."""
        lo, hi = self.band
        return None if lo is None or hi is None else hi - lo + 1


def anonymous_text(module: ModuleOp) -> str:
    """The module printed without the names a writer chose (the variant's symbol, SSA value
    names), so that equal programs print equal: the compile cache keys on it."""
    from xdsl.dialects.builtin import StringAttr

    copy = module.clone()
    for op in copy.walk():
        if isinstance(op, attn.VariantOp):
            op.properties["sym_name"] = StringAttr("attention")
        for value in (*op.results, *(arg for region in op.regions for block in region.blocks for arg in block.args)):
            value.name_hint = None
    return str(copy)


def canonicalize(module: ModuleOp, what: str) -> ModuleOp:
    """`module` verified and run through `FRONT_PIPELINE` (in place), as an `AttnFuseError`
    naming `what` if it is not a well-formed attn program."""
    try:
        module.verify()
        PassPipeline.parse_spec(PASSES, FRONT_PIPELINE).apply(make_context(), module)
        module.verify()
    except (PassFailedException, VerifyException, DiagnosticException, IRError) as err:
        raise AttnFuseError(f"{what} is not a valid attn program: {err}") from err
    return module


POSITION_ARGUMENTS = ("q_positions", "k_positions")
"""The call's keyword arguments for query and key RoPE positions, in that order."""


class VariantProgram:
    """A variant as the runtime sees it: an attn program (from a spec or from IR)."""

    def __init__(self, source: Any):
        self.source = source
        self._fixed: ModuleOp | None = None
        self._canonical: dict[tuple[bool, bool], Canonical] = {}
        if isinstance(source, str):
            self._fixed = parse_attn(source)
        elif isinstance(source, ModuleOp):
            self._fixed = verified(source.clone())
        elif not hasattr(source, "module"):
            raise AttnFuseError(
                f"compile() takes a spec made by af.attention(...) or an attn module (text or "
                f"xDSL ModuleOp), got {source!r}"
            )
        if self._fixed is not None:
            variants = [op for op in self._fixed.ops if isinstance(op, attn.VariantOp)]
            if len(variants) != 1:
                raise AttnFuseError(
                    f"an attn module for af.compile holds one attn.variant at its top level, "
                    f"got {len(variants)}"
                )
            self._variant_name = variants[0].sym_name.data
            self._declared = tuple(
                variants[0].argument(attn.PositionsType(r)) is not None for r in ("query", "key")
            )

    def __repr__(self) -> str:
        return repr(self.source) if self._fixed is None else f"attn.variant @{self._variant_name}"

    def explicit_positions_of(self) -> tuple[bool, bool] | None:
        """For IR, whether it takes query / key positions (fixed by its arguments); None for
        a spec, which builds a program for either."""
        return None if self._fixed is None else self._declared  # type: ignore[return-value]

    def accepts_positions(self, index: int) -> bool:
        """Whether a call may pass the query (0) / key (1) positions: a spec with rope
        rotates at them; an attn program must declare them (`!attn.positions`)."""
        fixed = self.explicit_positions_of()
        if fixed is None:
            return self.default().rope is not None
        return fixed[index]

    @property
    def default_positions(self) -> tuple[bool, bool]:
        """The call-time positions a call passes unless told otherwise: none for a spec, those
        an attn program declares (`!attn.positions`)."""
        return self.explicit_positions_of() or (False, False)

    def default(self) -> Canonical:
        """The canonical program of a call with the default positions."""
        return self.canonical(self.default_positions)

    def module(self, explicit_positions: tuple[bool, bool]) -> ModuleOp:
        """A fresh, uncanonicalized attn module of the variant (an attn program's own, whatever
        positions are asked for: it declares its own)."""
        if self._fixed is None:
            return self.source.module(explicit_positions)
        return self._fixed.clone()

    def canonical(self, explicit_positions: tuple[bool, bool]) -> Canonical:
        """The canonical program for a call with (or without) query / key positions. An attn
        program's positions must be passed exactly where a rotation reads them, and may be
        passed only where the program declares them."""
        canonical = self._canonical.get(explicit_positions)
        if canonical is not None:
            return canonical
        what = "the attn program" if self._fixed is not None else repr(self.source)
        canonical = Canonical(canonicalize(self.module(explicit_positions), what))
        fixed = self.explicit_positions_of()
        if fixed is not None:
            for name, declared, read, passed in zip(
                POSITION_ARGUMENTS, fixed, canonical.reads_positions, explicit_positions
            ):
                if passed and not declared:
                    raise ArgumentError(f"{name}= given, but the attn program takes no positions for it")
                if read and not passed:
                    raise ArgumentError(f"the attn program rotates at !attn.positions: pass {name}=")
        self._canonical[explicit_positions] = canonical
        return canonical


REGISTER = "register its module first, attnfuse.blocks.register_block_module(module)"
"""How an out-of-tree block's op gets into the attn dialect, for a program that names it."""


def parse_attn(text: str) -> ModuleOp:
    """Parses attn IR text (a module or a bare `attn.variant`), as an `AttnFuseError` that
    names the location on failure, a parser's or a verifier's."""
    locations: dict[int, Span] = {}
    try:
        module = OpLocatingParser(make_context(), text, "<attn program>", locations).parse_module()
    except (ParseError, VerifyException, DiagnosticException) as err:
        raise AttnFuseError(f"cannot parse the attn program: {err}{unregistered_op_hint(str(err), REGISTER)}") from err
    return verified(module, locations)


def verified(module: ModuleOp, locations: dict[int, Span] | None = None) -> ModuleOp:
    """`module`, verified (an `AttnFuseError` saying what is wrong otherwise: at the innermost
    op that fails, `file:line:col: op: message`, where `locations` knows where it was parsed)."""
    try:
        module.verify()
    except VerifyException as err:
        found = innermost_failing_op([module])
        if found is None:
            raise AttnFuseError(f"the attn program is not valid: {err}") from err
        op, message = found
        where = location_of(op, locations or {})
        named = message if message.startswith(f"{op.name}: ") else f"{op.name}: {message}"
        raise AttnFuseError(f"the attn program is not valid: {where + ': ' if where else ''}{named}") from err
    return module


@cache
def program_of(source: Any, generation: int = 0) -> VariantProgram:
    """The `VariantProgram` of a hashable source (a spec, or IR text), made once per
    `generation` of the registered block modules (text parses to other ops after a change)."""
    return VariantProgram(source)


def as_program(source: Any) -> VariantProgram:
    """`source` as a `VariantProgram`: itself, or made (and for hashable sources, cached)."""
    if isinstance(source, VariantProgram):
        return source
    if isinstance(source, ModuleOp):
        return VariantProgram(source)
    if isinstance(source, str):
        from attnfuse.blocks import registry_generation

        return program_of(source, registry_generation())
    try:
        hash(source)
    except TypeError:  # a list, a dict: not cacheable, and VariantProgram names what it got
        return VariantProgram(source)
    return program_of(source)


__all__ = ["Canonical", "DataBinding", "VariantProgram", "as_program", "parse_attn"]

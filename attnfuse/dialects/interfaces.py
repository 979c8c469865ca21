"""The op interfaces of the `attn` dialect: what every pass, the runtime and the reference ask
of a block's op, so that each block's meaning lives in the block's own file.

An interface is an `OpTrait` with methods (as xDSL's `CallableOpInterface`): an op declares it
in its `traits`, and a pass asks `op.get_trait(ScoreModifier)` instead of testing the op's
class. Three roles exist between `attn.scores` and `attn.pv`:

- `ScoreModifier`: maps each score to a new score (`attn.alibi`, `attn.add_bias`,
  ...). It says what it commutes with (canonicalize-attn reorders only what
  commutes), how it lowers to tile ops inside a key loop, its vector-Jacobian product (the
  backward kernels apply it in reverse order), the call-time tensors it reads, and its float64
  meaning (the reference interpreter).
- `KeyFilter`: drops keys (`attn.mask`, `attn.block_sparse`, `attn.document`). A dropped
  entry is a *mark*, not a value: it stays dropped whatever a modifier does to it, so filters
  commute with every modifier, and kernels apply them after the whole modifier chain. A
  filter contributes to the iteration space (a band, or block lists the runtime builds from
  its data) and, where that is not exact per entry, a test in partial blocks (`lower`).
- `Normalizer`: turns scores into probabilities (`attn.softmax`, `attn.relu`,
  ...); exactly one per variant. It owns the forward loop's carried state and the
  backward's score gradient.

Lowering methods receive the kernel builder of `attnfuse.transforms.kernel_builder` (typed
`Any` here: the dialect does not depend on the passes); reference methods receive torch
tensors and an `Evaluation` (imported lazily: the dialect does not import torch).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from xdsl.ir import Operation, SSAValue
from xdsl.traits import OpTrait

from attnfuse.errors import IRError


@dataclass(frozen=True)
class DataUse:
    """A call-time tensor an op's kernels read.

    `kind` is the tile tensor role it binds (`tile.TENSOR_AXES` names the kinds: `slopes`,
    `bias`, ...); ops whose uses have equal `key` share one kernel argument (two `attn.alibi`
    with the default slopes read one slopes tensor), others get an argument each
    (`slopes`, `slopes_1`, ...).
    """

    kind: str
    key: tuple[Any, ...] = ()
    argument: str | None = None
    """The call's keyword argument the tensor is made from (`bias=`), or None when the op's
    own parameters make it (ALiBi's slopes)."""
    gradient: str | None = None
    """The tile role of the tensor's gradient, when the backward can give one (`dbias`; see
    `ScoreModifier.data_gradient`); the kernel that writes it is launched when the call's
    tensor requires a gradient."""


class ReadsCallData:
    """What the score ops share: the call-time tensors an op reads, and how they are made."""

    def data(self, op: Operation) -> Sequence[DataUse]:
        """The call-time tensors the op's kernels read (see `DataUse`); none by default."""
        del op
        return ()

    def bind(self, op: Operation, use: DataUse, problem: Any, arguments: dict[str, Any]) -> Any:
        """The tensor the kernels read for `use` (one of `data(op)`), made for a call of
        `problem` (the runtime's `Problem`) from the call's keyword `arguments`, checked
        (an `ArgumentError` naming the argument otherwise)."""
        raise NotImplementedError(f"{op.name} reads no call-time data")


@dataclass(frozen=True)
class ScoreModifier(ReadsCallData, OpTrait, abc.ABC):
    """Interface of an op that maps every score `s[b, h, i, j]` to a new score."""

    rank: int = 0
    """Where canonicalize-attn puts the op among ops it commutes with (lower first), so that
    programs meaning the same thing become the same IR."""
    additive: bool = False
    """Whether the op adds a term that does not depend on the scores (`s + t[b, h, i, j]`):
    additive modifiers commute with each other."""

    def commutes_with(self, op: Operation, other: Operation) -> bool:
        """Whether applying `op` then `other` equals applying `other` then `op` for all
        scores. Filters commute with every modifier (dropped entries are marks), additive
        modifiers with each other; anything else does not (the safe answer)."""
        del op
        if other.has_trait(KeyFilter):
            return True
        trait = other.get_trait(ScoreModifier)
        return self.additive and trait is not None and trait.additive

    @abc.abstractmethod
    def lower(self, op: Operation, kernel: Any, scores: SSAValue) -> SSAValue:
        """Appends the tile ops computing the op on one block of scores (inside a key or
        query loop of `kernel`); returns the new scores."""

    @property
    def has_derivative(self) -> bool:
        """Whether the backward can be lowered for the op: it is additive (derivative 1) or its
        semantics define their own `vjp`. A variant with a modifier that has none runs forward
        only (the runtime refuses a call that autograd records)."""
        return self.additive or type(self).vjp is not ScoreModifier.vjp

    def vjp(self, op: Operation, kernel: Any, scores_in: SSAValue, grad: SSAValue) -> SSAValue:
        """The gradient with respect to the op's input scores, given the gradient `grad` of
        its result and its input `scores_in` (recomputed, fp32): the default is an additive
        modifier's, whose derivative is 1; any other modifier must give its own (an `IRError`
        at the op otherwise, never a gradient computed as if it were additive; see
        `has_derivative`)."""
        del kernel, scores_in
        if not self.additive:
            raise IRError(f"'{op.name}' is not additive (its ScoreModifier has additive=False), so its "
                          "derivative is not 1: its ScoreModifier must define vjp() for the backward", op)
        return grad


    def data_gradient(
        self, op: Operation, kernel: Any, grad: SSAValue
    ) -> Sequence[tuple[str, SSAValue]]:
        """The gradients of call-time data that the gradient `grad` of the op's result gives,
        as (tile role, score-shaped tile) pairs. The backward sums the contributions per role
        and stores them where the kernel writes that role. By default, an additive modifier
        gives `grad` itself for each of its data with a `DataUse.gradient` role (`s + bias`:
        the bias's gradient is the result's); others give none."""
        del kernel
        if not self.additive:
            return ()
        return [(use.gradient, grad) for use in self.data(op) if use.gradient is not None]

    @abc.abstractmethod
    def evaluate(self, op: Operation, scores: Any, env: Any) -> Any:
        """The op's meaning on a float64 score tensor `[B, Hq, Nq, Nk]` (`env`: the
        reference's `Evaluation`, which holds the call's shapes and tensors)."""


@dataclass(frozen=True)
class KeyFilter(ReadsCallData, OpTrait, abc.ABC):
    """Interface of an op that drops keys: `s[b, h, i, j]` becomes a dropped entry."""

    rank: int = 100
    """As `ScoreModifier.rank`; filters sort after every modifier."""

    def band(self, op: Operation) -> tuple[int | None, int | None] | None:
        """The kept keys as offsets `(lower, upper)` from the query position (None for an
        unbounded side), or None when the filter is not a band."""
        del op
        return None

    def block_size(self, op: Operation) -> int | None:
        """The block size of a block-granular filter (its kernels walk block lists, and no
        kernel block may be larger)."""
        del op
        return None

    def lists(self, op: Operation) -> bool:
        """Whether the filter's iteration space is block lists that the runtime builds per
        call from the filter's data (`tiles`): block-granular filters, and element-wise
        filters whose data decides which tiles can keep anything (documents)."""
        return self.block_size(op) is not None

    def lower(self, op: Operation, kernel: Any, scores: SSAValue) -> SSAValue:
        """Appends the tile ops that drop the filter's entries from a *partial* block of
        scores (dropped entries become -inf; full blocks keep every entry and get nothing);
        returns the new scores. Bands and block-granular filters need nothing here (the band
        is `tile.mask`'s, blocks are whole), hence the default. A filter that is neither a
        band nor listed must define it (an element-wise filter: a test of each entry, from
        its positions, say): then no block is full, and the kernels mask every block they
        visit."""
        del op, kernel
        return scores

    @property
    def tests_entries(self) -> bool:
        """Whether the filter drops entries by a per-entry test of its own (`lower`): one that
        is neither a band nor listed must (an element-wise filter), and its kernels test every
        block they visit."""
        return type(self).lower is not KeyFilter.lower

    def tiles(
        self, op: Operation, data: Any, problem: Any, q_block: int, k_block: int
    ) -> tuple[Any, Any]:
        """For a filter with `lists`: which (query tile, key tile) pairs of `q_block` queries
        by `k_block` keys may keep an entry (`visit`) and which keep every in-sequence entry
        (`full`: no per-entry test needed), as bool tensors broadcastable to
        `[B, Hq, query tiles, key tiles]`, from `data` (what `bind` returned) for a call of
        `problem`. `visit` may be conservative (a visited tile is masked entry by entry);
        `full` must be exact. The runtime intersects them with the band's and every other
        listed filter's (`attnfuse.runtime.block_lists`)."""
        raise NotImplementedError(f"{op.name} has no block lists")

    @abc.abstractmethod
    def evaluate(self, op: Operation, env: Any) -> Any:
        """The kept entries as a bool tensor broadcastable to `[B, Hq, Nq, Nk]`."""


@dataclass(frozen=True)
class Normalizer(OpTrait, abc.ABC):
    """Interface of the op that turns scores into probabilities (one per variant)."""

    has_lse: bool = False
    """Whether the forward produces a log-sum-exp per row (softmax)."""
    merges_splits: bool = False
    """Whether outputs over disjoint key sets combine exactly as `tile.merge_splits` combines
    them. With `has_lse`: the output is `sum(exp(s - lse) v)` with `lse = log(sum(exp(s)))`
    over the kept keys, as softmax's, so partials merge through their log-sum-exps. Without:
    the output is `sum(f(s) v)` for a function `f` of each score alone, so partials add.
    Split-KV decoding (`lower-to-tile{decode=true}`) splits the keys only for such a
    normalizer; any other (softmax with a sink, a normalizer that divides by a count) decodes
    through the one-pass forward kernel. False unless a normalizer says so: a wrong True
    gives wrong decode outputs, a wrong False only a slower decode. Read it through
    `partials_merge`, which does not let a subclass inherit True with another forward."""
    smooth: bool = True
    """Whether the probabilities' derivative is continuous in the scores. relu's jumps at 0,
    so its backward must see scores computed from unrounded rotated q and k."""

    @abc.abstractmethod
    def state_names(self, op: Operation) -> tuple[str, ...]:
        """Names of the values the forward key loop carries (the accumulator first)."""

    @abc.abstractmethod
    def init_state(self, op: Operation, kernel: Any) -> Sequence[SSAValue]:
        """Emits the loop state's initial values. A state that `tile.softmax_update` carries
        has its row max in base-2 units (a natural max `m` is `m * log2(e)`; 0 is 0)."""

    @abc.abstractmethod
    def step(
        self, op: Operation, kernel: Any, state: Sequence[SSAValue], scores: SSAValue, value: SSAValue
    ) -> Sequence[SSAValue]:
        """Emits one key block's update of the state from its (masked) scores and values."""

    @abc.abstractmethod
    def finalize(
        self, op: Operation, kernel: Any, state: Sequence[SSAValue]
    ) -> tuple[SSAValue, SSAValue | None]:
        """Emits the output rows (and the log-sum-exp when `has_lse`) from the final state."""

    @abc.abstractmethod
    def probs(self, op: Operation, kernel: Any, scores: SSAValue, lse: SSAValue | None) -> SSAValue:
        """Backward: the block's probabilities, recomputed from its scores (and the
        forward's log-sum-exp when `has_lse`)."""

    @abc.abstractmethod
    def grad_scores(
        self,
        op: Operation,
        kernel: Any,
        scores: SSAValue,
        probs: SSAValue,
        grad_probs: SSAValue,
        delta: SSAValue | None,
    ) -> SSAValue:
        """Backward: the gradient of the scores from that of the probabilities (`delta`:
        the per-row `rowsum(dO * O)`, for normalizers with `has_lse`)."""

    @abc.abstractmethod
    def evaluate(self, op: Operation, scores: Any, keep: Any, env: Any) -> tuple[Any, Any]:
        """The probabilities (and the log-sum-exp, or None) from float64 scores and the bool
        `keep` mask of kept entries; a row with no kept key has probabilities 0."""


FORWARD_METHODS = ("state_names", "init_state", "step", "finalize")
"""The `Normalizer` methods that make a forward's partial results (its loop state and output)."""


def partials_merge(normalizer: Normalizer) -> bool:
    """Whether split-KV decoding may split the keys of `normalizer`: its `merges_splits`, as
    declared by the class that set it, and only while the normalizer keeps that class's
    forward. A subclass that changes the loop state or the output (softmax with a sink: a
    changed `init_state`) has other partial results, which the parent's True does not cover,
    until the subclass declares `merges_splits` itself."""
    cls = type(normalizer)
    declarer = next(klass for klass in cls.__mro__ if "merges_splits" in vars(klass))
    return normalizer.merges_splits and all(
        getattr(cls, method) is getattr(declarer, method) for method in FORWARD_METHODS)


def score_semantics(op: Operation) -> ScoreModifier | KeyFilter | None:
    """The interface an op between the scores and the normalizer implements, or None."""
    return op.get_trait(ScoreModifier) or op.get_trait(KeyFilter)


def canonical_rank(op: Operation) -> int | None:
    """Where a score op sorts among the ops it commutes with (`ScoreModifier.rank`,
    `KeyFilter.rank`), or None for other ops: the order canonicalize-attn and spec identity
    (`dsl/spec.canonical_key`) give commuting ops."""
    trait = score_semantics(op)
    return None if trait is None else trait.rank


def canonical_order(op: Operation) -> tuple[int, str, tuple[tuple[str, str], ...]] | None:
    """A total order of score ops for canonicalize-attn (None for other ops): the canonical
    rank, then the op's name, then its attributes as printed, so that two commuting ops of
    one rank (a block author's modifier at ALiBi's rank, two ALiBi ops with other slopes) still
    sort one way, and programs that write them in either order print alike."""
    rank = canonical_rank(op)
    if rank is None:
        return None
    attributes = {**op.properties, **op.attributes}
    return rank, op.name, tuple(sorted((name, str(value)) for name, value in attributes.items()))


def commute(first: Operation, second: Operation) -> bool:
    """Whether `first` then `second` may be swapped: both must say so, since each op knows
    only its own algebra (a filter commutes with every modifier; a modifier knows which
    modifiers it commutes with)."""
    def says(a: Operation, b: Operation) -> bool:
        modifier = a.get_trait(ScoreModifier)
        if modifier is not None:
            return modifier.commutes_with(a, b)
        return a.has_trait(KeyFilter) and (b.has_trait(ScoreModifier) or b.has_trait(KeyFilter))

    return says(first, second) and says(second, first)


def normalizer_semantics(op: Operation) -> Normalizer:
    """The `Normalizer` interface of a normalizer op."""
    trait = op.get_trait(Normalizer)
    assert trait is not None, op.name
    return trait


__all__ = ["FORWARD_METHODS", "DataUse", "KeyFilter", "Normalizer", "ReadsCallData", "ScoreModifier",
           "canonical_order", "canonical_rank", "commute", "normalizer_semantics", "partials_merge", "score_semantics"]

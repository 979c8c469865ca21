"""Documents, `document()`: padding and packed sequences without a dense mask.

Meaning: with call-time `doc_ids=` (int32 or int64, `[Nk]` or per batch `[B, Nk]`), key j is
kept for query i iff both lie in one document: `doc_ids[q_pos(i)] == doc_ids[j]`, where
`q_pos(i) = i + Nk - Nq` (bottom-right aligned, as every mask). Negative ids are padding: a
key with one is never kept, and a query with one keeps nothing (its output row is 0 and, for
softmax, its lse -inf). A query position outside `[0, Nk)` (only when `Nq > Nk`) has no
document either. RoPE positions per document are the caller's (`q_positions=`,
`k_positions=`): they change only the rotation, never this filter.

DSL and IR: a mask-category block (`stage` 0, the user's order) building
`attn.document %scores, %doc_ids` on the variant's `!attn.doc_ids` argument. Algebra: a
`KeyFilter` of rank 102 (after `attn.mask` and `attn.block_sparse`): it commutes with every
modifier, and its keep mask ANDs with the other filters'.

Kernels: the filter is listed (`lists`). Per call, the runtime asks `tiles` which
(query tile, key tile) pairs can meet: each tile's smallest and largest non-padding id must
overlap (conservative for unsorted ids, exact for sorted ones), and a pair is *full* when
every in-sequence row of both tiles has one and the same id. The kernels walk those lists
(`attnfuse.runtime.block_lists`, intersected with a band and a block-sparse layout), skip
tiles whose documents cannot meet, run full tiles without a test, and test each entry of the
partial ones with `tile.document_mask`. No dense mask is ever materialized. The derivative is
a filter's: dropped entries have probability 0, hence gradient 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.irdl import IRDLOperation, irdl_op_definition, operand_def, result_def, traits_def
from xdsl.traits import Pure

from attnfuse.dialects import tile
from attnfuse.dialects.attn import DocIdsType, ScoresType
from attnfuse.dialects.interfaces import DataUse, KeyFilter
from attnfuse.dsl.blocks import Block
from attnfuse.errors import ArgumentError


def check_doc_ids(doc_ids: object, batch: int, seq_k: int, device: Any = None) -> Any:
    """`doc_ids` checked (an `ArgumentError` naming it otherwise) for a call with `batch`
    sequences of `seq_k` keys (on `device`, when given), as a `[B, Nk]` view."""
    import torch

    if doc_ids is None:
        raise ArgumentError("document() needs doc_ids= at call time")
    if not isinstance(doc_ids, torch.Tensor):
        raise ArgumentError(f"doc_ids must be a torch.Tensor, got {type(doc_ids).__name__}")
    if doc_ids.dtype not in (torch.int32, torch.int64):
        raise ArgumentError(f"doc_ids must be int32 or int64, got {doc_ids.dtype}")
    if device is not None and doc_ids.device != device:
        raise ArgumentError(f"doc_ids is on {doc_ids.device}, but q is on {device}")
    if list(doc_ids.shape) not in ([seq_k], [batch, seq_k]):
        raise ArgumentError(
            f"doc_ids must have shape [{seq_k}] or [{batch}, {seq_k}] (one id per key), got "
            f"{list(doc_ids.shape)}"
        )
    return doc_ids.expand(batch, seq_k)


def query_documents(doc_ids: Any, seq_q: int) -> Any:
    """The document of each query, `[B, Nq]`: `doc_ids[:, i + Nk - Nq]`, or -1 (no
    document) where that position is negative."""
    import torch

    seq_k = doc_ids.shape[-1]
    if seq_k == 0:  # no key: no query position has a document
        return torch.full((doc_ids.shape[0], seq_q), -1, dtype=doc_ids.dtype, device=doc_ids.device)
    q_pos = torch.arange(seq_q, device=doc_ids.device) + (seq_k - seq_q)
    ids = doc_ids[:, q_pos.clamp(min=0)]
    return torch.where(q_pos >= 0, ids, torch.full_like(ids, -1))


def _tile_ranges(ids: Any, block: int) -> tuple[Any, Any, Any]:
    """Per tile of `block` rows of `ids [B, N]`: the smallest and largest non-padding id
    (lowest: a huge value, highest: -1 when the tile has none), and whether every row of the
    tile inside the sequence has one and the same non-padding id."""
    import torch

    batch, n = ids.shape
    tiles = -(-n // block)
    padded = torch.nn.functional.pad(ids, (0, tiles * block - n), value=-1).view(batch, tiles, block)
    inside = (torch.arange(tiles * block, device=ids.device) < n).view(tiles, block)
    real = padded >= 0
    lowest = torch.where(real, padded, torch.full_like(padded, torch.iinfo(torch.int64).max)).amin(-1)
    highest = padded.amax(-1)
    one_document = ~(inside & ~real).any(-1) & (lowest == highest)
    return lowest, highest, one_document


@dataclass(frozen=True)
class DocumentSemantics(KeyFilter):
    """What `attn.document` means: keep pairs of one document, read from call-time ids."""

    rank: int = 102

    def lists(self, op: Operation) -> bool:
        return True

    def data(self, op: Operation) -> Sequence[DataUse]:
        return (DataUse("doc_ids", argument="doc_ids"),)

    def bind(self, op: Operation, use: DataUse, problem: Any, arguments: dict[str, Any]) -> Any:
        """The ids as the `[B, Nk]` view the kernels read (batch stride 0 when shared)."""
        return check_doc_ids(arguments.get("doc_ids"), problem.batch, problem.seq_k, problem.device)

    def lower(self, op: Operation, kernel: Any, scores: SSAValue) -> SSAValue:
        doc_ids = kernel.data_arg(op, "doc_ids")
        return kernel.add(tile.DocumentMaskOp(scores, doc_ids), "scores").results[0]

    def tiles(self, op: Operation, data: Any, problem: Any, q_block: int, k_block: int) -> tuple[Any, Any]:
        """Tiles whose documents can meet (their id ranges overlap), and tiles one document
        fills, `[B, 1, query tiles, key tiles]`."""
        import torch

        keys = data.to(torch.int64)
        q_low, q_high, q_one = _tile_ranges(query_documents(keys, problem.seq_q), q_block)
        k_low, k_high, k_one = _tile_ranges(keys, k_block)
        q_low, q_high, q_one = q_low[:, :, None], q_high[:, :, None], q_one[:, :, None]
        k_low, k_high, k_one = k_low[:, None, :], k_high[:, None, :], k_one[:, None, :]
        visit = (q_high >= 0) & (k_high >= 0) & (q_low <= k_high) & (k_low <= q_high)
        full = q_one & k_one & (q_low == k_low)
        return visit[:, None], full[:, None]

    def evaluate(self, op: Operation, env: Any) -> Any:
        """`[B, 1, Nq, Nk]`: same document, and not padding."""
        keys = check_doc_ids(env.tensors.get("doc_ids"), env.batch, env.seq_k).to(env.device)
        queries = query_documents(keys, env.seq_q)
        return ((queries[:, :, None] == keys[:, None, :]) & (keys[:, None, :] >= 0))[:, None]


@irdl_op_definition
class DocumentOp(IRDLOperation):
    """Drops key j for query i unless both lie in one document:
    `doc_ids[i + Nk - Nq] == doc_ids[j] >= 0` (negative ids are padding, which keeps and is
    kept by nothing). Its operand types are all it constrains: `!attn.doc_ids` is only ever a
    variant argument."""

    name = "attn.document"

    input = operand_def(ScoresType)
    doc_ids = operand_def(DocIdsType)
    result = result_def(ScoresType)

    assembly_format = "$input `,` $doc_ids attr-dict"
    traits = traits_def(Pure(), DocumentSemantics())

    def __init__(self, scores: SSAValue, doc_ids: SSAValue):
        super().__init__(operands=[scores, doc_ids], result_types=[ScoresType()])


@dataclass(frozen=True, repr=False)
class Document(Block):
    """Keep key j for query i iff both lie in one document of `doc_ids`."""

    category: ClassVar[str] = "mask"
    arguments: ClassVar[tuple[Attribute, ...]] = (DocIdsType(),)
    hint: ClassVar[str] = "kept"

    def build(self, variant: Any, value: SSAValue) -> Operation:
        doc_ids = variant.argument(DocIdsType())
        assert doc_ids is not None
        return DocumentOp(value, doc_ids)


def document() -> Document:
    """Keep only the keys in each query's document; pass `doc_ids=` (int32 or int64, `[Nk]`
    or `[B, Nk]`: one id per key position, negative for padding) at call time. The query at
    position `i + Nk - Nq` belongs to `doc_ids[i + Nk - Nq]`; a padding query outputs 0."""
    return Document()


OPS = (DocumentOp,)

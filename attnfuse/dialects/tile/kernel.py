"""`tile.kernel` (one GPU kernel: parameters, grid, tuning attributes, and the invariants that
tie them to its body) and `tile.return`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from xdsl.dialects.builtin import (
    ArrayAttr,
    FunctionType,
    IntegerAttr,
    StringAttr,
    SymbolNameConstraint,
    i64,
)
from xdsl.dialects.utils import parse_func_op_like, print_func_op_like
from xdsl.ir import (
    Attribute,
    Block,
    Region,
    SSAValue,
)
from xdsl.irdl import (
    IRDLOperation,
    irdl_op_definition,
    lazy_traits_def,
    prop_def,
    region_def,
    traits_def,
)
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.traits import (
    HasParent,
    IsolatedFromAbove,
    IsTerminator,
    SymbolOpInterface,
)
from xdsl.utils.exceptions import VerifyException

from attnfuse.dialects.dominance import check_defined_before_use
from attnfuse.dialects.tile.splits import (
    MergeLastSplitOp,
    MergeSplitsOp,
)
from attnfuse.dialects.tile.types import (
    BlockOrder,
    BlockOrderAttr,
    Grid,
    GridAttr,
    ScheduleAttr,
    TensorType,
    element_type_name,
)

GRIDS = {
    "query_blocks": "one program per (batch x query head, query block)",
    "key_blocks": "one program per (batch x key/value head, key block)",
    "kv_splits": "one program per (batch x key/value head x block of the group's query rows, "
                 "split of the key range)",
    "appended_keys": "one program per (batch x key/value head, block of new keys)",
}
"""Launch grids. The grid fixes the orientation of score tiles: in a `query_blocks` kernel
the program's rows are queries and a loop's rows are keys, so scores are `query x key`; in a
`key_blocks` kernel (the dK/dV backward) the program's rows are keys and a loop's rows are
queries, so every score-shaped tile is transposed, `key x query`. Ops that need positions
(masks, ALiBi, bias, RoPE) read the orientation from the grid.

A `kv_splits` kernel (split-KV decoding) is oriented as `query_blocks`, but its program's
rows are the (query head, query) pairs of every query head that shares one key/value head
(row `r` is query `r % Nq` of the group's head `r // Nq`), so K and V are read once per
group, and its programs split the key range: program `(.., s)` visits the keys of split
`s` only (`tile.kv_split`) and writes its partial output and log-sum-exp (`o_part`,
`lse_part`), which `tile.merge_splits` combines.

An `appended_keys` kernel (a cache append) owns a block of new keys of one (batch, key/value
head): its row `r` is the key at cache position `kv_lens[batch] + r`, which is its position
(for RoPE) and the row it is stored at in `k_cache` / `v_cache` (through the block table of
a paged cache); rows past the cache's capacity, or on a page outside the pools, are not
written."""


def _is_power_of_two(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


HOPPER_SHARED_BYTES = 232448
"""Shared memory one program of an sm_90 SM may take (227 KB): what a warp-specialized
forward's buffers must fit (`KernelOp.verify_forward_resources`)."""


@irdl_op_definition
class KernelOp(IRDLOperation):
    """One GPU kernel: its tensor parameters, launch grid and tuning attributes.

    Attributes: `grid` (see `GRIDS`), `block_m` (rows a program owns), `block_n` (key rows per
    loop step), `num_warps`, `num_stages` (software-pipelining depth), `head_dim`,
    `head_dim_v`, optional `rotary_dim`, `element_type` (the inputs' type), optional
    `block_order` (`#tile<order ...>`, ascending when absent), optional `head_major` (1: a
    `query_blocks` kernel's grid is one axis, program `p` owning block `p % blocks` (counted
    from the end under descending order) of batch x head `p // blocks`, so the programs running
    at once are consecutive blocks of few heads,
    which share those heads' keys and values in L2; 0, the default when absent: batch x head on
    grid axis 0, which the GPU walks fastest, blocks on axis 1), optional `shared_offsets`
    (`["do", "q"]`, set by `share-offsets`: when the runtime finds the two roles' row and
    column strides equal, the first role's loop loads reuse the second's offsets),
    optional `page_size` and optional `page_lookahead` (a paged kernel's key loops read the
    block-table entries of a step this many steps ahead: 1, the default when absent, reads
    the next step's entries during a step, so no K/V address waits on a table load in its
    own step and the loads software-pipeline like a contiguous cache's; 0 reads them in the
    step that uses them), optional `hoist_page_rows` (1, the default when absent: where a
    step's keys start a page or lie in one, each key's row in its page is the same every
    step and is computed once before the loop, and a step's table entries are indexed from
    its first key; 0: both from each key's position, every step), on a kernel that merges split partials optional `merge_stages`
    (the software-pipelining depth of its loop over the splits; 1, not pipelined, when
    absent), on a split decode's two kernels optional `pdl` (1: they overlap through
    programmatic dependent launch: the `kv_splits` kernel lets the kernel after it, the merge,
    launch while it runs, and the merge kernel, launched as its dependent, waits for it to
    complete before reading any partial result; 0, the default when absent: an ordinary
    launch after the split kernel has finished), and optional `schedule` (`#tile<schedule
    ...>`, with the integer attributes `producer_warps`, `consumer_registers` and optional
    `persistent`, or on the fused backward `producer_warps` and optional `dq_writers`; see
    `ScheduleAttr`).

    A kernel with a `kv_lens` parameter reads its key count per batch (`kv_lens[batch]`,
    clamped to the cache's length); one with a `block_table` parameter (and a `page_size`)
    reads a paged cache: its key-row operands (k, v) are page pools
    `[pages, Hkv, page_size, D]` and key `j` of batch `b` is row `j % page_size` of page
    `block_table[b, j // page_size]`. Both change only how rows are addressed and counted;
    positions (masks, ALiBi, RoPE) stay the logical key index `j`. A table entry outside the
    pools' `[0, pages)` is clamped to it where keys are read (the kernel reads no memory
    outside the pools), and a cache append writes nothing at such an entry.
    """

    name = "tile.kernel"

    body = region_def("single_block")
    sym_name = prop_def(SymbolNameConstraint())
    function_type = prop_def(FunctionType)

    traits = traits_def(IsolatedFromAbove(), SymbolOpInterface())

    INT_ATTRS: ClassVar[tuple[str, ...]] = (
        "block_m",
        "block_n",
        "num_warps",
        "num_stages",
        "head_dim",
        "head_dim_v",
    )
    OPTIONAL_INT_ATTRS: ClassVar[tuple[str, ...]] = (
        "rotary_dim", "page_size", "page_lookahead", "hoist_page_rows", "merge_stages", "pdl",
        "producer_warps", "consumer_registers", "persistent", "dq_writers",
    )
    """Integer attributes a kernel may have: each must be an integer when present (the printer
    reads them as ints; another attribute would read as absent and change the kernel)."""

    def __init__(
        self,
        name: str,
        roles: Sequence[str],
        *,
        grid: str,
        element_type: Attribute,
        config: dict[str, int],
    ):
        arg_types = [TensorType(role) for role in roles]
        super().__init__(
            properties={
                "sym_name": StringAttr(name),
                "function_type": FunctionType.from_lists(arg_types, []),
            },
            attributes={
                "grid": GridAttr(Grid(grid)),
                "element_type": element_type,
                **{key: IntegerAttr(value, i64) for key, value in config.items()},
            },
            regions=[Region(Block(arg_types=arg_types))],
        )
        for arg, role in zip(self.body.block.args, roles):
            arg.name_hint = role

    def int_attr(self, key: str) -> int | None:
        """An integer attribute, or None when absent."""
        attr = self.attributes.get(key)
        return attr.value.data if isinstance(attr, IntegerAttr) else None

    def get(self, key: str) -> int:
        """A required integer attribute (the verifier guarantees it)."""
        value = self.int_attr(key)
        assert value is not None, key
        return value

    @property
    def grid(self) -> str:
        attr = self.attributes["grid"]
        assert isinstance(attr, GridAttr)
        return attr.data

    @property
    def elem(self) -> str:
        return element_type_name(self.attributes["element_type"])

    @property
    def rotary_dim(self) -> int:
        """The rotary width: the `rotary_dim` attribute, or the head dim when absent."""
        value = self.int_attr("rotary_dim")
        return self.get("head_dim") if value is None else value

    @property
    def block_order(self) -> str:
        """`ascending` or `descending` (see `BlockOrderAttr`)."""
        attr = self.attributes.get("block_order")
        return attr.data if isinstance(attr, BlockOrderAttr) else BlockOrder.ASCENDING

    @property
    def schedule(self) -> str | None:
        """`warp_specialized`, or None for the portable schedule (see `ScheduleAttr`)."""
        attr = self.attributes.get("schedule")
        return attr.data if isinstance(attr, ScheduleAttr) else None

    @property
    def page_lookahead(self) -> int:
        """How many steps ahead a paged kernel's key loops read block-table entries (1 when
        the attribute is absent)."""
        value = self.int_attr("page_lookahead")
        return 1 if value is None else value

    @property
    def hoist_page_rows(self) -> int:
        """1 when a paged kernel's key loops compute the keys' rows in their pages once
        before the loop (where steps start pages or lie in one), 0 when every step computes
        them from the keys' positions (1 when the attribute is absent)."""
        value = self.int_attr("hoist_page_rows")
        return 1 if value is None else value

    @property
    def pdl(self) -> int:
        """1 when the kernel takes part in a split decode's programmatic dependent launch
        (the `pdl` attribute; 0 when absent)."""
        return self.int_attr("pdl") or 0

    @property
    def shared_offsets(self) -> tuple[str, ...] | None:
        """(follower, leader) roles whose loop loads may share offsets, or None."""
        attr = self.attributes.get("shared_offsets")
        if attr is None:
            return None
        if not isinstance(attr, ArrayAttr) or not all(isinstance(a, StringAttr) for a in attr.data):
            raise VerifyException(f"shared_offsets must be an array of role names, got {attr}")
        return tuple(a.data for a in attr.data)

    @property
    def roles(self) -> list[str]:
        """The tensor parameters' roles, in order."""
        return [t.role.data for t in self.function_type.inputs.data if isinstance(t, TensorType)]

    def argument(self, role: str) -> SSAValue:
        """The block argument bound to a tensor role."""
        return self.body.block.args[self.roles.index(role)]

    def _smallest(self, key: str) -> int:
        """The smallest `block_m` / `block_n`: 16, `tl.dot`'s smallest operand side; a split
        merge's rows multiply nothing, so it may own a single query row (the merge kernel
        of one-token decoding)."""
        if key == "block_m" and any(isinstance(op, MergeSplitsOp) for op in self.body.walk()):
            return 1
        return 16

    def header_problem(self) -> str | None:
        """What is wrong with the attributes every other check reads (the grid, the element
        type, the integer attributes), or None. The ops inside a kernel verify before it, and
        skip their checks against a kernel with a problem here (`checks.kernel_of`), which the
        kernel's own verifier then reports at the kernel."""
        if not isinstance(self.attributes.get("grid"), GridAttr):
            return f"kernel grid must be one of {', '.join(GRIDS)}"
        for key in self.INT_ATTRS:
            if self.int_attr(key) is None:
                return f"kernel needs an integer attribute '{key}'"
        for key in self.OPTIONAL_INT_ATTRS:
            attr = self.attributes.get(key)
            if attr is not None and not isinstance(attr, IntegerAttr):
                return f"kernel attribute '{key}' must be an integer, got {attr}"
        rotary = self.int_attr("rotary_dim")
        if rotary is not None and (rotary <= 0 or rotary % 2 or rotary > self.get("head_dim")):
            # The ops' column checks read the rotary width: checked with the header.
            return f"rotary_dim must be even and in (0, head_dim={self.get('head_dim')}], got {rotary}"
        try:
            element_type_name(self.attributes.get("element_type", StringAttr("none")))
        except VerifyException as error:
            return str(error)
        return None

    def verify_(self) -> None:
        problem = self.header_problem()
        if problem is not None:
            raise VerifyException(problem)
        # A warp-specialized kernel's rows are whole consumer warpgroups (verify_schedule):
        # three of them own 192 rows.
        sized = ("block_n",) if isinstance(self.attributes.get("schedule"), ScheduleAttr) else ("block_m", "block_n")
        for key in sized:
            if not (_is_power_of_two(self.get(key)) and self.get(key) >= self._smallest(key)):
                raise VerifyException(f"{key} must be a power of two >= {self._smallest(key)}, got {self.get(key)}")
        if self.get("num_warps") not in (1, 2, 4, 8, 12, 16) or (self.get("num_warps") == 12 and "schedule" not in self.attributes):
            # 12 only for three warp-specialized consumers (verify_schedule).
            raise VerifyException(f"num_warps must be 1, 2, 4, 8 or 16, got {self.get('num_warps')}")
        if self.get("num_stages") < 1:
            raise VerifyException(f"num_stages must be >= 1, got {self.get('num_stages')}")
        for key in ("head_dim", "head_dim_v"):
            if not 1 <= self.get(key) <= 256:
                raise VerifyException(f"{key} must be in [1, 256], got {self.get(key)}")
        check_defined_before_use(self)
        args = self.function_type.inputs.data
        if not all(isinstance(t, TensorType) for t in args):
            raise VerifyException("kernel parameters must all be !tile.tensor")
        if len(set(self.roles)) != len(self.roles):
            raise VerifyException("each tensor role may be bound to one kernel parameter only")
        if tuple(self.body.block.arg_types) != tuple(args):
            raise VerifyException("entry block arguments must match the kernel's parameters")
        if self.function_type.outputs.data:
            raise VerifyException("a kernel returns nothing: it writes its output tensors")
        order = self.attributes.get("block_order")
        if order is not None and not isinstance(order, BlockOrderAttr):
            raise VerifyException(f"block_order must be a #tile<order ...>, got {order}")
        self.verify_schedule()
        self.verify_head_major()
        page_size = self.int_attr("page_size")
        paged = "block_table" in self.roles
        if paged != (page_size is not None):
            raise VerifyException(
                "a kernel reading a paged cache has a block_table parameter and an integer "
                "'page_size' attribute, both or neither"
            )
        if page_size is not None and page_size < 1:
            raise VerifyException(f"page_size must be >= 1, got {page_size}")
        merge_stages = self.attributes.get("merge_stages")
        if merge_stages is not None and (self.int_attr("merge_stages") or 0) < 1:
            raise VerifyException(f"merge_stages must be an integer >= 1, got {self.int_attr('merge_stages')}")
        lookahead = self.attributes.get("page_lookahead")
        if lookahead is not None:
            if not paged:
                raise VerifyException("page_lookahead is an attribute of a paged kernel (one with a block_table parameter)")
            if self.int_attr("page_lookahead") not in (0, 1):
                raise VerifyException(f"page_lookahead must be 0 or 1, got {self.int_attr('page_lookahead')}")
        if self.attributes.get("hoist_page_rows") is not None:
            if not paged:
                raise VerifyException("hoist_page_rows is an attribute of a paged kernel (one with a block_table parameter)")
            if self.int_attr("hoist_page_rows") not in (0, 1):
                raise VerifyException(f"hoist_page_rows must be 0 or 1, got {self.int_attr('hoist_page_rows')}")
        self.verify_pdl()
        if paged and "kv_lens" not in self.roles:
            raise VerifyException("a paged kernel needs a kv_lens parameter: the pages hold no length")
        if self.grid == "appended_keys" and "kv_lens" not in self.roles:
            raise VerifyException("an appended_keys kernel needs a kv_lens parameter: the new keys go after the cached ones")
        if paged and self.grid == "key_blocks":
            raise VerifyException("a paged cache is accessed by query_blocks, kv_splits and "
                                  "appended_keys kernels only")
        if self.shared_offsets is not None:
            missing = [r for r in self.shared_offsets if r not in self.roles]
            if len(self.shared_offsets) != 2 or missing:
                raise VerifyException(
                    "shared_offsets names two of the kernel's tensor roles (follower, leader), "
                    f"got {list(self.shared_offsets)}"
                )

    def verify_pdl(self) -> None:
        """`pdl` belongs to the two kernels of a split decode merged by a second kernel: the
        `kv_splits` kernel (the primary) and the one that merges its partials
        (`tile.merge_splits`, the dependent). A split kernel that merges its own splits
        (`tile.merge_last_split`) has no dependent kernel to launch early."""
        if self.attributes.get("pdl") is None:
            return
        value = self.int_attr("pdl")
        if value not in (0, 1):
            raise VerifyException(f"pdl must be 0 or 1, got {self.attributes['pdl'] if value is None else value}")
        walk = list(self.body.walk())
        if self.grid == "kv_splits":
            if any(isinstance(op, MergeLastSplitOp) for op in walk):
                raise VerifyException("pdl: a kv_splits kernel that merges its own splits "
                                      "(tile.merge_last_split) has no dependent kernel to launch early")
            return
        if not any(isinstance(op, MergeSplitsOp) for op in walk):
            raise VerifyException("pdl is an attribute of a split decode's kernels: a kv_splits "
                                  "kernel or the kernel that merges its partials (tile.merge_splits)")

    @property
    def head_major(self) -> bool:
        """Whether the grid is head-major (see the class docstring; False when absent)."""
        return bool(self.int_attr("head_major"))

    def verify_head_major(self) -> None:
        if self.attributes.get("head_major") is None:
            return
        if self.int_attr("head_major") not in (0, 1):
            raise VerifyException(f"head_major must be 0 or 1, got {self.int_attr('head_major')}")
        if self.head_major and self.grid != "query_blocks":
            raise VerifyException(f"head_major is an attribute of a query_blocks kernel, not of a {self.grid} one")
        if self.head_major and "schedule" in self.attributes:
            raise VerifyException("head_major is the portable grid's: a #tile<schedule ...> kernel walks its own")

    def verify_schedule(self) -> None:
        schedule = self.attributes.get("schedule")
        if schedule is None:
            for key in ("producer_warps", "consumer_registers", "persistent", "dq_writers"):
                if key in self.attributes:
                    raise VerifyException(f"'{key}' belongs to a #tile<schedule ...> kernel")
            return
        if not isinstance(schedule, ScheduleAttr):
            raise VerifyException(f"schedule must be a #tile<schedule ...>, got {schedule}")
        if self.grid == "key_blocks":
            self.verify_backward_schedule()
            return
        if self.grid != "query_blocks":
            raise VerifyException("a warp-specialized kernel owns query blocks (grid query_blocks) or, "
                                  "the fused backward's, key blocks (grid key_blocks)")
        warps, producers, registers = self.get("num_warps"), self.int_attr("producer_warps"), self.int_attr("consumer_registers")
        if warps % 4 or self.get("block_m") != 16 * warps:
            raise VerifyException(
                "a warp-specialized kernel's consumers are whole warpgroups of 16 rows per warp: "
                f"num_warps a multiple of 4 and block_m = 16 * num_warps, got {warps} and {self.get('block_m')}"
            )
        if producers is None or producers < 1:
            raise VerifyException("a warp-specialized kernel needs an integer 'producer_warps' >= 1")
        if registers is None or not 24 <= registers <= 255:
            raise VerifyException("a warp-specialized kernel needs an integer 'consumer_registers' in [24, 255]")
        if "persistent" in self.attributes and self.int_attr("persistent") not in (0, 1):
            raise VerifyException("'persistent' is an integer 0 or 1 (one program per SM walking the tiles)")
        if "dq_writers" in self.attributes:
            raise VerifyException("'dq_writers' belongs to a warp-specialized key_blocks kernel (the fused backward)")
        self.verify_forward_resources()

    def verify_forward_resources(self) -> None:
        """A warp-specialized forward fits a Hopper SM: its shared memory
        (`verify_forward_shared_memory`) and its consumers' registers
        (`verify_forward_registers`)."""
        self.verify_forward_shared_memory()
        self.verify_forward_registers()

    def verify_forward_registers(self) -> None:
        """A consumer thread's `consumer_registers` hold at least its share of the tiles it
        keeps across a key step: the output accumulator (64 rows x head_dim_v, fp32), the
        scores (64 x block_n, fp32) and their probabilities (64 x block_n, 16-bit), over a
        warpgroup's 128 threads. A lower bound (indices, row statistics and addresses come
        on top): a schedule below it cannot be allocated (ptxas: "Insufficient registers",
        as three consumers' 160 registers at head dim 256)."""
        keys, dim_v, registers = self.get("block_n"), self.get("head_dim_v"), self.int_attr("consumer_registers")
        parts = {"the output accumulator": 64 * dim_v, "the scores": 64 * keys, "the probabilities": 64 * keys // 2}
        needed = sum(parts.values()) // 128
        if registers is not None and needed > registers:
            listed = ", ".join(f"{what} {n // 128}" for what, n in parts.items())
            raise VerifyException(
                f"a warp-specialized kernel's consumer threads need at least {needed} registers ({listed}), "
                f"more than their consumer_registers = {registers}: fewer consumers (more registers each), "
                "or more consumer_registers")

    def verify_forward_shared_memory(self) -> None:
        """A warp-specialized forward's buffers fit a Hopper SM's shared memory
        (`HOPPER_SHARED_BYTES`): the query tile (block_m x head_dim), `num_stages` blocks of k
        (block_n x head_dim) and of v (block_n x head_dim_v), and with `persistent` an output
        buffer of its own (block_m x head_dim_v); 16-bit elements. (The printer's barriers and
        scratch take a few hundred bytes more; the buffers come in steps of kilobytes.)"""
        rows, keys, stages = self.get("block_m"), self.get("block_n"), self.get("num_stages")
        dim, dim_v = self.get("head_dim"), self.get("head_dim_v")
        parts = {"the query tile": rows * dim, f"{stages} stages of k and v": stages * keys * (dim + dim_v)}
        if self.int_attr("persistent") == 1:
            parts["the output buffer"] = rows * dim_v
        needed = 2 * sum(parts.values())
        if needed > HOPPER_SHARED_BYTES:
            listed = ", ".join(f"{what} {2 * n // 1024} KB" for what, n in parts.items())
            raise VerifyException(
                f"a warp-specialized kernel's buffers need {needed // 1024} KB of shared memory ({listed}), "
                f"more than Hopper's {HOPPER_SHARED_BYTES // 1024} KB: fewer keys per step (block_n), "
                "stages or consumers" + (", or no persistent grid" if "the output buffer" in parts else ""))

    def verify_backward_schedule(self) -> None:
        """A warp-specialized `key_blocks` kernel (the fused backward): one consumer partition
        of `num_warps` (4 or 8: one or two warpgroups of 64 keys, so `block_m = 16 *
        num_warps`) and a loader of `producer_warps`; the consumer is the kernel's own
        partition, which takes the registers the others leave (no `consumer_registers`);
        optional `dq_writers` (1 when absent): the warps issuing the `tile.store_add`s, 1 or 2
        (each owning one of the two dQ staging buffers, so every other step)."""
        warps, producers = self.get("num_warps"), self.int_attr("producer_warps")
        if warps not in (4, 8) or self.get("block_m") != 16 * warps:
            raise VerifyException(
                "a warp-specialized key_blocks kernel's consumer is one or two warpgroups of 64 keys: "
                f"num_warps 4 or 8 and block_m = 16 * num_warps, got {warps} and {self.get('block_m')}"
            )
        if producers is None or producers < 1:
            raise VerifyException("a warp-specialized kernel needs an integer 'producer_warps' >= 1")
        for key in ("consumer_registers", "persistent"):
            if key in self.attributes:
                raise VerifyException(f"'{key}' belongs to a warp-specialized query_blocks kernel, not a key_blocks one")
        if "dq_writers" in self.attributes and self.int_attr("dq_writers") not in (1, 2):
            raise VerifyException("'dq_writers' is an integer 1 or 2 (one writer warp per dQ staging buffer at most)")

    @classmethod
    def parse(cls, parser: Parser) -> KernelOp:
        name, inputs, outputs, region, extra, _arg_attrs, _res_attrs = parse_func_op_like(
            parser, reserved_attr_names=("sym_name", "function_type")
        )
        op = cls.create(
            properties={
                "sym_name": StringAttr(name),
                "function_type": FunctionType.from_lists(inputs, outputs),
            },
            attributes=dict(extra.data) if extra is not None else {},
            regions=[region],
        )
        return op

    def print(self, printer: Printer) -> None:
        print_func_op_like(
            printer,
            self.sym_name,
            self.function_type,
            self.body,
            self.attributes,
            reserved_attr_names=("sym_name", "function_type"),
        )


@irdl_op_definition
class ReturnOp(IRDLOperation):
    """Ends a kernel."""

    name = "tile.return"
    assembly_format = "attr-dict"
    traits = lazy_traits_def(lambda: (IsTerminator(), HasParent(KernelOp)))

"""Print `tile` kernels as Triton source.

Each `tile.kernel` becomes one `@triton.jit` function; each tile op becomes a few lines under
a comment naming the op, with values named after the IR's (`q_lo`, `scores`, `row_max`).
Alongside the source, `KernelInfo` tells the runtime how to call each kernel: its tensor
roles in order, its grid and its launch parameters.

The kernel ABI is uniform so the runtime can launch any kernel from its `KernelInfo`:

    kernel(<for each role: {role}_ptr, then one stride per axis of tile.role_axes(role)>,
           sm_scale, n_q, n_k, num_heads, group_size,
           [num_splits, split_len,]   # kernels of a split decode (`KernelInfo.splits`)
           <constexprs with defaults: block sizes and static dims>)

`num_heads` is the count of the heads the grid's programs own: query heads on
`query_blocks`, key/value heads on `key_blocks` and `kv_splits`. `n_k` is the key count (the
cache's capacity where the kernel reads `kv_lens`).

The printer translates; the decisions are the passes', visible in the tile IR: whether the
score scale is folded into the exponential (`fold-scale-into-exp`: `unscaled` scores), the
order of the row blocks (`block_order`), which loads may share offsets (`share-offsets`).
Facts of the generated code, not of the IR: `exp` is computed as `exp2` of the scores times
log2(e) (one FMA with the row max), f32 operands of a 16-bit kernel's product are split into
half-precision parts (`split_products`), and static dims are padded to powers of two (at
least 16, the smallest `tl.dot` operand) with masked loads and stores.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any, ClassVar

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.dialects import arith, math
from xdsl.dialects.builtin import FloatAttr
from xdsl.ir import Block, Operation, SSAValue
from xdsl.utils.target import Target

from attnfuse.dialects import tile
from attnfuse.dialects.attn import FP32_MIN_NORMAL, SOFTMAX_FLOOR
from attnfuse.errors import AttnFuseError

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453

MERGE_STEP_VALUES = 8192
"""The fp32 partial outputs a split merge's step aims at, `[BLOCK_M, splits, BLOCK_DV]`: 64
registers a thread at four warps (a step holds one split at least, so a 64-row program at head
dim 256 holds 16384)."""
MAX_SPLITS_PER_STEP = 64


def plus(expr: str, offset: int) -> str:
    """`expr + offset`, written the way a person would."""
    if offset == 0:
        return expr
    return f"{expr} + {offset}" if offset > 0 else f"{expr} - {-offset}"


def scale_expression(scale: FloatAttr | None) -> str:
    """A score scale in the generated code: the static value, or the kernel's `sm_scale`."""
    return "sm_scale" if scale is None else repr(scale.value.data)


def padded(width: int) -> int:
    """The power-of-two tile width holding `width` columns: at least 16 for `tl.dot`."""
    size = 16
    while size < width:
        size *= 2
    return size


@dataclass(frozen=True)
class KernelInfo:
    """How to launch one generated kernel."""

    name: str
    roles: tuple[str, ...]
    grid: str
    block_m: int
    num_warps: int
    num_stages: int
    shared_offsets: tuple[str, str] | None = None
    """(follower, leader): the kernel has a `SHARED_OFFSETS` constexpr; when the runtime sets
    it (the two roles' row and column strides are equal), the follower's loop loads use the
    leader's offsets (`tile.kernel`'s `shared_offsets`, set by `share-offsets`)."""
    splits: bool = False
    """The kernel takes `num_splits, split_len` after `group_size`: a split decode kernel
    (`kv_splits` grid) or the merge of its partial results."""
    launch_pdl: bool = False
    """The kernel is launched as a programmatic dependent of the kernel before it (Triton's
    `launch_pdl`): a split decode's merge printed with `pdl = 1` for a GPU, which waits for
    the split kernel (`gdc_wait`) before reading its partials."""


@dataclass(frozen=True)
class TritonProgram:
    """A generated Triton module: its source and how to launch each kernel in it."""

    source: str
    kernels: tuple[KernelInfo, ...]

    def kernel(self, name: str) -> KernelInfo:
        for info in self.kernels:
            if info.name == name:
                return info
        raise KeyError(name)


# --------------------------------------------------------------------------------------------
# Naming
# --------------------------------------------------------------------------------------------


class Namer:
    """Python identifiers for SSA values: the IR's name hint, made unique."""

    def __init__(self, reserved: set[str]):
        self.taken = set(reserved)
        self.names: dict[SSAValue, str] = {}
        self.pins: dict[SSAValue, str] = {}

    def fresh(self, hint: str) -> str:
        name, i = hint, 1
        while name in self.taken:
            name, i = f"{hint}_{i}", i + 1
        self.taken.add(name)
        return name

    def define(self, value: SSAValue, hint: str | None = None) -> str:
        if value in self.pins:
            name = self.names[value] = self.pins.pop(value)
            return name
        name = self.fresh(hint or value.name_hint or "value")
        self.names[value] = name
        return name

    def alias(self, value: SSAValue, name: str) -> None:
        """Bind `value` to an existing name (a loop-carried variable)."""
        self.names[value] = name

    def pin(self, value: SSAValue, name: str) -> None:
        """Make the coming `define` of `value` reuse `name` (a variable the printer reassigns,
        such as the Gluon target's score tile, which each score op refines in place)."""
        self.pins[value] = name

    def __getitem__(self, value: SSAValue) -> str:
        return self.names[value]


# --------------------------------------------------------------------------------------------
# Kernel emission
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoopRows:
    """The rows of the current loop step, as names in the generated code."""

    index: str
    """Row indices (`keys` or `queries`)."""
    mask: str
    """Their in-bounds mask, or "" in a loop over full blocks."""
    position: str
    """Their positions (a key's is its index; a query's is bottom-right aligned)."""



COLUMN_COMMENT = {
    "all": "all columns",
    "half_lo": "first halves of the rotary pairs",
    "half_hi": "second halves of the rotary pairs",
    "even": "even rotary dims",
    "odd": "odd rotary dims",
    "pass": "dims past the rotary width",
}


TRITON_TYPES = {"f16": "tl.float16", "bf16": "tl.bfloat16", "f32": "tl.float32"}
"""Triton's name of each tile element type."""


@dataclass
class KernelEmitter:
    """Emits one `tile.kernel` as a `@triton.jit` function."""

    kernel: tile.KernelOp
    interpreter: bool = False
    """Emit for Triton's CPU interpreter, whose bf16 support is broken (a bf16 `tl.dot`
    multiplies raw bit patterns, triton-lang/triton#11584; fp32 -> bf16 conversion truncates):
    there bf16 operands go to the matrix products as fp32 copies and intermediate results
    (rotated q/k, probabilities) stay fp32. Only the final output is rounded to bf16."""
    lines: list[str] = field(default_factory=list)
    indent: int = 1
    helpers: set[str] = field(default_factory=set)
    """The module's helper functions (`HELPERS`) the kernel calls."""
    BASE2_ROW_MAX: ClassVar[bool] = False
    """Whether the online softmax keeps its row max in base-2 units (the max of the scores
    times the exponent's factor): p = exp2(s * f - m) and alpha = exp2(m_old - m_new) then
    need no multiply by log2(e) per row, and finalize turns the max back into natural units.
    The Gluon target's forward keeps it so (as FlashAttention-3 does); the portable target
    keeps natural units."""

    def __post_init__(self) -> None:
        k = self.kernel
        self.grid = k.grid
        self.elem = k.elem
        self.head_dim = k.get("head_dim")
        self.head_dim_v = k.get("head_dim_v")
        self.rotary_dim = k.rotary_dim
        self.rot_half = self.rotary_dim // 2
        self.pass_dim = self.head_dim - self.rotary_dim
        self.roles = k.roles
        self.namer = Namer(reserved=self.reserved_names())
        self.loop_vars: list[LoopRows] = []
        # `share-offsets` decides; the printer emits both address forms behind a constexpr.
        pair = k.shared_offsets
        self.shared_offsets: tuple[str, str] | None = (pair[0], pair[1]) if pair else None

    # -- helpers -------------------------------------------------------------------------

    def reserved_names(self) -> set[str]:
        names = {
            "tl", "triton", "block_id", "batch_head", "batch", "head", "kv_head", "rows",
            "row_in_bounds", "keys", "key_in_bounds", "q_pos", "slope", "entry", "sm_scale", "n_q", "n_k", "num_heads",
            "group_size", "start_n", "q_first", "q_last", "queries", "query_in_bounds", "start_m",
            "head_in_group", "diag_first", "diag_last", "lse_safe", "split", "num_splits",
            "split_len", "row_head", "row_query", "row_blocks", "pages", "page_ids", "next_page_ids",
            "page_rows", "group_rows",
            "split_lo", "split_hi", "split_lse", "split_out", "new_max", "safe_max", "rescale",
            "weight", "cached", "k_pos", "arrived", "count_ptr", "s", "prev_q_end",
            "cols_d", "cols_dv", "cols_half", "cols_pass", *HELPERS, *GDC_FUNCTIONS,
        }
        for role in self.roles:
            names |= {f"{role}_ptr", f"{role}_base"} | {f"stride_{role}_{a}" for a in "bhnd"}
            if tile.role_kind(role) == "slopes":
                names.add(self.slope_name(role))
        return names

    def emit(self, line: str = "") -> None:
        self.lines.append(("    " * self.indent + line) if line else "")

    def dot_options(self) -> str:
        # fp32 inputs: Triton's default tf32 products lose ~1e-3; keep IEEE fp32 accuracy.
        return ', input_precision="ieee"' if self.elem == "f32" or self.upcast_dots else ""

    @property
    def upcast_dots(self) -> bool:
        return self.interpreter and self.elem == "bf16"

    def dot_operand(self, value: str) -> str:
        """A matrix-product operand, upcast where the interpreter needs it."""
        return f"{value}.to(tl.float32)" if self.upcast_dots else value

    def strides(self, role: str) -> list[str]:
        return [f"stride_{role}_{axis}" for axis in tile.role_axes(role)]

    def head_of(self, role: str) -> str:
        return "kv_head" if role in tile.KEY_ROW_ROLES else "head"

    def set_in_query_head_loop(self, role: str) -> bool:
        """Whether `role`'s base pointer depends on the query head (every per-head role but
        the key-row ones), which a `key_blocks` kernel only knows inside its loop over the
        GQA group."""
        if self.grid != "key_blocks":
            return False
        axes = tile.role_axes(role)
        return axes.startswith("hn") or (axes.startswith("bh") and role not in tile.KEY_ROW_ROLES)

    def base_line(self, role: str) -> str | None:
        """The statement that points `{role}_base` at this program's slice, if it has one."""
        axes = tile.role_axes(role)
        if role in tile.BLOCK_LIST_ROLES:
            # Block lists: this batch's and head's (shared lists have zero strides) entry for
            # this program's block.
            return (f"{role}_base = {role}_ptr + batch * stride_{role}_b + head * stride_{role}_h"
                    f" + block_id * stride_{role}_n")
        if self.paged and role in self.paged_roles:
            # A page pool: the batch axis holds pages, chosen per row (`block_pointer`).
            return f"{role}_base = {role}_ptr + kv_head * stride_{role}_h"
        if axes.startswith("bh"):
            base = f"{role}_base = {role}_ptr + batch * stride_{role}_b + {self.head_of(role)} * stride_{role}_h"
            if "s" in axes and self.grid == "kv_splits":
                base += f" + split * stride_{role}_s"  # this program's split's partial results
            return base
        if axes == "bn":
            return f"{role}_base = {role}_ptr + batch * stride_{role}_b"
        return None

    def oriented(self) -> dict[str, str]:
        """2-D expressions for the current block's pairs: query and key positions and
        indices, in the grid's orientation (program rows down, loop rows across)."""
        loop = self.loop_vars[-1]
        if self.grid != "key_blocks":
            return {"q_pos": "q_pos[:, None]", "k_pos": f"{loop.position}[None, :]",
                    "q_idx": f"{self.query_rows}[:, None]", "k_idx": f"{loop.index}[None, :]"}
        return {"q_pos": f"{loop.position}[None, :]", "k_pos": "rows[:, None]",
                "q_idx": f"{loop.index}[None, :]", "k_idx": "rows[:, None]"}

    def block_bounds(self) -> str:
        """The in-bounds mask of the current (program rows x loop rows) block."""
        loop = self.loop_vars[-1]
        return " & ".join(["row_in_bounds[:, None]"] + ([f"{loop.mask}[None, :]"] if loop.mask else []))

    def along_queries(self, vector: SSAValue) -> str:
        """A per-query vector broadcast against a score tile."""
        assert isinstance(vector.type, tile.TileType)
        return f"{self.namer[vector]}[:, None]" if vector.type.shape == ("m",) else f"{self.namer[vector]}[None, :]"

    def role_of(self, value: SSAValue) -> str:
        assert isinstance(value.type, tile.TensorType)
        return value.type.role.data

    def columns(self, role: str, cols: str) -> tuple[str, str | None]:
        """(column index expression, column mask or None) of a column part."""
        if cols == "all":
            if role in tile.VALUE_WIDTH_ROLES:
                mask = "cols_dv < HEAD_DIM_V" if padded(self.head_dim_v) != self.head_dim_v else None
                return "cols_dv", mask
            mask = "cols_d < HEAD_DIM" if padded(self.head_dim) != self.head_dim else None
            return "cols_d", mask
        if cols == "pass":
            mask = "cols_pass < PASS_DIM" if padded(self.pass_dim) != self.pass_dim else None
            return "ROT_DIM + cols_pass", mask
        mask = "cols_half < ROT_HALF" if padded(self.rot_half) != self.rot_half else None
        index = {
            "half_lo": "cols_half",
            "half_hi": "ROT_HALF + cols_half",
            "even": "2 * cols_half",
            "odd": "2 * cols_half + 1",
        }[cols]
        return index, mask

    def rows(self, rows: str) -> tuple[str, str | None]:
        """(row index expression, row mask or None) of the program's or the loop's rows."""
        if rows == "program":
            return "rows", "row_in_bounds"
        loop = self.loop_vars[-1]
        return loop.index, loop.mask or None

    @property
    def paged(self) -> bool:
        """Whether the kernel's key-row operands are page pools (`block_table`)."""
        return "block_table" in self.roles

    @property
    def paged_roles(self) -> tuple[str, ...]:
        """The roles a paged kernel reads (or a cache append writes) as page pools."""
        return ("k_cache", "v_cache") if self.grid == "appended_keys" else tile.KEY_ROW_ROLES

    @property
    def query_rows(self) -> str:
        """The query index of each program row: the row itself, or in a `kv_splits` kernel
        (whose rows are (query head, query) pairs) its query."""
        return "row_query" if self.grid == "kv_splits" else "rows"

    def row_offsets(self, role: str, rows: str) -> str | None:
        """The offset of each accessed row of `role` from `{role}_base` where it is not
        `row index * stride_{role}_n` (None there)."""
        if rows == "program" and self.grid == "kv_splits" and role in tile.QUERY_ROW_ROLES:
            # Rows are (query head in the group, query) pairs: both axes vary by row.
            return f"(row_head * stride_{role}_h + row_query * stride_{role}_n)"
        if rows == "loop" and self.paged and role in self.paged_roles:
            if self.page_rows_hoisted and self.page_per_step:
                return f"(page_rows * stride_{role}_n)"  # after the step's page offset (`block_pointer`)
            return f"(pages * stride_{role}_b + page_rows * stride_{role}_n)"
        if rows == "program" and role in ("k_cache", "v_cache"):
            # A cache append writes each new key at its position after the cached ones.
            if self.paged:
                return f"(pages * stride_{role}_b + page_rows * stride_{role}_n)"
            return f"(k_pos * stride_{role}_n)"
        return None

    def step_page_offset(self, role: str, rows: str) -> str:
        """`+ offset` of the step's page from `{role}_base` where a paged step's keys lie in
        one page and their rows are hoisted (`page_rows_hoisted`), else empty: the step
        adds one scalar to offsets that do not change across steps."""
        if not (rows == "loop" and self.paged and role in self.paged_roles
                and self.page_rows_hoisted and self.page_per_step):
            return ""
        first = "" if self.kernel.get("page_size") == self.kernel.get("block_n") else f" + start_n % PAGE_SIZE * stride_{role}_n"
        return f" + (pages * stride_{role}_b{first})"

    def block_pointer(self, role: str, rows: str, cols: str | None) -> tuple[str, str | None]:
        row_index, row_mask = self.rows(rows)
        offsets = self.row_offsets(role, rows)
        page = self.step_page_offset(role, rows)
        if cols is None:
            return f"{role}_base{page} + {offsets or f'{row_index} * stride_{role}_n'}", row_mask
        col_index, col_mask = self.columns(role, cols)
        row_part = f"{offsets}[:, None]" if offsets else f"{row_index}[:, None] * stride_{role}_n"
        if page:
            # The rows' and columns' offsets, summed apart from the page: the same every step.
            ptrs = f"{role}_base{page} + ({row_part} + ({col_index})[None, :] * stride_{role}_d)"
        else:
            ptrs = f"{role}_base + {row_part} + ({col_index})[None, :] * stride_{role}_d"
        masks = [m for m in (row_mask and f"{row_mask}[:, None]", col_mask and f"({col_mask})[None, :]") if m]
        return ptrs, " & ".join(masks) if masks else None

    # -- kernel structure --------------------------------------------------------------------

    def signature(self) -> list[str]:
        params: list[str] = []
        for role in self.roles:
            params.append(", ".join([f"{role}_ptr", *self.strides(role)]) + ",")
        params.append("sm_scale, n_q, n_k, num_heads, group_size,")
        if self.splits:
            params.append("num_splits, split_len,")
        constexprs = {
            "BLOCK_M": self.kernel.get("block_m"),
            "BLOCK_N": self.kernel.get("block_n"),
            "HEAD_DIM": self.head_dim,
            "BLOCK_D": padded(self.head_dim),
            "HEAD_DIM_V": self.head_dim_v,
            "BLOCK_DV": padded(self.head_dim_v),
        }
        if self.used_column_sets() & {"cols_half", "cols_pass"}:
            constexprs |= {
                "ROT_DIM": self.rotary_dim,
                "ROT_HALF": self.rot_half,
                "BLOCK_HALF": padded(self.rot_half),
                "PASS_DIM": self.pass_dim,
                "BLOCK_PASS": padded(self.pass_dim),
            }
        if self.shared_offsets is not None:
            constexprs["SHARED_OFFSETS"] = False
        if self.paged:
            constexprs["PAGE_SIZE"] = self.kernel.get("page_size")
        params += [f"{k}: tl.constexpr = {v}," for k, v in constexprs.items()]
        return params

    @property
    def splits(self) -> bool:
        """Whether the kernel takes the split scalars (`KernelInfo.splits`)."""
        return self.grid == "kv_splits" or "o_part" in self.roles

    def prologue(self) -> None:
        if self.grid == "kv_splits":
            self.split_prologue()
            return
        if self.grid == "appended_keys":
            self.append_prologue()
            return
        k = self.kernel
        what = tile.GRIDS[self.grid]
        self.emit(f"# Program grid ({what}).")
        # Longest programs first: the grid is (batch x head, block), block-major, because the
        # GPU starts programs in order of axis 0 fastest; so every head's longest programs
        # start before any head's shorter ones and the launch has a short tail. Under a
        # causal mask the longest are the last query blocks and the first key blocks. (On the
        # H200 this order takes 30% less time than a head-major grid in dK/dV, 10% in dQ and
        # 7% in the forward: bench/results/20261129T1725Z-emitted_variants-lpt.log.)
        if k.block_order == tile.BlockOrder.DESCENDING:
            self.emit("block_id = tl.num_programs(1) - 1 - tl.program_id(1)")
        else:
            self.emit("block_id = tl.program_id(1)")
        self.emit("batch_head = tl.program_id(0)")
        # int64 offsets: B * H * N * D can pass 2**31 elements.
        self.emit("batch = (batch_head // num_heads).to(tl.int64)")
        self.emit("head = (batch_head % num_heads).to(tl.int64)")
        if self.grid == "query_blocks":
            self.emit("kv_head = head // group_size  # GQA/MQA: query heads share a key/value head")
        else:
            self.emit("kv_head = head  # programs of a key_blocks grid own a key/value head")
        self.emit_key_count()
        self.emit("rows = block_id * BLOCK_M + tl.arange(0, BLOCK_M)")
        n_rows = "n_q" if self.grid == "query_blocks" else "n_k"
        self.emit(f"row_in_bounds = rows < {n_rows}")
        if self.grid == "query_blocks":
            self.emit("q_pos = rows + (n_k - n_q)  # bottom-right aligned: the last query sits at the last key")
        self.emit_columns_and_bases()
        if self.grid == "query_blocks":
            self.emit_slope_loads()
        del k

    def emit_columns_and_bases(self) -> None:
        """What every prologue ends with: the column indices the kernel's tiles use and each
        role's base pointer (in a `key_blocks` kernel, those of the query-head roles come in
        its loop over the group, `emit_query_head_bases`)."""
        used_cols = self.used_column_sets()
        for name, width in (("cols_d", "BLOCK_D"), ("cols_dv", "BLOCK_DV"), ("cols_half", "BLOCK_HALF"), ("cols_pass", "BLOCK_PASS")):
            if name in used_cols:
                self.emit(f"{name} = tl.arange(0, {width})")
        for role in self.roles:
            line = self.base_line(role)
            if line is not None and not self.set_in_query_head_loop(role):
                self.emit(line)

    @property
    def pdl(self) -> bool:
        """Whether the kernel is printed with programmatic dependent launch (`pdl = 1`): for
        a GPU only. The grid-dependency calls are instructions (inline PTX in Triton 3.6) that
        Triton's CPU interpreter cannot run, and there kernels run one after the other
        anyway."""
        return bool(self.kernel.pdl) and not self.interpreter

    @property
    def launch_pdl(self) -> bool:
        """Whether the runtime launches the kernel as its predecessor's programmatic
        dependent (`KernelInfo.launch_pdl`): the merge of a `pdl` split decode, which waits
        before its first read. The split kernel itself waits for nothing, so it is launched
        as usual (launched early, it could read a cache the kernel before it still writes)."""
        return self.pdl and self.grid != "kv_splits"

    def split_prologue(self) -> None:
        """The prologue of a `kv_splits` kernel: which key/value head, block of the group's
        (query head, query) rows and split of the keys the program owns."""
        if self.pdl:
            # The merge may launch now. Its `gdc_wait` waits for this whole grid to complete
            # and its stores to be visible (griddepcontrol.wait), so where this trigger sits
            # decides only when the merge's programs may start, never what they read. The
            # launch happens once every program of this grid has triggered (or exited), i.e.
            # once the last one has started: triggering first thing lets the merge's launch
            # and prologue overlap all of this kernel's work. Its waiting programs take no
            # slot a split program needs: by then every split program is resident (the grid
            # is about one program per SM, `kv_cache.PROGRAMS_PER_SM`).
            self.emit("gdc_launch_dependents()  # pdl: the merge kernel may launch (it waits for this grid before reading)")
        self.emit(f"# Program grid ({tile.GRIDS['kv_splits']}).")
        self.emit("split = tl.program_id(1)")
        self.emit("group_rows = group_size * n_q  # (query head, query) pairs per key/value head")
        self.emit("row_blocks = tl.cdiv(group_rows, BLOCK_M)")
        self.emit("block_id = tl.program_id(0) % row_blocks")
        self.emit("batch_head = tl.program_id(0) // row_blocks")
        self.emit("batch = (batch_head // num_heads).to(tl.int64)")
        self.emit("kv_head = (batch_head % num_heads).to(tl.int64)")
        self.emit("head = kv_head * group_size  # the group's first query head")
        self.emit_key_count()
        self.emit("rows = block_id * BLOCK_M + tl.arange(0, BLOCK_M)")
        self.emit("row_in_bounds = rows < group_rows")
        self.emit("row_head = rows // n_q  # query head in the group")
        self.emit("row_query = rows % n_q")
        self.emit("q_pos = row_query + (n_k - n_q)  # bottom-right aligned: the last query sits at the last key")
        self.emit_columns_and_bases()
        for role in self.slope_roles():
            # One slope per row: the rows span the group's query heads.
            self.emit(f"{self.slope_name(role)} = tl.load({role}_ptr + head + row_head, mask=row_in_bounds, other=0.0)")

    def append_prologue(self) -> None:
        """The prologue of an `appended_keys` kernel (a cache append): the block of new keys
        of one (batch, key/value head) the program owns, their cache positions after the
        sequence's cached keys and, in a paged cache, their pages."""
        self.emit(f"# Program grid ({tile.GRIDS['appended_keys']}).")
        self.emit("block_id = tl.program_id(1)")
        self.emit("batch_head = tl.program_id(0)")
        self.emit("batch = (batch_head // num_heads).to(tl.int64)")
        self.emit("kv_head = (batch_head % num_heads).to(tl.int64)")
        self.emit("head = kv_head")
        self.emit("cached = tl.minimum(tl.maximum(tl.load(kv_lens_ptr + batch), 0), n_k)  # keys the sequence holds")
        self.emit("rows = block_id * BLOCK_M + tl.arange(0, BLOCK_M)  # new keys")
        self.emit("k_pos = cached + rows  # each new key's position: where it is written")
        self.emit("row_in_bounds = (rows < n_q) & (k_pos < n_k)  # nothing is written past the cache's capacity")
        self.emit_columns_and_bases()
        if self.paged:
            self.emit("# Paged cache: position p is row p % PAGE_SIZE of page block_table[batch, p // PAGE_SIZE].")
            self.emit("pages = tl.load(block_table_base + (k_pos // PAGE_SIZE) * stride_block_table_n, "
                      "mask=row_in_bounds, other=0).to(tl.int64)")
            self.emit("page_rows = k_pos % PAGE_SIZE")

    def emit_key_count(self) -> None:
        """Where the kernel reads `kv_lens`: this sequence's key count, clamped to the
        cache's capacity `n_k` (so no length reads past the cache)."""
        if "kv_lens" in self.roles:
            self.emit("n_k = tl.minimum(tl.maximum(tl.load(kv_lens_ptr + batch), 0), n_k)  # this sequence's keys")

    def slope(self, role: str) -> str:
        """A slopes role's value for the current block, broadcast along the program's rows
        where each row has its own (a `kv_splits` kernel's rows span query heads)."""
        name = self.slope_name(role)
        return f"{name}[:, None]" if self.grid == "kv_splits" else name

    def emit_query_head_bases(self) -> None:
        """In a `key_blocks` kernel's loop over the GQA group: point the query-head roles at
        the current query head."""
        self.emit("head = kv_head * group_size + head_in_group")
        for role in self.roles:
            line = self.base_line(role)
            if line is not None and self.set_in_query_head_loop(role):
                self.emit(line)
        self.emit_slope_loads()

    def slope_roles(self) -> list[str]:
        """The kernel's ALiBi slope tensors (`slopes`, `slopes_1`, ...)."""
        return [role for role in self.roles if tile.role_kind(role) == "slopes"]

    @staticmethod
    def slope_name(role: str) -> str:
        """The variable holding the current head's slope of a slopes role."""
        return "slope" + role.removeprefix("slopes")

    def emit_slope_loads(self) -> None:
        """Loads the current head's slope of every slopes tensor."""
        for role in self.slope_roles():
            self.emit(f"{self.slope_name(role)} = tl.load({role}_ptr + head)  # this head's ALiBi slope")

    def used_column_sets(self) -> set[str]:
        used = set()
        if "rope_table" in self.roles:
            used.add("cols_half")
        for op in self.kernel.walk():
            if isinstance(op, (tile.LoadOp, tile.StoreOp, tile.StoreAddOp)) and op.cols is not None:
                role = op.role
                cols = op.cols.data
                if cols == "all":
                    used.add("cols_dv" if role in tile.VALUE_WIDTH_ROLES else "cols_d")
                elif cols == "pass":
                    used.add("cols_pass")
                else:
                    used.add("cols_half")
        return used

    def run(self) -> list[str]:
        name = self.kernel.sym_name.data
        block_m = self.kernel.get("block_m")
        if block_m & (block_m - 1):
            # Only a warp-specialized schedule's rows may be no power of two (192: three
            # consumer warpgroups); `tl.arange` cannot span them.
            raise AttnFuseError(f"the Triton target cannot print {name}: its {block_m} rows per program "
                                "are a warp-specialized schedule's (print it with -t gluon)")
        out = ["@triton.jit", f"def {name}("]
        out += [f"    {p}" for p in self.signature()]
        out.append("):")
        self.lines = []
        self.prologue()
        self.emit_block(self.kernel.body.block)
        return out + self.lines

    def emit_block(self, block: Block) -> None:
        for op in block.ops:
            handler = self.HANDLERS.get(type(op))
            if handler is None:
                raise AttnFuseError(f"the Triton target cannot print {op.name}")
            handler(self, op)

    # -- ops -------------------------------------------------------------------------------

    def emit_load(self, op: tile.LoadOp) -> None:
        role = op.role
        cols = None if op.cols is None else op.cols.data
        ptrs, mask = self.block_pointer(role, op.rows.data, cols)
        what = COLUMN_COMMENT.get(cols or "", "one value per row")
        self.emit(f"# tile.load: {role} rows ({op.rows.data}), {what}")
        # Padded rows read 0, except the log-sum-exp: +inf there makes exp(s - lse) = 0, so
        # no probability is ever formed on a row past the sequence end.
        other = 'float("inf")' if role == "lse" else "0.0"
        masking = f", mask={mask}, other={other}" if mask else ""
        assert isinstance(op.result.type, tile.TileType)
        widened = op.result.type.elem == "f32" and role not in tile.FP32_ROLES and self.elem != "f32"
        widen = ".to(tl.float32)" if widened else ""
        name = self.namer.define(op.result)
        if self.shared_offsets is not None and role == self.shared_offsets[0] and op.rows.data == "loop":
            # Same strides as the leader (the runtime checked): its offsets, its strides.
            leader = self.shared_offsets[1]
            leader_ptrs, _ = self.block_pointer(leader, op.rows.data, cols)
            shared_ptrs = f"{role}_base" + leader_ptrs.removeprefix(f"{leader}_base")
            self.emit("if SHARED_OFFSETS:")
            self.emit(f"    {name} = tl.load({shared_ptrs}{masking}){widen}")
            self.emit("else:")
            self.emit(f"    {name} = tl.load({ptrs}{masking}){widen}")
            return
        self.emit(f"{name} = tl.load({ptrs}{masking}){widen}")

    def emit_store(self, op: tile.StoreOp) -> None:
        role = op.role
        cols = None if op.cols is None else op.cols.data
        ptrs, mask = self.block_pointer(role, op.rows.data, cols)
        self.emit(f"# tile.store: {role} rows ({op.rows.data})" + (f", {COLUMN_COMMENT[cols]}" if cols else ""))
        masking = f", mask={mask}" if mask else ""
        value = f"{self.namer[op.value]}.to({role}_ptr.dtype.element_ty)"
        self.emit(f"tl.store({ptrs}, {value}{masking})")

    def emit_store_add(self, op: tile.StoreAddOp) -> None:
        role = op.role
        cols = None if op.cols is None else op.cols.data
        ptrs, mask = self.block_pointer(role, op.rows.data, cols)
        order = "in key-block order" if op.ordered else "atomics: unordered"
        self.emit(f"# tile.store_add: added into {role} rows ({op.rows.data})"
                  + (f", {COLUMN_COMMENT[cols]}" if cols else "") + f" ({order})")
        masking = f", mask={mask}" if mask else ""
        value = self.namer[op.value]
        # The ordered adds of one step (one per column part of a rotation) share the query
        # block's counter: the first waits for it, the last hands the block on.
        step_adds = [o for o in op.parent_block().ops if isinstance(o, tile.StoreAddOp) and o.ordered] \
            if op.ordered else []
        if op.ordered and op is step_adds[0]:
            value = self.emit_order_wait(op, value)
        # Relaxed: the adds only need to be atomic (and, ordered, made before the handover,
        # which releases them); nothing reads dq_acc before the kernel ends.
        self.emit(f'tl.atomic_add({ptrs}, {value}{masking}, sem="relaxed")')
        if op.ordered and op is step_adds[-1]:
            self.emit("tl.debug_barrier()  # every thread's adds are made before the rows are handed on")
            self.emit(f'tl.atomic_xchg({self.order_counter_name}, block_id + 1, sem="release")'
                      "  # the next key block adds next")

    def order_counter(self, op: tile.StoreAddOp) -> str:
        """The address of the counter that orders the step's adds into the loop's query
        block: its first row's in `dq_order`."""
        order = op.order
        assert order is not None and isinstance(order.type, tile.TensorType)
        role = order.type.role.data
        return f"{role}_base + {self.STEP_ROW} * stride_{role}_n"

    STEP_ROW = "start_m"
    """The first query row of the loop's block (in a `key_blocks` kernel)."""

    order_counter_name = ""
    """The counter of the current step's ordered adds (set at the step's first add)."""

    def order_waits(self) -> str:
        """Whether the key block before the program's visits the loop's query block (then
        this program's add waits for its): `prev_q_end` is the end of its query range, whose
        start is at most this program's (the ranges move down the queries with the keys)."""
        return f"(block_id > 0) & ({self.STEP_ROW} < prev_q_end)"

    def emit_order_wait(self, op: tile.StoreAddOp, value: str) -> str:
        """Before the step's first ordered add: wait until the key block before this one has
        added, where it visits the loop's query block (`order_counter_name`
        then names the counter). Returns the tile to add. The interpreter runs a (batch, head)'s
        programs one at a time in ascending key-block order, so there the key block before
        has always added, and the counter holds this block exactly when it visited: the
        interpreter checks both ways instead of waiting (a wait that could never end would
        hang the test) and adds NaN where the rule and the counter disagree."""
        counter = self.order_counter_name = self.namer.fresh("order_counter")
        self.emit(f"{counter} = {self.order_counter(op)}")
        if self.interpreter:
            in_order = self.namer.fresh("in_order")
            self.emit(f"{in_order} = (block_id == 0) | (({self.STEP_ROW} < prev_q_end)"
                      f" == (tl.load({counter}) == block_id))")
            checked = self.namer.fresh("checked")
            self.emit(f'{checked} = tl.where({in_order}, {value}, float("nan"))  # out of order: NaN, never silently')
            return checked
        self.emit(f"if {self.order_waits()}:")
        self.emit(f'    while tl.atomic_add({counter}, 0, sem="acquire") != block_id:')
        self.emit("        pass")
        return value

    def emit_previous_block_end(self, op: tile.QBoundsOp) -> None:
        """`prev_q_end`: where the query range of key block `block_id - 1` ends (as
        `emit_q_bounds` computes it for that block), for adds in key-block order."""
        lower = op.band.bounds[0]
        if lower is None:
            self.emit("prev_q_end = n_q  # every earlier key block visits every later query")
            return
        self.emit("# The query range of the previous key block ends where its last key's does.")
        self.emit(f"prev_q_end = tl.minimum({plus('tl.minimum(block_id * BLOCK_M, n_k) - 1 - (n_k - n_q)', -lower + 1)}, n_q)")

    def positions(self, op: tile.RotateOp) -> tuple[str, str | None]:
        """(positions of the rotated rows, their in-bounds mask or None)."""
        assert isinstance(op.lo.type, tile.TileType)
        if op.lo.type.shape[0] == "n":
            loop = self.loop_vars[-1]
            return loop.position, loop.mask or None
        if self.grid == "appended_keys":
            return "k_pos", "row_in_bounds"
        return ("q_pos" if op.positions.data == "query" else "rows"), "row_in_bounds"

    def position_rows(self, op: tile.RotateOp) -> str:
        """The row indices of the rotated rows (call-time positions are indexed by row)."""
        assert isinstance(op.lo.type, tile.TileType)
        return self.loop_vars[-1].index if op.lo.type.shape[0] == "n" else self.query_rows

    def emit_rotate(self, op: tile.RotateOp) -> None:
        lo, hi = self.namer[op.lo], self.namer[op.hi]
        self.emit(f"# tile.rotate: RoPE at {op.positions.data} positions, in fp32, pairs ({lo}, {hi})")
        cos, sin, table_rows = (self.namer.fresh(n) for n in ("cos", "sin", "table_rows"))
        a, b = self.namer.fresh(f"{lo}_f32"), self.namer.fresh(f"{hi}_f32")
        pos, row_mask = self.positions(op)
        if op.given_positions is not None:
            role = self.role_of(op.given_positions)
            # Given positions are indexed by row (query i or key j), not by default position.
            rows = self.position_rows(op)
            pos = self.namer.fresh(f"{role}_rows")
            masking = f", mask={row_mask}, other=0" if row_mask else ""
            self.emit(f"{pos} = tl.load({role}_base + {rows} * stride_{role}_n{masking})")
        col_mask = "(cols_half < ROT_HALF)[None, :]" if padded(self.rot_half) != self.rot_half else None
        masks = [m for m in (row_mask and f"{row_mask}[:, None]", col_mask) if m]
        masking = f", mask={' & '.join(masks)}" if masks else ""
        # Query positions are negative when Nq > Nk (and given ones may be):
        # cos(-x) = cos(x), sin(-x) = -sin(x).
        negative = op.positions.data == "query" or op.given_positions is not None
        self.emit(f"{table_rows} = {'tl.abs(' + pos + ')' if negative else pos}")
        ptrs = f"rope_table_ptr + {table_rows}[:, None] * stride_rope_table_n + cols_half[None, :] * stride_rope_table_d"
        self.emit(f"{cos} = tl.load({ptrs}{masking + ', other=1.0' if masking else ''})")
        self.emit(f"{sin} = tl.load({ptrs} + stride_rope_table_c{masking + ', other=0.0' if masking else ''})")
        sign = []
        if negative:
            sign.append(f"tl.where({pos} < 0, -1.0, 1.0)[:, None]")
        if op.inverse is not None:
            sign.append("-1.0")
        if sign:
            self.emit(f"{sin} = {sin} * {' * '.join(sign)}")
        self.emit(f"{a} = {lo}.to(tl.float32)")
        self.emit(f"{b} = {hi}.to(tl.float32)")
        # Back to the input type for the tensor cores (the interpreter's bf16 path keeps fp32:
        # its fp32 -> bf16 conversion truncates instead of rounding).
        lo_cast = "" if self.upcast_dots else f".to({lo}.dtype)"
        hi_cast = "" if self.upcast_dots else f".to({hi}.dtype)"
        self.emit(f"{self.namer.define(op.lo_out)} = ({a} * {cos} - {b} * {sin}){lo_cast}")
        self.emit(f"{self.namer.define(op.hi_out)} = ({a} * {sin} + {b} * {cos}){hi_cast}")

    def emit_join(self, op: tile.JoinOp) -> None:
        lo, hi = self.namer[op.lo], self.namer[op.hi]
        assert isinstance(op.lo.type, tile.TileType)
        rows = "BLOCK_M" if op.lo.type.shape[0] == "m" else "BLOCK_N"
        joined = f"tl.join({lo}, {hi})"  # [rows, half, 2]: pairs side by side
        if op.pairs.data == "half":
            # [rows, 2, half]: all first elements, then all second elements.
            joined = f"tl.permute({joined}, (0, 2, 1))"
            what = "halves side by side"
        else:
            what = "pair elements alternating"
        self.emit(f"# tile.join: back to full width ({what}), once per program")
        self.emit(f"{self.namer.define(op.result)} = tl.reshape({joined}, ({rows}, BLOCK_D))")

    def emit_split(self, op: tile.SplitOp) -> None:
        value = self.namer[op.input]
        assert isinstance(op.input.type, tile.TileType)
        rows = "BLOCK_M" if op.input.type.shape[0] == "m" else "BLOCK_N"
        lo, hi = self.namer.define(op.lo), self.namer.define(op.hi)
        if op.pairs.data == "half":
            self.emit("# tile.split: full width into the halves of the rotary pairs, once per program")
            pairs = f"tl.permute(tl.reshape({value}, ({rows}, 2, BLOCK_HALF)), (0, 2, 1))"
        else:
            self.emit("# tile.split: full width into even and odd dims, once per program")
            pairs = f"tl.reshape({value}, ({rows}, BLOCK_HALF, 2))"
        self.emit(f"{lo}, {hi} = tl.split({pairs})")

    def emit_scores(self, op: tile.ScoresOp) -> None:
        name = self.namer.define(op.result)
        self.emit("# tile.scores: q @ k^T summed over column parts, fp32 accumulation")
        products: list[tuple[str, str]] = []
        for q, k in zip(op.queries, op.keys):
            assert isinstance(q.type, tile.TileType)
            if q.type.elem == "f32" and self.elem != "f32" and not self.upcast_dots:
                products += self.split_products(q, k)
            else:
                products.append((self.dot_operand(self.namer[q]), self.dot_operand(self.namer[k])))
        for i, (q_op, k_op) in enumerate(products):
            acc = f", acc={name}" if i else ""
            self.emit(f"{name} = tl.dot({q_op}, tl.trans({k_op}){acc}{self.dot_options()})")
        self.emit_score_scale(name, op)

    def emit_score_scale(self, name: str, op: tile.ScoresOp) -> None:
        """Multiplies the product `name` by the scale of `op` (or says it is folded into the
        exponential: `fold-scale-into-exp`)."""
        scale = scale_expression(op.scale)
        if op.unscaled is not None:
            self.emit(f"# (the scale, {scale}, is applied where the scores meet the exponential)")
        elif op.scale is None:
            self.emit(f"{name} = {name} * sm_scale")
        else:
            self.emit(f"{name} = {name} * {scale}  # static scale")

    @staticmethod
    def exponent_factor(op: tile.SoftmaxUpdateOp | tile.RecomputeProbsOp) -> str:
        """What an exponential multiplies its scores by: log2(e), times the scale when they
        arrive unscaled (`fold-scale-into-exp`)."""
        if op.unscaled_scores is None:
            return repr(LOG2E)
        if op.scale is None:
            return f"(sm_scale * {LOG2E})"
        return repr(float(op.scale.value.data) * LOG2E)

    def split_products(self, q: SSAValue, k: SSAValue) -> list[tuple[str, str]]:
        """The element-type products whose fp32 sum is q @ k^T of widened (fp32) operands, on
        the tensor cores' native half-precision path. Each operand is split into its rounding
        to the element type (head) and the rounding of the remainder (rest), and the products
        that matter are summed smallest first: rest x head, head x rest, head x head. The
        error is about 2^-16 |q| |k| in bf16; in fp16 about 2^-22 |q| |k| for elements of
        magnitude 2^-3 and more, less exact below (the remainder turns subnormal).

        An operand loaded straight from an element-type tensor (a widened `tile.load`, such as
        the columns RoPE leaves alone) is its own head: its remainder is 0, so its rest
        products are not emitted.

        Why not `input_precision="tf32x3"` on the fp32 operands: Triton 3.6 on the H200
        miscompiled a dK/dV kernel that fed one widened operand to a tf32x3 product and its
        rounding to a half-precision product (wrong dK, then an illegal memory access;
        bench/results/20261129T1700Z-gpu_check_backward-relu-tf32x3.log)."""
        elem = TRITON_TYPES[self.elem]
        heads: dict[SSAValue, str] = {}
        rests: dict[SSAValue, str | None] = {}
        for value in (q, k):
            name = self.namer[value]
            heads[value] = self.namer.fresh(f"{name}_head")
            self.emit(f"{heads[value]} = {name}.to({elem})")
            if isinstance(value.owner, tile.LoadOp):
                rests[value] = None  # element-type data widened: exact in its head
            else:
                rests[value] = self.namer.fresh(f"{name}_rest")
                self.emit(f"{rests[value]} = ({name} - {heads[value]}.to(tl.float32)).to({elem})")
        products = [(rests[q], heads[k]), (heads[q], rests[k]), (heads[q], heads[k])]
        return [(a, b) for a, b in products if a is not None and b is not None]

    def emit_mask(self, op: tile.MaskOp) -> None:
        loop = self.loop_vars[-1]
        pair = self.oriented()
        lower, upper = op.band.bounds
        conds = [f"{loop.mask}[None, :]"] if loop.mask else []
        if self.grid == "key_blocks":
            # Program rows are keys: padded rows of a ragged last key block are dropped too,
            # so that nothing (ALiBi at far positions, say) overflows on them.
            conds.append("row_in_bounds[:, None]")
        if upper is not None:
            conds.append(f"({pair['k_pos']} <= {plus(pair['q_pos'], upper)})")
        if lower is not None:
            conds.append(f"({pair['k_pos']} >= {plus(pair['q_pos'], lower)})")
        self.emit(f"# tile.mask: keep keys in q_pos + [{lower}, {upper}] and inside the sequence")
        keep = self.namer.fresh("keep")
        self.emit(f"{keep} = {' & '.join(conds) if conds else 'True'}")
        self.emit(f"{self.namer.define(op.result)} = tl.where({keep}, {self.namer[op.input]}, float(\"-inf\"))")

    def emit_document_mask(self, op: tile.DocumentMaskOp) -> None:
        loop = self.loop_vars[-1]
        role = self.role_of(op.doc_ids)
        # Query positions and key indices as vectors, and how each broadcasts to the tile.
        if self.grid != "key_blocks":
            queries, keys, q_axis, k_axis = "q_pos", loop.index, "[:, None]", "[None, :]"
        else:
            queries, keys, q_axis, k_axis = loop.position, "rows", "[None, :]", "[:, None]"
        doc_q, doc_k = self.namer.fresh("doc_q"), self.namer.fresh("doc_k")
        self.emit("# tile.document_mask: keep pairs in one document (negative ids are padding)")
        # A query position outside [0, n_k) (a padded row, or Nq > Nk) has no document.
        self.emit(f"{doc_q} = tl.load({role}_base + {queries} * stride_{role}_n, "
                  f"mask=({queries} >= 0) & ({queries} < n_k), other=-1)")
        self.emit(f"{doc_k} = tl.load({role}_base + {keys} * stride_{role}_n, mask={keys} < n_k, other=-1)")
        keep = self.namer.fresh("keep")
        self.emit(f"{keep} = ({doc_q}{q_axis} == {doc_k}{k_axis}) & ({doc_k}{k_axis} >= 0)")
        self.emit(f"{self.namer.define(op.result)} = tl.where({keep}, {self.namer[op.input]}, float(\"-inf\"))")

    def emit_band_range(self, op: tile.KVBoundsOp | tile.QBoundsOp, first: str, last: str,
                        lower: int | None, upper: int | None, length: str) -> None:
        """The loop's block range for program rows at positions `first..last`, which keep
        loop rows at positions `row + [lower, upper]` of `length` loop rows, split into
        partial / full / partial blocks (`tile.loops._BandBounds`)."""
        start, full_start, full_end, end = (self.namer.define(r) for r in op.results)
        # Clamp at 0 before dividing: integer division of negatives differs between the GPU
        # (truncation) and the interpreter (floor).
        if lower is None:
            self.emit(f"{start} = 0")
            self.emit(f"{full_start} = 0")
        else:
            self.emit(f"{start} = tl.maximum({plus(first, lower)}, 0) // BLOCK_N * BLOCK_N")
            self.emit(f"{full_start} = (tl.maximum({plus(last, lower)}, 0) + BLOCK_N - 1) // BLOCK_N * BLOCK_N")
        if upper is None:
            self.emit(f"{end} = {length}")
            self.emit(f"{full_end} = {length} // BLOCK_N * BLOCK_N")
        else:
            self.emit(f"{end} = tl.minimum({plus(last, upper + 1)}, {length})")
            self.emit(f"{full_end} = tl.maximum(tl.minimum({plus(first, upper + 1)}, {length}), 0) // BLOCK_N * BLOCK_N")
        self.emit("# Full blocks lie inside [start, end); blocks outside it are empty and skipped.")
        self.emit(f"{full_start} = tl.minimum(tl.maximum({full_start}, {start}), {end})")
        self.emit(f"{full_end} = tl.minimum(tl.maximum({full_end}, {full_start}), {end})")

    def emit_kv_bounds(self, op: tile.KVBoundsOp) -> None:
        lower, upper = op.band.bounds
        if self.grid == "kv_splits":
            self.emit(f"# tile.kv_bounds: key blocks the sequence's queries visit (band q_pos + [{lower}, {upper}])")
            self.emit("q_first = n_k - n_q  # position of the first query")
            self.emit("q_last = n_k - 1")
        else:
            self.emit(f"# tile.kv_bounds: key blocks this query block visits (band q_pos + [{lower}, {upper}])")
            self.emit("q_first = block_id * BLOCK_M + (n_k - n_q)  # position of the block's first query")
            self.emit("q_last = q_first + (BLOCK_M - 1)")
        self.emit_band_range(op, "q_first", "q_last", lower, upper, "n_k")

    def emit_kv_split(self, op: tile.KVSplitOp) -> None:
        self.emit("# tile.kv_split: only this program's split of the keys")
        self.emit("split_lo = split * split_len")
        self.emit("split_hi = split_lo + split_len")
        for value, result in zip(op.operands, op.results):
            self.emit(f"{self.namer.define(result)} = tl.minimum(tl.maximum({self.namer[value]}, split_lo), split_hi)")

    def splits_per_step(self) -> int:
        """Splits a merge step loads at once: as many as keep a step's partial
        outputs, `[BLOCK_M, SPLITS, BLOCK_DV]` fp32, at `MERGE_STEP_VALUES`, at most
        `MAX_SPLITS_PER_STEP`; a power of two. The merge kernel (one query row per program)
        takes every split of a decode in one step, so its time is one round trip to L2, not
        one per split."""
        rows, width = self.kernel.get("block_m"), padded(self.head_dim_v)
        return max(1, min(MAX_SPLITS_PER_STEP, MERGE_STEP_VALUES // (rows * width)))

    def emit_split_merge(self, role_o: str, o_base: str, o_rows: str, role_lse: str | None,
                         lse_base: str | None, lse_rows: str | None, out: str, lse: str | None,
                         load_options: str = "") -> None:
        """The loop over the splits that merges their partial results (`tile.merge_splits`,
        `tile.merge_last_split`), `splits_per_step()` splits a step: with an lse
        (softmax), each split's output weighted by `exp(lse_s - lse)`, online over the steps;
        without, summed. The partials of split `s` and row offset `r` (`o_rows`, `lse_rows`:
        per-row offsets) are at `o_base + s * stride_s + r + column * stride_d`; `out` (and
        `lse`) name the results."""
        per_step = self.splits_per_step()
        self.emit(f"{out} = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)")
        columns = " & (cols_dv < HEAD_DIM_V)[None, None, :]" if padded(self.head_dim_v) != self.head_dim_v else ""

        def step_loads() -> None:
            self.emit(f"splits = step + tl.arange(0, {per_step})  # the step's splits")
            self.emit("split_rows = row_in_bounds[:, None] & (splits < num_splits)[None, :]")
            self.emit(f"split_out = tl.load({o_base} + (splits * stride_{role_o}_s)[None, :, None]"
                      f" + ({o_rows})[:, None, None] + (cols_dv * stride_{role_o}_d)[None, None, :],"
                      f" mask=split_rows[:, :, None]{columns}, other=0.0{load_options})")

        if role_lse is None:
            self.emit(f"for step in {self.splits_range(per_step)}:")
            self.indent += 1
            step_loads()
            self.emit(f"{out} += tl.sum(split_out, 1)")
            self.indent -= 1
            return
        assert lse is not None and lse_base is not None and lse_rows is not None
        merged_max, total = self.namer.fresh("merged_max"), self.namer.fresh("merged_sum")
        self.emit(f"{merged_max} = tl.full([BLOCK_M], float(\"-inf\"), dtype=tl.float32)")
        self.emit(f"{total} = tl.zeros([BLOCK_M], dtype=tl.float32)")
        self.emit(f"for step in {self.splits_range(per_step)}:")
        self.indent += 1
        step_loads()
        self.emit(f"split_lse = tl.load({lse_base} + (splits * stride_{role_lse}_s)[None, :] + ({lse_rows})[:, None],"
                  f" mask=split_rows, other=float(\"-inf\"){load_options})")
        self.emit(f"new_max = tl.maximum({merged_max}, tl.max(split_lse, 1))")
        self.emit("# Splits with no kept key (lse -inf) weigh 0; subtract 0 while every split so far is empty.")
        self.emit("safe_max = tl.where(new_max == float(\"-inf\"), 0.0, new_max)")
        self.emit(f"rescale = tl.math.exp2(({merged_max} - safe_max) * {LOG2E})")
        self.emit(f"weight = tl.math.exp2((split_lse - safe_max[:, None]) * {LOG2E})")
        self.emit(f"{out} = {out} * rescale[:, None] + tl.sum(split_out * weight[:, :, None], 1)")
        self.emit(f"{total} = {total} * rescale + tl.sum(weight, 1)")
        self.emit(f"{merged_max} = new_max")
        self.indent -= 1
        has_keys = self.namer.fresh("has_keys")
        self.emit(f"{has_keys} = {total} != 0.0")
        self.emit(f"{out} = {out} / tl.where({has_keys}, {total}, 1.0)[:, None]")
        self.emit(f"{lse} = tl.where({has_keys}, {merged_max} + tl.math.log2(tl.where({has_keys}, {total}, 1.0)) * {LN2}, float(\"-inf\"))")

    def splits_range(self, per_step: int) -> str:
        """The iteration over the merge's steps (`per_step` splits each): software-pipelined
        `merge_stages` deep (`tl.range`: its loads are not products' operands, which Triton
        pipelines only in a loop that asks), so a step's partials are in flight while earlier
        ones merge."""
        stages = self.kernel.int_attr("merge_stages") or 1
        if stages > 1:
            return f"tl.range(0, num_splits, {per_step}, num_stages={stages})"
        return f"range(0, num_splits, {per_step})"

    def value_column_mask(self) -> str:
        """` & (cols_dv < HEAD_DIM_V)[None, :]` where the value dim is padded, else ""."""
        return " & (cols_dv < HEAD_DIM_V)[None, :]" if padded(self.head_dim_v) != self.head_dim_v else ""

    def emit_merge_last_split(self, op: tile.MergeLastSplitOp) -> None:
        o_role, lse_role = self.role_of(op.o_part), self.role_of(op.lse_part)
        counts = self.role_of(op.split_counts)
        self.emit("# tile.merge_last_split: the last split program of these rows merges every split's partials")
        # Every thread's partial stores are issued before the count, which releases them to
        # the program that sees the final count (the atomic is acq_rel at GPU scope).
        self.emit("tl.debug_barrier()")
        self.emit(f"count_ptr = {counts}_ptr + tl.program_id(0)  # one count per (batch, kv head, row block)")
        self.emit("arrived = tl.atomic_add(count_ptr, 1)")
        self.emit("if arrived == num_splits - 1:")
        self.indent += 1

        def rows_of(role: str) -> str:
            return f"(row_head * stride_{role}_h + row_query * stride_{role}_n)"

        def all_splits(role: str) -> str:
            return f"{role}_ptr + batch * stride_{role}_b + head * stride_{role}_h"

        o_mask = f"row_in_bounds[:, None]{self.value_column_mask()}"
        weighted = op.weighted is not None
        out = self.namer.fresh("merged")
        lse = self.namer.fresh("merged_lse") if weighted else None
        # Other programs wrote the partials: read them past L1 (.cg), where no stale copy is.
        self.emit_split_merge(o_role, all_splits(o_role), rows_of(o_role),
                              lse_role if weighted else None, all_splits(lse_role) if weighted else None,
                              rows_of(lse_role) if weighted else None, out, lse, ', cache_modifier=".cg"')
        if lse is not None:
            out_lse = self.role_of(op.lse)  # type: ignore[arg-type]
            self.emit(f"tl.store({out_lse}_base + {rows_of(out_lse)}, {lse}, mask=row_in_bounds)")
        o_out = self.role_of(op.o)
        self.emit(f"tl.store({o_out}_base + {rows_of(o_out)}[:, None] + cols_dv[None, :] * stride_{o_out}_d, "
                  f"{out}.to({o_out}_ptr.dtype.element_ty), mask={o_mask})")
        self.emit("tl.atomic_xchg(count_ptr, 0)  # ready for the next call")
        self.indent -= 1

    def emit_merge_splits(self, op: tile.MergeSplitsOp) -> None:
        o_role, lse_role = self.role_of(op.o_part), self.role_of(op.lse_part)
        out, lse = self.namer.define(op.output), self.namer.define(op.lse)
        o_rows = f"rows * stride_{o_role}_n"
        if self.pdl:
            # Launched as the split kernel's dependent, the merge may start while that kernel
            # runs: nothing before this line reads memory, and this waits for the split
            # kernel's whole grid to complete, its partials visible.
            self.emit("gdc_wait()  # pdl: the split kernel has completed; its partials are visible")
        if op.weighted is None:
            self.emit("# tile.merge_splits: a pointwise normalizer's outputs are sums over keys: add them")
            self.emit_split_merge(o_role, f"{o_role}_base", o_rows, None, None, None, out, None)
            self.emit(f"{lse} = tl.zeros([BLOCK_M], dtype=tl.float32)  # no log-sum-exp")
            return
        self.emit("# tile.merge_splits: weight each split's output by exp(lse_s - lse), online over the splits")
        self.emit_split_merge(o_role, f"{o_role}_base", o_rows, lse_role, f"{lse_role}_base",
                              f"rows * stride_{lse_role}_n", out, lse)

    def emit_kv_loop(self, op: tile.KVLoopOp) -> None:
        masked = op.masked is not None
        kind = "partial key blocks: masked and bounds-checked" if masked else "full key blocks: no mask work"
        self.emit(f"# tile.kv_loop over {kind}")
        lo, hi = self.namer[op.lower], self.namer[op.upper]
        ahead = self.paged and self.kernel.page_lookahead > 0

        def prelude() -> None:
            if ahead:
                self.emit_first_pages(lo)
            if self.page_rows_hoisted:
                self.emit_page_rows()

        self.emit_block_loop(op, f"for start_n in range({lo}, {hi}, BLOCK_N):", [], masked,
                             prelude=prelude if self.paged else None, pages_ahead=ahead)

    def emit_q_loop(self, op: tile.QLoopOp) -> None:
        masked = op.masked is not None
        kind = "partial query blocks: masked and bounds-checked" if masked else "full query blocks: no mask work"
        self.emit(f"# tile.q_loop over {kind}, for each query head of this key/value head")
        lo, hi = self.namer[op.lower], self.namer[op.upper]
        self.emit_block_loop(op, f"for start_m in range({lo}, {hi}, BLOCK_N):", [], masked)

    def emit_block_loop(
        self, op: Operation, header: str, first: list[str], masked: bool,
        prelude: Callable[[], None] | None = None, pages_ahead: bool = False,
    ) -> None:
        """A loop over key blocks (`query_blocks` kernels) or over query blocks of every query
        head of the GQA group (`key_blocks` kernels): `prelude` (run once per head), `header`,
        the statements `first` that set the step's start, the row indices (bounds-checked when
        `masked`), then the body; loop-carried values keep one name. A paged kernel's key
        step reads its pages from the block table, or with `pages_ahead` (the prelude read
        the first step's, `emit_first_pages`) the next step's, carried to it."""
        block = op.regions[0].block
        carried = [self.namer[v] for v in op.operands if isinstance(v.type, tile.TileType)]
        for arg, name in zip(block.args, carried):
            self.namer.alias(arg, name)
        over_queries = isinstance(op, tile.QUERY_LOOP_OPS)
        opened = 0
        if over_queries:
            self.emit("for head_in_group in range(0, group_size):")
            self.indent += 1
            opened += 1
            self.emit_query_head_bases()
        if prelude is not None:
            prelude()
        self.emit(header)
        self.indent += 1
        opened += 1
        for line in first:
            self.emit(line)
        # Loops are never nested, so each loop can reuse the names of its row indices.
        if over_queries:
            self.emit("start_m = tl.multiple_of(start_m, BLOCK_N)")
            self.emit("queries = start_m + tl.arange(0, BLOCK_N)")
            rows = LoopRows("queries", "query_in_bounds" if masked else "", "q_pos")
            if masked:
                self.emit("query_in_bounds = queries < n_q")
            self.emit("q_pos = queries + (n_k - n_q)")
        else:
            self.emit("start_n = tl.multiple_of(start_n, BLOCK_N)")
            self.emit("keys = start_n + tl.arange(0, BLOCK_N)")
            rows = LoopRows("keys", "key_in_bounds" if masked else "", "keys")
            if masked:
                self.emit("key_in_bounds = keys < n_k")
            if self.paged:
                self.emit_next_pages() if pages_ahead else self.emit_pages(masked)
        self.loop_vars.append(rows)
        self.emit_block(block)
        self.loop_vars.pop()
        if pages_ahead:
            self.emit("page_ids = next_page_ids  # the next step's, read during this one")
        self.indent -= opened
        for result, name in zip(op.results, carried):
            self.namer.alias(result, name)

    @property
    def page_per_step(self) -> bool:
        """Whether a key step's keys lie in one page (the page size is a multiple of the
        step), so the step reads one table entry, not one per key."""
        return self.kernel.get("page_size") % self.kernel.get("block_n") == 0

    @property
    def page_rows_hoisted(self) -> bool:
        """Whether a key step's rows in their pages are the same every step and computed
        once before the loop (`hoist_page_rows`): its keys start pages (the page size divides
        the step, which starts at a multiple of BLOCK_N) or lie in one page."""
        page, step = self.kernel.get("page_size"), self.kernel.get("block_n")
        return bool(self.kernel.hoist_page_rows) and (page % step == 0 or step % page == 0)

    def emit_page_rows(self) -> None:
        """Before a paged key loop with hoisted rows: each step key's row in its page
        (`page_rows`), relative to the step's first row when the step lies in one page."""
        if self.page_per_step:
            self.emit("page_rows = tl.arange(0, BLOCK_N)  # from the step's first row in its page")
        else:
            self.emit("page_rows = tl.arange(0, BLOCK_N) % PAGE_SIZE  # steps start pages: the same every step")

    def table_load(self, keys: str, per_step: str) -> str:
        """The load of the pages of the step whose keys are `keys` (its first key
        `per_step` when a step's keys lie in one page), masked to the sequence's keys: a
        table's entries past the sequence may hold anything (-1), or lie past its end.
        With hoisted rows a step's entries are indexed from its first key."""
        if self.page_per_step:
            first = f"({per_step})" if " " in per_step else per_step
            return (f"tl.load(block_table_base + {first} // PAGE_SIZE * stride_block_table_n, "
                    f"mask={per_step} < n_k, other=0)")
        if self.page_rows_hoisted:
            first = f"({per_step})" if " " in per_step else per_step
            return (f"tl.load(block_table_base + ({first} // PAGE_SIZE + tl.arange(0, BLOCK_N) // PAGE_SIZE)"
                    f" * stride_block_table_n, mask={keys} < n_k, other=0)")
        return (f"tl.load(block_table_base + (({keys}) // PAGE_SIZE) * stride_block_table_n, "
                f"mask={keys} < n_k, other=0)")

    def emit_first_pages(self, lo: str) -> None:
        """Before a paged key loop whose steps read their pages a step ahead: the first
        step's page ids (starting at key `lo`)."""
        self.emit("# Paged cache: key j is row j % PAGE_SIZE of page block_table[batch, j // PAGE_SIZE].")
        self.emit("# Each step reads the next step's page ids, so no K/V address waits on a table load of its")
        self.emit("# own step and the K/V loads pipeline as a contiguous cache's do; the first step's come here.")
        self.emit(f"page_ids = {self.table_load(f'{lo} + tl.arange(0, BLOCK_N)', lo)}")

    def emit_next_pages(self) -> None:
        """A paged key step that reads its pages ahead: the next step's page ids
        (`next_page_ids`, carried to it as `page_ids`), this step's pages and the row of each
        of its keys in its page. The ids stay int32 until used: Triton schedules a load
        whose result a loop carries as is together with its next-step user, one step
        ahead of it (widened first, the load would go to the user's step)."""
        self.emit(f"next_page_ids = {self.table_load('keys + BLOCK_N', 'start_n + BLOCK_N')}")
        self.emit("pages = page_ids.to(tl.int64)  # int64 offsets: a pool can pass 2**31 elements")
        if not self.page_rows_hoisted:
            self.emit("page_rows = keys % PAGE_SIZE")

    def emit_pages(self, masked: bool) -> None:
        """A paged kernel's key step that reads its own page ids (`page_lookahead` 0, or a
        loop whose next step is not known ahead): the page and the row in it of each key
        (`pages`, `page_rows`), from this sequence's block table. Keys past the sequence
        read no table entry (a table's unused entries may hold anything)."""
        self.emit("# Paged cache: key j is row j % PAGE_SIZE of page block_table[batch, j // PAGE_SIZE].")
        if self.page_per_step:
            # The step's keys lie in one page: one table entry, read once. A step past the
            # sequence's last key is partial and its loads are masked, so its entry (maybe
            # past the table's used part) is never followed.
            entry = "start_n // PAGE_SIZE"
            guard = ", mask=start_n < n_k, other=0" if masked else ""
            self.emit(f"pages = tl.load(block_table_base + {entry} * stride_block_table_n{guard}).to(tl.int64)")
        else:
            guard = ", mask=key_in_bounds, other=0" if masked else ""
            entries = ("(start_n // PAGE_SIZE + tl.arange(0, BLOCK_N) // PAGE_SIZE)" if self.page_rows_hoisted
                       else "(keys // PAGE_SIZE)")
            self.emit(f"pages = tl.load(block_table_base + {entries} * stride_block_table_n{guard}).to(tl.int64)")
        if not self.page_rows_hoisted:
            self.emit("page_rows = keys % PAGE_SIZE")

    def emit_yield(self, op: tile.YieldOp) -> None:
        loop = op.parent_op()
        assert isinstance(loop, tile.LOOP_OPS)
        targets = [self.namer[v] for v in loop.inits]
        values = [self.namer[v] for v in op.values]
        if targets != values:
            self.emit(f"{', '.join(targets)} = {', '.join(values)}")

    def emit_softmax_init(self, op: tile.SoftmaxInitOp) -> None:
        acc, row_max, row_sum = (self.namer.define(r) for r in op.results)
        self.emit(f"# tile.softmax_init: empty accumulator, row max at the softmax's floor ({SOFTMAX_FLOOR!r}), row sum 0")
        self.emit(f"{acc} = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)")
        self.emit(f"{row_max} = tl.full([BLOCK_M], {self.softmax_floor!r}, dtype=tl.float32)")
        self.emit(f"{row_sum} = tl.zeros([BLOCK_M], dtype=tl.float32)")

    @property
    def softmax_floor(self) -> float:
        """`attn.SOFTMAX_FLOOR` in the units of the carried row max (base 2 under
        `BASE2_ROW_MAX`): where the online softmax's row max starts."""
        return SOFTMAX_FLOOR * LOG2E if self.BASE2_ROW_MAX else SOFTMAX_FLOOR

    def emit_softmax_update(self, op: tile.SoftmaxUpdateOp) -> None:
        scores, row_max, row_sum = (self.namer[v] for v in op.operands)
        new_max = self.namer.fresh("row_max_new")
        factor = self.exponent_factor(op)
        if self.BASE2_ROW_MAX:
            self.emit("# tile.softmax_update: online softmax step, the row max in base-2 units (as the exponent scales s)")
            block_max = f"tl.max({scores}, 1) * {factor}"
        else:
            self.emit("# tile.softmax_update: online softmax step")
            unscaled = op.unscaled_scores is not None
            block_max = f"tl.max({scores}, 1) * {scale_expression(op.scale)}" if unscaled else f"tl.max({scores}, 1)"
        # The row max starts at the softmax's floor (`emit_softmax_init`), not -inf: it is
        # never -inf (a row with no kept key yet needs no select), and a row whose scores all lie
        # far below the floor (a whole row masked by -1e9 or finfo.min) shifts by it, so every
        # weight exp2(s * factor - max) is 0, never exp2 of a rounding of max * log2(e) beyond
        # the exponent's range (inf, then NaN). At and above the floor the weights are exact.
        self.emit(f"{new_max} = tl.maximum({row_max}, {block_max})")
        probs = self.fresh_result(op.probs)
        alpha = self.fresh_result(op.alpha)
        if self.BASE2_ROW_MAX:
            self.emit(f"{probs} = tl.math.exp2({scores} * {factor} - {new_max}[:, None])")
            self.emit(f"{alpha} = tl.math.exp2({row_max} - {new_max})")
        else:
            # exp(s - max) as exp2(s * log2(e) - max * log2(e)): one FMA per score.
            self.emit(f"{probs} = tl.math.exp2({scores} * {factor} - ({new_max} * {LOG2E})[:, None])")
            self.emit(f"{alpha} = tl.math.exp2(({row_max} - {new_max}) * {LOG2E})")
        self.emit(f"{self.fresh_result(op.new_row_sum)} = {row_sum} * {alpha} + tl.sum({probs}, 1)")
        self.emit(f"{self.fresh_result(op.new_row_max)} = {new_max}")

    def fresh_result(self, value: SSAValue) -> str:
        """A result's name: the loop-carried name when it is yielded back, else a new one."""
        carried = self.carried_name(value)
        if carried is not None:
            self.namer.alias(value, carried)
            return carried
        return self.namer.define(value)

    def carried_name(self, value: SSAValue) -> str | None:
        # A value that is only yielded can reuse the carried variable's name, provided the old
        # value has no reader after this op (the emitters read operands before writing).
        uses = list(value.uses)
        if len(uses) != 1 or not isinstance(uses[0].operation, tile.YieldOp):
            return None
        loop = uses[0].operation.parent_op()
        assert isinstance(loop, tile.LOOP_OPS)
        arg = loop.body.block.args[uses[0].index]
        producer = value.owner
        assert isinstance(producer, Operation)
        block = loop.body.block
        order = {op: i for i, op in enumerate(block.ops)}
        if any(order.get(u.operation, 1 << 30) > order[producer] for u in arg.uses):
            return None
        return self.namer[loop.inits[uses[0].index]]

    def emit_accumulate(self, op: tile.AccumulateOp) -> None:
        acc, probs, value = self.namer[op.acc], self.namer[op.probs], self.namer[op.value]
        self.emit("# tile.accumulate: " + ("acc * alpha + p @ v" if op.alpha is not None else "acc + p @ v"))
        scaled = f"{acc} * {self.namer[op.alpha]}[:, None]" if op.alpha is not None else acc
        result = self.fresh_result(op.result)
        p_op, value_op = self.gradient_product_operands(probs, op.value)
        self.emit(f"{result} = tl.dot({p_op}, {value_op}, acc={scaled}{self.dot_options()})")

    def gradient_product_operands(self, weights: str, value: SSAValue) -> tuple[str, str]:
        """The operands of a product of an fp32 weight tile (probabilities, score gradients)
        with a loaded tile `value`, as `tile.accumulate` and `tile.dot_lhs_transposed` define
        it: the weights rounded to the value's element type, so the product runs at that
        precision and tensor-core rate. A value widened to f32 for exact scores is rounded
        back too: this product needs no more than the element type's precision, like every
        other gradient product."""
        name = self.namer[value]
        assert isinstance(value.type, tile.TileType)
        if value.type.elem == "f32" and self.elem != "f32" and not self.upcast_dots:
            elem = TRITON_TYPES[self.elem]
            return f"{weights}.to({elem})", f"{name}.to({elem})"
        return (weights if self.upcast_dots else f"{weights}.to({name}.dtype)"), self.dot_operand(name)

    def emit_softmax_finalize(self, op: tile.SoftmaxFinalizeOp) -> None:
        acc, row_max, row_sum = (self.namer[v] for v in op.operands)
        has_keys = self.namer.fresh("has_keys")
        self.emit("# tile.softmax_finalize: normalize; a row with no weight gives 0 and lse = -inf")
        # A row sum under fp32's smallest normal number is a row with no kept key (0) or whose
        # scores all lie SOFTMAX_UNDERFLOW below the floor it started at (subnormal weights):
        # no weight (docs/semantics.md, "Additive bias"). Written as a negated `<`, so that a
        # NaN row sum (NaN inputs) gives NaN, not an empty row.
        self.emit(f"{has_keys} = ~({row_sum} < {FP32_MIN_NORMAL!r})")
        safe_sum = self.namer.fresh("row_sum_safe")
        self.emit(f"{safe_sum} = tl.where({has_keys}, {row_sum}, 1.0)")
        self.emit(f"{self.namer.define(op.output)} = {acc} / {safe_sum}[:, None]")
        lse = self.namer.define(op.lse)
        # lse in natural units: max + ln(sum), or (max + log2(sum)) * ln(2) for a base-2 max.
        natural = (f"({row_max} + tl.math.log2({safe_sum})) * {LN2}" if self.BASE2_ROW_MAX
                   else f"{row_max} + tl.math.log2({safe_sum}) * {LN2}")
        self.emit(f"{lse} = tl.where({has_keys}, {natural}, float(\"-inf\"))")

    def emit_alibi(self, op: tile.AlibiOp) -> None:
        pair = self.oriented()
        self.emit("# tile.alibi: slope * (k_pos - q_pos)")
        self.emit(
            f"{self.namer.define(op.result)} = {self.namer[op.input]}"
            f" + {self.slope(self.role_of(op.slopes))} * ({pair['k_pos']} - {pair['q_pos']}).to(tl.float32)"
        )

    def score_pointers(self, role: str) -> str:
        """Pointers to `role[batch, head, i, j]` for the current block's (query, key) pairs."""
        pair = self.oriented()
        if self.grid == "kv_splits":
            queries = f"(row_head * stride_{role}_h + row_query * stride_{role}_n)[:, None]"
            return f"{role}_base + {queries} + {pair['k_idx']} * stride_{role}_d"
        return f"{role}_base + {pair['q_idx']} * stride_{role}_n + {pair['k_idx']} * stride_{role}_d"

    def bias_block(self, role: str) -> str:
        """The load of `role[batch, head, query, key]` for the current block's pairs, broadcast
        through its strides; 0 outside the sequences (those entries are masked or discarded)."""
        return f"tl.load({self.score_pointers(role)}, mask={self.block_bounds()}, other=0.0)"

    def emit_add_bias(self, op: tile.AddBiasOp) -> None:
        block = self.namer.fresh("bias_block")
        role = self.role_of(op.bias)
        self.emit(f"# tile.add_bias: {role}[batch, head, query, key], broadcast through its strides")
        self.emit(f"{block} = {self.bias_block(role)}.to(tl.float32)")
        self.emit(f"{self.namer.define(op.result)} = {self.namer[op.input]} + {block}")

    def emit_relu_probs(self, op: tile.ReluProbsOp) -> None:
        self.emit("# tile.relu_probs: relu(s) / Nk (dropped keys are -inf: weight 0)")
        # NaN scores stay NaN (as torch.relu keeps them): tl.maximum would drop them.
        self.emit(
            f"{self.namer.define(op.result)} = tl.maximum({self.namer[op.input]}, 0.0, "
            "propagate_nan=tl.PropagateNan.ALL) / n_k"
        )

    def emit_zeros(self, op: tile.ZerosOp) -> None:
        assert isinstance(op.result.type, tile.TileType)
        sizes = {"m": "BLOCK_M", "n": "BLOCK_N", "d": "BLOCK_D", "dv": "BLOCK_DV", "half": "BLOCK_HALF", "pass": "BLOCK_PASS"}
        shape = ", ".join(sizes[d] for d in op.result.type.shape)
        self.emit("# tile.zeros")
        self.emit(f"{self.namer.define(op.result)} = tl.zeros([{shape}], dtype=tl.float32)")

    def emit_sparse_kv_loop(self, op: tile.SparseKVLoopOp | tile.SparseQLoopOp) -> None:
        masked = op.masked is not None
        blocks, count = self.role_of(op.blocks), self.role_of(op.count)
        kind = "partial: masked and bounds-checked" if masked else "full: no mask work"
        over = "query" if isinstance(op, tile.SparseQLoopOp) else "key"
        self.emit(f"# {op.name} over the {over} blocks the layout lists ({kind})")
        count_name = self.namer.fresh(f"{count}")
        start = "start_m" if over == "query" else "start_n"
        first = [f"{start} = tl.load({blocks}_base + entry * stride_{blocks}_d) * BLOCK_N"]
        self.emit_block_loop(op, f"for entry in range(0, {count_name}):", first, masked,
                             prelude=lambda: self.emit(f"{count_name} = tl.load({count}_base)"))

    # -- backward ops ----------------------------------------------------------------------

    def emit_q_bounds(self, op: tile.QBoundsOp) -> None:
        lower, upper = op.band.bounds
        self.emit(f"# tile.q_bounds: query blocks that visit this key block (band q_pos + [{lower}, {upper}])")
        # The query rows whose positions equal the block's first and last keys. Seen from the
        # key rows, a query row is kept at `key - (Nk - Nq) + [-upper, -lower]`.
        self.emit("diag_first = block_id * BLOCK_M - (n_k - n_q)")
        self.emit("diag_last = tl.minimum(block_id * BLOCK_M + BLOCK_M, n_k) - 1 - (n_k - n_q)")
        self.emit_band_range(op, "diag_first", "diag_last", None if upper is None else -upper,
                             None if lower is None else -lower, "n_q")
        self.emit("# A ragged last key block has padded rows: every query block is partial for it.")
        full_start, full_end = (self.namer[r] for r in op.results[1:3])
        self.emit(f"{full_end} = tl.where(block_id * BLOCK_M + BLOCK_M <= n_k, {full_end}, {full_start})")
        if self.ordered_adds:
            self.emit_previous_block_end(op)

    @property
    def ordered_adds(self) -> bool:
        """Whether the kernel adds into dq_acc in key-block order (`tile.store_add ... in_order`)."""
        return any(isinstance(op, tile.StoreAddOp) and op.ordered for op in self.kernel.walk())

    def emit_row_dot(self, op: tile.RowDotOp) -> None:
        a, b = self.namer[op.lhs], self.namer[op.rhs]
        self.emit("# tile.row_dot: rowsum(a * b) in fp32")
        self.emit(f"{self.namer.define(op.result)} = tl.sum({a}.to(tl.float32) * {b}.to(tl.float32), 1)")

    def emit_dot_transposed(self, op: tile.DotTransposedOp) -> None:
        a, b = self.dot_operand(self.namer[op.lhs]), self.dot_operand(self.namer[op.rhs])
        self.emit("# tile.dot_transposed: a @ b^T, fp32 accumulation")
        self.emit(f"{self.namer.define(op.result)} = tl.dot({a}, tl.trans({b}){self.dot_options()})")

    def emit_dot_lhs_transposed(self, op: tile.DotLhsTransposedOp) -> None:
        self.emit("# tile.dot_lhs_transposed: a^T @ b, fp32 accumulation")
        a_op, b_op = self.gradient_product_operands(self.namer[op.lhs], op.rhs)
        self.emit(f"{self.namer.define(op.result)} = tl.dot(tl.trans({a_op}), {b_op}{self.dot_options()})")

    def emit_recompute_probs(self, op: tile.RecomputeProbsOp) -> None:
        lse = self.namer[op.lse]
        self.emit("# tile.recompute_probs: p = exp(s - lse); a row with no kept key (lse = -inf) gives 0")
        safe = self.namer.fresh("lse_safe")
        self.emit(f"{safe} = tl.where({lse} == float(\"-inf\"), float(\"inf\"), {lse})")
        bcast = "[:, None]" if op.lse.type.shape == ("m",) else "[None, :]"  # type: ignore[union-attr]
        self.emit(
            f"{self.namer.define(op.result)} = tl.math.exp2({self.namer[op.scores]} * {self.exponent_factor(op)}"
            f" - ({safe} * {LOG2E}){bcast})"
        )

    def emit_softmax_grad(self, op: tile.SoftmaxGradOp) -> None:
        self.emit("# tile.softmax_grad: dS = P * (dP - delta)")
        self.emit(
            f"{self.namer.define(op.result)} = {self.namer[op.probs]} * "
            f"({self.namer[op.grad_probs]} - {self.along_queries(op.delta)})"
        )

    def emit_relu_grad(self, op: tile.ReluGradOp) -> None:
        self.emit("# tile.relu_grad: dS = dP / Nk where s > 0")
        self.emit(
            f"{self.namer.define(op.result)} = tl.where({self.namer[op.scores]} > 0.0, "
            f"{self.namer[op.grad_probs]}, 0.0) / n_k"
        )

    def emit_apply_scale(self, op: tile.ApplyScaleOp) -> None:
        scale = "sm_scale" if op.scale is None else repr(op.scale.value.data)
        self.emit(f"# tile.apply_scale: times the score scale ({'static' if op.scale else 'sm_scale'})")
        self.emit(f"{self.namer.define(op.result)} = {self.namer[op.input]} * {scale}")

    def emit_store_scores(self, op: tile.StoreScoresOp) -> None:
        role = self.role_of(op.dest)
        self.emit(f"# tile.store_scores: {role}[batch, head, query, key] for this block")
        self.emit(
            f"tl.store({self.score_pointers(role)}, {self.namer[op.value]}.to({role}_ptr.dtype.element_ty),"
            f" mask={self.block_bounds()})"
        )

    def emit_seq_len(self, op: tile.SeqLenOp) -> None:
        length = "n_q" if op.axis.data == "query" else "n_k"
        self.emit(f"# tile.seq_len: {length} as f32")
        # `* 1.0`, not `.to()`: Triton passes an integer argument equal to 1 as a constant.
        self.emit(f"{self.namer.define(op.result, 'num_' + op.axis.data + 's')} = {length} * 1.0")

    def emit_map(self, op: tile.MapOp) -> None:
        block = op.body.block
        operands = [self.namer[v] for v in op.inputs]
        self.emit(f"# tile.map over ({', '.join(operands)}), entry by entry")
        names: dict[SSAValue, str] = dict(zip(block.args, operands))
        # Entries that vary over the tile: those computed from a tile operand. A body that
        # yields anything else (a constant, a function of scalar operands) computes a scalar,
        # which is broadcast to the result's shape: the result is a tile whatever its body.
        varying = {arg for arg, value in zip(block.args, op.inputs) if isinstance(value.type, tile.TileType)}
        for inner in block.ops:
            if isinstance(inner, tile.MapYieldOp):
                value = names[inner.value]
                if inner.value not in varying:
                    like = operands[next(i for i, v in enumerate(op.inputs) if isinstance(v.type, tile.TileType))]
                    value = f"tl.where(True, {value}, {like})  # the same value at every entry of {like}'s shape"
                self.emit(f"{self.namer.define(op.result)} = {value}")
                return
            if any(v in varying for v in inner.operands):
                varying.update(inner.results)
            expression = scalar_expression(inner, [names[v] for v in inner.operands], self.helpers)
            result = inner.results[0]
            if isinstance(inner, arith.ConstantOp) or result.has_one_use():
                names[result] = expression  # inlined where it is used
                continue
            name = self.namer.fresh(result.name_hint or "entry")
            self.emit(f"{name} = {expression}")
            names[result] = name

    def emit_return(self, op: tile.ReturnOp) -> None:
        del op  # the function just ends

    HANDLERS: ClassVar[dict[type[Operation], Callable[[KernelEmitter, Any], None]]] = {}


KernelEmitter.HANDLERS = {
    tile.LoadOp: KernelEmitter.emit_load,
    tile.StoreOp: KernelEmitter.emit_store,
    tile.StoreAddOp: KernelEmitter.emit_store_add,
    tile.RotateOp: KernelEmitter.emit_rotate,
    tile.ScoresOp: KernelEmitter.emit_scores,
    tile.MaskOp: KernelEmitter.emit_mask,
    tile.KVBoundsOp: KernelEmitter.emit_kv_bounds,
    tile.KVSplitOp: KernelEmitter.emit_kv_split,
    tile.MergeSplitsOp: KernelEmitter.emit_merge_splits,
    tile.MergeLastSplitOp: KernelEmitter.emit_merge_last_split,
    tile.KVLoopOp: KernelEmitter.emit_kv_loop,
    tile.YieldOp: KernelEmitter.emit_yield,
    tile.SoftmaxInitOp: KernelEmitter.emit_softmax_init,
    tile.SoftmaxUpdateOp: KernelEmitter.emit_softmax_update,
    tile.AccumulateOp: KernelEmitter.emit_accumulate,
    tile.SoftmaxFinalizeOp: KernelEmitter.emit_softmax_finalize,
    tile.ReturnOp: KernelEmitter.emit_return,
    tile.AlibiOp: KernelEmitter.emit_alibi,
    tile.AddBiasOp: KernelEmitter.emit_add_bias,
    tile.ReluProbsOp: KernelEmitter.emit_relu_probs,
    tile.ZerosOp: KernelEmitter.emit_zeros,
    tile.JoinOp: KernelEmitter.emit_join,
    tile.SplitOp: KernelEmitter.emit_split,
    tile.SparseKVLoopOp: KernelEmitter.emit_sparse_kv_loop,
    tile.DocumentMaskOp: KernelEmitter.emit_document_mask,
    tile.QBoundsOp: KernelEmitter.emit_q_bounds,
    tile.QLoopOp: KernelEmitter.emit_q_loop,
    tile.SparseQLoopOp: KernelEmitter.emit_sparse_kv_loop,
    tile.RowDotOp: KernelEmitter.emit_row_dot,
    tile.DotTransposedOp: KernelEmitter.emit_dot_transposed,
    tile.DotLhsTransposedOp: KernelEmitter.emit_dot_lhs_transposed,
    tile.RecomputeProbsOp: KernelEmitter.emit_recompute_probs,
    tile.SoftmaxGradOp: KernelEmitter.emit_softmax_grad,
    tile.ReluGradOp: KernelEmitter.emit_relu_grad,
    tile.ApplyScaleOp: KernelEmitter.emit_apply_scale,
    tile.StoreScoresOp: KernelEmitter.emit_store_scores,
    tile.SeqLenOp: KernelEmitter.emit_seq_len,
    tile.MapOp: KernelEmitter.emit_map,
}


# --------------------------------------------------------------------------------------------
# The scalar ops of `tile.map` bodies
# --------------------------------------------------------------------------------------------

BINARY_OPERATORS: dict[type[Operation], str] = {
    arith.AddfOp: "+",
    arith.SubfOp: "-",
    arith.MulfOp: "*",
    arith.DivfOp: "/",
}

CALLS: dict[type[Operation], str] = {
    math.ExpOp: "tl.exp",
    math.LogOp: "tl.log",
    math.SqrtOp: "tl.sqrt",
    math.AbsFOp: "tl.abs",
    math.TanhOp: "_tanh",
}
"""Elementwise functions; `_tanh` is a helper of the generated module (`HELPERS`)."""

COMPARISONS = {"oeq": "==", "olt": "<", "ole": "<=", "ogt": ">", "oge": ">="}
"""`arith.cmpf` predicates (`tile.MAP_COMPARISONS`: ordered, false when either side is NaN,
as these operators are)."""

HELPERS = {
    "_tanh": '''@triton.jit
def _tanh(x):
    # tanh(x) = 2 sigmoid(2x) - 1 loses digits near 0 (cancellation): use the series there.
    # Below 0.4 the odd series to x^11 is within an fp32 ulp; above, the form is within ~7 ulp.
    x2 = x * x
    series = x * (1.0 - x2 * (1.0 / 3.0 - x2 * (2.0 / 15.0 - x2 * (17.0 / 315.0 - x2 * (
        62.0 / 2835.0 - x2 * (1382.0 / 155925.0))))))
    return tl.where(tl.abs(x) < 0.4, series, 2.0 * tl.sigmoid(2.0 * x) - 1.0)
''',
}
"""Helper functions the printed kernels may call, printed once into the module if used."""


def _constant(op: arith.ConstantOp, operands: list[str]) -> str:
    value = op.value
    assert isinstance(value, FloatAttr)
    number = float(value.value.data)
    # As fp32, which the verifier's types say the body computes in: a constant past fp32's
    # range is inf there (never printed as a bare `inf`, which is not Python).
    return repr(number) if abs(number) <= 3.4028234663852886e38 else f'float("{number}")'


def _comparison(op: arith.CmpfOp, operands: list[str]) -> str:
    predicate = arith.CMPF_COMPARISON_OPERATIONS[op.predicate.value.data]
    if predicate not in COMPARISONS:
        raise AttnFuseError(f"the Triton target cannot print arith.cmpf {predicate}")
    return f"({operands[0]} {COMPARISONS[predicate]} {operands[1]})"


def _binary(symbol: str) -> Callable[[Operation, list[str]], str]:
    return lambda op, operands: f"({operands[0]} {symbol} {operands[1]})"


def _nan_propagating(fn: str) -> Callable[[Operation, list[str]], str]:
    # maximumf/minimumf propagate NaN (MLIR's semantics); tl.maximum alone would drop it.
    return lambda op, operands: f"{fn}({operands[0]}, {operands[1]}, propagate_nan=tl.PropagateNan.ALL)"


SCALAR_RULES: dict[type[Operation], Callable[[Any, list[str]], str]] = {
    arith.ConstantOp: _constant,
    **{op_type: _binary(symbol) for op_type, symbol in BINARY_OPERATORS.items()},
    arith.NegfOp: lambda op, operands: f"(-{operands[0]})",
    arith.MaximumfOp: _nan_propagating("tl.maximum"),
    arith.MinimumfOp: _nan_propagating("tl.minimum"),
    arith.CmpfOp: _comparison,
    arith.SelectOp: lambda op, operands: f"tl.where({operands[0]}, {operands[1]}, {operands[2]})",
    **{op_type: (lambda name: lambda op, operands: f"{name}({operands[0]})")(name)
       for op_type, name in CALLS.items()},
}
"""How each scalar op of a `tile.map` body prints, its operands already printed (applied to
tiles, every rule is elementwise). `tile.MAP_BODY_OPS` is what the verifier admits; a test
checks that each has a rule."""


def scalar_expression(op: Operation, operands: list[str], helpers: set[str]) -> str:
    """The Triton expression of one `arith`/`math` op of a map body (`SCALAR_RULES`); records
    the helpers it calls in `helpers`."""
    rule = SCALAR_RULES.get(type(op))
    if rule is None:
        raise AttnFuseError(f"the Triton target cannot print {op.name} in a tile.map body")
    if CALLS.get(type(op)) in HELPERS:
        helpers.add(CALLS[type(op)])
    return rule(op, operands)


HEADER = '''"""Generated by AttnFuse from tile IR. Do not edit: change the variant and recompile."""

import triton
import triton.language as tl
'''

GDC_FUNCTIONS = ("gdc_launch_dependents", "gdc_wait")
"""Triton's grid-dependency control (`triton.language.extra.cuda`, Triton 3.6 and later),
imported by a module whose kernels are printed with `pdl` (`KernelEmitter.pdl`)."""

GDC_IMPORT = f"from triton.language.extra.cuda import {', '.join(GDC_FUNCTIONS)}\n"


def emit_module(module: ModuleOp, interpreter: bool = False) -> TritonProgram:
    """The Triton source of every `tile.kernel` in `module`, with launch information
    (`interpreter`: for Triton's CPU interpreter, see `KernelEmitter.interpreter`)."""
    kernels = [op for op in module.ops if isinstance(op, tile.KernelOp)]
    if not kernels:
        raise AttnFuseError("no tile.kernel to print: run lower-to-tile first")
    others = [op for op in module.ops if not isinstance(op, tile.KernelOp)]
    if others:
        raise AttnFuseError(f"the Triton target prints tile kernels only, found {others[0].name}")
    parts = [HEADER]
    infos = []
    helpers: set[str] = set()
    gdc = False
    for kernel in kernels:
        emitter = KernelEmitter(kernel, interpreter)
        gdc |= emitter.pdl
        parts.append("\n\n" + "\n".join(emitter.run()) + "\n")
        helpers |= emitter.helpers
        infos.append(
            KernelInfo(
                name=kernel.sym_name.data,
                roles=tuple(kernel.roles),
                grid=kernel.grid,
                block_m=kernel.get("block_m"),
                num_warps=kernel.get("num_warps"),
                num_stages=kernel.get("num_stages"),
                shared_offsets=emitter.shared_offsets,
                splits=emitter.splits,
                launch_pdl=emitter.launch_pdl,
            )
        )
    for name in sorted(helpers):
        parts.insert(1, "\n\n" + HELPERS[name])
    if gdc:
        parts[0] += GDC_IMPORT
    return TritonProgram("".join(parts), tuple(infos))


@dataclass(frozen=True)
class TritonTarget(Target):
    """`-t triton`: print the module's tile kernels as Triton source."""

    name = "triton"

    interpreter: bool = False
    """`-t 'triton{interpreter=true}'`: the variant run on Triton's CPU interpreter."""

    def emit(self, ctx: Context, module: ModuleOp, output: IO[str]) -> None:
        output.write(emit_module(module, self.interpreter).source)


__all__ = ["KernelInfo", "TritonProgram", "TritonTarget", "emit_module", "padded"]

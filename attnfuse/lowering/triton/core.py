"""The part of the Triton printer every op group uses: the kernel's signature and prologue, the
addressing of its tensor roles, the emission of blocks of ops, and the per-kernel state
(`EmitterCore`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from xdsl.ir import Block, Operation, SSAValue

from attnfuse.dialects import tile
from attnfuse.errors import AttnFuseError
from attnfuse.lowering.triton.names import Namer
from attnfuse.lowering.triton.program import GDC_FUNCTIONS, padded
from attnfuse.lowering.triton.scalars import HELPERS


CONSTEXPR_NAMES = ("BLOCK_M", "BLOCK_N", "HEAD_DIM", "BLOCK_D", "HEAD_DIM_V", "BLOCK_DV", "ROT_DIM", "ROT_HALF",
                   "BLOCK_HALF", "PASS_DIM", "BLOCK_PASS", "SHARED_OFFSETS", "PAGE_SIZE")
"""The compile-time parameters a printed kernel may take (`EmitterCore.signature`)."""


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
class EmitterCore:
    """What printing one `tile.kernel` as a `@triton.jit` function needs whatever its ops: the
    kernel's facts, its signature and prologue, its roles' addressing, and `run`, which emits
    its body through `HANDLERS` (`KernelEmitter`, which joins the op groups' printers)."""

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
            "tl", "triton", "block_id", "num_blocks", "batch_head", "batch", "head", "kv_head", "rows",
            "row_in_bounds", "keys", "key_in_bounds", "q_pos", "slope", "entry", "rank", "sm_scale", "n_q", "n_k", "num_heads",
            "group_size", "start_n", "q_first", "q_last", "queries", "query_in_bounds", "start_m",
            "head_in_group", "diag_first", "diag_last", "lse_safe", "split", "num_splits",
            "split_len", "row_head", "row_query", "row_blocks", "pages", "page_ids", "next_page_ids",
            "page_rows", "group_rows", "num_pages",
            "split_lo", "split_hi", "split_lse", "split_out", "new_max", "safe_max", "rescale",
            "splits", "split_rows", "step",
            "weight", "cached", "k_pos", "arrived", "count_ptr", "s", "prev_q_end",
            "cols_d", "cols_dv", "cols_half", "cols_pass", *HELPERS, *GDC_FUNCTIONS,
        }
        # The kernel's own parameters and name: read, never assigned, by the printed code.
        names |= set(CONSTEXPR_NAMES) | {self.kernel.sym_name.data}
        for role in self.roles:
            names |= {f"{role}_ptr", f"{role}_base", *self.strides(role)} | {f"stride_{role}_{a}" for a in "bhnd"}
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

    @staticmethod
    def pool_page(ids: str) -> str:
        """The int64 page index of block-table entries `ids` (int32), clamped to the pools'
        `[0, num_pages)`: the table is the caller's data, read on the GPU where no check can
        raise, so an entry outside the pools reads one of their pages instead of other memory
        (docs/semantics.md, "KV caches")."""
        return f"tl.minimum(tl.maximum({ids}, 0), num_pages - 1).to(tl.int64)"

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
        if self.paged:
            params.append("num_pages,")
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
        if k.head_major:
            # One axis, heads outermost (`head_major`): programs running together are
            # neighbouring blocks of a few heads and share their keys and values in L2.
            self.emit("num_blocks = tl.cdiv(n_q, BLOCK_M)")
            self.emit("batch_head = tl.program_id(0) // num_blocks")
            within = "tl.program_id(0) % num_blocks"
            self.emit(f"block_id = num_blocks - 1 - {within}" if k.block_order == tile.BlockOrder.DESCENDING
                      else f"block_id = {within}")
        else:
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
            self.emit("page_ids = tl.load(block_table_base + (k_pos // PAGE_SIZE) * stride_block_table_n, "
                      "mask=row_in_bounds, other=0)")
            self.emit("row_in_bounds = row_in_bounds & (page_ids >= 0) & (page_ids < num_pages)"
                      "  # nothing is written outside the pools")
            self.emit("pages = page_ids.to(tl.int64)")
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

    STEP_ROW = "start_m"
    """The first query row of the loop's block (in a `key_blocks` kernel)."""

    order_counter_name = ""
    """The counter of the current step's ordered adds (set at the step's first add)."""

    def emit_return(self, op: tile.ReturnOp) -> None:
        del op  # the function just ends

    HANDLERS: ClassVar[dict[type[Operation], Callable[[EmitterCore, Any], None]]] = {}

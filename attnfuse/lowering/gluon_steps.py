"""What the Gluon target's forward and backward printers share: the names of a kernel's
functions and parameters (`GluonFunctions`), and its step functions (`MaskedLoopSteps`):
several
consecutive loops of a kernel (full blocks, masked blocks) run as ONE pipelined range, so a
step function prints the ops the loops share once and each loop's masks under a runtime test
of the block's start against the loops' bounds (`bound_1`, ...: the lower bound of loop i).

One function per loop, chosen at the call site, doubled the softmax step in every consumer of
the forward and three consumers' 160 registers spilled; the merged form spills none."""

from __future__ import annotations

from attnfuse.dialects import tile


Pieces = list[tuple[bool, list[str]]]
"""One loop's ops as printed, op by op: (is a mask, its lines at indent 0)."""


class GluonFunctions:
    """Mixin of `KernelEmitter`s printing a Gluon kernel from its shape analysis's `parts`
    (whose `operands` are the roles behind its leading TMA descriptors): the kernel's name, its
    other roles' pointer parameters, its slopes, its loops' bounds, and `@gluon.jit` functions.
    `DESCRIPTOR_ROLES`: roles besides the operands that only descriptors carry."""

    DESCRIPTOR_ROLES: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.kernel.sym_name.data  # type: ignore[attr-defined]

    @property
    def operands(self) -> tuple[str, str, str, str]:
        """The roles of the leading descriptors, in the entry's order."""
        return self.parts.operands  # type: ignore[attr-defined]

    def pointer_roles(self) -> list[str]:
        skip = set(self.operands) | set(self.DESCRIPTOR_ROLES)
        return [role for role in self.roles if role not in skip]  # type: ignore[attr-defined]

    def pointer_params(self) -> list[str]:
        """The pointer roles' parameters (pointer, then strides), as the portable target
        passes them."""
        return [name for role in self.pointer_roles()
                for name in (f"{role}_ptr", *self.strides(role))]  # type: ignore[attr-defined]

    def slope_params(self) -> list[str]:
        return [self.slope_name(role) for role in self.slope_roles()]  # type: ignore[attr-defined]

    def bound_params(self) -> list[str]:
        """`bound_i`, the lower bound of loop i, for every loop after the first."""
        return [f"bound_{i}" for i in range(1, len(self.loops))]  # type: ignore[attr-defined]

    def document_roles(self) -> list[str]:
        """The document filter's ids (`doc_ids`), where the kernel has one."""
        return [role for role in self.roles if tile.role_kind(role) == "doc_ids"]  # type: ignore[attr-defined]

    def document_params(self) -> list[str]:
        """What `tile.document_mask` reads in a step: the ids of the program's sequence (its
        base, which the consumer points at the batch) and their stride."""
        return [name for role in self.document_roles() for name in (f"{role}_base", f"stride_{role}_n")]

    def document_bases(self) -> list[str]:
        """The consumer's `{doc_ids}_base`, its sequence of ids (nothing without one)."""
        return [self.base_line(role) for role in self.document_roles()]  # type: ignore[attr-defined]

    @staticmethod
    def function(header: str, body: list[str]) -> list[str]:
        return ["@gluon.jit", header] + body


class BiasBlocks:
    """Mixin of the Gluon printers: an additive bias's block, loaded by `<kernel>_<BIAS_FUNCTION>`
    from its pointer and strides while the block's product runs, and added in the score step. A printer
    says where its blocks lie: `BIAS_BLOCK` (the loop's start, the program rows' start, the
    rows' count: the function's index parameters), `BIAS_HEADER` (the index lines, in the score
    tile's layout) and `BIAS_LOOP_ROWS` (the loop's rows, as the portable printers read them)."""

    BIAS_BLOCK: tuple[str, str, str] = ("start_n", "row_start", "ROWS")
    BIAS_FUNCTION = "bias"
    """The load function's name after the kernel's (`<kernel>_bias`)."""
    BIAS_HEADER: tuple[str, ...] = ()
    BIAS_LOOP_ROWS: object = None

    def bias_roles(self) -> list[str]:
        """The kernel's additive-bias tensors (`bias`, `bias_1`, ...), loaded by `bias_function`'s
        function and added in the step."""
        return [role for role in self.roles if tile.role_kind(role) == "bias"]  # type: ignore[attr-defined]

    def bias_params(self) -> list[str]:
        """What a bias block is loaded by: its tile's batch and head, and each bias's pointer
        and strides (the load points `{role}_base` at the head's slice itself)."""
        roles = self.bias_roles()
        if not roles:
            return []
        return ["batch", "head", *[name for role in roles
                                   for name in (f"{role}_ptr", *self.strides(role))]]  # type: ignore[attr-defined]

    def bias_tiles(self) -> list[str]:
        """The variables holding the current block's bias tiles, one per bias role, loaded by
        `bias_function`'s function before the consumer waits for the block's scores."""
        return [f"{role}_tile" for role in self.bias_roles()]

    def bias_function(self) -> list[str]:
        """`<name>_<BIAS_FUNCTION>(start, row_start, batch, head, bias pointers..., n_q, n_k)`: the bias
        tiles of one block, as `tile.add_bias` reads them (`KernelEmitter.score_pointers`, in
        the grid's orientation; outside the sequences they read 0, and those entries are
        masked or discarded). The consumer calls it right after issuing the block's product,
        so the loads may run beside it (in the forward on the H200 this measured within
        run-to-run spread of loading inside the step: docs/performance.md §2). Offsets are
        int64, as the portable kernel's: a full bias's batch stride times the batch can pass
        2**31."""
        if not self.bias_roles():
            return []
        self.loop_vars.append(self.BIAS_LOOP_ROWS)  # type: ignore[attr-defined]
        body = ["batch = batch.to(tl.int64)  # int64 offsets: B * H * Nq * Nk can pass 2**31 elements",
                "head = head.to(tl.int64)", *self.BIAS_HEADER]
        for role in self.bias_roles():
            body += [self.base_line(role),  # type: ignore[attr-defined]
                     f"# tile.add_bias's operand: {role}[batch, head, query, key], broadcast through its strides",
                     f"{role}_tile = {self.bias_block(role)}"]  # type: ignore[attr-defined]
        self.loop_vars.pop()  # type: ignore[attr-defined]
        body.append(f"return {', '.join(self.bias_tiles())}")
        start, row_start, rows = self.BIAS_BLOCK
        params = [start, row_start, *self.bias_params(), "n_q", "n_k", f"{rows}: gl.constexpr",
                  "BLOCK_N: gl.constexpr", "S_LAYOUT: gl.constexpr"]
        name = self.name  # type: ignore[attr-defined]
        return self.function(f"def {name}_{self.BIAS_FUNCTION}({', '.join(params)}):",  # type: ignore[attr-defined]
                             ["    " + line for line in body]) + ["", ""]

    def bias_call(self, indent: str) -> list[str]:
        """The current block's bias tiles, into `bias_tiles()` (nothing without a bias)."""
        if not self.bias_roles():
            return []
        args = ", ".join([*self.BIAS_BLOCK[:2], *self.bias_params(), "n_q", "n_k", self.BIAS_BLOCK[2], "BLOCK_N",
                          "S_LAYOUT"])
        return [f"{indent}{', '.join(self.bias_tiles())} = {self.name}_{self.BIAS_FUNCTION}({args})"]  # type: ignore[attr-defined]

    def emit_add_bias(self, op: tile.AddBiasOp) -> None:
        """`tile.add_bias` on the tile `bias_function`'s function loaded for this block."""
        role = self.role_of(op.bias)  # type: ignore[attr-defined]
        self.emit(f"# tile.add_bias: {role}[batch, head, query, key], loaded beside the block's product")  # type: ignore[attr-defined]
        self.emit(f"{self.namer.define(op.result)} = {self.namer[op.input]} + {role}_tile.to(tl.float32)")  # type: ignore[attr-defined]


class MaskedLoopSteps:
    """Mixin of `KernelEmitter`s that print one step function for a kernel's consecutive
    loops (`self.loops`, each with the loop op as `.op`; `self.parts.listed` where they walk
    block lists); `RANGE_START` names the variable holding a range step's first row (`start_n`
    over keys, `start_m` over queries)."""

    RANGE_START = "start_n"

    @property
    def listed(self) -> bool:
        """Whether the loops walk block lists (documents, block sparsity): a step's loop is
        then told by its index over the lists (the full blocks' entries first, `bound_1` the
        first list's count), not by its first row."""
        return self.parts.listed  # type: ignore[attr-defined]

    @property
    def STEP_START(self) -> str:  # noqa: N802 (a name the printed tests read like a constant)
        """What tells a step's loop: its first row in a range, its index over lists."""
        return "step" if self.listed else self.RANGE_START

    def pieces_per_loop(self, pieces_of):
        """`pieces_of(loop)` for each loop, every loop printed with the same free names (so
        that what they share prints the same and can be merged); afterwards no value takes a
        name any of them used."""
        namer = self.namer  # type: ignore[attr-defined]
        taken = set(namer.taken)
        every_loop = set(taken)
        per_loop = []
        for loop in self.loops:  # type: ignore[attr-defined]
            namer.taken = set(taken)
            per_loop.append(pieces_of(loop))
            every_loop |= namer.taken
        namer.taken = every_loop
        return per_loop

    def loop_condition(self, index: int) -> str:
        """Whether the block at `STEP_START` lies in loop `index` (the loops cover consecutive
        ranges from `bound_i`, the lower bound of loop i)."""
        last = len(self.loops) - 1  # type: ignore[attr-defined]
        start = self.STEP_START
        below = f"{start} < bound_{index + 1}" if index < last else ""
        above = f"{start} >= bound_{index}" if index > 0 else ""
        if below and above:
            return f"({above}) & ({below})"
        return below or above or "True"

    def guarded(self, groups: list[tuple[list[int], list[str]]]) -> list[str]:
        """Each group's lines under the test that the block lies in one of its loops (none for
        a group of every loop); the loops' ranges are disjoint, so later groups are `elif`s."""
        out: list[str] = []
        keyword = "if"
        every = len(self.loops)  # type: ignore[attr-defined]
        for loops, lines in groups:
            if len(loops) == every:
                out += lines
                continue
            test = " | ".join(f"({self.loop_condition(i)})" if len(loops) > 1 else self.loop_condition(i)
                              for i in loops)
            out.append(f"{keyword} {test}:")
            out += ["    " + line if line else "" for line in lines]
            keyword = "elif"
        return out

    @staticmethod
    def same_skeleton(per_loop: list[Pieces]) -> bool:
        """Whether the loops differ only by their masks (then `merged_steps` prints them)."""
        skeletons = [[lines for mask, lines in pieces if not mask] for pieces in per_loop]
        return all(s == skeletons[0] for s in skeletons)

    def merged_steps(self, per_loop: list[Pieces]) -> list[str]:
        """Loops that differ only by masks: the shared ops once, and between them each loop's
        masks, loops whose masks print alike sharing one test. A loop's masks after its last
        shared op come last."""
        out: list[str] = []
        cursor = [0] * len(per_loop)

        def masks_of(i: int, pieces: Pieces) -> list[str]:
            masks: list[str] = []
            while cursor[i] < len(pieces) and pieces[cursor[i]][0]:
                masks += pieces[cursor[i]][1]
                cursor[i] += 1
            return masks

        def grouped_masks() -> list[str]:
            groups: dict[tuple[str, ...], list[int]] = {}
            for i, pieces in enumerate(per_loop):
                masks = masks_of(i, pieces)
                if masks:
                    groups.setdefault(tuple(masks), []).append(i)
            return self.guarded([(loops, list(masks)) for masks, loops in groups.items()])

        for shared in [lines for mask, lines in per_loop[0] if not mask]:
            out += grouped_masks()
            for i in range(len(per_loop)):
                cursor[i] += 1  # the shared op itself
            out += shared
        return out + grouped_masks()


__all__ = ["GluonFunctions", "MaskedLoopSteps", "Pieces"]

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

"""Binding a call's data: the call-time tensors (bias, block layout, document ids, RoPE
positions) checked and bound to the kernel roles of the ops that read them, and the block lists
of the listed filters, built once per plan and state of the caller's tensors.

`CallBinding` is the part of `CompiledAttention` (runtime/api.py) that does this; it reads the
compiled object's `program` and `variant`."""

from __future__ import annotations

import weakref

import torch

from attnfuse.runtime.block_lists import ListSource, call_block_lists
from attnfuse.runtime.call_data import (
    given_positions,
    position_extent,
    refuse_non_strided,
    refuse_undeclared_data,
)
from attnfuse.runtime.call_plan import LIST_SOURCES, CallPlan
from attnfuse.runtime.program import DATA_KEYWORDS, Canonical, VariantProgram
from attnfuse.runtime.tensor_cache import tensor_state


def _checked_by_caller() -> None:
    """A `TensorCache` check for a tensor the call has just checked itself."""


class CallBinding:
    """`CompiledAttention`'s binding of call-time data (see the module's docstring)."""

    # Set by CompiledAttention.__init__.
    program: VariantProgram
    variant: Canonical

    def _block_lists(
        self,
        sources: tuple[ListSource, ...],
        plan: CallPlan,
        backward: bool,
    ) -> dict[str, torch.Tensor]:
        """The block lists the forward (or the backward) kernels read for the call's listed
        filters (a block layout, document ids), built once per plan and state of the caller's
        tensors (`TensorCache`, keyed by the first; a second filter's tensor is part of what
        is looked up, and checked to be the same object). A backward gets what its kernels
        read: a dQ kernel's lists (none in a fused backward), and the query lists' ranks where
        dQ is added in key-block order."""
        assert plan.config is not None
        first, others = sources[0].given, tuple(source.given for source in sources[1:])
        ranks = backward and (plan.backward_reads("full_q_rank") or plan.backward_reads("partial_q_rank"))
        dq_lists = backward and (plan.backward_reads("full_blocks") or plan.backward_reads("partial_blocks"))
        what = (backward, ranks, dq_lists, tuple((id(t), tensor_state(t)) for t in others))

        def build() -> tuple[tuple, dict[str, torch.Tensor]]:
            lists = call_block_lists(sources, self.variant.band, plan.problem, plan.config, backward, ranks,
                                     dq_lists)
            return tuple(weakref.ref(t) for t in others), lists

        refs, lists = plan.layouts.get(first, what, build, _checked_by_caller)
        if any(ref() is not t for ref, t in zip(refs, others)):
            refs, lists = build()  # another tensor at a freed one's address: not the cached lists
        return lists

    def call_tensors(
        self,
        plan: CallPlan,
        arguments: dict[str, object],
        explicit_positions: tuple[bool, bool] = (False, False),
    ) -> dict[str, torch.Tensor]:
        """The call-time data tensors, bound from the call's keyword `arguments` by the ops of
        the program that read them (bias, block-sparse lists, RoPE positions), checked."""
        tensors: dict[str, torch.Tensor] = {}
        problem = plan.problem
        variant = self.program.canonical(explicit_positions)
        for name, view in given_positions(self.program, problem, arguments).items():  # checked even if unread
            if variant.reads_positions[name == "k_positions"]:
                tensors[name] = view
        if ("q_positions" in tensors or "k_positions" in tensors) and plan.compiled is not None:
            assert variant.rope is not None
            # The table must reach the largest |position|: one host sync per positions tensor
            # and version, not per call (every layer of a model passes the same positions).
            furthest = 0
            for name in ("q_positions", "k_positions"):
                if name in tensors:
                    extent = plan.positions.get(arguments[name], "extent",
                                                lambda name=name: position_extent(tensors[name], name),
                                                _checked_by_caller)
                    furthest = max(furthest, extent)
            if furthest > plan.constants["rope_table"].shape[1]:
                tensors["rope_table"] = self._rope_table(problem, furthest)
        refuse_undeclared_data(self.program, variant.arguments, arguments, DATA_KEYWORDS)
        refuse_non_strided(arguments)  # before any binding reads them
        sources: list[ListSource] = []
        for binding in variant.bindings:
            if binding.use.argument is None:
                continue  # made from the program: a plan constant
            listed = binding in variant.listed
            if binding.role is not None and binding.role in tensors and not listed:
                continue  # two ops reading one tensor (two add_bias of one bias): bound once
            value = binding.bind(problem, arguments)
            if binding.role is not None:
                tensors[binding.role] = value
            if listed:
                sources.append(ListSource(binding.op, value, arguments[binding.use.argument],
                                          binding.use.argument))
        if sources and plan.config is not None and plan.splits is None:
            # (Split decode kernels test each entry instead: they have no block lists.)
            tensors[LIST_SOURCES] = tuple(sources)  # type: ignore[assignment]
            tensors |= self._block_lists(tuple(sources), plan, backward=False)
        return tensors

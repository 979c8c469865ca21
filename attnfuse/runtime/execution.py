"""Running a plan's kernels: the forward (with its output, log-sum-exp and rotated copies),
the backward (with the gradients' buffers and the fused backward's dQ accumulator), and the
launch schedule of a set of kernels, worked out once per plan.

`KernelExecution` is the part of `CompiledAttention` (runtime/api.py) that launches; it sets
the compiled object's `last`."""

from __future__ import annotations

import torch

from attnfuse.errors import ArgumentError, AttnFuseError
from attnfuse.runtime.call_plan import (
    LIST_SOURCES,
    ROTATED_ROLES,
    ROTATION_KERNELS,
    CallPlan,
)
from attnfuse.runtime.compiler import CompiledProgram
from attnfuse.runtime.inputs import Problem
from attnfuse.runtime.interpreter import truncates_to_bf16
from attnfuse.runtime.launch import KernelLaunch
from attnfuse.runtime.launch_graphs import LaunchGraphs
from attnfuse.runtime.layout import empty_in_layout_of


def _dq_accumulator(p: Problem, ordered: bool) -> dict[str, torch.Tensor]:
    """The fused backward's zeroed `dq_acc` (fp32 `[B, Hq, Nq, D]`) and, for adds in
    key-block order, its `dq_order` counters (int32 `[B, Hq, Nq]`), zeroed by the same fill:
    one allocation whose tail holds the counters. Zeroed per call: torch.zeros is an async
    device fill (no host sync, so CUDA-graph capture still works), and the preprocess, which
    does not run for relu, stays free of a second job."""
    rows = p.batch * p.heads_q * p.seq_q
    acc = torch.zeros(rows * p.head_dim + (rows if ordered else 0), dtype=torch.float32, device=p.device)
    tensors = {"dq_acc": acc[:rows * p.head_dim].view(p.batch, p.heads_q, p.seq_q, p.head_dim)}
    if ordered:
        tensors["dq_order"] = acc[rows * p.head_dim:].view(torch.int32).view(p.batch, p.heads_q, p.seq_q)
    return tensors


class KernelExecution:
    """`CompiledAttention`'s kernel runs (see the module's docstring)."""

    last: CompiledProgram | None
    """The program of the most recent call that ran kernels (`CompiledAttention.source`)."""

    def forward(
        self,
        plan: CallPlan,
        data: dict[str, torch.Tensor],
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        rotated: dict[str, torch.Tensor] | None = None,
        keep_lse: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Runs the forward kernels; returns the output and the fp32 log-sum-exp (for relu
        attention, which has none, an unwritten buffer that is never returned to users).
        The rotated copies the pre-rotation kernels wrote (`q_rot`, `k_rot`) are added to
        `rotated` when it is given. Without `keep_lse` (an inference call that discards the
        lse) the kernels store the lse into the plan's scratch buffer, which every such call
        overwrites: the lse returned is then not the call's to keep."""
        p = plan.problem
        # In q's memory order (`empty_in_layout_of`): a model's head merge then reads it as a view.
        out = empty_in_layout_of(q, p.dtype, None if p.head_dim_v == p.head_dim else
                                 (p.batch, p.heads_q, p.seq_q, p.head_dim_v))
        lse = None if keep_lse or plan.compiled is None else plan.scratch.get("lse")
        if lse is None:
            lse = torch.empty(p.batch, p.heads_q, p.seq_q, dtype=torch.float32, device=p.device)
            if not keep_lse and plan.compiled is not None:
                # Calls on other streams may write it at once: a race between stores that
                # nothing reads, as harmless as a graph replay writing it.
                plan.scratch["lse"] = lse
        if plan.compiled is None:
            # No key: every row outputs 0 with lse -inf; no row or batch: nothing to compute.
            out.zero_()
            lse.fill_(float("-inf"))
            return out, lse
        self.last = plan.compiled
        tensors = {"q": q, "k": k, "v": v, "o": out, "lse": lse, **plan.constants, **data}
        if plan.splits is not None:
            # Split-KV decoding: each split's partial output and lse (fp32), then their merge.
            splits = plan.splits[0]
            tensors["o_part"] = torch.empty(p.batch, p.heads_q, splits, p.seq_q, p.head_dim_v,
                                            dtype=torch.float32, device=p.device)
            tensors["lse_part"] = torch.empty(p.batch, p.heads_q, splits, p.seq_q,
                                              dtype=torch.float32, device=p.device)
            # attention_merge exists only where the partials are not merged in attention_decode.
            self._run(plan, tensors, ("attention_decode", "attention_merge"))
            return out, lse
        self._run(plan, tensors, ("attention_fwd",))
        if rotated is not None:
            for role in ROTATED_ROLES:
                if role in tensors:
                    rotated[role] = tensors[role]
        return out, lse

    def _run(self, plan: CallPlan, tensors: dict[str, torch.Tensor], kernels: tuple[str, ...]) -> None:
        """Launches the plan's kernels named in `kernels`, in program order, preceded by the
        rotation kernels whose output (`q_rot`, `k_rot`) they read and `tensors` lacks; several
        launches on a GPU go as one CUDA graph where `launch_graphs.LaunchGraphs` allows."""
        key = (kernels, "q_rot" in tensors, "k_rot" in tensors)
        entry = plan.schedules.get(key)
        if entry is None:
            schedule = self._schedule(plan, tensors, kernels)
            entry = plan.schedules[key] = (schedule, self._graphs(plan, schedule))
        schedule, graphs = entry
        for _launch, rotated, copy_dtype in schedule:
            if rotated is not None:
                # A pre-rotation kernel writes the rotated copy the attention kernels read, in
                # the operand's memory order: a model's q is a [B, N, H, D] projection, and the
                # output gradient comes back in that order too (the model's head merge), so the
                # dK/dV kernel can share their offsets (SHARED_OFFSETS). Allocated before any
                # launch, so that a graph's key holds its address like any operand's (a loop's
                # copies come back at the same addresses, as its activations do).
                tensors[rotated] = empty_in_layout_of(tensors[rotated[0]], copy_dtype)
        if graphs is not None and graphs(tensors):
            return
        for launch, _rotated, _copy_dtype in schedule:
            launch(tensors)

    @staticmethod
    def _schedule(
        plan: CallPlan, tensors: dict[str, torch.Tensor], kernels: tuple[str, ...]
    ) -> tuple[tuple[KernelLaunch, str | None, torch.dtype], ...]:
        """The launches `_run` makes for `kernels` (see there), each with the rotated copy
        it writes (a pre-rotation kernel) or None and that copy's dtype; their grids checked.
        Once per plan, kernel set and rotated copies given."""
        given = {role for role in ROTATION_KERNELS.values() if role in tensors}
        roles = {role for launch in plan.launches if launch.info.name in kernels
                 for role in launch.info.roles}
        wanted = set(kernels) | {name for name, role in ROTATION_KERNELS.items()
                                 if role in roles and role not in given}
        # The interpreter would truncate the copies to bf16: they are kept in fp32 there; GPUs
        # round. The operands' dtype and device are the plan's.
        p = plan.problem
        copy_dtype = torch.float32 if truncates_to_bf16(p.dtype, p.device) else p.dtype
        schedule = tuple((launch, ROTATION_KERNELS.get(launch.info.name), copy_dtype)
                         for launch in plan.launches if launch.info.name in wanted)
        for launch, _rotated, _dtype in schedule:
            launch.check_grid()
        return schedule

    @staticmethod
    def _graphs(plan: CallPlan, schedule: tuple[tuple[KernelLaunch, str | None, torch.dtype], ...]
                ) -> LaunchGraphs | None:
        """The CUDA graphs a schedule replays as (`launch_graphs`), keyed by every role its
        launches read or write (a Gluon launch's own roles too; a pre-rotation kernel's copy,
        which `_run` allocates before the launches), or None where `LaunchGraphs` finds none
        usable (one launch, not a GPU) or a launch allocates on every call
        (`GluonBackwardLaunch.allocates`)."""
        if any(launch.allocates for launch, _rotated, _dtype in schedule):
            return None
        roles = {role for launch, _rotated, _dtype in schedule
                 for role in (*launch.info.roles, *getattr(launch, "keyed_roles", ()))}
        graphs = LaunchGraphs([launch for launch, _rotated, _dtype in schedule], roles, plan.problem.device)
        return graphs if graphs.usable else None

    def backward(
        self,
        plan: CallPlan,
        data: dict[str, torch.Tensor],
        saved: tuple[torch.Tensor, ...],
        grad_out: torch.Tensor,
        grad_lse: torch.Tensor | None,
        bias_grad: bool,
        saved_roles: tuple[str, str] = ("q", "k"),
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Runs the backward kernels: (dq, dk, dv, dbias) from the saved (q, k, v, o, lse), the
        output gradient and, for softmax, the log-sum-exp's gradient. `dbias` is the full-size
        `[B, Hq, Nq, Nk]` fp32 gradient of the broadcast bias, or None. `saved` may hold the
        forward's rotated copies in place of q and k (`saved_roles` names what it holds,
        `_AttentionFunction.forward`); the gradients are those of the unrotated q and k."""
        q, k, v, out, lse = saved
        p = plan.problem
        # Every program stores all its rows, so the kernels fill the gradients whole. Dtypes
        # come from the problem (a rotated copy in the interpreter is fp32), memory orders from
        # the operands (a rotated copy has its operand's): the projections' backward then
        # reads them as views.
        dq, dk, dv = (empty_in_layout_of(t, p.dtype) for t in (q, k, v))
        dbias = None
        if bias_grad:
            # Pairs in blocks the kernels skip (dropped by the mask) keep gradient 0.
            dbias = torch.zeros(p.batch, p.heads_q, p.seq_q, p.seq_k, dtype=torch.float32, device=p.device)
        if plan.compiled is None:
            return dq.zero_(), dk.zero_(), dv.zero_(), dbias
        if plan.splits is not None:
            # A split decode's program has no backward kernels: nothing would fill dq, dk, dv.
            raise AttnFuseError("internal: a backward was run on a decode plan; ask plan(..., backward=True)")
        q_role, k_role = saved_roles
        tensors = {q_role: q, k_role: k, "v": v, "o": out, "lse": lse, "do": grad_out, "dq": dq,
                   "dk": dk, "dv": dv, **plan.constants, **data}
        sources = data.get(LIST_SOURCES)
        if sources is not None:
            tensors |= self._block_lists(sources, plan, backward=True)  # type: ignore[arg-type]
        softmax = "delta" in plan.roles  # relu attention has no delta and no preprocess
        if softmax:
            tensors["delta"] = torch.empty(p.batch, p.heads_q, p.seq_q, dtype=torch.float32, device=p.device)
        if dbias is not None:
            tensors["dbias"] = dbias
        if plan.backward_reads("dq_acc"):
            # The fused backward (`bwd-dq=fused` or `ordered`): dK/dV adds dS K into dq_acc
            # (and, for a bias that requires a gradient, its `_bias` copy stores dbias), the
            # finish kernel scales it into dq.
            ordered = plan.backward_reads("dq_order")
            if not ordered and torch.are_deterministic_algorithms_enabled():
                # The plan was made (in the forward) while they were off; its atomics would
                # break the promise made since. PyTorch's own non-deterministic ops raise here.
                raise ArgumentError(
                    "torch.use_deterministic_algorithms(True) was set after the forward of a "
                    "deterministic=False call that took the fused (atomic) backward: run the "
                    "forward again with deterministic algorithms on, or compile with "
                    "deterministic=True")
            tensors |= _dq_accumulator(p, ordered)
            if softmax:
                self._run(plan, tensors, ("attention_bwd_preprocess",))
                if grad_lse is not None:
                    tensors["delta"].sub_(grad_lse)  # as below
            dkdv_kernel = "attention_bwd_dkdv_dq_bias" if dbias is not None else "attention_bwd_dkdv_dq"
            self._run(plan, tensors, (dkdv_kernel, "attention_bwd_dq_finish"))
            return dq, dk, dv, dbias
        if softmax and grad_lse is None and dbias is None:
            # dQ forms delta itself and stores it; dK/dV, launched after it, reads it.
            self._run(plan, tensors, ("attention_bwd_dq_delta", "attention_bwd_dkdv"))
            return dq, dk, dv, dbias
        if softmax:
            self._run(plan, tensors, ("attention_bwd_preprocess",))
            if grad_lse is not None:
                # d lse_i / d s_ij = p_ij: a gradient of the lse shifts delta (dS = P (dP - delta)).
                tensors["delta"].sub_(grad_lse)
        dq_kernel = "attention_bwd_dq_bias" if dbias is not None else "attention_bwd_dq"
        self._run(plan, tensors, ("attention_bwd_dkdv", dq_kernel))
        return dq, dk, dv, dbias

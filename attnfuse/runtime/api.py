"""The torch-facing entry point: `compile(spec)` and the callable it returns."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from attnfuse.dsl.blocks import AdditiveBias, Alibi, BlockSparse, Relu, Rope, ScaledDotProduct
from attnfuse.dsl.build_ir import mask_band
from attnfuse.dsl.spec import AttentionSpec
from attnfuse.errors import ArgumentError, AttnFuseError
from attnfuse.runtime.compiler import (
    CompiledProgram,
    CompileKey,
    compile_program,
    generate_program,
    lower_spec,
)
from attnfuse.runtime.call_data import (
    alibi_slopes,
    bias_view,
    check_layout,
    positions_view,
    sparse_block_lists,
)
from attnfuse.runtime.config import (
    TileConfig,
    check_placement_request,
    choose_tile_config,
    rope_placement,
)
from attnfuse.runtime.inputs import Problem, check_inputs
from attnfuse.runtime.launch import KernelLaunch, default_scale, prepare, rope_table


@dataclass(frozen=True)
class CallPlan:
    """What a call of one shape runs: decided once per shape, then reused."""

    problem: Problem
    compiled: CompiledProgram | None
    launches: tuple[KernelLaunch, ...]
    constants: dict[str, torch.Tensor]
    """Tensors that depend only on the shape: rotary frequencies, ALiBi slopes."""
    config: TileConfig | None


MAX_ROPE_POSITION = 2**24
"""Positions beyond this are not exact in fp32, the precision the rotation is defined in."""


class CompiledAttention:
    """A compiled variant: call it as `fn(q, k, v, return_lse=False)`.

    Kernels are generated per head dim, dtype and tile configuration on first use and cached
    (in memory and on disk). `source` is the Triton source of the most recent call's kernels.
    """

    def __init__(
        self,
        spec: AttentionSpec,
        *,
        rope_placement: str | tuple[str, str] = "auto",
        config: TileConfig | None = None,
    ):
        if not isinstance(spec, AttentionSpec):
            raise AttnFuseError(f"compile() takes a spec made by af.attention(...), got {spec!r}")
        if config is not None and not isinstance(config, TileConfig):
            raise ArgumentError(f"config must be an af.TileConfig or None, got {config!r}")
        check_placement_request(rope_placement)
        self.spec = spec
        self.rope_placement = rope_placement
        self.config = config
        self.last: CompiledProgram | None = None
        self._plans: dict[tuple, CallPlan] = {}
        self._sparse_cache: tuple[torch.Tensor, tuple, dict[str, torch.Tensor]] | None = None
        sdp = spec.block(ScaledDotProduct)
        self._scale = sdp.scale if isinstance(sdp, ScaledDotProduct) else None

    def __repr__(self) -> str:
        return f"CompiledAttention({self.spec!r})"

    # -- compile -----------------------------------------------------------------------------

    def tile_config(self, problem: Problem) -> TileConfig:
        """The tile configuration for a problem: the user's, else the dispatcher's; blocks
        never exceed a block-sparse layout's block size."""
        config = self.config or choose_tile_config(problem)
        sparse = self.spec.block(BlockSparse)
        if isinstance(sparse, BlockSparse):
            bs = sparse.block_size
            config = replace(config, block_m=min(config.block_m, bs), block_n=min(config.block_n, bs))
        return config

    def compile_key(
        self, problem: Problem, explicit_positions: tuple[bool, bool] = (False, False)
    ) -> CompileKey:
        """What this call's kernels are specialized on."""
        config = self.tile_config(problem)
        placement = rope_placement(self.spec, problem, config, self.rope_placement)
        return CompileKey(problem.head_dim, problem.head_dim_v, problem.element_type, config,
                          placement, explicit_positions)

    def program_for(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> CompiledProgram:
        """The compiled kernels that a call with these tensors runs."""
        problem = check_inputs(self.spec, q, k, v)
        return compile_program(self.spec, self.compile_key(problem), q.device.type != "cuda")

    @property
    def source(self) -> str:
        """The generated Triton source: of the last call, or, before one, for head dim 64 in
        fp16 on this machine's default device (the GPU if there is one)."""
        if self.last is not None:
            return self.last.source
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        problem = Problem(1, 1, 1, 1, 1, 64, 64, torch.float16, device)
        program, _path, _key = generate_program(self.spec, self.compile_key(problem), device.type != "cuda")
        return program.source

    def tile_ir(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str:
        """The tile IR a call with these tensors compiles to, as text."""
        problem = check_inputs(self.spec, q, k, v)
        return str(lower_spec(self.spec, self.compile_key(problem)))

    def plan(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        explicit_positions: tuple[bool, bool] = (False, False),
    ) -> CallPlan:
        """The checked, compiled and prepared launches for tensors of these shapes."""
        try:
            key = (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, k.device,
                   v.device, q.layout, k.layout, v.layout, explicit_positions)
        except (AttributeError, RuntimeError):
            key = None  # not dense tensors: check_inputs says which argument is wrong
        plan = self._plans.get(key) if key is not None else None
        if plan is None:
            # Validation depends only on what the key holds, so a cached plan is a checked one.
            problem = check_inputs(self.spec, q, k, v)
            plan = self._make_plan(problem, explicit_positions)
            if key is not None:
                self._plans[key] = plan
        return plan

    def _make_plan(self, problem: Problem, explicit_positions: tuple[bool, bool]) -> CallPlan:
        constants: dict[str, torch.Tensor] = {}
        alibi = self.spec.block(Alibi)
        if isinstance(alibi, Alibi):
            # Before the empty-problem exit: the slope count is checked for every call.
            constants["slopes"] = alibi_slopes(alibi.slopes, problem)
        if problem.empty:
            return CallPlan(problem, None, (), {}, None)
        key = self.compile_key(problem, explicit_positions)
        compiled = compile_program(self.spec, key, problem.device.type != "cuda")
        scale = self._scale if self._scale is not None else default_scale(problem.head_dim)
        rope = self.spec.block(Rope)
        if isinstance(rope, Rope):
            rotary_dim = rope.rotary_dim or problem.head_dim
            length = max(problem.seq_q, problem.seq_k)
            constants["rope_table"] = rope_table(rope.theta, rotary_dim, rope.scaling, problem.device, length)
        launches = tuple(prepare(compiled, problem, scale))
        return CallPlan(problem, compiled, launches, constants, key.config)

    def call_tensors(
        self,
        plan: CallPlan,
        bias: object,
        block_layout: object,
        q_positions: object = None,
        k_positions: object = None,
    ) -> dict[str, torch.Tensor]:
        """The call-time data tensors (bias, block-sparse lists, RoPE positions), checked."""
        tensors: dict[str, torch.Tensor] = {}
        problem = plan.problem
        rope = self.spec.block(Rope)
        for name, given, length in (
            ("q_positions", q_positions, problem.seq_q),
            ("k_positions", k_positions, problem.seq_k),
        ):
            if given is None:
                continue
            if not isinstance(rope, Rope):
                raise ArgumentError(f"{name}= given, but {self.spec!r} has no rope()")
            tensors[name] = positions_view(given, name, length, problem)
        if ("q_positions" in tensors or "k_positions" in tensors) and plan.compiled is not None:
            # The table must reach the largest |position| (one host sync per such call).
            furthest = 0
            for name in ("q_positions", "k_positions"):
                if name not in tensors or not tensors[name].numel():
                    continue
                largest = int(tensors[name].to(torch.int64).abs().max())
                if largest > MAX_ROPE_POSITION:
                    raise ArgumentError(
                        f"{name} must lie in [-{MAX_ROPE_POSITION}, {MAX_ROPE_POSITION}] (fp32 "
                        f"represents them exactly), got |position| = {largest}"
                    )
                furthest = max(furthest, largest + 1)
            if furthest > plan.constants["rope_table"].shape[1]:
                assert isinstance(rope, Rope)
                tensors["rope_table"] = rope_table(
                    rope.theta, rope.rotary_dim or problem.head_dim, rope.scaling,
                    problem.device, furthest,
                )
        if self.spec.block(AdditiveBias) is not None:
            tensors["bias"] = bias_view(bias, plan.problem)
        elif bias is not None:
            raise ArgumentError(f"bias= given, but {self.spec!r} has no additive_bias()")
        sparse = self.spec.block(BlockSparse)
        if isinstance(sparse, BlockSparse):
            layout = check_layout(block_layout, sparse.block_size, plan.problem)
            if plan.config is not None:
                tensors |= self._sparse_lists(layout, sparse.block_size, plan)
        elif block_layout is not None:
            raise ArgumentError(f"block_layout= given, but {self.spec!r} has no block_sparse()")
        return tensors

    def _sparse_lists(self, layout: torch.Tensor, block_size: int, plan: CallPlan) -> dict[str, torch.Tensor]:
        # Layouts are usually reused across calls (every layer of a model): keep the lists of
        # the last layout seen. Reuse them only for that very tensor object, unmodified since
        # (its in-place version counter unchanged): another tensor may share its storage or,
        # once it is freed, its address.
        key = (layout._version, plan.problem, plan.config)
        cached = self._sparse_cache
        if cached is not None and cached[0] is layout and cached[1] == key:
            return cached[2]
        assert plan.config is not None
        lists = sparse_block_lists(
            layout, block_size, mask_band(self.spec), plan.problem,
            plan.config.block_m, plan.config.block_n,
        )
        self._sparse_cache = (layout, key, lists)
        return lists

    # -- run ---------------------------------------------------------------------------------

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        return_lse: bool = False,
        bias: torch.Tensor | None = None,
        block_layout: torch.Tensor | None = None,
        q_positions: torch.Tensor | None = None,
        k_positions: torch.Tensor | None = None,
        **unexpected: Any,
    ):
        if unexpected:
            raise ArgumentError(
                f"unexpected argument(s) {', '.join(sorted(unexpected))} for {self.spec!r}"
            )
        if return_lse and self.spec.block(Relu) is not None:
            raise ArgumentError("return_lse=True needs softmax(): relu() attention has no log-sum-exp")
        explicit = (q_positions is not None, k_positions is not None)
        plan = self.plan(q, k, v, explicit)
        data = self.call_tensors(plan, bias, block_layout, q_positions, k_positions)
        if torch.is_grad_enabled() and any(
            t.requires_grad for t in (q, k, v, *data.values())
        ):
            # The bias goes in as an input of its own so autograd tracks it.
            out, lse = _AttentionFunction.apply(self, plan, data, q, k, v, data.get("bias"))
        else:
            out, lse = self.forward(plan, data, q, k, v)
        return (out, lse) if return_lse else out

    def forward(
        self,
        plan: CallPlan,
        data: dict[str, torch.Tensor],
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Runs the forward kernels; returns the output and the fp32 log-sum-exp (for relu
        attention, which has none, an unwritten buffer that is never returned to users)."""
        p = plan.problem
        out = torch.empty(p.batch, p.heads_q, p.seq_q, p.head_dim_v, dtype=q.dtype, device=q.device)
        lse = torch.empty(p.batch, p.heads_q, p.seq_q, dtype=torch.float32, device=q.device)
        if plan.compiled is None:
            # No key: every row outputs 0 with lse -inf; no row or batch: nothing to compute.
            out.zero_()
            lse.fill_(float("-inf"))
            return out, lse
        self.last = plan.compiled
        tensors = {"q": q, "k": k, "v": v, "o": out, "lse": lse, **plan.constants, **data}
        for launch in plan.launches:
            # A pre-rotation kernel writes the rotated copy the attention kernel reads.
            if launch.info.name == "rotate_query":
                tensors["q_rot"] = torch.empty_like(q, memory_format=torch.contiguous_format)
            elif launch.info.name == "rotate_key":
                tensors["k_rot"] = torch.empty_like(k, memory_format=torch.contiguous_format)
            launch(tensors)
        return out, lse


class _AttentionFunction(torch.autograd.Function):
    """Autograd glue. The backward kernels are not generated yet: backward raises a clear
    error rather than silently differentiating something else."""

    @staticmethod
    def forward(ctx, fn: CompiledAttention, plan: CallPlan, data, q, k, v, bias):  # type: ignore[override]
        del bias  # read from `data`; an input only so that autograd sees it
        ctx.spec = fn.spec
        out, lse = fn.forward(plan, data, q, k, v)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):  # type: ignore[override]
        raise AttnFuseError(
            f"the backward pass of {ctx.spec!r} is not available yet: AttnFuse generates "
            "forward kernels only in this version"
        )


def compile(
    spec: AttentionSpec,
    *,
    rope_placement: str | tuple[str, str] = "auto",
    config: TileConfig | None = None,
) -> CompiledAttention:
    """Compiles a variant. `rope_placement` ("auto", "fused", "pre_rotated", "q_fused" or a
    (query, key) pair) overrides the Rotation Calculus; `config` fixes the tile configuration."""
    return CompiledAttention(spec, rope_placement=rope_placement, config=config)

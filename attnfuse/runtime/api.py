"""The torch-facing entry point: `compile(spec)` and the callable it returns."""

from __future__ import annotations

from typing import Any

import torch

from attnfuse.dsl.blocks import Rope, ScaledDotProduct
from attnfuse.dsl.spec import AttentionSpec
from attnfuse.errors import ArgumentError, AttnFuseError
from attnfuse.runtime.compiler import CompiledProgram, CompileKey, compile_program, lower_spec
from attnfuse.runtime.config import TileConfig, choose_tile_config, rope_placement
from attnfuse.runtime.inputs import Problem, check_inputs
from attnfuse.runtime.launch import default_scale, inverse_frequencies, launch


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
        self.spec = spec
        self.rope_placement = rope_placement
        self.config = config
        self.last: CompiledProgram | None = None

    def __repr__(self) -> str:
        return f"CompiledAttention({self.spec!r})"

    # -- compile -----------------------------------------------------------------------------

    def compile_key(self, problem: Problem) -> CompileKey:
        """What this call's kernels are specialized on."""
        config = self.config or choose_tile_config(problem)
        placement = rope_placement(self.spec, problem, config, self.rope_placement)
        return CompileKey(problem.head_dim, problem.head_dim_v, problem.element_type, config, placement)

    def program_for(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> CompiledProgram:
        """The compiled kernels that a call with these tensors runs."""
        problem = check_inputs(self.spec, q, k, v)
        return compile_program(self.spec, self.compile_key(problem), q.device.type != "cuda")

    @property
    def source(self) -> str:
        """The generated Triton source: of the last call, or for head dim 64, fp16 before one."""
        if self.last is not None:
            return self.last.source
        q = torch.empty(1, 1, 1, 64, dtype=torch.float16, device="meta")
        problem = check_inputs(self.spec, q, q, q)
        return compile_program(self.spec, self.compile_key(problem), True).source

    def tile_ir(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str:
        """The tile IR a call with these tensors compiles to, as text."""
        problem = check_inputs(self.spec, q, k, v)
        return str(lower_spec(self.spec, self.compile_key(problem)))

    # -- run ---------------------------------------------------------------------------------

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        return_lse: bool = False,
        **unexpected: Any,
    ):
        if unexpected:
            raise ArgumentError(
                f"unexpected argument(s) {', '.join(sorted(unexpected))} for {self.spec!r}"
            )
        problem = check_inputs(self.spec, q, k, v)
        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
            out, lse = _AttentionFunction.apply(self, problem, q, k, v)
        else:
            out, lse = self.forward(problem, q, k, v)
        return (out, lse) if return_lse else out

    def forward(
        self, problem: Problem, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Runs the forward kernels; returns the output and the fp32 log-sum-exp."""
        out = torch.empty(problem.batch, problem.heads_q, problem.seq_q, problem.head_dim_v,
                          dtype=q.dtype, device=q.device)
        lse = torch.empty(problem.batch, problem.heads_q, problem.seq_q, dtype=torch.float32,
                          device=q.device)
        if problem.empty:
            # No key: every row outputs 0 with lse -inf; no row or batch: nothing to compute.
            out.zero_()
            lse.fill_(float("-inf"))
            return out, lse
        compiled = compile_program(self.spec, self.compile_key(problem), q.device.type != "cuda")
        self.last = compiled
        tensors = {"q": q, "k": k, "v": v, "o": out, "lse": lse}
        rope = self.spec.block(Rope)
        if isinstance(rope, Rope):
            rotary_dim = rope.rotary_dim or problem.head_dim
            tensors["inv_freq"] = inverse_frequencies(rope.theta, rotary_dim, q.device)
        sdp = self.spec.block(ScaledDotProduct)
        scale = sdp.scale if isinstance(sdp, ScaledDotProduct) and sdp.scale is not None else default_scale(problem.head_dim)
        for info in compiled.program.kernels:
            if info.name == "rotate_query":
                tensors["q_rot"] = torch.empty(q.shape, dtype=q.dtype, device=q.device)
            elif info.name == "rotate_key":
                tensors["k_rot"] = torch.empty(k.shape, dtype=k.dtype, device=k.device)
            launch(compiled, info.name, problem, tensors, scale)
        return out, lse


class _AttentionFunction(torch.autograd.Function):
    """Autograd glue. The backward kernels are not generated yet: backward raises a clear
    error rather than silently differentiating something else."""

    @staticmethod
    def forward(ctx, fn: CompiledAttention, problem: Problem, q, k, v):  # type: ignore[override]
        ctx.spec = fn.spec
        out, lse = fn.forward(problem, q, k, v)
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

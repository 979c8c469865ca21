"""Planning a call: from the shapes of q, k, v (and the cache layout) to a `CallPlan`, the
compile key, compiled program and prepared launches of that shape, made once and reused.

`CallPlanning` is the part of `CompiledAttention` (runtime/api.py) that decides what a call
runs: the tile configuration, the RoPE placement (the Rotation Calculus' choice), whether the
split-KV decode kernels or the Hopper (Gluon) kernels take it, the backward's form. It reads
the compiled object's `program`, `variant`, `config`, `_placement`, `_deterministic`,
`_plans` and `_gluon_backward_keys`."""

from __future__ import annotations

import functools
from dataclasses import replace

import torch

from attnfuse.errors import ArgumentError
from attnfuse.runtime import kv_cache
from attnfuse.runtime.backward_choice import backward_request, choose_backward
from attnfuse.runtime.call_plan import BACKWARD_KERNEL_PREFIX, CallPlan
from attnfuse.runtime.compiler import (
    CompiledProgram,
    CompileKey,
    compile_program,
    lower_spec,
)
from attnfuse.runtime.config import (
    LISTED_GLUON_FORWARD,
    TileConfig,
    automatic_placement,
    choose_tile_config,
    decode_tile_config,
    rope_placement,
    takes_decode_pdl,
)
from attnfuse.runtime.gluon_backward import (
    GLUON_BACKWARD_TILES,
    gluon_backward,
    scheduled_backward,
    takes_gluon_backward,
)
from attnfuse.runtime.gluon_forward import (
    gluon_forward,
    takes_gluon_forward,
    takes_listed_gluon,
)
from attnfuse.runtime.inputs import Problem, check_inputs
from attnfuse.runtime.interpreter import runs_interpreted
from attnfuse.runtime.kv_cache import (
    CONTIGUOUS,
    MAX_DECODE_QUERIES,
    CacheLayout,
    decode_rows,
    row_blocks,
    split_plan,
)
from attnfuse.runtime.launch import default_scale, prepare, rope_table
from attnfuse.runtime.program import Canonical, VariantProgram
from attnfuse.runtime.tuning import tuned_config


class CallPlanning:
    """`CompiledAttention`'s planning methods (see the module's docstring)."""

    # Set by CompiledAttention.__init__.
    program: VariantProgram
    variant: Canonical
    config: TileConfig | None
    _placement: str | tuple[str, str]
    _deterministic: bool
    _plans: dict[tuple, CallPlan]
    _gluon_backward_keys: dict[CompileKey, bool]

    def tile_config(self, problem: Problem, capability: tuple[int, int] | None = None) -> TileConfig:
        """The tile configuration for a problem: the user's, else the dispatcher's (for a GPU
        of `capability` when given, as in `choose_tile_config`); blocks never exceed a
        block-sparse layout's block size."""
        config = self.config
        tuned_forward = False  # whether a tuning entry set the forward's tiles (measured as they are)
        if config is None:
            config = choose_tile_config(
                problem,
                capability,
                keys_per_row=self.variant.keys_per_row,
                reads_bias=self.variant.reads("bias"),
                block_sparse=self.variant.block_size is not None,
            )
            if capability is None:
                # Measured on this GPU (`attnfuse-tune`, `ATTNFUSE_TUNING`): preferred to the
                # built-in rules, which were measured on the H200.
                config, tuned_forward = tuned_config(config, problem, self.variant.text)
        bs = self.variant.block_size
        if bs is not None:
            bm, bn, _warps, _stages = config.backward()
            kv_bm, kv_bn, _warps, _stages = config.dkdv()
            config = replace(config, block_m=min(config.block_m, bs), block_n=min(config.block_n, bs),
                             bwd_block_m=min(bm, bs), bwd_block_n=min(bn, bs),
                             dkdv_block_m=min(kv_bm, bs), dkdv_block_n=min(kv_bn, bs))
            if self.config is None and not tuned_forward and config.block_m < 128 and config.num_warps > 4:
                # The dispatcher's two-warpgroup forwards own 128 rows; with fewer rows one
                # warpgroup is the measured choice.
                config = replace(config, num_warps=4)
        gluon_reads_whole = self.variant.rope is None or automatic_placement(self._placement)
        if self.config is None and gluon_reads_whole and takes_listed_gluon(problem, self.variant):
            # The Gluon forward's tiles: the block lists (built from this config) name them.
            # (With RoPE placed by the caller the rotation may sit in the kernel, which the
            # Gluon forward does not take: the portable kernel keeps its own tiles then.)
            bm, bn, warps, stages = LISTED_GLUON_FORWARD
            config = replace(config, block_m=bm, block_n=bn, num_warps=warps, num_stages=stages)
        return config

    def compile_key(
        self, problem: Problem, explicit_positions: tuple[bool, bool] = (False, False),
        decode: bool = False, cache: CacheLayout = CONTIGUOUS,
    ) -> CompileKey:
        """What this call's kernels are specialized on (for a call without autograd; a
        training call's forward may rotate differently, `training_key`); `decode` for the
        split-KV kernels, `cache` for how the keys are held."""
        config = self.tile_config(problem)
        if decode and self.config is None:
            config = decode_tile_config(problem, paged=cache.page_size > 0)
        placement = rope_placement(self.variant.rope is not None, self.variant.rotary_dim, problem,
                                   config, self._placement, decode, cache)
        if (placement is not None and not decode and cache == CONTIGUOUS
                and automatic_placement(self._placement)
                and takes_gluon_forward(problem, self.variant)):
            # The Hopper forward (Gluon; by size and, under `auto`, by variant class) reads q and
            # k whole: with the rotation left to AttnFuse
            # it runs first, in the pre-rotation kernels. At the Llama-3-8B heads (bf16) that
            # took 0.264 / 0.913 ms at 4096 / 8192 against the fused rotation's 0.328 / 1.118
            # (bench/results/20261201T165020Z-gluon-forward.md).
            placement = ("pre_rotated", "given" if placement[1] == "given" else "pre_rotated")
        # The backward pre-rotates unless a placement was asked for explicitly: each of its
        # kernels loops over q or k, so in-loop rotation is paid per program for both
        # (measured slower at every N on the H200: bench/results/20261129T1234Z-backward_tune-parts.log).
        bwd_rope = "pre_rotated" if automatic_placement(self._placement) else "as_forward"
        # Decoding and cache layouts build no backward, nor does a variant with a modifier
        # that has no derivative (its training calls are refused: `training_refusal`).
        backward = self.variant.underivable is None
        bwd_dq = ("separate" if decode or cache != CONTIGUOUS or not backward
                  else choose_backward(problem, self.variant, self.deterministic, bwd_rope))
        # Read (and checked) for decode plans only: other kernels have no dependent launch.
        pdl = takes_decode_pdl(problem, runs_interpreted(problem.device)) if decode else True
        key = CompileKey(problem.head_dim, problem.head_dim_v, problem.element_type, config,
                         placement, explicit_positions, bwd_rope, decode, cache,
                         decode_merge=kv_cache.DECODE_MERGE if decode else "kernel",
                         decode_pdl=pdl, bwd_dq=bwd_dq, backward=backward)
        if bwd_dq != "separate" and self.variant.listed and self.config is None and takes_gluon_backward(
                problem, self.variant, bwd_rope, ordered=bwd_dq == "ordered"):
            # A listed fused backward on the Gluon backward's tiles: `warp-specialize` schedules a
            # listed dK/dV kernel only on them (the lists the runtime builds name its tiles).
            gluon_tiles = replace(key, config=replace(config, dkdv_block_m=GLUON_BACKWARD_TILES[0],
                                                      dkdv_block_n=GLUON_BACKWARD_TILES[1]))
            if self._gluon_schedules(gluon_tiles):
                key = gluon_tiles
        if bwd_dq != "separate" and backward_request() == "auto" and not self._gluon_schedules(key):
            # `auto` builds the fused backward only for the Gluon kernel (the portable fused
            # kernel is slower than the split); `takes_gluon_backward` predicted it from the
            # variant, and the lowered kernel says otherwise: the split, rather than the
            # slow kernel.
            key = replace(key, bwd_dq="separate")
        return key

    def _gluon_schedules(self, key: CompileKey) -> bool:
        """Whether the fused backward of `key` lowers to a kernel the Gluon target schedules
        and prints (`gluon_backward.scheduled_backward`): once per key."""
        known = self._gluon_backward_keys.get(key)
        if known is None:
            known = self._gluon_backward_keys[key] = scheduled_backward(lower_spec(self.program, key)) is not None
        return known

    def training_key(self, key: CompileKey, compiled: CompiledProgram) -> CompileKey:
        """The compile key of a call that autograd records. Where the backward reads a
        pre-rotated copy of q (or k), the forward pre-rotates that operand too, and the call
        saves the copy for the backward instead of the operand: each rotation then runs once
        per training step, in the forward, instead of once in each pass, and the backward
        launches no rotation kernel. The forward kernel reads the copies instead of rotating
        in its loops; on the H200 this forward measured as fast as the Rotation Calculus'
        choice for inference (Llama-3-8B, N=2048 and 4096: 0.1065 and 0.3420 ms against
        0.1063 and 0.3454, bench/results/20261129T183441Z and 183458Z). An explicitly requested
        placement is kept (its backward rotates as the forward does)."""
        if key.placement is None or not automatic_placement(self._placement):
            return key
        bwd_roles = {role for info in compiled.program.kernels
                     if info.name.startswith(BACKWARD_KERNEL_PREFIX) for role in info.roles}
        query, k_place = key.placement
        placement = ("pre_rotated" if "q_rot" in bwd_roles else query,
                     "pre_rotated" if "k_rot" in bwd_roles else k_place)
        return key if placement == key.placement else replace(key, placement=placement)

    def compiled_for(
        self, problem: Problem, explicit_positions: tuple[bool, bool], training: bool,
        decode: bool = False, cache: CacheLayout = CONTIGUOUS,
    ) -> tuple[CompileKey, CompiledProgram]:
        """The compile key and compiled program of a call: `compile_key`, or for a call that
        autograd records, `training_key`."""
        key = self.compile_key(problem, explicit_positions, decode, cache)
        interpret = runs_interpreted(problem.device)
        compiled = compile_program(self.program, key, interpret)
        if training:
            training_key = self.training_key(key, compiled)
            if training_key != key:
                key, compiled = training_key, compile_program(self.program, training_key, interpret)
        return key, compiled

    def plan(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        explicit_positions: tuple[bool, bool] = (False, False),
        training: bool = False,
        cache: CacheLayout = CONTIGUOUS,
        paged_keys: int | None = None,
        backward: bool = False,
    ) -> CallPlan:
        """The checked, compiled and prepared launches for tensors of these shapes; with
        `training`, for a call that autograd records (`training_key`); `cache` and
        `paged_keys` as `kv_cache.check_cache_arguments` gives them; with `backward`, a plan
        whose program has the backward kernels (never the split decode's), for a backward
        run apart from its forward (the traced operators')."""
        try:
            # The usual contiguous layout enters as None: a CacheLayout's (dataclass) hash is
            # a Python call, and the key is hashed on every call.
            key = (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, k.device,
                   v.device, q.layout, k.layout, v.layout, explicit_positions, training,
                   None if cache is CONTIGUOUS else cache, paged_keys, backward,
                   # Deterministic algorithms order the fused backward's adds (`choose_backward`).
                   not self.deterministic and torch.are_deterministic_algorithms_enabled())
        except (AttributeError, RuntimeError):
            key = None  # not dense tensors: check_inputs says which argument is wrong
        plan = self._plans.get(key) if key is not None else None
        if plan is None:
            # Validation depends only on what the key holds, so a cached plan is a checked one.
            problem = check_inputs(self.program, q, k, v, paged_keys)
            plan = self._make_plan(problem, explicit_positions, training, cache, backward)
            if key is not None:
                self._plans[key] = plan
        return plan

    def decodes(self, problem: Problem, training: bool) -> bool:
        """Whether a call runs the split-KV decode kernels: few queries (`decode_rows`), no
        autograd (they have no backward), no block-granular filter (block sparsity has
        per-query-block lists, which split programs do not have), and a normalizer whose
        partials over disjoint key sets merge exactly (`Normalizer.merges_splits`)."""
        return (decode_rows(problem) and not training and self.variant.block_size is None
                and self.variant.merges_splits)

    def _make_plan(self, problem: Problem, explicit_positions: tuple[bool, bool], training: bool,
                   cache: CacheLayout = CONTIGUOUS, backward: bool = False) -> CallPlan:
        constants: dict[str, torch.Tensor] = {}
        variant = self.program.canonical(explicit_positions)
        if backward and variant.underivable is not None:
            # The backward operator, called directly (a call that records autograd is
            # refused by the call itself, `CompiledAttention.__call__`).
            raise ArgumentError(variant.training_refusal())
        for binding in variant.bindings:
            # Data made from the program alone (ALiBi's slopes) depends only on the shape;
            # made before the empty-problem exit, so that its checks run for every call.
            if binding.use.argument is None and binding.role is not None and binding.role not in constants:
                constants[binding.role] = binding.bind(problem, {})
        if problem.empty:
            return CallPlan(problem, None, (), {}, None, cache=cache)
        decode = self.decodes(problem, training or backward)
        if cache.kv_lens and variant.block_size is not None:
            raise ArgumentError(
                "kv_lens= cannot combine with block_sparse(): its block lists are built over "
                "the whole cache, not per sequence"
            )
        if cache.kv_lens and not decode and variant.listed:
            names = ", ".join(b.op.name.removeprefix("attn.") for b in variant.listed)
            if decode_rows(problem) and not variant.merges_splits:
                raise ArgumentError(
                    f"kv_lens= with {names} needs the split decode kernels, which "
                    f"{variant.normalizer.name} cannot take: its results over disjoint key sets do not "
                    "merge exactly (Normalizer.merges_splits), and the block lists of the one-pass "
                    "kernels do not follow per-sequence lengths")
            raise ArgumentError(
                f"kv_lens= with {names} needs a decode-sized call (at most "
                f"{MAX_DECODE_QUERIES} queries): its block lists do not follow per-sequence lengths"
            )
        key, compiled = self.compiled_for(problem, explicit_positions, training, decode, cache)
        scale = variant.scale if variant.scale is not None else default_scale(problem.head_dim)
        if variant.rope is not None:
            constants["rope_table"] = self._rope_table(problem, max(problem.seq_q, problem.seq_k))
        splits = split_plan(problem, key.config.block_m, key.config.block_n) if decode else None
        launches = prepare(compiled, problem, scale, splits)
        if not decode and problem.device.type == "cuda":
            # On Hopper the forward may run on the Gluon target (runtime/gluon_forward.py).
            # The same tile module for both (lowered at most once, only where Gluon may run).
            tile_module = functools.cache(lambda: lower_spec(self.program, key))
            launches = gluon_forward(launches, problem, scale, tile_module, variant)
            # And the fused backward's dK/dV/dQ kernel (runtime/gluon_backward.py).
            launches = gluon_backward(launches, problem, scale, tile_module, variant)
        launches = tuple(launches)
        if any("split_counts" in launch.info.roles for launch in launches):
            # The last-split merge's arrival counts: zero between calls (each call's last
            # program resets its count), so made once per plan.
            counts = problem.batch * problem.heads_kv * row_blocks(problem, key.config.block_m)
            constants["split_counts"] = torch.zeros(counts, dtype=torch.int32, device=problem.device)
        binds_nothing = all(binding.use.argument is None for binding in variant.bindings)
        return CallPlan(problem, compiled, launches, constants, key.config, cache=cache, splits=splits,
                        binds_nothing=binds_nothing)

    def _rope_table(self, problem: Problem, length: int) -> torch.Tensor:
        """The cos/sin table of the program's rotation for positions below `length`."""
        rope = self.variant.rope
        assert rope is not None
        theta, rotary_dim, _interleaved, scaling = rope.rope_key
        return rope_table(theta, rotary_dim or problem.head_dim, scaling, problem.device, length)

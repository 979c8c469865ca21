"""The torch-facing entry point: `compile(spec)` and the callable it returns."""

from __future__ import annotations

import functools

import weakref
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import torch

from attnfuse.errors import ArgumentError, AttnFuseError
from attnfuse.runtime.block_lists import ListSource, call_block_lists
from attnfuse.runtime.call_data import given_positions, position_extent, refuse_non_strided, refuse_undeclared_data
from attnfuse.runtime.compiler import (
    CompiledProgram,
    CompileKey,
    compile_program,
    generate_program,
    lower_spec,
)
from attnfuse.runtime.config import (
    KEY_POSITIONS_WITH_GIVEN_KEY,
    LISTED_GLUON_FORWARD,
    TileConfig,
    automatic_placement,
    check_placement_request,
    choose_tile_config,
    decode_tile_config,
    rope_placement,
    takes_decode_pdl,
)
from attnfuse.runtime import kv_cache
from attnfuse.runtime.kv_cache import (
    CONTIGUOUS,
    MAX_DECODE_QUERIES,
    CacheLayout,
    check_cache_arguments,
    decode_rows,
    row_blocks,
    split_plan,
)
from attnfuse.runtime.backward_choice import backward_request, choose_backward
from attnfuse.runtime.direct_apply import c_apply, direct_apply_supported
from attnfuse.runtime.gluon_backward import gluon_backward, scheduled_backward
from attnfuse.runtime.gluon_forward import gluon_forward, takes_gluon, takes_listed_gluon
from attnfuse.runtime.inputs import Problem, check_inputs
from attnfuse.runtime.interpreter import runs_interpreted, truncates_to_bf16
from attnfuse.runtime.key_rotation import rotate_keys
from attnfuse.runtime.launch import KernelLaunch, default_scale, prepare, rope_table
from attnfuse.runtime.layout import empty_in_layout_of
from attnfuse.runtime import torch_op
from attnfuse.runtime.program import (
    DATA_KEYWORDS,
    Canonical,
    VariantProgram,
    anonymous_text,
    as_program,
)
from attnfuse.runtime.tensor_cache import TensorCache, tensor_state


LIST_SOURCES = "block_list_sources"
"""The entry of a call's data that holds its listed filters (`ListSource`s), from which the
backward builds its own lists; not a kernel role."""

REREAD_BY_BACKWARD = ("bias", "q_positions", "k_positions")
"""The call-time tensors (their names in a call's data, which are the call's keywords) that
the backward reads again besides the listed filters' (`LIST_SOURCES`): a training call
checks that none was changed in place since its forward."""


@dataclass(frozen=True)
class CallPlan:
    """What a call of one shape runs: decided once per shape, then reused."""

    problem: Problem
    compiled: CompiledProgram | None
    launches: tuple[KernelLaunch, ...]
    constants: dict[str, torch.Tensor]
    """Tensors that depend only on the shape: rotary frequencies, ALiBi slopes."""
    config: TileConfig | None
    schedules: dict[tuple, tuple[tuple[KernelLaunch, str | None, torch.dtype], ...]] = field(default_factory=dict)
    """The launches `CompiledAttention._run` makes for a set of kernels (and the rotated
    copies each writes), worked out once."""
    layouts: TensorCache = field(default_factory=TensorCache, compare=False)
    """The block lists of the block-sparse layouts this plan's calls passed, per layout."""
    positions: TensorCache = field(default_factory=TensorCache, compare=False)
    """The largest |position| of the RoPE positions this plan's calls passed."""
    cache: CacheLayout = CONTIGUOUS
    """How the call's keys are held (per-sequence lengths, pages)."""
    splits: tuple[int, int] | None = None
    """A split-KV decode's (number of splits, keys per split); None for the forward kernel."""
    binds_nothing: bool = False
    """Whether the plan's program reads no call-time data (no bias, layout, ids, positions):
    a call that passes none binds nothing (`CompiledAttention.call_tensors` would return
    `{}`), so `__call__` skips it."""
    scratch: dict[str, torch.Tensor] = field(default_factory=dict, compare=False)
    """Buffers that kernels write and no one reads, kept across calls instead of allocated
    per call: the log-sum-exp of inference calls that do not return it (`forward`)."""

    def reads(self, role: str) -> bool:
        """Whether any kernel of the plan takes a tensor of `role` (the compiled program, not
        the spec, says which buffers a call must provide)."""
        return role in self.roles

    def backward_reads(self, role: str) -> bool:
        """Whether a backward kernel of the plan takes a tensor of `role`."""
        return role in self.backward_roles

    # Asked on every call (the per-call paths test membership directly, without a method
    # call): worked out once per plan.
    @cached_property
    def roles(self) -> frozenset[str]:
        """The roles any kernel of the plan takes (`reads`)."""
        return frozenset(role for launch in self.launches for role in launch.info.roles)

    @cached_property
    def backward_roles(self) -> frozenset[str]:
        """The roles the plan's backward kernels take (`backward_reads`)."""
        return frozenset(role for launch in self.launches
                         if launch.info.name.startswith(BACKWARD_KERNEL_PREFIX)
                         for role in launch.info.roles)


def records_autograd(*inputs: object) -> bool:
    """Whether autograd records a call with these inputs: grad mode is on and one of them is a
    tensor that requires a gradient."""
    if not torch.is_grad_enabled():
        return False
    for t in inputs:  # a loop, not any(genexpr): asked on every call
        if isinstance(t, torch.Tensor) and t.requires_grad:
            return True
    return False


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


def _checked_by_caller() -> None:
    """A `TensorCache` check for a tensor the call has just checked itself."""


class CompiledAttention:
    """A compiled variant: call it as `fn(q, k, v, return_lse=False)`.

    Kernels are generated per head dim, dtype and tile configuration on first use and cached
    (in memory and on disk). `source` is the Triton source of the most recent call's kernels.
    """

    def __init__(
        self,
        source: object,
        *,
        rope_placement: str | tuple[str, str] = "auto",
        config: TileConfig | None = None,
        deterministic: bool = True,
    ):
        if config is not None and not isinstance(config, TileConfig):
            raise ArgumentError(f"config must be an af.TileConfig or None, got {config!r}")
        if not isinstance(deterministic, bool):
            raise ArgumentError(f"deterministic must be True or False, got {deterministic!r}")
        self._deterministic = deterministic
        query, key = check_placement_request(rope_placement)
        self.program: VariantProgram = as_program(source)
        self.spec = source
        # What a call without positions runs: checks the program now, where the user wrote it.
        self.variant: Canonical = self.program.default()
        self.rope_placement = rope_placement
        # Whether calls pass keys already rotated: rope_placement=(..., "given"), or an attn
        # program whose key rotation is #attn<placement given>.
        self.key_given = key == "given" or self.variant.key_given
        if self.variant.key_given and key != "given":
            if key != "auto":
                raise ArgumentError(
                    f"rope_placement key {key!r}: the attn program's key rotation is "
                    "#attn<placement given> (keys arrive rotated); leave the key auto or given"
                )
            rope_placement = (query, "given")
        # The request the compile keys are made from: the user's, with the key given where
        # the program says so.
        self._placement = rope_placement
        self.config = config
        self.last: CompiledProgram | None = None
        self._plans: dict[tuple, CallPlan] = {}
        self._gluon_backward_keys: dict[CompileKey, bool] = {}
        """Per compile key with a fused backward: whether the Gluon target schedules it."""
        self._append_launches: dict[tuple, KernelLaunch] = {}
        """The cache append's prepared launches, per shape and cache layout (`append_kv`)."""
        # What a traced call (torch.compile, torch.export) reads, as plain attributes: the
        # tracer must not step into the program's (xDSL) code.
        self._has_lse = self.variant.has_lse
        self._rope_key = None if self.variant.rope is None else self.variant.rope.rope_key
        self._operator_keys = self._make_operator_keys()

    def __repr__(self) -> str:
        return f"CompiledAttention({self.program!r})"

    def _make_operator_keys(self) -> dict[tuple[bool, bool], str]:
        """The `torch.ops.attnfuse` operator key (`torch_op.operator_key`) of each set of
        call-time positions a call may pass, registered so that traced graphs run this
        variant."""
        texts = {self.program.default_positions: self.variant.text}
        if self.program.explicit_positions_of() is None and self.variant.rope is not None:
            # A spec with a rotation builds a program per set of positions given.
            for explicit in ((True, False), (False, True), (True, True)):
                texts[explicit] = anonymous_text(self.program.module(explicit))
        keys = {}
        for explicit, text in texts.items():
            keys[explicit] = torch_op.operator_key(text, self.rope_placement, self.config, self.deterministic)
            torch_op.register(keys[explicit], self)
        return keys

    # -- compile -----------------------------------------------------------------------------

    def tile_config(self, problem: Problem, capability: tuple[int, int] | None = None) -> TileConfig:
        """The tile configuration for a problem: the user's, else the dispatcher's (for a GPU
        of `capability` when given, as in `choose_tile_config`); blocks never exceed a
        block-sparse layout's block size."""
        config = self.config or choose_tile_config(
            problem,
            capability,
            keys_per_row=self.variant.keys_per_row,
            reads_bias=self.variant.reads("bias"),
        )
        bs = self.variant.block_size
        if bs is not None:
            bm, bn, _warps, _stages = config.backward()
            kv_bm, kv_bn, _warps, _stages = config.dkdv()
            config = replace(config, block_m=min(config.block_m, bs), block_n=min(config.block_n, bs),
                             bwd_block_m=min(bm, bs), bwd_block_n=min(bn, bs),
                             dkdv_block_m=min(kv_bm, bs), dkdv_block_n=min(kv_bn, bs))
            if self.config is None and config.block_m < 128 and config.num_warps > 4:
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

    @property
    def deterministic(self) -> bool:
        """Whether the backward must be bit-for-bit reproducible (`af.compile`'s keyword;
        fixed for the object: its plans and operators are keyed on it)."""
        return self._deterministic

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
                and takes_gluon(problem, causal=self.variant.band[1] is not None)):
            # The Hopper forward (Gluon) reads q and k whole: with the rotation left to AttnFuse
            # it runs first, in the pre-rotation kernels. At the Llama-3-8B heads (bf16) that
            # took 0.264 / 0.913 ms at 4096 / 8192 against the fused rotation's 0.328 / 1.118
            # (bench/results/20261201T165020Z-gluon-forward.md).
            placement = ("pre_rotated", "given" if placement[1] == "given" else "pre_rotated")
        # The backward pre-rotates unless a placement was asked for explicitly: each of its
        # kernels loops over q or k, so in-loop rotation is paid per program for both
        # (measured slower at every N on the H200: bench/results/20261129T1234Z-backward_tune-parts.log).
        bwd_rope = "pre_rotated" if automatic_placement(self._placement) else "as_forward"
        # Decoding and cache layouts build no backward.
        bwd_dq = ("separate" if decode or cache != CONTIGUOUS
                  else choose_backward(problem, self.variant, self.deterministic, explicit_positions, bwd_rope))
        # Read (and checked) for decode plans only: other kernels have no dependent launch.
        pdl = takes_decode_pdl(problem, runs_interpreted(problem.device)) if decode else True
        key = CompileKey(problem.head_dim, problem.head_dim_v, problem.element_type, config,
                         placement, explicit_positions, bwd_rope, decode, cache,
                         decode_merge=kv_cache.DECODE_MERGE if decode else "kernel",
                         decode_pdl=pdl, bwd_dq=bwd_dq)
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

    def program_for(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, training: bool | None = None
    ) -> CompiledProgram:
        """The compiled kernels that a call with these tensors runs. `training` (default: as
        a call would decide, from grad mode and whether q, k or v require grad) selects the
        program of a call that autograd records."""
        problem = check_inputs(self.program, q, k, v)
        if training is None:
            training = records_autograd(q, k, v)
        return self.compiled_for(problem, self.program.default_positions, training)[1]

    @property
    def source(self) -> str:
        """The generated Triton source: of the last call, or, before one, for head dim 64 in
        fp16 on this machine's default device (the GPU if there is one)."""
        if self.last is not None:
            return self.last.source
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        problem = Problem(1, 1, 1, 1, 1, 64, 64, torch.float16, device)
        key = self.compile_key(problem, self.program.default_positions)
        program, _path, _key = generate_program(self.program, key, runs_interpreted(device))
        return program.source

    def tile_ir(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, training: bool | None = None
    ) -> str:
        """The tile IR a call with these tensors compiles to, as text (`training` as in
        `program_for`)."""
        problem = check_inputs(self.program, q, k, v)
        if training is None:
            training = records_autograd(q, k, v)
        key, _compiled = self.compiled_for(problem, self.program.default_positions, training)
        return str(lower_spec(self.program, key))

    def rotate_keys(self, k: torch.Tensor, k_positions: torch.Tensor | None = None) -> torch.Tensor:
        """`R(k_pos) k`: keys `[B, Hkv, N, D]` rotated by this variant's rotation (its theta,
        rotary width, pairs and scaling), at `k_positions` (int `[N]` or `[B, N]`; default
        `j` for key `j`), in k's dtype and layout. This is what a KV cache stores for a call
        compiled with `rope_placement=(..., "given")`: rotate each key once, when it is
        written, and pass the cache as k. The rotation is the pre-rotation kernel's (the
        same numbers a `pre_rotated` key placement attends to); autograd differentiates
        through it (the gradient is the inverse rotation)."""
        if self._rope_key is None:
            raise ArgumentError(f"rotate_keys: {self.program!r} has no rope()")
        return rotate_keys(self._rope_key, k, k_positions)

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
            launches = gluon_backward(launches, problem, scale, tile_module)
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

    def _block_lists(
        self,
        sources: tuple[ListSource, ...],
        plan: CallPlan,
        backward: bool,
    ) -> dict[str, torch.Tensor]:
        """The block lists the forward (or the backward) kernels read for the call's listed
        filters (a block layout, document ids), built once per plan and state of the caller's
        tensors (`TensorCache`, keyed by the first; a second filter's tensor is part of what
        is looked up, and checked to be the same object)."""
        assert plan.config is not None
        first, others = sources[0].given, tuple(source.given for source in sources[1:])
        what = (backward, tuple((id(t), tensor_state(t)) for t in others))

        def build() -> tuple[tuple, dict[str, torch.Tensor]]:
            lists = call_block_lists(sources, self.variant.band, plan.problem, plan.config, backward)
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

    # -- run ---------------------------------------------------------------------------------

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        return_lse: bool = False,
        bias: torch.Tensor | None = None,
        q_positions: torch.Tensor | None = None,
        k_positions: torch.Tensor | None = None,
        kv_lens: torch.Tensor | None = None,
        block_table: torch.Tensor | None = None,
        **data: Any,
    ):
        """Attention of q, k, v. Call-time data comes as keywords: `bias=`, `block_layout=`,
        `doc_ids=` (`DATA_KEYWORDS`: each for the block that reads it), and `q_positions=`
        / `k_positions=` for RoPE. A KV cache is described by `kv_lens=` (int32 `[B]`: the
        keys each sequence has; its queries sit at its last positions) and, for a paged one,
        `block_table=` (int32 `[B, max_pages]`, with k and v page pools `[num_pages, Hkv,
        page_size, D]`); these calls are inference-only (`kv_cache`)."""
        unexpected = [name for name in data if name not in DATA_KEYWORDS] if data else None
        if unexpected:
            raise ArgumentError(
                f"unexpected argument(s) {', '.join(sorted(unexpected))} for {self.program!r}"
            )
        if return_lse is not True and return_lse is not False:
            # Any truthy object would otherwise ask for the lse (and a tensor would fail deep
            # inside with "Boolean value of Tensor ... is ambiguous").
            raise ArgumentError(f"return_lse must be True or False, got {return_lse!r}")
        if return_lse and not self._has_lse:
            name = self.variant.normalizer_name
            raise ArgumentError(f"return_lse=True needs softmax(): {name}() attention has no log-sum-exp")
        if k_positions is not None and self.key_given:
            raise ArgumentError(KEY_POSITIONS_WITH_GIVEN_KEY)
        cache_call = kv_lens is not None or block_table is not None
        # Positions and layouts are integer and bool tensors, which never require a gradient.
        training = records_autograd(q, k, v, bias)
        if cache_call and training:
            raise ArgumentError(
                "kv_lens= / block_table= calls are inference-only (a KV cache has no "
                "backward): call under torch.no_grad() or with inputs that do not require grad"
            )
        if torch_op.traced(q, k, v, bias, kv_lens, block_table):
            if cache_call:
                key = self.operator_key((q_positions is not None, k_positions is not None))
                return torch_op.call_cache(key, q, k, v, kv_lens, block_table, return_lse=return_lse,
                                           bias=bias, q_positions=q_positions, k_positions=k_positions, **data)
            return self._call_operator(q, k, v, return_lse, bias, data, q_positions, k_positions)
        if cache_call:
            out, lse = self.cache_forward(q, k, v, kv_lens, block_table, bias=bias,
                                          q_positions=q_positions, k_positions=k_positions,
                                          keep_lse=return_lse, **data)
            return (out, lse) if return_lse else out
        explicit = (q_positions is not None, k_positions is not None)
        plan = self.plan(q, k, v, explicit, training)
        if plan.binds_nothing and not data and bias is None and not (explicit[0] or explicit[1]):
            data = {}  # what call_tensors binds for a variant that reads no call-time data
        else:
            arguments = {**data, "bias": bias, "q_positions": q_positions, "k_positions": k_positions}
            data = self.call_tensors(plan, arguments, explicit)
        if training:
            # The user's bias goes in as an input of its own so autograd tracks it.
            given_bias = bias if "bias" in data else None
            out, lse = apply_attention(self, plan, data, q, k, v, given_bias)
            return (out, lse) if return_lse else out
        out, lse = self.forward(plan, data, q, k, v, keep_lse=return_lse)
        return (out, lse) if return_lse else out

    def cache_forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_lens: torch.Tensor | None,
        block_table: torch.Tensor | None,
        *,
        bias: torch.Tensor | None = None,
        q_positions: torch.Tensor | None = None,
        k_positions: torch.Tensor | None = None,
        keep_lse: bool = True,
        **data: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`(out, lse)` of an inference call over a KV cache (`kv_lens=`, `block_table=`):
        what `__call__` runs eagerly, and `torch.ops.attnfuse.attention_cache` under tracing
        (`keep_lse` as in `forward`)."""
        cache, paged_keys = check_cache_arguments(q, k, v, kv_lens, block_table)
        explicit = (q_positions is not None, k_positions is not None)
        plan = self.plan(q, k, v, explicit, False, cache, paged_keys)
        arguments = {**data, "bias": bias, "q_positions": q_positions, "k_positions": k_positions}
        tensors = self.call_tensors(plan, arguments, explicit)
        tensors["kv_lens"] = kv_lens  # type: ignore[assignment]
        if block_table is not None:
            tensors["block_table"] = block_table
        return self.forward(plan, tensors, q, k, v, keep_lse=keep_lse)

    def append_kv(
        self,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_lens: torch.Tensor,
        block_table: torch.Tensor | None = None,
    ) -> None:
        """Writes new keys and values `k`, `v` (`[B, Hkv, N, D]`) into a KV cache for this
        variant, in one kernel: key `i` of sequence `b` at position `kv_lens[b] + i` of
        `k_cache`, `v_cache` (contiguous `[B, Hkv, L_max, D]`, or page pools with
        `block_table=`), rotated there when this variant's keys arrive rotated
        (`rope_placement=(..., "given")`). `kv_lens` is not changed: advance it after the
        append. Positions past the cache's capacity are not written (`cache_append`)."""
        from attnfuse.runtime.cache_append import append_kv

        append_kv(self, k_cache, v_cache, k, v, kv_lens, block_table)

    def operator_key(self, explicit_positions: tuple[bool, bool] = (False, False)) -> str:
        """The key under which traced graphs run this variant (`torch_op.call`), for a call
        that passes query / key positions as `explicit_positions` says."""
        key = self._operator_keys.get(explicit_positions)
        if key is None:
            name = "q_positions" if explicit_positions[0] else "k_positions"
            raise ArgumentError(f"{name}= given, but {self.program!r} has no rope() that takes it")
        return key

    def _call_operator(self, q, k, v, return_lse, bias, data, q_positions, k_positions):
        """A traced call: through `torch.ops.attnfuse.attention`, whose autograd runs
        `attention_backward` (torch_op.py); the operators run the eager path underneath."""
        key = self.operator_key((q_positions is not None, k_positions is not None))
        return torch_op.call(key, q, k, v, return_lse=return_lse, bias=bias,
                             q_positions=q_positions, k_positions=k_positions, **data)

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
        rotation kernels whose output (`q_rot`, `k_rot`) they read and `tensors` lacks."""
        key = (kernels, "q_rot" in tensors, "k_rot" in tensors)
        schedule = plan.schedules.get(key)
        if schedule is None:
            schedule = plan.schedules[key] = self._schedule(plan, tensors, kernels)
        for launch, rotated, copy_dtype in schedule:
            if rotated is not None:
                # A pre-rotation kernel writes the rotated copy the attention kernels read, in
                # the operand's memory order: a model's q is a [B, N, H, D] projection, and the
                # output gradient comes back in that order too (the model's head merge), so the
                # dK/dV kernel can share their offsets (SHARED_OFFSETS).
                tensors[rotated] = empty_in_layout_of(tensors[rotated[0]], copy_dtype)
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
        if plan.backward_reads("dq_acc"):
            # The fused backward (`bwd-dq=fused` or `ordered`, never with a bias): dK/dV adds
            # dS K into dq_acc, the finish kernel scales it into dq.
            assert dbias is None
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
            self._run(plan, tensors, ("attention_bwd_dkdv_dq", "attention_bwd_dq_finish"))
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
        if dbias is not None:
            tensors["dbias"] = dbias
        dq_kernel = "attention_bwd_dq_bias" if dbias is not None else "attention_bwd_dq"
        self._run(plan, tensors, ("attention_bwd_dkdv", dq_kernel))
        return dq, dk, dv, dbias


ROTATION_KERNELS = {"rotate_query": "q_rot", "rotate_key": "k_rot"}
"""The pre-rotation kernels and the rotated copy each writes."""

ROTATED_ROLES = tuple(ROTATION_KERNELS.values())
"""The rotated copies, in the order `forward` hands them back."""

BACKWARD_KERNEL_PREFIX = "attention_bwd"
"""The backward kernels' names start with this (lower_backward.py)."""


class _AttentionFunction(torch.autograd.Function):
    """Autograd glue: saves q, k, v, the output and the log-sum-exp (never the score matrix);
    the backward kernels recompute the rest. For q and k it saves the forward's rotated copy
    instead where the backward reads that copy (`CompiledAttention.training_key`): no rotation
    in the backward, at the cost of the copies' memory until the backward (which replaces
    q's and k's where nothing else keeps those alive; the interpreter's copies of bf16 inputs
    are fp32, twice the size)."""

    @staticmethod
    def forward(ctx, fn: CompiledAttention, plan: CallPlan, data, q, k, v, bias):  # type: ignore[override]
        # The kernels read the broadcast view in `data`; the user's bias is an input so that
        # autograd sees it, and its shape is where its gradient is summed to.
        ctx.bias_layout = None if bias is None else (bias.shape, bias.dtype)
        rotated: dict[str, torch.Tensor] = {}
        out, lse = fn.forward(plan, data, q, k, v, rotated)
        ctx.fn, ctx.plan, ctx.data = fn, plan, data
        # The listed filters' tensors (a layout, document ids) as the forward read them: the
        # backward reads them again (its own block lists, the ids per entry).
        sources = data.get(LIST_SOURCES)
        read = [] if sources is None else [(source.argument, source.given) for source in sources]
        # The bias and RoPE positions are read again too (the scores are recomputed): as the
        # forward read them, or the gradients follow other scores than the output (positions
        # past the forward's rotation table would even be read out of bounds).
        read += [(name, data[name]) for name in REREAD_BY_BACKWARD if name in data]
        ctx.read_states = tuple((argument, t, tensor_state(t)) for argument, t in read)
        # A rotated copy replaces its operand where the backward reads the copy; otherwise
        # the backward gets the operand (and rotates it itself if it must).
        q_saved = rotated["q_rot"] if "q_rot" in rotated and "q_rot" in plan.backward_roles else None
        k_saved = rotated["k_rot"] if "k_rot" in rotated and "k_rot" in plan.backward_roles else None
        ctx.saved_roles = ("q" if q_saved is None else "q_rot", "k" if k_saved is None else "k_rot")
        ctx.save_for_backward(q if q_saved is None else q_saved, k if k_saved is None else k_saved,
                              v, out, lse)
        # An output nobody differentiated (usually lse) arrives as None, not as a tensor of
        # zeros that would cost a fill and a subtraction on the device.
        ctx.materialize_grads = False  # what ctx.set_materialize_grads(False) sets, without its call
        if not fn._has_lse:
            ctx.mark_non_differentiable(lse)  # a normalizer without one (relu)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):  # type: ignore[override]
        fn: CompiledAttention = ctx.fn
        bias_grad = ctx.needs_input_grad[6]
        saved = ctx.saved_tensors  # unpacked once: each access unpacks them all again
        for argument, given, state in ctx.read_states:
            if tensor_state(given) != state:
                # As autograd refuses a saved tensor changed in place: the backward would read
                # the new data, not what the forward used.
                raise ArgumentError(
                    f"{argument} was modified in place between the forward and the backward; "
                    f"the backward needs the forward's {argument} (pass a copy, or change it "
                    "after the backward)")
        if grad_out is None:
            grad_out = torch.zeros_like(saved[3])
        dq, dk, dv, dbias = fn.backward(ctx.plan, ctx.data, saved, grad_out, grad_lse, bias_grad,
                                        ctx.saved_roles)
        if dbias is not None:
            # Summed over the broadcast dims in fp32, then rounded once to the bias's type.
            shape, dtype = ctx.bias_layout
            dbias = dbias.sum_to_size(shape).to(dtype)
        if torch.is_grad_enabled():  # create_graph=True
            dq, dk, dv, dbias = _without_second_derivative((dq, dk, dv, dbias), (*saved, grad_out, grad_lse))
        return None, None, None, dq, dk, dv, dbias


DIRECT_APPLY = direct_apply_supported()
"""Whether training calls make their autograd node through the C apply directly
(`apply_attention`): this torch's `Function.apply` has the preamble that reproduces, checked
once at import (`runtime/direct_apply.py`)."""

_function_apply = c_apply(_AttentionFunction)
"""`torch._C._FunctionBase.apply` bound to `_AttentionFunction`: the autograd node's creation,
which `Function.apply` calls after its Python preamble."""

if DIRECT_APPLY:  # read once, here: the per-call path looks up no attributes of torch._C
    _transforms_active = torch._C._are_functorch_transforms_active
    _unwrap_if_dead = torch._C._functorch.unwrap_if_dead


def _apply_direct(
    fn: CompiledAttention, plan: CallPlan, data: dict[str, torch.Tensor],
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`_AttentionFunction.apply(fn, plan, data, q, k, v, bias)` without `Function.apply`'s
    Python frames: outside functorch's transforms it only unwraps the tensors of transforms
    that have exited ("dead wrappers") and calls the C apply (`EXPECTED_PREAMBLE`); under a
    transform the call goes through `Function.apply` (which refuses this Function: it has no
    `setup_context`)."""
    if _transforms_active():
        return _AttentionFunction.apply(fn, plan, data, q, k, v, bias)
    return _function_apply(fn, plan, data, _unwrap_if_dead(q), _unwrap_if_dead(k), _unwrap_if_dead(v),
                           None if bias is None else _unwrap_if_dead(bias))


apply_attention = _apply_direct if DIRECT_APPLY else _AttentionFunction.apply
"""How a training call makes its autograd node: `_apply_direct` where the feature test at
import passed, else `Function.apply` (the same node, a few us more per step)."""


def _without_second_derivative(
    grads: tuple[torch.Tensor | None, ...], inputs: tuple[torch.Tensor | None, ...]
) -> tuple[torch.Tensor | None, ...]:
    """`grads` attached to a node that raises if differentiated. Under create_graph=True the
    gradients should depend on q, k, v and dO through a graph; the kernels make none, so a
    second derivative would otherwise treat them as constants and drop their terms."""
    depends_on = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    if not depends_on:
        return grads  # nothing they depend on is differentiable: constants are the truth
    present = [i for i, g in enumerate(grads) if g is not None]
    attached = _NoSecondDerivative.apply(len(present), *(grads[i] for i in present), *depends_on)
    result = list(grads)
    for i, g in zip(present, attached):
        result[i] = g
    return tuple(result)


class _NoSecondDerivative(torch.autograd.Function):
    """Passes first-order gradients through unchanged, as outputs that depend on what they
    were computed from (`depends_on`), and raises if anything is differentiated through
    them: the attention backward has no derivative of its own."""

    @staticmethod
    def forward(ctx, count: int, *tensors: torch.Tensor):  # type: ignore[override]
        # Detached, not views: autograd forbids in-place changes of a multi-output Function's
        # views, and callers may scale or clip gradients in place.
        return tuple(g.detach() for g in tensors[:count])

    @staticmethod
    def backward(ctx, *_grads):  # type: ignore[override]
        raise AttnFuseError(
            "second derivatives of attention are not implemented: a gradient that AttnFuse "
            "computed with create_graph=True was differentiated again (a gradient penalty or "
            "a Hessian-vector product through the attention)"
        )


def compiled_form(spec: Any) -> CompiledAttention:
    """What `spec(q, k, v)` runs: `compile(spec)`, made on the spec's first call and kept on
    it. Under `torch.compile` / `torch.export` (Dynamo traces this function), the spec is
    compiled (or its compiled form taken) by `_spec_form_name`, which Dynamo runs instead of tracing (compiling
    is xDSL code), and found by name in `_SPEC_FORMS`: a plain global dict, which the trace
    reads like any global, so the call traces on into the compiled variant's operator with
    no graph break. (A spec made inside the traced function is refused there: see
    `_spec_form_name`.)"""
    if torch.compiler.is_compiling():
        # The trace reads nothing of the spec itself: a guard on its `_compiled`, which
        # changes when the spec compiles, would fail (or recompile the graph).
        return _SPEC_FORMS[_spec_form_name(spec)]
    compiled = spec._compiled
    if compiled is None:
        compiled = spec._compiled = compile(spec)
    return compiled


_SPEC_FORMS: dict[str, CompiledAttention] = {}
"""The compiled forms of specs first called under tracing, by their operator key (one per
variant program: equal specs share one)."""
_SPEC_FORM_NAMES: dict[Any, str] = {}
"""The names of the specs (`AttentionSpec`s; the runtime does not import the DSL) in `_SPEC_FORMS`."""


def _spec_form_name(spec: Any) -> str:
    """The `_SPEC_FORMS` name of a spec first called under tracing, compiled here (and kept
    on the spec, as an eager first call does). Dynamo hands this function the real spec, so
    the spec must exist outside the traced function: one made inside it is, at this point, an
    object whose attributes Dynamo has not written yet."""
    if not hasattr(spec, "_key"):
        raise AttnFuseError(
            "a spec made inside a function that torch.compile / torch.export traces cannot be "
            "called there: make it outside (spec = af.attention(...); the traced function calls "
            "spec(q, k, v)), or call af.compile(spec) outside and the compiled object inside"
        )
    name = _SPEC_FORM_NAMES.get(spec)
    if name is None:
        compiled = spec._compiled
        if compiled is None:
            compiled = spec._compiled = compile(spec)
        name = _SPEC_FORM_NAMES[spec] = compiled.operator_key()
        _SPEC_FORMS.setdefault(name, compiled)
    return name


# What `torch.compiler.assume_constant_result(_spec_form_name)` does (it sets this
# attribute; Dynamo then calls the function at trace time and keeps its result as a
# constant), without the 4 s import of torch._dynamo it makes: eager calls do not pay for it.
# test_serving_audit checks that the decorator still sets this very attribute.
_spec_form_name._dynamo_marked_constant = True  # type: ignore[attr-defined]


def compile(
    source: object,
    *,
    rope_placement: str | tuple[str, str] = "auto",
    config: TileConfig | None = None,
    deterministic: bool = True,
) -> CompiledAttention:
    """Compiles a variant: a spec (`af.attention(...)`) or an attn program, as text or as an
    xDSL module holding one `attn.variant` (hand-written IR runs and is checked like DSL
    output). `rope_placement` ("auto", "fused", "pre_rotated", "q_fused" or a (query, key)
    pair) overrides the Rotation Calculus; `config` fixes the tile configuration.

    A pair `(query, "given")`, the query "auto", "fused" or "pre_rotated", compiles for keys
    that arrive rotated (a KV cache's, `R(k_pos) k`, written with `rotate_keys`): no kernel
    rotates k, its gradient is that of the k passed, and `k_positions=` is an error; the
    queries are rotated at their positions (`q_positions=`, `[Nq]` or `[B, Nq]`).

    `deterministic=True` (the default) keeps the backward bit-for-bit reproducible: the
    separate dQ kernels, or, where the Hopper (Gluon) backward takes the call, the fused
    backward with its dQ adds in key-block order. `deterministic=False` allows the fused
    backward with its adds unordered (an fp32 sum whose last bits vary between runs; faster).
    `backward_choice.choose_backward` picks (`ATTNFUSE_BACKWARD=auto|fused|ordered|separate`);
    `torch.use_deterministic_algorithms(True)` keeps the adds ordered; a variant with a bias
    takes the separate kernels.

    Inside a function that `torch.compile` / `torch.export` traces, `compile(spec)` of a spec
    made outside it, with the default options, is the spec's own compiled form (what
    `spec(q, k, v)` runs there); anything else must be compiled outside the traced function
    (compiling is xDSL code, which the tracer cannot step into)."""
    # Dynamo tracing, not `is_compiling()`: that is also true inside the functions Dynamo runs
    # for real and keeps as constants (`_spec_form_name`, the HF integration's
    # `_operator_key`), which compile for real.
    if torch.compiler.is_dynamo_compiling():
        defaults = rope_placement in ("auto", ("auto", "auto")) and config is None and deterministic is True
        if hasattr(source, "_key") and defaults:
            return compiled_form(source)
        raise AttnFuseError(
            "af.compile cannot run inside a function that torch.compile / torch.export traces "
            "(except af.compile(spec) of a spec made outside it, with default options): compile "
            "outside (fn = af.compile(...)) and call fn(q, k, v) inside")
    return CompiledAttention(source, rope_placement=rope_placement, config=config,
                             deterministic=deterministic)

"""The torch-facing entry point: `compile(spec)` and the callable it returns.

`CompiledAttention` is assembled from the call path's parts, one module each:
`planning` (what a call of one shape runs), `call_binding` (the call-time data),
`execution` (launching the kernels) and `attention_autograd` (the training node).
This module holds the object's state, its public calls and `compile`."""

from __future__ import annotations

from typing import Any

import torch
import torch.autograd.forward_ad as forward_ad

from attnfuse.errors import ArgumentError, AttnFuseError
from attnfuse.runtime import torch_op
from attnfuse.runtime.attention_autograd import (
    TRACED_TRANSFORM,
    apply_attention,
    call_under_transform,
    differentiating_transforms,
    refuse_forward_ad,
    transforms_active,
)
from attnfuse.runtime.call_binding import CallBinding
from attnfuse.runtime.call_plan import CallPlan, records_autograd
from attnfuse.runtime.compiler import (
    CompiledProgram,
    CompileKey,
    generate_program,
    lower_spec,
)
from attnfuse.runtime.config import (
    KEY_POSITIONS_WITH_GIVEN_KEY,
    TileConfig,
    check_placement_request,
)
from attnfuse.runtime.execution import KernelExecution
from attnfuse.runtime.inputs import Problem, check_inputs, resolved_negation
from attnfuse.runtime.interpreter import runs_interpreted
from attnfuse.runtime.key_rotation import rotate_keys
from attnfuse.runtime.kv_cache import check_cache_arguments
from attnfuse.runtime.launch import KernelLaunch
from attnfuse.runtime.planning import CallPlanning
from attnfuse.runtime.program import (
    DATA_KEYWORDS,
    Canonical,
    VariantProgram,
    anonymous_text,
    as_program,
)


class CompiledAttention(CallPlanning, CallBinding, KernelExecution):
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

    @property
    def deterministic(self) -> bool:
        """Whether the backward must be bit-for-bit reproducible (`af.compile`'s keyword;
        fixed for the object: its plans and operators are keyed on it)."""
        return self._deterministic

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
        if training and self.variant.underivable is not None:
            # Refused here, at the forward, traced or not (a traced call's plan is made
            # without autograd's flag; its backward operator would refuse only later).
            raise ArgumentError(self.variant.training_refusal())
        if cache_call and training:
            raise ArgumentError(
                "kv_lens= / block_table= calls are inference-only (a KV cache has no "
                "backward): call under torch.no_grad() or with inputs that do not require grad"
            )
        if forward_ad._current_level >= 0:  # inside `forward_ad.dual_level()`: one read per call
            refuse_forward_ad(q, k, v, bias)
        if torch_op.traced(q, k, v, bias, kv_lens, block_table):
            if transforms_active() and differentiating_transforms():
                # The operators have no functorch rules (and no forward derivative): a clear
                # refusal rather than torch's errors or a zero tangent. (Functionalization,
                # make_fx(functionalize(f))'s, needs none: the operators are pure.)
                raise ArgumentError(TRACED_TRANSFORM)
            if cache_call:
                key = self.operator_key((q_positions is not None, k_positions is not None))
                return torch_op.call_cache(key, q, k, v, kv_lens, block_table, return_lse=return_lse,
                                           bias=bias, q_positions=q_positions, k_positions=k_positions, **data)
            return self._call_operator(q, k, v, return_lse, bias, data, q_positions, k_positions)
        # The kernels read memory, which a lazily negated view (`z.conj().imag`) holds
        # un-negated. (Asked on every call: a method call per tensor, nothing more.)
        try:
            negated = q.is_neg() or k.is_neg() or v.is_neg() or (bias is not None and bias.is_neg())
        except (AttributeError, TypeError):
            negated = True  # not all tensors: resolved_negation leaves them for the checks
        if negated:
            q, k, v, bias = (resolved_negation(q), resolved_negation(k), resolved_negation(v),
                             resolved_negation(bias))
        if transforms_active():  # torch.func: grad, vjp, vmap, ...
            if not differentiating_transforms():
                # Functionalization only (torch.func.functionalize): the operators are pure
                # and it takes them as they are.
                return self._call_operator(q, k, v, return_lse, bias, data, q_positions, k_positions)
            if cache_call:
                raise ArgumentError("kv_lens= / block_table= calls are not supported under "
                                    "torch.func transforms (vmap, grad): call them directly")
            out, lse = call_under_transform(self, q, k, v, bias, data, q_positions, k_positions, training)
            return (out, lse) if return_lse else out
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

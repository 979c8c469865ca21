"""The Hopper (Gluon) backward: where a training call's backward runs the warp-specialized
fused kernel (`lowering/gluon_backward.py`) and how it is launched.

`takes_gluon_backward` decides at plan time, before the program is compiled, whether the
fused backward (`lower-to-tile{bwd-dq=fused}`, or `ordered` for a deterministic call) is built
for the Gluon target: the rule `backward_choice.choose_backward` applies under
`ATTNFUSE_BACKWARD=auto`. `gluon_backward`
then replaces the plan's portable fused dK/dV/dQ launches (`FUSED_BACKWARD_KERNELS`) with Gluon ones where
`warp-specialize` scheduled the kernel, whatever chose the fused backward (under
`ATTNFUSE_BACKWARD=fused` too, at any size: the portable fused kernel is slower still). An input
a TMA descriptor cannot cover (strides of 0,
rows not 16-byte aligned) is copied, and so are lse and delta where Nq is not a multiple of 4
(`GluonBackwardLaunch.padded_rows`); a call whose outputs or row statistics (at such a
multiple) it cannot cover runs the portable fused kernel of the same plan. `ATTNFUSE_BACKWARD_TARGET=triton` keeps the
portable kernel, `gluon` takes Gluon wherever it lowers and the shape fits (whatever the
measurements say), `auto` (the default) builds the fused backward for it only where
`MIN_WORK` says for the variant's class. Read at plan time. A variant with an additive bias has two
such kernels (`FUSED_BACKWARD_KERNELS`: the second also stores the bias gradient), and each is
replaced by its own Gluon launch.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache, cached_property
from typing import TYPE_CHECKING, Any

import torch
from xdsl.dialects.builtin import ModuleOp

from attnfuse.dialects import make_context, tile
from attnfuse.dialects.backward_shape import BACKWARD_HEAD_DIMS, FUSED_BACKWARD_KERNELS
from attnfuse.errors import ArgumentError
from attnfuse.runtime.gluon_forward import _descriptor_ready, _gluon_module, hopper
from attnfuse.lowering.gluon_backward import DESCRIPTOR_ROLES, ROW_ALIGNMENT, padded_rows_per_head
from attnfuse.runtime.gluon_launch import GluonRunner, call_key, pointer_arguments, specialization_of
from attnfuse.runtime.inputs import Problem
from attnfuse.runtime.launch import KernelLaunch
from attnfuse.runtime.program import Canonical
from attnfuse.transforms.warp_specialize import BACKWARD_BLOCK_M, WarpSpecializePass

if TYPE_CHECKING:
    from attnfuse.lowering.gluon import GluonKernel, GluonProgram

TARGET_ENV = "ATTNFUSE_BACKWARD_TARGET"
TARGETS = ("auto", "gluon", "triton")

KERNEL = "attention_bwd_dkdv_dq"
"""The fused backward's dK/dV/dQ kernel (with a bias, `FUSED_BACKWARD_KERNELS` has its `_bias`
copy too)."""

OUTPUT_ROLES = ("dk", "dv", "dq_acc")
"""The outputs behind the descriptors after q, k, v and dO (the launch ABI's order)."""

ROW_ROLES = ("lse", "delta")
"""The row statistics behind the 1-D descriptors (`[B, Hq, Nq]` fp32, contiguous, or copied with
each head's rows padded to `ROW_ALIGNMENT`), where the kernel reads them (the softmax; a
pointwise normalizer reads none)."""


GLUON_BACKWARD_TILES = (BACKWARD_BLOCK_M, WarpSpecializePass().bwd_block_n)
"""(keys, queries) of the scheduled backward's block pairs (`warp-specialize`'s defaults): the
tiles a listed variant's dK/dV lists are built for where it takes the Gluon backward."""

NORMALIZERS = ("softmax", "relu", "sigmoid")
"""Normalizers whose fused backward the schedule takes (`backward_shape`)."""

GLUON_BACKWARD_MIN_WORK = {64: 16 * 1024 * 1024, 128: 4 * 1024 * 1024}
"""`auto` takes the Gluon backward at a head dim of this table from this many (query, key)
pairs per head (half of Nq x Nk under a causal band), for `deterministic=False` calls; chosen
by what a training step sees, forward + backward. On the H200, fwd+bwd / bwd alone, ms
(bench/results/20261203T121105Z- (head dim 128), 20261203T121038Z- and
20261203T123030Z-backward-targets.md (head dim 64)):
- head dim 128 (Llama-3-8B heads, bf16): causal 4096 0.919 / 0.690 against the split's
  1.086 / 0.929, causal 8192 3.548 / 2.829 against 4.463 / 3.669;
- head dim 64 (B=4, 12 heads, fp16): causal 4096 1.029 / 0.774 against the split's 1.003 /
  0.829 and 1.104 / 0.860 (two columns of the same split kernels in one run: a wash within
  the spread, so the atomic-free split keeps it; hence 16M), causal 8192 3.968 / 3.049
  against 4.371 / 3.279, dense 4096 1.836 / 1.511 against 2.042 / 1.796, dense 8192
  7.951 / 6.180 against 9.109 / 7.269.
At head dim 128 the rule starts at 4M pairs (causal 2897), where the ordered kernel was
measured faster (`GLUON_ORDERED_MIN_WORK`); the unordered kernel, faster than the ordered
wherever both were timed, was not timed below 8M and takes the same sizes."""

GLUON_ORDERED_MIN_WORK = {64: 16 * 1024 * 1024, 128: 4 * 1024 * 1024}
"""The same for the backward with its dQ adds in key-block order (deterministic calls, the
default), two dQ writer warps (`warp-specialize{bwd-dq-writers}`). On the H200, fwd+bwd / bwd
alone, ms (the same files):
- head dim 128: causal 4096 0.950 / 0.757 against the split's 1.086 / 0.929, causal 8192
  3.720 / 2.865 against 4.463 / 3.669, RoPE + causal 4096 0.975 / 0.732 against 1.126 /
  0.930, 8192 3.751 / 2.831 against 4.628 / 3.675;
- head dim 64: causal 4096 1.040 / 0.791 and 1.043 / 0.818 against the split's 1.003 /
  0.829 and 1.104 / 0.860 (a wash, as above), causal 8192 3.830 / 3.072 against 4.371 /
  3.279, dense 4096 1.941 / 1.564 against 2.042 / 1.796, dense 8192 7.966 / 6.299 against
  9.109 / 7.269.
The order costs 0-5% of fwd+bwd over the unordered kernel (0-9% of the backward alone).
Below 8M pairs at head dim 128, on an H100 (Triton 3.6, both columns on the Gluon forward,
bench/results/20261205T214814Z-backward-targets.md, `ATTNFUSE_FORWARD_TARGET=gluon python3
bench/backward_targets.py --cases causal,rope+causal --seq-lens 1024,2048,3072 --columns
separate,ordered_gluon`, in `bash bench/gpu_session.sh gluon-sizes`), fwd+bwd ms, ordered
Gluon against the split: causal 0.247 / 0.168,
0.427 / 0.400, 0.657 / 0.707 at N = 1024 / 2048 / 3072; RoPE + causal 0.228 / 0.174, 0.445 /
0.426, 0.695 / 0.737. The split is faster up to 2048 (2M pairs), the Gluon backward 6-7% faster
at 3072 (4.7M): the rule starts at 4M. At head dim 64 the split stays faster at causal 4096
(8.4M pairs: 1.004 against 1.067 fwd+bwd, bench/results/20261205T214831Z-backward-targets.md);
at 6144 (18.9M, which the 16M rule takes) the two measures disagree: fwd+bwd, the split
2.241 against the Gluon backward's 2.304 (the split 2.8% faster); the backward alone, the
split 1.883 against 1.707 (the Gluon kernel 9% faster). Unresolved by one run, so 16M stays. Smaller calls keep the split."""

GLUON_POINTWISE_MIN_WORK = {64: 8 * 1024 * 1024, 128: 8 * 1024 * 1024}
"""The same, ordered or not, under a pointwise normalizer (ReLU, sigmoid), whose split
backward evaluates the normalizer and its derivative in both of its kernels: the fused one
gains more than under the softmax. On the H200, fwd+bwd ms, the ordered Gluon backward
(`ordered_gluon` column) against the split (`separate`)
(bench/results/20261204T032404Z-backward-targets-pointwise-llama.md and
20261204T032450Z-backward-targets-pointwise-paper.md):
- head dim 128 (Llama-3-8B heads, bf16): relu 4096 1.602 against 2.062, 8192 6.511 / 8.944;
  relu + causal 4096 0.888 / 1.072, 8192 3.366 / 4.402; sigmoid + causal 4096 1.096 / 1.398,
  8192 4.104 / 5.619;
- head dim 64 (B=4, 12 heads, fp16): relu 4096 1.730 / 1.797, 8192 7.128 / 7.912; relu +
  causal 4096 0.904 / 0.980, 8192 3.440 / 3.875; sigmoid + causal 4096 1.165 / 1.464,
  8192 4.709 / 5.438.
Smaller calls are not measured and keep the split."""


GLUON_LISTED_MIN_WORK = {128: 32 * 1024 * 1024}
"""The same for document calls (`document()`: block lists of documents), with the dQ adds unordered
(`deterministic=False`). On the H100, the document step (packs of 3 documents at 8192, 7 at
16384; Llama heads, bf16), fwd+bwd ms, the split backward against the Gluon one
(`bash bench/gpu_session.sh listed-backward`, bench/results/20261206T0230Z-gpu-session46-h100.md):
causal 8192 2.073 / 1.855, 16384 3.823 / 3.428; bidirectional 8192 4.144 / 3.466, 16384
7.090 / 6.077 (the Gluon backward 10-16% faster). Counted as `pairs_per_head` counts a dense
call of the same length (causal 8192: 32M); head dim 64 and shorter calls are not measured and
keep the split."""

GLUON_BIAS_MIN_WORK = {128: 8 * 1024 * 1024}
"""The same, ordered or not, for a softmax variant with an additive bias (its blocks loaded
beside each step's products; with a gradient, the `_bias` kernel storing dS). On the H200,
causal, Llama heads (B=1, 32/8 heads of 128, bf16), fwd+bwd ms, the split / the ordered Gluon
backward / the unordered one (`bash bench/gpu_session.sh verify48`, i.e. `python3
bench/backward_targets.py --cases bias+causal,biasgrad+causal --seq-lens 4096,8192 --columns
separate,ordered_gluon,fused_gluon`, bench/results/20261206T040319Z-backward-targets-bias.md):
- a padding mask `[B, 1, N, N]` without a gradient: 4096 1.853 / 1.623 / 1.571, 8192 7.048 /
  6.219 / 5.947 (the Gluon backward 12-16% faster);
- a learned bias `[1, H, 1, N]` with its gradient: 4096 3.384 / 2.625 / 2.642, 8192 13.165 /
  11.152 / 10.242 (15-22% faster).
From causal 4096 (8.4M pairs) on; head dim 64, shorter calls, and a bias under a pointwise
normalizer or with block lists are not measured and keep the split."""

GLUON_LISTED_ORDERED_MIN_WORK: dict[int, int] = {}
"""The same with the adds in key-block order (the default, deterministic): none, so `auto`
keeps the split and `ATTNFUSE_BACKWARD_TARGET=gluon` takes the Gluon kernel. In the same run
the ordered Gluon backward was faster for bidirectional documents (8192 4.096 / 3.753, 16384
7.205 / 6.841) but slower under causal (8192 2.068 / 2.269, 16384 3.928 / 4.353): a key block's
first add waits for the lower key blocks' turns, which a causal pack makes long. No rule by
size separates them."""


MIN_WORK: dict[tuple[str, bool], dict[int, int]] = {
    ("softmax", False): GLUON_BACKWARD_MIN_WORK,
    ("softmax", True): GLUON_ORDERED_MIN_WORK,
    ("pointwise", False): GLUON_POINTWISE_MIN_WORK,
    ("pointwise", True): GLUON_POINTWISE_MIN_WORK,
    ("documents", False): GLUON_LISTED_MIN_WORK,
    ("documents", True): GLUON_LISTED_ORDERED_MIN_WORK,
    # Block layouts: not measured (the listed runs timed documents only), so `auto` keeps the split.
    ("block layout", False): {},
    ("block layout", True): {},
    ("softmax with a bias", False): GLUON_BIAS_MIN_WORK,
    ("softmax with a bias", True): GLUON_BIAS_MIN_WORK,
}
"""`auto`'s rule by (`backward_class`, adds in key-block order): from how many (query, key)
pairs per head (`pairs_per_head`) at each head dim the Gluon backward runs; a class or head dim
absent from the table keeps the split."""


def backward_target() -> str:
    """The user's choice (`ATTNFUSE_BACKWARD_TARGET`), checked."""
    target = os.environ.get(TARGET_ENV, "auto").strip().lower() or "auto"
    if target not in TARGETS:
        raise ArgumentError(f"{TARGET_ENV}={target!r}: expected one of {', '.join(TARGETS)}")
    return target


def variant_fits(variant: Canonical, head_dim: int | None = None) -> bool:
    """Whether the variant's fused backward has the shape `warp-specialize` schedules
    (`dialects/backward_shape.py`), as far as the variant says it without lowering: a softmax,
    ReLU or sigmoid over elementwise score ops (additive biases among them; block lists of
    documents, or of a block layout whose blocks hold whole tiles of `GLUON_BACKWARD_TILES`)
    and RoPE, if any, over the full head dim (`rotary_dim` None, or `head_dim` where given), by
    halves or interleaved (and not under ReLU, whose backward rotates in the kernel). A cheap
    filter before anything is lowered: what decides is the lowered kernel
    (`scheduled_backward`), which the runtime asks before it builds the fused backward for
    this target (`CompiledAttention.compile_key`)."""
    if variant.normalizer_name not in NORMALIZERS:
        return False
    if variant.block_size is not None and variant.block_size % max(GLUON_BACKWARD_TILES):
        return False
    rope = variant.rope
    if rope is not None and variant.rotary_dim not in (None, head_dim):
        # A partial width (or, with no head dim given, any explicit one): the loops read q and
        # k by parts. `rotary_dim` equal to the head dim rotates it whole, as None does.
        return False
    if rope is not None and not variant.normalizer_semantics.smooth:
        # ReLU's derivative jumps at 0: its backward rotates in the kernel from the unrounded
        # inputs (`lower_backward.needs_exact_scores`), which the schedule reads whole.
        return False
    return True


def fits(problem: Problem) -> bool:
    """Head dims the schedule is written for, equal for keys and values, 16-bit inputs, and
    rows its flat lse / delta index can address (`rows_addressable`)."""
    return (problem.head_dim in BACKWARD_HEAD_DIMS and problem.head_dim_v == problem.head_dim
            and problem.dtype in (torch.float16, torch.bfloat16) and rows_addressable(problem))


def rows_addressable(problem: Problem) -> bool:
    """Whether the kernel's flat lse / delta index, an int32, reaches every row: B * Hq * Nq'
    < 2^31 (Nq' = Nq padded to `ROW_ALIGNMENT`), which only a q of 256 GiB or more passes."""
    return problem.batch * problem.heads_q * padded_rows_per_head(problem.seq_q) < 2**31


def takes_gluon_backward(problem: Problem, variant: Canonical, bwd_rope: str = "pre_rotated",
                         ordered: bool = False) -> bool:
    """Whether the backward of a call of this shape and variant runs the Gluon fused
    backward (`backward_choice.choose_backward` then builds the fused backward, where it is
    allowed): an sm_90 GPU, a variant and shape the schedule covers, and the user's choice
    (`ATTNFUSE_BACKWARD_TARGET`) or `auto`'s measured rule (never for a variant with an op
    of a block module outside the package, which nothing measured; else `MIN_WORK` by the
    variant's class and whether its adds are in key-block order, `ordered`). RoPE at
    call-time positions (as a Hugging Face model's `position_ids` are passed) is scheduled
    like RoPE at the default ones: dK's inverse rotation in the epilogue
    reads the keys' positions. A backward that rotates in its loops (`bwd_rope` other than
    `pre_rotated`: a placement the caller asked for) is not, since the schedule reads q and k
    whole."""
    target = backward_target()
    if not _target_allows(target, variant) or not hopper(problem) or not fits(problem) or not variant_fits(variant, problem.head_dim):
        return False
    if variant.rope is not None and bwd_rope != "pre_rotated":
        return False
    if target == "gluon":
        return True
    least = MIN_WORK.get((backward_class(variant), ordered), {}).get(problem.head_dim)
    return least is not None and pairs_per_head(problem, variant) >= least


def backward_class(variant: Canonical) -> str:
    """The class of variants one measured rule covers (`MIN_WORK`): "block layout"
    (`block_sparse`), "documents" (other block lists), "pointwise" (ReLU, sigmoid) or
    "softmax", followed by " with a bias" where the variant reads an additive bias."""
    if variant.listed:
        base = "block layout" if variant.block_size is not None else "documents"
    else:
        base = "softmax" if variant.normalizer_name == "softmax" else "pointwise"
    return f"{base} with a bias" if variant.reads("bias") else base


def _target_allows(target: str, variant: Canonical) -> bool:
    """Whether the user's backward target lets `variant` run the Gluon backward at all: not
    under `triton`, and under `auto` not a variant with an op of a block module, for which no
    measurement speaks (as the forward's `auto`, `AUTO_VARIANT_CLASSES["outside"]`)."""
    return target != "triton" and not (target == "auto" and variant.outside_ops)


def pairs_per_head(problem: Problem, variant: Canonical) -> float:
    """The (query, key) pairs a head's backward visits, as `GLUON_BACKWARD_MIN_WORK` counts
    them: Nq x Nk, halved under a causal band, and at most the band's width of keys per query
    under a sliding window."""
    if variant.keys_per_row is not None:
        return problem.seq_q * min(problem.seq_k, variant.keys_per_row)
    causal = variant.band[1] is not None
    return problem.seq_q * problem.seq_k * (0.5 if causal else 1.0)


@dataclass
class GluonBackwardLaunch:
    """The fused backward's dK/dV/dQ launch on the Gluon target; `portable` runs calls whose
    tensors a descriptor cannot cover. Shaped like `KernelLaunch` where the runtime reads it."""

    portable: KernelLaunch
    kernel: Any
    launch: GluonKernel
    problem: Problem
    sm_scale: float
    fallbacks: dict[str, int] = field(default_factory=dict)
    """Calls that ran the portable kernel, by the first tensor a descriptor could not cover
    (for benchmarks and tests to see which calls did)."""

    @property
    def info(self):
        return self.portable.info

    def check_grid(self) -> None:
        self.portable.check_grid()

    def __call__(self, tensors: dict[str, torch.Tensor]) -> None:
        # The same tensors as a call before (the common case in a training loop): its encoded
        # descriptors again, no checks (the key determines what they found).
        pointers, pointed = pointer_arguments(self.launch.roles, self.described_roles, tensors)
        padded = self.padded_rows(tensors)
        # Descriptors of this call's own padded copies are never replayed (their addresses are
        # not in the key).
        key = None if padded else call_key([tensors[role] for role in self.keyed_roles])
        if key is not None and self.runner.replay(key, pointers):
            return
        # An input a descriptor cannot cover (an expanded dO, whose strides are 0, say) is
        # copied: a copy costs a pass over it, the portable fused kernel far more. The outputs
        # and row statistics are the runtime's own allocations, covered unless a caller of the
        # plan hands others.
        inputs = [t if _descriptor_ready(t) else t.clone(memory_format=torch.contiguous_format)
                  for t in (tensors[role] for role in self.launch.operands)]
        outputs = [tensors[role] for role in OUTPUT_ROLES]
        rows = padded or [tensors[role] for role in self.row_roles]
        unready = [role for role, t in zip(OUTPUT_ROLES, outputs) if not _descriptor_ready(t)]
        unready += [role for role, t in zip(self.row_roles, rows) if not (t.is_contiguous() and t.data_ptr() % 16 == 0)]
        if unready:
            self.fallbacks[unready[0]] = self.fallbacks.get(unready[0], 0) + 1
            self.portable(tensors)
            return
        blocks = inputs + outputs
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        p = self.problem
        block_m, block_n = self.launch.block_m, self.launch.block_n
        blocks_and_layouts = _blocks_and_layouts(blocks[0].dtype == torch.float16, p.head_dim, block_m, block_n)
        descs = [TensorDescriptor(t, list(t.shape), list(t.stride()), block, layout)
                 for t, (block, layout) in zip(blocks, blocks_and_layouts[:7])]
        row_block, row_layout = blocks_and_layouts[7]
        descs += [TensorDescriptor(t, [t.numel()], [1], row_block, row_layout) for t in rows]
        # Replayed later only if no input was copied (a copy's address is new every call).
        copied = any(t is not tensors[role] for t, role in zip(inputs, self.launch.operands))
        self.runner([*descs, *pointers], self.scalars, specialization_of(blocks + rows, pointed),
                    descriptors=len(descs), key=None if copied else key)

    @property
    def allocates(self) -> bool:
        """Whether every call allocates (`padded_rows`' copies): `KernelExecution._graphs` then
        makes no launch graph for the schedule, which would keep the copies in its pool."""
        return bool(self.row_roles) and self.problem.seq_q % ROW_ALIGNMENT != 0

    def padded_rows(self, tensors: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """Where Nq is not a multiple of `ROW_ALIGNMENT`: the call's lse and delta (`[B, Hq,
        Nq]`, any strides) copied into new `[B * Hq, Nq']` buffers (Nq' the next multiple; the
        rows the kernel reads, `n_rows`) whose padding is 0 (a finite delta for the rows past
        Nq, whose probabilities the kernel zeroes; 0 * NaN would not be 0). Nothing (an empty
        list) where the rows are read in place. The buffers are the call's own, as the rows
        are: calls of one plan on two streams or threads never share them (`allocates`: no
        launch graph is made for such a schedule)."""
        if not self.allocates:
            return []
        p = self.problem
        width = padded_rows_per_head(p.seq_q)
        padded = []
        for role in self.row_roles:
            rows = tensors[role]
            buffer = torch.zeros(p.batch * p.heads_q, width, device=rows.device, dtype=torch.float32)
            # A view of the buffer in the rows' shape (the runtime's rows have exactly it): the
            # copy follows any strides and allocates nothing.
            buffer.view(p.batch, p.heads_q, width)[..., : p.seq_q].copy_(rows)
            padded.append(buffer)
        return padded

    @cached_property
    def row_roles(self) -> tuple[str, ...]:
        """The row statistics the kernel reads (`ROW_ROLES`, or none under a pointwise normalizer)."""
        return tuple(role for role in ROW_ROLES if role in self.launch.roles)

    @cached_property
    def described_roles(self) -> set[str]:
        """The roles behind descriptors (the rest are pointer arguments)."""
        return set(self.launch.operands) | set(DESCRIPTOR_ROLES)

    @cached_property
    def keyed_roles(self) -> tuple[str, ...]:
        """Every tensor role of the launch, those behind descriptors first (`call_key`)."""
        pointer_roles = [role for role in self.launch.roles if role not in self.described_roles]
        return (*self.launch.operands, *OUTPUT_ROLES, *self.row_roles, *pointer_roles)

    @cached_property
    def scalars(self) -> tuple[object, ...]:
        p = self.problem
        return (self.sm_scale, p.seq_q, p.seq_k, p.heads_kv, p.group_size)

    @cached_property
    def runner(self) -> GluonRunner:
        """The kernel's launches over this plan's grid `(B * Hkv, cdiv(n_k, BLOCK_M))`."""
        p = self.problem
        return GluonRunner(self.kernel, (p.batch * p.heads_kv, -(-p.seq_k // self.launch.block_m)),
                           self.launch.num_warps)


@cache
def _blocks_and_layouts(fp16: bool, dim: int, block_m: int, block_n: int) -> tuple[tuple[list[int], Any], ...]:
    """The block shape and shared layout of each descriptor (q, k, v, dO, dK, dV, dq_acc, then
    the rows of lse and delta): made once per shape, not on every call (host time)."""
    from triton.experimental.gluon import language as gl

    dtype = gl.float16 if fp16 else gl.bfloat16
    query, key = [1, 1, block_n, dim], [1, 1, block_m, dim]
    q_layout = gl.NVMMASharedLayout.get_default_for(query, dtype)
    k_layout = gl.NVMMASharedLayout.get_default_for(key, dtype)
    acc_layout = gl.NVMMASharedLayout.get_default_for(query, gl.float32)
    rows = ([block_n], gl.NVMMASharedLayout.get_default_for([block_n], gl.float32))
    return ((query, q_layout), (key, k_layout), (key, k_layout), (query, q_layout), (key, k_layout),
            (key, k_layout), (query, acc_layout), rows)


def scheduled_backward(module: ModuleOp) -> dict[str, GluonProgram] | None:
    """The Gluon programs of `module`'s fused backward kernels (`FUSED_BACKWARD_KERNELS`: the
    dK/dV/dQ kernel and, with a bias, its copy that stores the bias gradient), by kernel name,
    where `warp-specialize` schedules every one of them and the Gluon target prints it; None
    otherwise. This is what decides whether a call runs the Gluon backward (`variant_fits`
    only predicts it). Applies `warp-specialize` to `module`."""
    from attnfuse.lowering.gluon import GluonUnsupported, emit_gluon_kernel

    WarpSpecializePass().apply(make_context(), module)
    kernels = [op for op in module.ops if isinstance(op, tile.KernelOp) and op.sym_name.data in FUSED_BACKWARD_KERNELS]
    if not kernels or any(kernel.schedule is None for kernel in kernels):
        return None
    try:
        return {kernel.sym_name.data: emit_gluon_kernel(kernel) for kernel in kernels}
    except GluonUnsupported:
        return None


def gluon_backward(
    launches: list[Any], problem: Problem, sm_scale: float, tile_module: Callable[[], ModuleOp],
    variant: Canonical,
) -> list[Any]:
    """`launches` with the fused backward's dK/dV/dQ kernels replaced by their Gluon launches where
    the plan has them, this GPU and the user's choice allow it and `warp-specialize` schedules
    the kernels (unchanged otherwise). Under `auto` a variant with an op of a block module keeps
    the portable kernels whatever `ATTNFUSE_BACKWARD` chose (`takes_gluon_backward`)."""
    if not any(launch.info.name in FUSED_BACKWARD_KERNELS for launch in launches) \
            or not _target_allows(backward_target(), variant):
        return launches
    if not hopper(problem) or not fits(problem):
        # (A fused backward forced by ATTNFUSE_BACKWARD, which `takes_gluon_backward` does not
        # decide, keeps its portable kernels where the Gluon ones do not fit.)
        return launches
    programs = scheduled_backward(tile_module())
    if programs is None:
        return launches
    replaced = []
    for launch in launches:
        program = programs.get(launch.info.name)
        if program is None:
            replaced.append(launch)
            continue
        compiled = getattr(_gluon_module(program.source), launch.info.name)
        replaced.append(GluonBackwardLaunch(launch, compiled, program.kernels[0], problem, sm_scale))
    return replaced


__all__ = [
    "GLUON_BACKWARD_MIN_WORK",
    "GLUON_BACKWARD_TILES",
    "GLUON_BIAS_MIN_WORK",
    "GLUON_LISTED_MIN_WORK",
    "GLUON_LISTED_ORDERED_MIN_WORK",
    "GLUON_ORDERED_MIN_WORK",
    "GLUON_POINTWISE_MIN_WORK",
    "MIN_WORK",
    "GluonBackwardLaunch",
    "backward_class",
    "backward_target",
    "gluon_backward",
    "pairs_per_head",
    "rows_addressable",
    "scheduled_backward",
    "takes_gluon_backward",
    "variant_fits",
]

"""Checks of call-time tensors: every mistake becomes an `ArgumentError` naming the argument,
what was expected and what was given."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import torch

from attnfuse.errors import ArgumentError

SUPPORTED_DTYPES = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32"}
MAX_HEAD_DIM = 256


@dataclass(frozen=True)
class Problem:
    """The shape facts of one call."""

    batch: int
    heads_q: int
    heads_kv: int
    seq_q: int
    seq_k: int
    head_dim: int
    head_dim_v: int
    dtype: torch.dtype
    device: torch.device
    pages: int = 0
    """Pages in a paged cache's pools (k and v `[pages, Hkv, page_size, D]`); 0 for a
    contiguous cache."""

    @property
    def group_size(self) -> int:
        return self.heads_q // self.heads_kv

    @property
    def element_type(self) -> str:
        return SUPPORTED_DTYPES[self.dtype]

    @property
    def empty(self) -> bool:
        return 0 in (self.batch, self.heads_q, self.seq_q, self.seq_k)


def check_tensor(name: str, t: object, dtypes: Collection[torch.dtype] = tuple(SUPPORTED_DTYPES)) -> None:
    """Checks one operand: a dense 4-D `[batch, heads, seq, dim]` tensor of one of `dtypes`."""
    if not isinstance(t, torch.Tensor):
        raise ArgumentError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided or t.is_nested:
        raise ArgumentError(f"{name} must be a dense (strided) tensor, got layout {t.layout}"
                            + (" (nested)" if t.is_nested else ""))
    if t.dim() != 4:
        raise ArgumentError(f"{name} must be 4-D [batch, heads, seq, dim], got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        supported = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise ArgumentError(f"{name} has dtype {t.dtype}; supported: {supported}")


def resolved_negation(t: object) -> object:
    """`t`, or for a tensor with PyTorch's negative bit (a lazily negated view, such as
    `z.conj().imag`, whose memory holds the values before the negation) its values
    materialized: kernels read memory. The copy is differentiable; anything else is returned
    as it is (and checked where it is read)."""
    return t.resolve_neg() if isinstance(t, torch.Tensor) and t.is_neg() else t


def refuse_negative_view(name: str, t: torch.Tensor) -> None:
    """An `ArgumentError` for a tensor that a kernel writes in place and that carries PyTorch's
    negative bit: the kernel would write memory whose values the view reads negated."""
    if t.is_neg():
        raise ArgumentError(f"{name} is a lazily negated view (its negative bit is set, as for "
                            "z.conj().imag): a kernel writes it in place, and would write the "
                            f"opposite values; pass a tensor without it ({name}.resolve_neg())")


def refuse_overlapping_view(name: str, t: torch.Tensor) -> None:
    """An `ArgumentError` for a tensor that a kernel writes in place and whose elements may
    share memory (an expanded view, stride 0): one write would change several of its
    positions. Decided from the strides: sorted, each must step past everything the smaller
    ones reach (views whose elements are distinct in some other interleaving are refused
    too; none of a cache's usual layouts is)."""
    reach = 0  # the furthest element offset the dimensions taken so far reach
    for size, stride in sorted((d for d in zip(t.shape, t.stride()) if d[0] > 1), key=lambda d: d[1]):
        if stride <= reach:
            raise ArgumentError(
                f"{name} has elements that share memory (shape {list(t.shape)}, strides {t.stride()}: an "
                "expanded view?): a kernel writes it in place, and one write would land at several "
                f"positions; pass a tensor whose elements are distinct ({name}.contiguous())")
        reach += stride * (size - 1)


def check_backward_operands(problem: Problem, out: object, lse: object, grad_out: object,
                            grad_lse: object) -> None:
    """Checks what the backward operator (`attnfuse::attention_backward`) takes beside q, k, v:
    the forward's output and log-sum-exp and their gradients, which its kernels read at the
    problem's shapes (a caller of the operator, not autograd, can pass anything)."""
    rows = (problem.batch, problem.heads_q, problem.seq_q)
    expected = {"out": ((*rows, problem.head_dim_v), problem.dtype, out),
                "grad_out": ((*rows, problem.head_dim_v), problem.dtype, grad_out),
                "lse": (rows, torch.float32, lse),
                "grad_lse": (rows, torch.float32, grad_lse)}
    for name, (shape, dtype, t) in expected.items():
        if t is None and name == "grad_lse":
            continue
        if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
            raise ArgumentError(f"{name} must be a dense torch.Tensor, got {type(t).__name__}")
        if tuple(t.shape) != shape or t.dtype != dtype or t.device != problem.device:
            raise ArgumentError(
                f"{name} must be {dtype} {list(shape)} on {problem.device} (from q, k, v), got "
                f"{t.dtype} {list(t.shape)} on {t.device}")


REFERENCE_DTYPES = (*SUPPORTED_DTYPES, torch.float64)
"""The inputs' dtypes `af.reference_attention` takes: the kernels', and float64."""


def check_inputs(
    source: object, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, paged_keys: int | None = None,
    kernels: bool = True,
) -> Problem:
    """Validates q, k, v against each other and the variant (a spec, attn IR or a
    `VariantProgram`); returns the call's shape facts. With `paged_keys`, k and v are page
    pools (`[num_pages, Hkv, page_size, D]`, any number of pages) holding up to that many
    keys per sequence, the problem's key length (`kv_cache.check_cache_arguments`). Without
    `kernels` (the reference's checks), what only the kernels need is not asked: float64 is
    taken, any device and any head dim."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, tuple(SUPPORTED_DTYPES) if kernels else REFERENCE_DTYPES)
    if not (q.dtype == k.dtype == v.dtype):
        raise ArgumentError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ArgumentError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if kernels and q.device.type not in ("cuda", "cpu"):
        raise ArgumentError(
            f"q, k, v are on {q.device}; AttnFuse runs on cuda (or on the cpu through Triton's "
            "interpreter)"
        )
    b, h_q, n_q, d = q.shape
    if paged_keys is None and (k.shape[0] != b or v.shape[0] != b):
        raise ArgumentError(f"batch sizes differ: q {b}, k {k.shape[0]}, v {v.shape[0]}")
    if paged_keys is not None and k.shape[0] != v.shape[0]:
        raise ArgumentError(f"k and v page pools hold different numbers of pages: {k.shape[0]} and {v.shape[0]}")
    h_kv, n_k, d_k = k.shape[1], k.shape[2], k.shape[3]
    if d_k != d:
        raise ArgumentError(f"k head dim must equal q's ({d}), got {d_k}")
    if v.shape[1] != h_kv:
        raise ArgumentError(f"v must have k's {h_kv} heads, got {v.shape[1]}")
    if v.shape[2] != n_k:
        if paged_keys is not None:
            raise ArgumentError(f"v's pages must have k's page size {n_k}, got {v.shape[2]}")
        raise ArgumentError(f"v must have k's sequence length {n_k}, got {v.shape[2]}")
    if h_kv == 0 or h_q % h_kv:
        raise ArgumentError(f"query heads ({h_q}) must be a multiple of key/value heads ({h_kv})")
    d_v = v.shape[3]
    for name, dim in (("q/k head dim", d), ("v head dim", d_v)):
        if dim < 1 or (kernels and dim > MAX_HEAD_DIM):
            raise ArgumentError(f"{name} must be in [1, {MAX_HEAD_DIM}], got {dim}")
    from attnfuse.runtime.program import as_program

    program = as_program(source).default()
    rotary_dim = program.rotary_dim
    if rotary_dim is not None and rotary_dim > d:
        raise ArgumentError(f"rope: rotary_dim {rotary_dim} exceeds the head dim {d}")
    if program.rope is not None and rotary_dim is None and d % 2:
        raise ArgumentError(f"rope: the head dim {d} is odd; give an even rotary_dim")
    if paged_keys is None:
        return Problem(b, h_q, h_kv, n_q, n_k, d, d_v, q.dtype, q.device)
    return Problem(b, h_q, h_kv, n_q, paged_keys, d, d_v, q.dtype, q.device, pages=k.shape[0])

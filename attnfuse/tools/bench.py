"""attnfuse-bench: time AttnFuse kernels side by side with PyTorch's attention.

Method
------
Everything runs in one process, one case (variant x sequence length) at a
time, so every implementation sees the same GPU state, the same inputs and
the same clocks:

1. Fresh inputs are drawn with ``torch.randn`` (never zeros: zeros hide
   masking and scaling bugs because every row of the softmax is uniform).
2. A float32 reference is computed from the same inputs: upcast, rotated in
   float32 with float64 RoPE tables, masked with explicit bottom-right
   causal and window masks, biased with ALiBi's slopes (computed here by the
   paper's rule, independently of AttnFuse's) or the bias tensor, and
   evaluated with the math SDPA backend in query chunks so that N=16384 fits
   in memory. In ``fwdbwd`` mode the reference gradients
   come from autograd through the same (checkpointed) chunks.
3. Each implementation runs once untimed and is compared with the reference
   by relative error ``||out - ref|| / ||ref||`` (and the same for dq, dk,
   dv in ``fwdbwd`` mode). A row whose error exceeds the tolerance is
   marked FAIL and is not timed: a wrong kernel's time means nothing. The
   untimed run also absorbs compilation (torch.compile, Triton JIT).
4. Timing is ``triton.testing.do_bench(fn, warmup, rep,
   return_mode="median")``: CUDA-event timing of many runs with the L2 cache
   flushed before each, summarised by the median, which is robust to the
   occasional slow run. ``warmup``/``rep`` are milliseconds, not counts.

Baselines
---------
``flex``
    ``torch.compile(flex_attention)`` with a ``BlockMask`` for causal and
    sliding-window variants (bottom-right aligned), no mask for full
    attention, and a ``score_mod`` adding ALiBi's bias or reading the bias
    variant's ``[1, Hq, N, N]`` tensor (drawn once, without a gradient).
``sdpa-cudnn`` / ``sdpa-flash`` / ``sdpa-math``
    ``F.scaled_dot_product_attention`` pinned to one backend with
    ``sdpa_kernel``; a backend that cannot run the case is reported n/a.
    Windows, ALiBi and a bias would need a dense ``attn_mask`` (with the
    causal mask folded in), so those variants are ``unsupported`` for SDPA.

For the RoPE variants the baselines cannot fuse the rotation, so q and k are
rotated first by a ``torch.compile``d, static-shape function (cos/sin tables
built once, outside the timed region). Inductor turns it into fused
elementwise kernels, which makes it the strongest unfused RoPE baseline a
user could write (the design brief's choice); the time reported is rotation
plus attention. AttnFuse receives the raw q and k and rotates in its kernel.

With Hq != Hkv, flex and SDPA get ``enable_gqa=True``. An SDPA backend that
refuses it is retried with the kv heads repeated outside the timed region,
and the row says so.

Each row's status is ``ok``; ``FAIL`` (ran, but the error is over the
tolerance; not timed); ``n/a`` (raised: backend refusal, unsupported dtype,
a backward pass not implemented yet, ...; the error text is kept); or
``unsupported`` (the implementation cannot express the case, e.g. a
``--placement`` that ``af.compile`` does not accept). One implementation's
failure never stops the run. Results go to
``<out>/<UTC time>-<label>-<mode>.json`` and a matching ``.md`` table; the
exit status is 1 when any row FAILs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as _dt
import gc
import hashlib
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

# --------------------------------------------------------------------------
# Tables: variants, presets, implementations
# --------------------------------------------------------------------------

#: Base of the RoPE frequencies, shared by the AttnFuse spec and the
#: baselines' pre-rotation so both compute the same function.
ROPE_THETA = 10000.0

#: A row FAILs when any relative error exceeds this.
DEFAULT_TOLERANCE = 2e-2

PLACEMENTS = ("auto", "fused", "pre_rotated", "q_fused")

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


#: Keys a sliding-window variant keeps behind each query (--window), as in Mistral-style
#: local attention: query i sees keys i - window + 1 .. i.
DEFAULT_WINDOW = 1024


@dataclasses.dataclass(frozen=True)
class Variant:
    """One attention variant, as the few facts every implementation is built from: the
    AttnFuse spec, the baselines' masks and score modifications and the reference all derive
    from these fields, so they cannot describe different functions."""

    rope: bool  # rotate q and k with half-split RoPE before the scores
    mask: str  # "causal" (bottom-right aligned) or "full"
    window: bool = False  # also keep only the last --window keys of each query
    alibi: bool = False  # add ALiBi's slope[h] * (k_pos - q_pos) to the scores
    bias: bool = False  # add a random [1, Hq, N, N] bias tensor (no gradient) to the scores

    def spec(self, af: Any, window: int = DEFAULT_WINDOW) -> Any:
        """The AttnFuse spec of this variant (``af`` is the attnfuse module)."""
        blocks = []
        if self.rope:
            blocks.append(af.rope(theta=ROPE_THETA))
        if self.alibi:
            blocks.append(af.alibi())  # the default slopes; the bench's own are alibi_slopes
        if self.bias:
            blocks.append(af.additive_bias())
        if self.mask == "causal":
            blocks.append(af.causal())
        if self.window:
            blocks.append(af.sliding_window(window))
        if self.mask == "full" and not self.window:
            blocks.append(af.full())
        return af.attention(*blocks)

    @property
    def only_causal_or_full(self) -> bool:
        """Whether SDPA's own flags express it (no window, ALiBi or bias)."""
        return not (self.window or self.alibi or self.bias)


# Extend this table to benchmark more variants; every implementation derives what it
# needs from the fields of Variant.
VARIANTS: dict[str, Variant] = {
    "causal": Variant(rope=False, mask="causal"),
    "full": Variant(rope=False, mask="full"),
    "rope_causal": Variant(rope=True, mask="causal"),
    "rope_full": Variant(rope=True, mask="full"),
    "window_causal": Variant(rope=False, mask="causal", window=True),
    "rope_window_causal": Variant(rope=True, mask="causal", window=True),
    "alibi_causal": Variant(rope=False, mask="causal", alibi=True),
    "bias_causal": Variant(rope=False, mask="causal", bias=True),
}

#: Named shape sets. Explicit shape flags override single fields.
PRESETS: dict[str, dict[str, Any]] = {
    "paper": {"batch": 4, "heads": 12, "kv_heads": 12, "head_dim": 64,
              "seq_lens": [512, 1024, 2048, 4096, 8192, 16384]},
    "llama3-8b": {"batch": 1, "heads": 32, "kv_heads": 8, "head_dim": 128, "seq_lens": [2048, 4096]},
}

#: Shapes when neither a preset nor shape flags are given.
CUDA_DEFAULT_SHAPE = {"batch": 4, "heads": 12, "kv_heads": None, "head_dim": 64,
                      "seq_lens": [512, 1024, 2048, 4096, 8192], "dtype": "fp16"}
# On CPU the harness is only a smoke test of itself, so keep it tiny.
CPU_DEFAULT_SHAPE = {"batch": 1, "heads": 2, "kv_heads": None, "head_dim": 16,
                     "seq_lens": [64, 128], "dtype": "fp32"}

CUDA_DEFAULT_IMPLS = ["flex", "sdpa-cudnn", "sdpa-flash", "attnfuse"]
CPU_DEFAULT_IMPLS = ["flex", "sdpa-math", "attnfuse"]


# --------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------


@dataclasses.dataclass
class Config:
    """Fully resolved benchmark settings (what the results file records)."""

    label: str
    mode: str
    batch: int
    heads: int
    kv_heads: int
    head_dim: int
    seq_lens: list[int]
    dtype: str
    variants: list[str]
    impls: list[str]
    placement: str
    window: int
    warmup_ms: float
    rep_ms: float
    tolerance: float
    seed: int
    device: str


def _csv(kind: Callable[[str], Any]) -> Callable[[str], list]:
    """argparse type for comma-separated lists of ``kind``."""

    def parse(text: str) -> list:
        items = [item.strip() for item in text.split(",") if item.strip()]
        if not items:
            raise argparse.ArgumentTypeError("expected a comma-separated list")
        return [kind(item) for item in items]

    return parse


def _choice_list(choices: Sequence[str]) -> Callable[[str], list[str]]:
    """argparse type for comma-separated names drawn from ``choices``."""

    def parse(text: str) -> list[str]:
        names = _csv(str)(text)
        unknown = [name for name in names if name not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(
                f"unknown {', '.join(unknown)}; choose from {', '.join(choices)}"
            )
        return names

    return parse


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface of ``attnfuse-bench``."""
    parser = argparse.ArgumentParser(
        prog="attnfuse-bench",
        description="Benchmark AttnFuse kernels against FlexAttention and SDPA backends "
        "(median of triton.testing.do_bench, correctness-gated).",
    )
    shape = parser.add_argument_group("shapes (override single fields of --preset)")
    shape.add_argument("--preset", choices=sorted(PRESETS), help="named shape set")
    shape.add_argument("--batch", type=int, help="batch size B")
    shape.add_argument("--heads", type=int, help="query heads Hq")
    shape.add_argument("--kv-heads", type=int, help="key/value heads Hkv (default: --heads)")
    shape.add_argument("--head-dim", type=int, help="head dimension D")
    shape.add_argument("--seq-lens", type=_csv(int), help="comma-separated sequence lengths N")
    shape.add_argument("--dtype", choices=sorted(DTYPES), help="input dtype (default fp16; fp32 on CPU)")

    what = parser.add_argument_group("what to run")
    what.add_argument("--mode", choices=["fwd", "fwdbwd"], default="fwd",
                      help="forward only, or forward + backward (default fwd)")
    what.add_argument("--variants", type=_choice_list(list(VARIANTS)), default=list(VARIANTS),
                      help=f"comma-separated subset of {','.join(VARIANTS)} (default all)")
    what.add_argument("--impls", type=_choice_list(list(IMPLS)),
                      help=f"comma-separated subset of {','.join(IMPLS)} "
                      f"(default {','.join(CUDA_DEFAULT_IMPLS)}; on CPU {','.join(CPU_DEFAULT_IMPLS)})")
    what.add_argument("--window", type=int, default=DEFAULT_WINDOW,
                      help=f"keys per query of the window variants (default {DEFAULT_WINDOW})")
    what.add_argument("--placement", choices=PLACEMENTS, default="auto",
                      help="RoPE placement passed to af.compile(spec, rope_placement=...) "
                      "for RoPE variants; 'auto' passes nothing")

    timing = parser.add_argument_group("timing and checking")
    timing.add_argument("--warmup", type=float, default=25.0, help="do_bench warmup, in ms (default 25)")
    timing.add_argument("--rep", type=float, default=100.0, help="do_bench repetition time, in ms (default 100)")
    timing.add_argument("--tol", type=float, default=DEFAULT_TOLERANCE,
                        help=f"relative-error tolerance of the correctness gate (default {DEFAULT_TOLERANCE:g})")
    timing.add_argument("--seed", type=int, default=0, help="seed for the random inputs")

    output = parser.add_argument_group("output")
    output.add_argument("--out", type=Path, help="results directory (default bench/results)")
    output.add_argument("--traceback", action="store_true",
                        help="print full tracebacks of failing implementations to stderr")
    output.add_argument("--no-plots", action="store_true",
                        help="write no PNG plots (they need matplotlib; `attnfuse-bench plot "
                        "RESULTS.json` makes them later)")
    output.add_argument("--no-progress", action="store_true",
                        help="no progress display (a rich bar on a terminal, else one line per step)")
    output.add_argument("--allow-cpu", action="store_true",
                        help="run on CPU when CUDA is absent (tiny default shapes; smoke test only)")
    return parser


def resolve_config(args: argparse.Namespace, device: str) -> Config:
    """Merge defaults, preset and explicit flags into a validated Config."""
    base = dict(CUDA_DEFAULT_SHAPE if device == "cuda" else CPU_DEFAULT_SHAPE)
    if args.preset:
        base.update(PRESETS[args.preset])
    overrides = {
        "batch": args.batch, "heads": args.heads, "kv_heads": args.kv_heads,
        "head_dim": args.head_dim, "seq_lens": args.seq_lens, "dtype": args.dtype,
    }
    explicit = {key: value for key, value in overrides.items() if value is not None}
    base.update(explicit)
    if base["kv_heads"] is None:  # MHA unless told otherwise
        base["kv_heads"] = base["heads"]

    shape_overridden = any(key != "dtype" for key in explicit)
    if args.preset:
        label = f"{args.preset}-custom" if shape_overridden else args.preset
    else:
        label = "custom"

    config = Config(
        label=label,
        mode=args.mode,
        batch=base["batch"],
        heads=base["heads"],
        kv_heads=base["kv_heads"],
        head_dim=base["head_dim"],
        seq_lens=list(base["seq_lens"]),
        dtype=base["dtype"],
        variants=list(args.variants),
        impls=list(args.impls or (CUDA_DEFAULT_IMPLS if device == "cuda" else CPU_DEFAULT_IMPLS)),
        placement=args.placement,
        window=args.window,
        warmup_ms=args.warmup,
        rep_ms=args.rep,
        tolerance=args.tol,
        seed=args.seed,
        device=device,
    )
    _validate(config)
    return config


def _validate(config: Config) -> None:
    """Reject shapes no implementation could run, before spending GPU time."""
    for name in ("batch", "heads", "kv_heads", "head_dim"):
        if getattr(config, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be positive")
    if config.window < 1:
        raise ValueError("--window must be positive")
    if any(n < 1 for n in config.seq_lens):
        raise ValueError("--seq-lens must be positive")
    if config.heads % config.kv_heads:
        raise ValueError(f"--heads ({config.heads}) must be a multiple of --kv-heads ({config.kv_heads})")
    if config.head_dim % 2 and any(VARIANTS[v].rope for v in config.variants):
        raise ValueError("RoPE variants need an even --head-dim")


# --------------------------------------------------------------------------
# RoPE (half-split, Llama/NeoX convention)
# --------------------------------------------------------------------------


def rope_tables(n: int, head_dim: int, device: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables of shape [n, head_dim // 2] for positions 0..n-1.

    Frequencies are theta^(-2t/D) for t < D/2 and angles are pos * freq, both
    computed in ``dtype`` (float32 for the baselines, float64 for the
    reference so the reference carries no angle rounding of its own).
    """
    exponent = torch.arange(0, head_dim, 2, device=device, dtype=dtype) / head_dim
    freq = ROPE_THETA ** (-exponent)
    pos = torch.arange(n, device=device, dtype=dtype)
    angle = pos[:, None] * freq[None, :]
    return torch.cos(angle), torch.sin(angle)


def rotate_half_split(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x_t, x_{t+D/2}) by the table angles, in float32.

    The result is cast back to ``x.dtype`` because that is what a user feeds
    the attention kernel after rotating separately.
    """
    half = x.shape[-1] // 2
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:]
    rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return rotated.to(x.dtype)


def _rotate_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Rotate q and k with shared tables (the function the baselines compile)."""
    return rotate_half_split(q, cos, sin), rotate_half_split(k, cos, sin)


_COMPILED: dict[str, Callable] = {}


def compiled_rotate_qk() -> Callable:
    """The baselines' pre-rotation, compiled once with static shapes."""
    if "rotate" not in _COMPILED:
        _COMPILED["rotate"] = torch.compile(_rotate_qk, dynamic=False)
    return _COMPILED["rotate"]


def compiled_flex() -> Callable:
    """``torch.compile(flex_attention)`` with static shapes, built once."""
    if "flex" not in _COMPILED:
        from torch.nn.attention.flex_attention import flex_attention

        _COMPILED["flex"] = torch.compile(flex_attention, dynamic=False)
    return _COMPILED["flex"]


def configure_dynamo() -> None:
    """Allow one compiled graph per (shape, mask) without eager fallback.

    Every sequence length and mask closure is a new static-shape graph of the
    same function; the default recompile limit (8) would silently drop
    flex_attention to its very slow eager path part-way through a preset.
    """
    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), 256))
            break
    if hasattr(config, "accumulated_recompile_limit"):
        config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, 4096)


# --------------------------------------------------------------------------
# One benchmark case and its reference
# --------------------------------------------------------------------------


@dataclasses.dataclass
class Case:
    """Inputs and settings shared by every implementation of one case."""

    variant_name: str
    variant: Variant
    config: Config
    n: int
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    dout: torch.Tensor
    cos: torch.Tensor | None  # float32 tables for the baselines' pre-rotation
    sin: torch.Tensor | None
    bias: torch.Tensor | None = None  # [1, Hq, N, N] in the inputs' dtype, for bias variants

    @property
    def backward(self) -> bool:
        return self.config.mode == "fwdbwd"

    @property
    def gqa(self) -> bool:
        return self.config.heads != self.config.kv_heads

    @property
    def causal_offset(self) -> int:
        """Nk - Nq: shifts the diagonal so the last query sees the last key."""
        return self.k.shape[-2] - self.q.shape[-2]


def make_case(config: Config, variant_name: str, n: int) -> Case:
    """Draw fresh random inputs for one (variant, N) case."""
    torch.manual_seed(config.seed)

    def draw(heads: int) -> torch.Tensor:
        return torch.randn(config.batch, heads, n, config.head_dim, device=config.device,
                           dtype=DTYPES[config.dtype])

    q, k, v, dout = draw(config.heads), draw(config.kv_heads), draw(config.kv_heads), draw(config.heads)
    if config.mode == "fwdbwd":
        for tensor in (q, k, v):
            tensor.requires_grad_(True)
    variant = VARIANTS[variant_name]
    cos = sin = None
    if variant.rope:
        cos, sin = rope_tables(n, config.head_dim, config.device, torch.float32)
    bias = None
    if variant.bias:  # one bias per head and position pair, shared by the batch
        bias = torch.randn(1, config.heads, n, n, device=config.device, dtype=DTYPES[config.dtype])
    return Case(variant_name, variant, config, n, q, k, v, dout, cos, sin, bias)


@dataclasses.dataclass
class Reference:
    """float32 reference output (and gradients w.r.t. raw q, k, v)."""

    out: torch.Tensor
    grads: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None


def alibi_slopes(heads: int) -> list[float]:
    """ALiBi's slopes for ``heads`` heads, by the paper's rule: for a power of two ``n``,
    2^(-8i/n) for i = 1..n; otherwise the power of two below, then every other slope of
    twice that count. Written here from the paper, apart from AttnFuse's own, so that the
    reference checks AttnFuse's default slopes too."""

    def power_of_two(n: int) -> list[float]:
        return [2.0 ** (-8.0 * i / n) for i in range(1, n + 1)]

    below = 2 ** math.floor(math.log2(heads))
    return power_of_two(below) + power_of_two(2 * below)[0::2][: heads - below]


def keep_mask(variant: Variant, distance: torch.Tensor, window: int) -> torch.Tensor | None:
    """Which keys a query keeps, from ``distance = q_pos - k_pos`` (None: all of them)."""
    keep = None
    if variant.mask == "causal":
        keep = distance >= 0
    if variant.window:
        inside = (distance < window) & (distance > -window)
        keep = inside if keep is None else keep & inside
    return keep


def _reference_block(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, row0: int,
                     variant: Variant, window: int, slopes: torch.Tensor | None,
                     bias: torch.Tensor | None, offset: int) -> torch.Tensor:
    """Math-SDPA attention of query rows [row0, row0 + q.shape[-2]), with the variant's
    masks (bottom-right aligned), ALiBi bias and additive ``bias`` (these rows' [H, rows, Nk],
    any float dtype) written out as an explicit ``attn_mask``.

    The backend is pinned inside the block (not around the caller) so the
    recomputation during a checkpointed backward uses the math path too.
    """
    q_pos = torch.arange(row0, row0 + q.shape[-2], device=q.device) + offset
    k_pos = torch.arange(k.shape[-2], device=q.device)
    distance = q_pos[:, None] - k_pos[None, :]
    mask = keep_mask(variant, distance, window)
    additive = None
    if slopes is not None:
        additive = -slopes[:, None, None] * distance  # slope[h] * (k_pos - q_pos)
    if bias is not None:
        additive = bias.float() if additive is None else additive + bias.float()
    if additive is not None:
        mask = additive if mask is None else additive.masked_fill(~mask, -math.inf)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def compute_reference(case: Case, max_scores: int = 1 << 26) -> Reference:
    """float32 reference on upcast, rotated inputs, chunked over batch and rows.

    ``max_scores`` bounds the score-matrix elements of one chunk: the full
    [B, H, N, N] float32 matrix at N=16384 would need tens of GB. In fwdbwd
    mode each chunk is checkpointed so only its inputs stay alive until the
    backward pass.
    """
    from torch.utils.checkpoint import checkpoint

    leaves = [t.detach().requires_grad_(case.backward) for t in (case.q, case.k, case.v)]
    with torch.set_grad_enabled(case.backward):
        q, k, v = (t.float() for t in leaves)
        if case.variant.rope:
            cos, sin = (t.float() for t in rope_tables(case.n, q.shape[-1], q.device, torch.float64))
            q, k = rotate_half_split(q, cos, sin), rotate_half_split(k, cos, sin)
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)

        n_q, n_k, heads = q.shape[-2], k.shape[-2], q.shape[1]
        rows_per_chunk = max(1, min(n_q, max_scores // (heads * n_k)))
        slopes = None
        if case.variant.alibi:
            slopes = torch.tensor(alibi_slopes(heads), device=q.device, dtype=torch.float32)
        batches = []
        for b in range(q.shape[0]):
            chunks = []
            for row0 in range(0, n_q, rows_per_chunk):
                rows = slice(row0, row0 + rows_per_chunk)
                # A view: the block upcasts it, so a checkpoint keeps no float32 copy alive.
                bias = None if case.bias is None else case.bias[0, :, rows]
                args = (q[b, :, rows], k[b], v[b], row0, case.variant, case.config.window, slopes,
                        bias, case.causal_offset)
                if case.backward:
                    chunks.append(checkpoint(_reference_block, *args, use_reentrant=False))
                else:
                    chunks.append(_reference_block(*args))
            batches.append(torch.cat(chunks, dim=-2))
        out = torch.stack(batches)

    grads = None
    if case.backward:
        grads = torch.autograd.grad(out, leaves, case.dout.float())
    return Reference(out.detach(), grads)


def relative_error(actual: torch.Tensor | None, expected: torch.Tensor) -> float:
    """||actual - expected|| / ||expected|| in float32 (inf on shape mismatch; ||actual -
    expected|| itself when `expected` is all zeros, as when every row keeps no key)."""
    if actual is None or tuple(actual.shape) != tuple(expected.shape):
        return math.inf
    diff = (actual.detach().float() - expected.float()).norm().item()
    scale = expected.float().norm().item()
    return diff / scale if scale else diff


# --------------------------------------------------------------------------
# Implementations
# --------------------------------------------------------------------------


@dataclasses.dataclass
class Prepared:
    """A ready-to-time implementation of one case.

    ``fn(*inputs)`` returns the attention output. ``inputs`` are the autograd
    leaves (the raw q, k, v unless the implementation needed them reshaped
    outside the timed region); ``raw_grads`` maps their gradients back to
    the raw q, k, v shapes for the correctness check.
    """

    fn: Callable[..., torch.Tensor]
    inputs: tuple[torch.Tensor, ...]
    context: Callable[[], AbstractContextManager] = contextlib.nullcontext
    raw_grads: Callable[[tuple], tuple] = lambda grads: grads
    note: str = ""


class NotApplicable(Exception):
    """The implementation cannot express this case by design (reported as 'unsupported')."""


def _pre_rotation(case: Case) -> Callable:
    """The baselines' rotation step: compiled RoPE for RoPE variants, else identity."""
    if not case.variant.rope:
        return lambda q, k: (q, k)
    rotate = compiled_rotate_qk()
    cos, sin = case.cos, case.sin  # built once in make_case, outside timing
    return lambda q, k: rotate(q, k, cos, sin)


def build_flex(case: Case) -> list[Prepared]:
    """FlexAttention candidates: compiled; on CPU also eager as a fallback."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    variant, offset, window = case.variant, case.causal_offset, case.config.window
    block_mask = score_mod = None
    if variant.mask == "causal" or variant.window:

        def keep(b, h, q_idx, kv_idx):
            return keep_mask(variant, q_idx + offset - kv_idx, window)

        # Built once, outside timing, like a model would cache it per shape.
        block_mask = create_block_mask(keep, B=None, H=None, Q_LEN=case.q.shape[-2],
                                       KV_LEN=case.k.shape[-2], device=case.config.device)
    terms = []  # what score_mod adds to a score: (h, q_idx, kv_idx) -> value
    if variant.alibi:
        slopes = torch.tensor(alibi_slopes(case.config.heads), device=case.config.device, dtype=torch.float32)
        terms.append(lambda h, q_idx, kv_idx: slopes[h] * (kv_idx - q_idx - offset))
    if variant.bias:
        bias = case.bias
        terms.append(lambda h, q_idx, kv_idx: bias[0, h, q_idx, kv_idx])
    if terms:

        def score_mod(score, b, h, q_idx, kv_idx):
            for term in terms:
                score = score + term(h, q_idx, kv_idx)
            return score

    rotate = _pre_rotation(case)
    gqa = case.gqa

    def with_attention(attention: Callable) -> Callable:
        def run(q, k, v):
            q, k = rotate(q, k)
            return attention(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=gqa)

        return run

    inputs = (case.q, case.k, case.v)
    candidates = [Prepared(with_attention(compiled_flex()), inputs)]
    if case.config.device == "cpu":
        # Inductor's CPU flex template needs a working C++ toolchain; eager
        # flex is slow but enough to smoke-test the harness. Never on GPU,
        # where an eager fallback would silently make the baseline useless.
        candidates.append(Prepared(with_attention(flex_attention), inputs,
                                   note="eager flex_attention (compiled failed on CPU)"))
    return candidates


def _expand_kv_heads(case: Case, fn: Callable, context: Callable[[], AbstractContextManager]) -> Prepared:
    """Leaves with k/v heads repeated to Hq, for backends without enable_gqa.

    The repeat happens here, outside the timed region; gradients of the
    expanded leaves are summed over each group to compare with raw dk/dv.
    """
    group = case.config.heads // case.config.kv_heads
    k = case.k.detach().repeat_interleave(group, dim=1).requires_grad_(case.backward)
    v = case.v.detach().repeat_interleave(group, dim=1).requires_grad_(case.backward)

    def raw_grads(grads: tuple) -> tuple:
        dq, dk, dv = grads

        def fold(g):
            return None if g is None else g.unflatten(1, (-1, group)).sum(2)

        return dq, fold(dk), fold(dv)

    return Prepared(fn, (case.q, k, v), context, raw_grads,
                    note="kv heads expanded outside timing (enable_gqa unsupported)")


def sdpa_builder(backend_name: str) -> Callable[[Case], list[Prepared]]:
    """Builder for SDPA pinned to one backend (``SDPBackend`` member name)."""

    def build(case: Case) -> list[Prepared]:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = getattr(SDPBackend, backend_name)
        if not case.variant.only_causal_or_full:
            # A window, ALiBi or a bias needs an explicit [Nq, Nk] attn_mask, which the fused SDPA
            # backends either refuse or read from memory: not the comparison this bench makes.
            raise NotApplicable("needs a dense attn_mask (sliding window, ALiBi or bias)")
        is_causal = case.variant.mask == "causal"
        if is_causal and case.causal_offset != 0:
            # SDPA's is_causal is top-left aligned; it only matches the
            # bottom-right mask when Nq == Nk.
            raise NotApplicable("is_causal is top-left aligned and Nq != Nk")
        rotate = _pre_rotation(case)

        def attention(enable_gqa: bool) -> Callable:
            def run(q, k, v):
                q, k = rotate(q, k)
                return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=enable_gqa)

            return run

        def context() -> AbstractContextManager:
            """Pins the backend around the check and the timing (not per call)."""
            return sdpa_kernel(backend)

        candidates = [Prepared(attention(case.gqa), (case.q, case.k, case.v), context)]
        if case.gqa:
            candidates.append(_expand_kv_heads(case, attention(False), context))
        return candidates

    return build


def build_attnfuse(case: Case) -> list[Prepared]:
    """AttnFuse on the raw q, k, v (it applies RoPE itself)."""
    import attnfuse as af

    spec = case.variant.spec(af, case.config.window)
    note = ""
    if case.config.placement != "auto" and case.variant.rope:
        try:
            fn = af.compile(spec, rope_placement=case.config.placement)
        except TypeError as err:
            raise NotApplicable(f"rope_placement={case.config.placement} unsupported ({err})") from err
        note = f"rope_placement={case.config.placement}"
    else:
        fn = af.compile(spec)
    if case.bias is not None:
        compiled, bias = fn, case.bias

        def fn(q, k, v):
            return compiled(q, k, v, bias=bias)

    return [Prepared(fn, (case.q, case.k, case.v), note=note)]


#: Implementation name -> builder returning candidates in order of
#: preference; the first candidate that runs is checked and timed.
IMPLS: dict[str, Callable[[Case], list[Prepared]]] = {
    "flex": build_flex,
    "sdpa-cudnn": sdpa_builder("CUDNN_ATTENTION"),
    "sdpa-flash": sdpa_builder("FLASH_ATTENTION"),
    "sdpa-math": sdpa_builder("MATH"),
    "attnfuse": build_attnfuse,
}


# --------------------------------------------------------------------------
# Checking and timing
# --------------------------------------------------------------------------


def _synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _step(prepared: Prepared, case: Case) -> Callable[[], Any]:
    """The timed unit: forward, or forward + backward of one call."""
    if not case.backward:
        return lambda: prepared.fn(*prepared.inputs)
    return lambda: prepared.fn(*prepared.inputs).backward(case.dout)


def check(prepared: Prepared, case: Case, reference: Reference) -> dict[str, float]:
    """Run once, untimed, and return relative errors against the reference."""
    for leaf in prepared.inputs:
        leaf.grad = None
    with prepared.context(), torch.set_grad_enabled(case.backward):
        out = prepared.fn(*prepared.inputs)
        if case.backward:
            out.backward(case.dout)
    _synchronize(case.config.device)
    errors = {"out": relative_error(out, reference.out)}
    if case.backward:
        grads = prepared.raw_grads(tuple(leaf.grad for leaf in prepared.inputs))
        for name, grad, expected in zip(("dq", "dk", "dv"), grads, reference.grads, strict=True):
            errors[name] = relative_error(grad, expected)
    return errors


def cpu_median_ms(fn: Callable, warmup_ms: float, rep_ms: float, grad_to_none: Sequence[torch.Tensor]) -> float:
    """Wall-clock median for CPU smoke runs (do_bench needs a GPU driver)."""
    start = time.perf_counter()
    fn()
    estimate_ms = max((time.perf_counter() - start) * 1e3, 1e-3)
    for _ in range(max(1, int(warmup_ms / estimate_ms))):
        fn()
    times = []
    for _ in range(max(3, int(rep_ms / estimate_ms))):
        for leaf in grad_to_none:
            leaf.grad = None
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def time_ms(prepared: Prepared, case: Case) -> float:
    """Median milliseconds of the timed unit (do_bench on CUDA)."""
    step = _step(prepared, case)
    grads = list(prepared.inputs) if case.backward else []
    with prepared.context(), torch.set_grad_enabled(case.backward):
        if case.config.device == "cuda":
            from triton.testing import do_bench

            return float(do_bench(step, warmup=case.config.warmup_ms, rep=case.config.rep_ms,
                                  grad_to_none=grads or None, return_mode="median"))
        return cpu_median_ms(step, case.config.warmup_ms, case.config.rep_ms, grads)


def _error_text(err: BaseException, caught: Sequence[warnings.WarningMessage] = ()) -> str:
    """One line naming the error, plus warnings that explain it.

    SDPA explains a backend refusal only through warnings ("Flash attention
    kernel not used because ..."), so those are folded into the message.
    """
    text = f"{type(err).__name__}: {err}"
    # Deprecation notices from libraries never explain a failure; skip them.
    explanatory = [w for w in caught if not issubclass(w.category, (DeprecationWarning, FutureWarning))]
    reasons = _unique_warnings(explanatory)
    if reasons:
        text += " | " + " | ".join(reasons)
    return " ".join(text.split())[:2000]


def _unique_warnings(caught: Sequence[warnings.WarningMessage], limit: int = 5) -> list[str]:
    """Distinct warning messages, shortened, in order of first appearance."""
    seen: list[str] = []
    for item in caught:
        message = " ".join(str(item.message).split())[:300]
        if message not in seen:
            seen.append(message)
    return seen[:limit]


def empty_row(variant: str, n: int, impl: str, error: str | None = None) -> dict[str, Any]:
    """A result row before anything ran (the JSON schema of one result)."""
    return {"variant": variant, "n": n, "impl": impl, "status": "n/a", "ms": None, "speedup_vs_flex": None,
            "rel_err": {}, "rel_err_max": None, "note": "", "error": error, "warnings": []}


def run_impl(name: str, case: Case, reference: Reference, show_traceback: bool) -> dict[str, Any]:
    """Build, check and time one implementation; never raises (except Ctrl-C)."""
    row = empty_row(case.variant_name, case.n, name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            candidates = IMPLS[name](case)
        except Exception as err:  # noqa: BLE001 - any failure becomes an n/a row
            _record_failure(row, err, caught, show_traceback)
            return row

        prepared, errors = None, None
        failures = []
        for candidate in candidates:
            mark = len(caught)
            try:
                errors = check(candidate, case, reference)
                prepared = candidate
                break
            except Exception as err:  # noqa: BLE001 - try the next candidate
                failures.append(_error_text(err, caught[mark:]))
                if show_traceback:
                    traceback.print_exc()
        if prepared is None:
            row["error"] = " || ".join(dict.fromkeys(failures))  # drop repeats, keep order
            _log(f"  {name:<11} n/a  {row['error'][:160]}")
            return row

        row["note"] = "; ".join(filter(None, [prepared.note] + [f"fallback after: {f[:200]}" for f in failures]))
        row["rel_err"] = errors
        row["rel_err_max"] = max(errors.values())
        if not row["rel_err_max"] <= case.config.tolerance:  # also catches NaN
            row["status"] = "FAIL"
            terms = ", ".join(f"{key}={value:.1e}" for key, value in errors.items())
            row["note"] = "; ".join(filter(None, [row["note"], f"over tolerance: {terms}"]))
            _log(f"  {name:<11} FAIL rel_err={row['rel_err_max']:.2e} (not timed)")
        else:
            try:
                row["ms"] = time_ms(prepared, case)
                row["status"] = "ok"
                _log(f"  {name:<11} {row['ms']:9.4f} ms  rel_err={row['rel_err_max']:.1e}")
            except Exception as err:  # noqa: BLE001
                _record_failure(row, err, caught, show_traceback)
        row["warnings"] = _unique_warnings(caught)
    return row


def _record_failure(row: dict, err: Exception, caught, show_traceback: bool) -> None:
    """Mark ``row`` n/a (or unsupported) with the error's text."""
    # "unsupported" = cannot express this case by design; "n/a" = it broke.
    row["status"] = "unsupported" if isinstance(err, NotApplicable) else "n/a"
    row["error"] = _error_text(err, caught)
    if show_traceback:
        traceback.print_exception(err)
    _log(f"  {row['impl']:<11} {row['status']}  {row['error'][:160]}")


def run_case(config: Config, variant_name: str, n: int, show_traceback: bool,
             on_impl: Callable[[str], None] = lambda name: None) -> list[dict[str, Any]]:
    """All implementations of one (variant, N) case, with speedups vs flex; ``on_impl(name)``
    is called before each implementation runs (the progress display's hook)."""
    _log(f"[{variant_name} N={n}]")
    case = make_case(config, variant_name, n)
    try:
        reference = compute_reference(case)
    except Exception as err:  # noqa: BLE001 - without a reference nothing can be checked
        _log(f"  reference failed: {_error_text(err)}")
        return [empty_row(variant_name, n, name, error=f"reference failed: {_error_text(err)}")
                for name in config.impls]
    rows = []
    for name in config.impls:
        on_impl(name)
        rows.append(run_impl(name, case, reference, show_traceback))
        _release_memory(config.device)
    flex_ms = next((row["ms"] for row in rows if row["impl"] == "flex" and row["ms"]), None)
    for row in rows:
        if flex_ms and row["ms"]:
            row["speedup_vs_flex"] = flex_ms / row["ms"]
    return rows


def _release_memory(device: str) -> None:
    """Drop an implementation's buffers before the next one allocates."""
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# Metadata and output
# --------------------------------------------------------------------------


def package_version(module_name: str) -> str | None:
    """``__version__`` of an importable module, else its distribution version."""
    from importlib import import_module
    from importlib.metadata import PackageNotFoundError, version

    with contextlib.suppress(Exception):  # a broken package still gets its metadata row
        found = getattr(import_module(module_name), "__version__", None)
        if found:
            return str(found)
    try:
        return version(module_name)
    except PackageNotFoundError:
        return None


def _git_commit(repo: Path) -> str | None:
    """HEAD of the source checkout, with '-dirty' when it has local changes."""
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain"], capture_output=True,
                               text=True, timeout=10, check=True).stdout.strip()
        return head + ("-dirty" if dirty else "")
    except Exception:  # noqa: BLE001 - not a checkout, or no git
        return None


def source_digest(package: Path | None = None) -> str:
    """A digest of the attnfuse package's Python sources (or of those under `package`): it
    names the code that ran even where the checkout's git metadata is missing or stale
    (copies of a working tree). Run `python -c "from attnfuse.tools.bench import
    source_digest; print(source_digest())"` in a checkout to match a result to a commit."""
    package = package or Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _source_root() -> Path | None:
    """The repository root when running from a source checkout."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").exists() else None


def collect_metadata(config: Config, started: _dt.datetime) -> dict[str, Any]:
    """Everything needed to reproduce or compare a run."""
    cuda = config.device == "cuda"
    root = _source_root()
    return {
        "timestamp_utc": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": shlex.join(getattr(sys, "orig_argv", sys.argv)),
        "argv": list(sys.argv),
        "cwd": os.getcwd(),
        "device": config.device,
        "gpu": torch.cuda.get_device_name() if cuda else None,
        "gpu_capability": ".".join(map(str, torch.cuda.get_device_capability())) if cuda else None,
        "cpu": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "triton": package_version("triton"),
        "attnfuse": package_version("attnfuse"),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "git_commit": _git_commit(root) if root else None,
        "source_digest": source_digest(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }


def default_out_dir() -> Path:
    """bench/results of the source checkout, else of the working directory."""
    return (_source_root() or Path.cwd()) / "bench" / "results"


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    """Format a number for the table; '-' when absent, never a misleading 0.00."""
    if value is None:
        return "-"
    if value and abs(value) < 0.01 and spec.endswith("f"):
        spec = ".1e"
    return f"{value:{spec}}{suffix}"


def table_rows(results: Sequence[dict[str, Any]]) -> list[list[str]]:
    """Display strings for the table: case, N, impl, ms, speedup, rel_err, status."""
    return [
        [row["variant"], str(row["n"]), row["impl"], _fmt(row["ms"], ".4f"),
         _fmt(row["speedup_vs_flex"], ".2f", "x"), _fmt(row["rel_err_max"], ".1e"), row["status"]]
        for row in results
    ]


TABLE_HEADER = ["case", "N", "impl", "ms", "speedup vs flex", "rel_err", "status"]


def _notes(results: Sequence[dict[str, Any]]) -> list[str]:
    """Explanations for rows that are not plain 'ok', one per distinct message.

    A missing backward or an unsupported backend repeats for every N; listing
    the affected cases once keeps the table readable.
    """
    grouped: dict[tuple[str, str], list[str]] = {}
    for row in results:
        text = row["error"] or row["note"]
        if text:
            grouped.setdefault((row["impl"], text[:240]), []).append(f"{row['variant']}@{row['n']}")
    return [f"{impl} [{', '.join(cases)}]: {text}" for (impl, text), cases in grouped.items()]


def render_table(results: Sequence[dict[str, Any]], title: str) -> None:
    """Print the results with rich when installed, else as aligned text."""
    rows = table_rows(results)
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(title)
        print(plain_table(TABLE_HEADER, rows))
    else:
        table = Table(title=title)
        for column in TABLE_HEADER:
            table.add_column(column, justify="left" if column in ("case", "impl", "status") else "right")
        styles = {"FAIL": "bold red", "n/a": "yellow", "unsupported": "dim"}
        for row, cells in zip(results, rows, strict=True):
            table.add_row(*cells, style=styles.get(row["status"]))
        Console().print(table)
    for note in _notes(results):
        print(f"  * {note}")


def plain_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Fixed-width text table."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()

    return "\n".join([line(header), line(["-" * width for width in widths])] + [line(row) for row in rows])


def markdown_report(document: dict[str, Any]) -> str:
    """The .md companion of the JSON file: metadata, command, table, notes."""
    meta, config = document["metadata"], document["config"]
    lines = [f"# attnfuse-bench {config['label']} ({config['mode']})", ""]
    for key in ("timestamp_utc", "gpu", "device", "torch", "triton", "attnfuse", "cuda", "cudnn",
                "python", "git_commit", "source_digest"):
        lines.append(f"- {key}: {meta.get(key)}")
    lines.append(
        f"- shape: B={config['batch']} Hq={config['heads']} Hkv={config['kv_heads']} "
        f"D={config['head_dim']} dtype={config['dtype']} placement={config['placement']}"
        + (f" window={config['window']}" if any(VARIANTS[v].window for v in config["variants"]) else "")
    )
    timer = "triton do_bench median" if config["device"] == "cuda" else "wall-clock median (CPU smoke test)"
    lines.append(f"- timing: {timer}, warmup={config['warmup_ms']} ms, rep={config['rep_ms']} ms; "
                 f"tolerance={config['tolerance']:g}")
    if document.get("interrupted"):
        lines.append("- **interrupted: partial results**")
    lines += ["", "```", meta["command"], "```", ""]
    lines.append("| " + " | ".join(TABLE_HEADER) + " |")
    lines.append("|" + "|".join("---" for _ in TABLE_HEADER) + "|")
    for cells in table_rows(document["results"]):
        lines.append("| " + " | ".join(cells) + " |")
    notes = _notes(document["results"])
    if notes:
        lines += ["", "Notes:", ""] + [f"- {note.replace('|', '/')}" for note in notes]
    return "\n".join(lines) + "\n"


def write_results(document: dict[str, Any], out_dir: Path, started: _dt.datetime) -> tuple[Path, Path]:
    """Write ``<UTC time>-<label>-<mode>.json`` and ``.md`` under ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    config = document["config"]
    stem = f"{started.strftime('%Y%m%dT%H%M%SZ')}-{config['label']}-{config['mode']}"
    json_path, md_path = out_dir / f"{stem}.json", out_dir / f"{stem}.md"
    # allow_nan=False would reject inf errors; write them as strings instead.
    json_path.write_text(json.dumps(_json_safe(document), indent=2) + "\n")
    md_path.write_text(markdown_report(document))
    return json_path, md_path


def _json_safe(value: Any) -> Any:
    """Replace NaN/inf floats (invalid JSON) with their string names."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(item) for item in value]
    return value


# --------------------------------------------------------------------------
# Progress
# --------------------------------------------------------------------------


class CaseProgress:
    """Progress over the (case, implementation) steps of a run: what is being timed, how many
    steps are done, time elapsed. A rich bar when rich is installed and stderr is a terminal;
    otherwise one plain line per step (what a log file on the GPU machine keeps)."""

    def __init__(self, total: int, enabled: bool = True):
        self.total, self.enabled, self.done = total, enabled, -1
        self.started = time.perf_counter()
        self._rich = None
        self._task = None

    def __enter__(self) -> CaseProgress:
        if self.enabled and sys.stderr.isatty():
            with contextlib.suppress(ImportError):
                from rich.console import Console
                from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                           TimeElapsedColumn)

                self._rich = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                      TimeElapsedColumn(), console=Console(stderr=True))
                self._rich.start()
                self._task = self._rich.add_task("starting", total=self.total)
        return self

    def step(self, description: str) -> None:
        """The previous step is done; ``description`` (case and implementation) starts now."""
        self.done += 1
        if not self.enabled:
            return
        if self._rich is not None:
            self._rich.update(self._task, completed=self.done, description=description)
        else:
            elapsed = time.perf_counter() - self.started
            _log(f"[{self.done + 1}/{self.total}, {elapsed:.0f} s] {description}")

    def __exit__(self, *exc: object) -> None:
        if self._rich is not None:
            self._rich.update(self._task, completed=self.done + 1, description="done")
            self._rich.stop()


# --------------------------------------------------------------------------
# Plots
# --------------------------------------------------------------------------


def _pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend, or None (with a one-line note)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plots skipped: matplotlib is not installed (pip install matplotlib; then "
              "`python -m attnfuse.tools.bench plot RESULTS.json` makes them from the results)")
        return None
    return plt


def plot_panels(path: Path, title: str, panels: Sequence[dict[str, Any]], plt: Any = None) -> Path | None:
    """One PNG of side-by-side line plots; returns its path (None without matplotlib).

    Each panel is a dict: ``series`` ({label: {x: y}}; missing points are simply absent),
    ``xlabel``, ``ylabel``, ``xscale`` ("log2" with a tick at every x, or "linear"),
    ``yscale`` ("log" or "linear") and optionally ``hline`` ((y, label): a dashed reference
    line, e.g. ratio 1).
    """
    plt = plt or _pyplot()
    if plt is None:
        return None
    figure, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 4.6), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        xs_all = sorted({x for points in panel["series"].values() for x in points})
        for label, points in panel["series"].items():
            xs = sorted(points)
            if xs:
                ax.plot(xs, [points[x] for x in xs], marker="o", label=label)
        if panel.get("hline") is not None:
            y, label = panel["hline"]
            ax.axhline(y, color="gray", linestyle="--", linewidth=1, label=label)
        if panel.get("xscale", "log2") == "log2":
            ax.set_xscale("log", base=2)
            if xs_all:
                ax.set_xticks(xs_all)
                ax.set_xticklabels([f"{x:g}" for x in xs_all])
                ax.minorticks_off()
        if panel.get("yscale") == "log":
            ax.set_yscale("log")
        ax.set_xlabel(panel["xlabel"])
        ax.set_ylabel(panel["ylabel"])
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    figure.suptitle(title, fontsize="medium")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def time_and_ratio_panels(times: dict[str, dict[float, float]], reference: str, xlabel: str,
                          time_label: str = "time per call (ms)", xscale: str = "log2") -> list[dict]:
    """Two panels: every series' time against x, and each peer's time over ``reference``'s
    (above 1: the reference is faster)."""
    ratios = {}
    base = times.get(reference, {})
    for label, points in times.items():
        if label != reference:
            ratios[label] = {x: ms / base[x] for x, ms in points.items() if base.get(x)}
    panels = [{"series": times, "xlabel": xlabel, "ylabel": time_label, "xscale": xscale, "yscale": "log"}]
    values = [r for points in ratios.values() for r in points.values() if r > 0]
    if values:
        # A log axis once the ratios span more than 4x, so 0.1x and 10x read alike.
        yscale = "log" if max(values) / min(values) > 4 else "linear"
        panels.append({"series": ratios, "xlabel": xlabel,
                       "ylabel": f"peer time / {reference} time (> 1: {reference} faster)",
                       "xscale": xscale, "yscale": yscale, "hline": (1.0, f"= {reference}")})
    return panels


def write_plots(document: dict[str, Any], stem: Path) -> list[Path]:
    """One ``<stem>-<variant>.png`` per variant of a results document: time against N per
    implementation, and each peer's time over AttnFuse's. Empty without matplotlib."""
    config, meta = document["config"], document["metadata"]
    rows = [row for row in document["results"] if isinstance(row.get("ms"), (int, float))]
    if not rows:
        return []
    plt = _pyplot()
    if plt is None:
        return []
    mode = {"fwd": "forward", "fwdbwd": "forward + backward"}.get(config["mode"], config["mode"])
    shape = (f"B={config['batch']} Hq={config['heads']} Hkv={config['kv_heads']} D={config['head_dim']} "
             f"{config['dtype']}")
    written = []
    for variant in dict.fromkeys(row["variant"] for row in rows):
        times: dict[str, dict[float, float]] = {}
        for row in rows:
            if row["variant"] == variant:
                times.setdefault(row["impl"], {})[row["n"]] = row["ms"]
        title = f"{variant}, {mode}: {shape} on {meta.get('gpu') or 'CPU'}"
        path = plot_panels(stem.with_name(f"{stem.name}-{variant}.png"), title,
                           time_and_ratio_panels(times, "attnfuse", "sequence length N"), plt)
        if path:
            written.append(path)
    return written


def plot_main(argv: Sequence[str]) -> int:
    """``attnfuse-bench plot RESULTS.json ...``: the PNGs of finished runs, beside each file."""
    parser = argparse.ArgumentParser(prog="attnfuse-bench plot",
                                     description="Plot attnfuse-bench results files (needs matplotlib).")
    parser.add_argument("results", nargs="+", type=Path, help="JSON files written by attnfuse-bench")
    args = parser.parse_args(argv)
    if _pyplot() is None:
        return 2
    for path in args.results:
        for written in write_plots(json.loads(path.read_text()), path.with_suffix("")):
            print(f"wrote {written}")
    return 0


# --------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------


def _load_attnfuse_runtime() -> None:
    """Load AttnFuse's runtime before any baseline imports ``triton.language``.

    Without a GPU the runtime selects Triton's interpreter when it loads, and
    that choice only takes effect if ``triton.language`` has not been
    imported yet; ``af.compile`` loads lazily, after torch.compile (flex) has
    imported Triton, which would leave the interpreted kernels broken. A
    failure here is left for the attnfuse rows to report.
    """
    with contextlib.suppress(Exception):
        import attnfuse

        attnfuse.compile  # noqa: B018 - the attribute access is the load


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; 0 when every checked row passed, 1 on any FAIL, 2 on setup errors."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["plot"]:
        return plot_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)

    if torch.cuda.is_available():
        device = "cuda"
    elif args.allow_cpu:
        device = "cpu"
        _log("attnfuse-bench: no CUDA device; running on CPU (smoke test only, timings meaningless).")
    else:
        print("attnfuse-bench: no CUDA device available. The benchmark needs an NVIDIA GPU; "
              "pass --allow-cpu to smoke-test the harness on CPU with tiny shapes.", file=sys.stderr)
        return 2

    try:
        config = resolve_config(args, device)
    except ValueError as err:
        parser.error(str(err))  # exits with status 2

    if "attnfuse" in config.impls:
        _load_attnfuse_runtime()
    # The reference must be true float32 (no TF32 matmuls).
    torch.set_float32_matmul_precision("highest")
    configure_dynamo()

    started = _dt.datetime.now(_dt.UTC)
    metadata = collect_metadata(config, started)
    _log(f"attnfuse-bench {config.label} {config.mode} on {metadata['gpu'] or 'CPU'}: "
         f"B={config.batch} Hq={config.heads} Hkv={config.kv_heads} D={config.head_dim} "
         f"dtype={config.dtype} N={','.join(map(str, config.seq_lens))}")

    results: list[dict[str, Any]] = []
    interrupted = False
    cases = [(variant_name, n) for variant_name in config.variants for n in config.seq_lens]
    try:
        with CaseProgress(len(cases) * len(config.impls), enabled=not args.no_progress) as progress:
            for variant_name, n in cases:
                results += run_case(config, variant_name, n, args.traceback,
                                    on_impl=lambda name, v=variant_name, n=n: progress.step(f"{v} N={n} {name}"))
    except KeyboardInterrupt:
        interrupted = True
        _log("interrupted: writing partial results")

    document = {"metadata": metadata, "config": dataclasses.asdict(config), "results": results,
                "interrupted": interrupted}
    title = f"attnfuse-bench {config.label} {config.mode} ({metadata['gpu'] or 'CPU'}, {config.dtype})"
    render_table(results, title)
    json_path, md_path = write_results(document, args.out or default_out_dir(), started)
    print(f"wrote {json_path}\nwrote {md_path}")
    if not args.no_plots:
        for path in write_plots(document, json_path.with_suffix("")):
            print(f"wrote {path}")
    if interrupted:
        return 130
    return 1 if any(row["status"] == "FAIL" for row in results) else 0


if __name__ == "__main__":
    sys.exit(main())

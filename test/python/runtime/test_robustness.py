"""Robustness: bad inputs fail loudly, odd-but-valid inputs compute the right thing.

- Every bad input in `BAD` raises the exact `AttnFuseError` subclass listed, with a message
  that names the argument or block at fault *and* says what was expected and what was given
  (each case lists message fragments that must appear in that order). docs/robustness.md is
  this table in prose; keep the two in step.
- Strided and non-contiguous inputs (transposed views, slices with a step along N, a last dim
  whose stride is not 1, zero strides, storage offsets) give the reference's result, and the
  same bits as their contiguous copies.
- NaN and +-inf in the inputs land where the reference puts them.
- Empty problems (B, Nq, Nk or Hq = 0) follow the reference.
- No input (q, k, v, bias, block_layout, positions) is ever modified.

Known package bugs are pinned by `xfail(strict=True)` tests whose reason starts with "BUG:":
they fail today and turn into errors (XPASS) once the bug is fixed, so the marker gets
removed then.
"""

from __future__ import annotations

import functools
import math
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from conftest import HAS_CUDA, assert_close_to_reference, make_qkv

import attnfuse as af
from attnfuse.blocks.additive_bias import AdditiveBias
from attnfuse.blocks.block_sparse import BlockSparse
from attnfuse.blocks.relu import Relu
from attnfuse.errors import ArgumentError, AttnFuseError, CompositionError, PassOptionError

CAUSAL = af.attention(af.causal())
ROPE = af.attention(af.rope(), af.causal())
BIAS = af.attention(af.additive_bias())
SPARSE = af.attention(af.block_sparse(16))
RELU = af.attention(af.relu(), af.causal())


def T(*shape: int, dtype: torch.dtype = torch.float32, device: str = "cpu") -> torch.Tensor:
    """A seeded random tensor (values never matter for the bad-input cases)."""
    gen = torch.Generator().manual_seed(sum(shape) + len(shape))
    return torch.randn(*shape, generator=gen).to(dtype).to(device)


def QKV(b=1, hq=2, hkv=None, nq=8, nk=None, d=16, dtype=torch.float32):
    hkv = hq if hkv is None else hkv
    nk = nq if nk is None else nk
    return T(b, hq, nq, d, dtype=dtype), T(b, hkv, nk, d, dtype=dtype), T(b, hkv, nk, d, dtype=dtype)


# --------------------------------------------------------------------------------------------
# The bad-input table
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bad:
    call: Callable[[], object]
    """Makes the bad call (or builds the bad block / spec)."""
    error: type[AttnFuseError]
    """The exact exception class raised."""
    fragments: tuple[str, ...]
    """Literal pieces of the message, in order: the argument/block, what was expected, what
    was given."""
    compiles: bool = False
    """The check runs after the kernels are compiled (call-time data: bias, layout, positions,
    ALiBi slopes), so on a CUDA machine the CPU tensors need the interpreter."""

    @property
    def pattern(self) -> str:
        return ".*".join(re.escape(f) for f in self.fragments)


def _call(spec, *tensors, **kwargs):
    return lambda: spec(*tensors, **kwargs)


def _sparse_call(layout):
    # For Nq = 40, Nk = 70, bs = 16 the layout is [3, 5] or [Hq = 4, 3, 5].
    q, k, v = QKV(1, 4, 2, nq=40, nk=70)
    return lambda: SPARSE(q, k, v, block_layout=layout)


BAD: dict[str, Bad] = {
    # -- q, k, v: rank, type -----------------------------------------------------------------
    "q-rank-3": Bad(_call(CAUSAL, T(2, 8, 16), T(1, 2, 8, 16), T(1, 2, 8, 16)), ArgumentError,
                    ("q must be 4-D [batch, heads, seq, dim]", "got shape (2, 8, 16)")),
    "k-rank-5": Bad(_call(CAUSAL, T(1, 2, 8, 16), T(1, 2, 8, 16, 1), T(1, 2, 8, 16)), ArgumentError,
                    ("k must be 4-D", "got shape (1, 2, 8, 16, 1)")),
    "v-rank-2": Bad(_call(CAUSAL, T(1, 2, 8, 16), T(1, 2, 8, 16), T(8, 16)), ArgumentError,
                    ("v must be 4-D", "got shape (8, 16)")),
    "q-scalar": Bad(_call(CAUSAL, torch.tensor(1.0), T(1, 2, 8, 16), T(1, 2, 8, 16)), ArgumentError,
                    ("q must be 4-D", "got shape ()")),
    "q-list": Bad(_call(CAUSAL, T(1, 2, 8, 16).tolist(), T(1, 2, 8, 16), T(1, 2, 8, 16)), ArgumentError,
                  ("q must be a torch.Tensor", "got list")),
    "k-int": Bad(_call(CAUSAL, T(1, 2, 8, 16), 3, T(1, 2, 8, 16)), ArgumentError,
                 ("k must be a torch.Tensor", "got int")),
    "v-none": Bad(_call(CAUSAL, T(1, 2, 8, 16), T(1, 2, 8, 16), None), ArgumentError,
                  ("v must be a torch.Tensor", "got NoneType")),
    "v-numpy": Bad(_call(CAUSAL, T(1, 2, 8, 16), T(1, 2, 8, 16), T(1, 2, 8, 16).numpy()), ArgumentError,
                   ("v must be a torch.Tensor", "got ndarray")),
    # -- q, k, v: shapes against each other --------------------------------------------------
    "batch-k": Bad(_call(CAUSAL, T(2, 2, 8, 16), T(1, 2, 8, 16), T(1, 2, 8, 16)), ArgumentError,
                   ("batch sizes differ", "q 2, k 1, v 1")),
    "batch-v": Bad(_call(CAUSAL, T(2, 2, 8, 16), T(2, 2, 8, 16), T(3, 2, 8, 16)), ArgumentError,
                   ("batch sizes differ", "q 2, k 2, v 3")),
    "head-dim-q-vs-k": Bad(_call(CAUSAL, T(1, 2, 8, 16), T(1, 2, 8, 32), T(1, 2, 8, 16)), ArgumentError,
                           ("k head dim must equal q's (16)", "got 32")),
    "v-heads-vs-k": Bad(_call(CAUSAL, T(1, 2, 8, 16), T(1, 2, 8, 16), T(1, 1, 8, 16)), ArgumentError,
                        ("v must have k's 2 heads", "got 1")),
    "v-length-vs-k": Bad(_call(CAUSAL, T(1, 2, 8, 16), T(1, 2, 8, 16), T(1, 2, 9, 16)), ArgumentError,
                         ("v must have k's sequence length 8", "got 9")),
    "gqa-3-of-2": Bad(_call(CAUSAL, *QKV(1, 3, 2)), ArgumentError,
                      ("query heads (3) must be a multiple of key/value heads (2)",)),
    "gqa-kv-more-than-q": Bad(_call(CAUSAL, *QKV(1, 2, 4)), ArgumentError,
                              ("query heads (2) must be a multiple of key/value heads (4)",)),
    "gqa-kv-0": Bad(_call(CAUSAL, *QKV(1, 2, 0)), ArgumentError,
                    ("query heads (2) must be a multiple of key/value heads (0)",)),
    "head-dim-264": Bad(_call(CAUSAL, T(1, 1, 4, 264), T(1, 1, 4, 264), T(1, 1, 4, 16)), ArgumentError,
                        ("q/k head dim must be in [1, 256]", "got 264")),
    "v-head-dim-512": Bad(_call(CAUSAL, T(1, 1, 4, 16), T(1, 1, 4, 16), T(1, 1, 4, 512)), ArgumentError,
                          ("v head dim must be in [1, 256]", "got 512")),
    "head-dim-0": Bad(_call(CAUSAL, T(1, 1, 4, 0), T(1, 1, 4, 0), T(1, 1, 4, 16)), ArgumentError,
                      ("q/k head dim must be in [1, 256]", "got 0")),
    # -- dtypes and devices ------------------------------------------------------------------
    "mixed-fp32-fp16": Bad(_call(CAUSAL, T(1, 2, 8, 16), T(1, 2, 8, 16, dtype=torch.float16), T(1, 2, 8, 16)),
                           ArgumentError, ("q, k, v must share one dtype",
                                           "got torch.float32, torch.float16, torch.float32")),
    "mixed-bf16-fp16": Bad(_call(CAUSAL, *QKV(dtype=torch.bfloat16)[:2], T(1, 2, 8, 16, dtype=torch.float16)),
                           ArgumentError, ("q, k, v must share one dtype",
                                           "got torch.bfloat16, torch.bfloat16, torch.float16")),
    "int32": Bad(_call(CAUSAL, *(torch.ones(1, 2, 8, 16, dtype=torch.int32),) * 3), ArgumentError,
                 ("q has dtype torch.int32", "supported: float16, bfloat16, float32")),
    "int64-v": Bad(_call(CAUSAL, T(1, 2, 8, 16), T(1, 2, 8, 16), torch.ones(1, 2, 8, 16, dtype=torch.int64)),
                   ArgumentError, ("v has dtype torch.int64", "supported: float16, bfloat16, float32")),
    "fp64": Bad(_call(CAUSAL, *QKV(dtype=torch.float64)), ArgumentError,
                ("q has dtype torch.float64", "supported: float16, bfloat16, float32")),
    "fp64-k-only": Bad(_call(CAUSAL, T(1, 2, 8, 16), T(1, 2, 8, 16, dtype=torch.float64), T(1, 2, 8, 16)),
                       ArgumentError, ("k has dtype torch.float64", "supported")),
    "bool": Bad(_call(CAUSAL, *(torch.ones(1, 2, 8, 16, dtype=torch.bool),) * 3), ArgumentError,
                ("q has dtype torch.bool", "supported")),
    "complex64": Bad(_call(CAUSAL, *(torch.ones(1, 2, 8, 16, dtype=torch.complex64),) * 3), ArgumentError,
                     ("q has dtype torch.complex64", "supported")),
    "fp8": Bad(_call(CAUSAL, *(torch.zeros(1, 2, 8, 16).to(torch.float8_e4m3fn),) * 3), ArgumentError,
               ("q has dtype torch.float8_e4m3fn", "supported")),
    "k-on-meta": Bad(_call(CAUSAL, T(1, 2, 8, 16), T(1, 2, 8, 16, device="meta"), T(1, 2, 8, 16)),
                     ArgumentError, ("q, k, v must be on one device", "got cpu, meta, cpu")),
    "v-on-meta": Bad(_call(CAUSAL, T(1, 2, 8, 16), T(1, 2, 8, 16), T(1, 2, 8, 16, device="meta")),
                     ArgumentError, ("q, k, v must be on one device", "got cpu, cpu, meta")),
    # -- rope against the head dim (checked with the tensors) --------------------------------
    "rotary-dim-gt-d": Bad(_call(af.attention(af.rope(rotary_dim=64)), *QKV(d=32)), ArgumentError,
                           ("rope: rotary_dim 64 exceeds the head dim 32",)),
    "odd-d-with-rope": Bad(_call(ROPE, *QKV(d=33)), ArgumentError,
                           ("rope: the head dim 33 is odd", "give an even rotary_dim")),
    # -- additive_bias / bias= ---------------------------------------------------------------
    "bias-missing": Bad(_call(BIAS, *QKV()), ArgumentError,
                        ("additive_bias() needs bias= at call time", "broadcastable to [B, Hq, Nq, Nk]"),
                        compiles=True),
    "bias-wrong-shape": Bad(_call(BIAS, *QKV(), bias=T(9)), ArgumentError,
                            ("bias of shape (9,) does not broadcast to [B, Hq, Nq, Nk] = [1, 2, 8, 8]",),
                            compiles=True),
    "bias-5-dims": Bad(_call(BIAS, *QKV(), bias=T(1, 1, 2, 8, 8)), ArgumentError,
                       ("bias must have at most 4 dims", "got shape (1, 1, 2, 8, 8)"), compiles=True),
    "bias-fp64": Bad(_call(BIAS, *QKV(), bias=T(8, 8, dtype=torch.float64)), ArgumentError,
                     ("bias must be float16, bfloat16 or float32", "got torch.float64"), compiles=True),
    "bias-int": Bad(_call(BIAS, *QKV(), bias=torch.zeros(8, 8, dtype=torch.int32)), ArgumentError,
                    ("bias must be float16, bfloat16 or float32", "got torch.int32"), compiles=True),
    "bias-on-meta": Bad(_call(BIAS, *QKV(), bias=T(8, 8, device="meta")), ArgumentError,
                        ("bias is on meta", "but q is on cpu"), compiles=True),
    "bias-list": Bad(_call(BIAS, *QKV(), bias=[[0.0] * 8] * 8), ArgumentError,
                     ("bias must be a torch.Tensor", "got list"), compiles=True),
    "bias-without-additive_bias": Bad(_call(CAUSAL, *QKV(), bias=T(8, 8)), ArgumentError,
                                      ("bias= given", "attention(causal()) has no additive_bias()"),
                                      compiles=True),
    # -- block_sparse / block_layout= --------------------------------------------------------
    "layout-missing": Bad(_sparse_call(None), ArgumentError,
                          ("block_sparse(16) needs block_layout= at call time",), compiles=True),
    "layout-transposed": Bad(_sparse_call(torch.ones(5, 3, dtype=torch.bool)), ArgumentError,
                             ("block_layout must have shape [3, 5] or [4, 3, 5]", "got [5, 3]"), compiles=True),
    "layout-kv-heads": Bad(_sparse_call(torch.ones(2, 3, 5, dtype=torch.bool)), ArgumentError,
                           ("block_layout must have shape [3, 5] or [4, 3, 5]", "got [2, 3, 5]"), compiles=True),
    "layout-uint8": Bad(_sparse_call(torch.ones(3, 5, dtype=torch.uint8)), ArgumentError,
                        ("block_layout must be a bool tensor", "got torch.uint8"), compiles=True),
    "layout-float": Bad(_sparse_call(torch.ones(3, 5)), ArgumentError,
                        ("block_layout must be a bool tensor", "got torch.float32"), compiles=True),
    "layout-on-meta": Bad(_sparse_call(torch.ones(3, 5, dtype=torch.bool, device="meta")), ArgumentError,
                          ("block_layout is on meta", "but q is on cpu"), compiles=True),
    "layout-list": Bad(_sparse_call([[True] * 5] * 3), ArgumentError,
                       ("block_layout must be a torch.Tensor", "got list"), compiles=True),
    "layout-without-block_sparse": Bad(
        _call(CAUSAL, *QKV(), block_layout=torch.ones(1, 1, dtype=torch.bool)), ArgumentError,
        ("block_layout= given", "attention(causal()) has no block_sparse()"), compiles=True),
    # -- alibi slopes against the heads ------------------------------------------------------
    "alibi-slope-count": Bad(_call(af.attention(af.alibi([0.5])), *QKV(hq=2)), ArgumentError,
                             ("alibi: 1 slopes given for 2 query heads",), compiles=True),
    "alibi-slopes-per-kv-head": Bad(_call(af.attention(af.alibi([0.5, 0.25])), *QKV(hq=4, hkv=2)),
                                    ArgumentError, ("alibi: 2 slopes given for 4 query heads",), compiles=True),
    # -- sizes past CUDA's grid ---------------------------------------------------------------
    # (CPU tiles: 32 query rows per forward program; built when run, being 134 MB.)
    "grid-too-many-query-blocks": Bad(lambda: CAUSAL(*QKV(hq=1, nq=65535 * 32 + 1, nk=8)), ArgumentError,
                                      ("attention_fwd: the query sequence needs 65536 blocks of 32 rows",
                                       "more than the 65535", "at most 2097120 queries per call"),
                                      compiles=True),
    # -- RoPE positions ----------------------------------------------------------------------
    "q_positions-float": Bad(_call(ROPE, *QKV(), q_positions=torch.arange(8.0)), ArgumentError,
                             ("q_positions must be int32 or int64", "got torch.float32"), compiles=True),
    "k_positions-int16": Bad(_call(ROPE, *QKV(), k_positions=torch.arange(8, dtype=torch.int16)), ArgumentError,
                             ("k_positions must be int32 or int64", "got torch.int16"), compiles=True),
    "q_positions-length": Bad(_call(ROPE, *QKV(), q_positions=torch.arange(9)), ArgumentError,
                              ("q_positions must have shape [8] or [1, 8]", "got [9]"), compiles=True),
    "q_positions-batch": Bad(_call(ROPE, *QKV(), q_positions=torch.zeros(2, 8, dtype=torch.int64)),
                             ArgumentError, ("q_positions must have shape [8] or [1, 8]", "got [2, 8]"),
                             compiles=True),
    "q_positions-3d": Bad(_call(ROPE, *QKV(), q_positions=torch.zeros(1, 1, 8, dtype=torch.int64)),
                          ArgumentError, ("q_positions must have shape [8] or [1, 8]", "got [1, 1, 8]"),
                          compiles=True),
    "q_positions-on-meta": Bad(_call(ROPE, *QKV(), q_positions=torch.arange(8, device="meta")), ArgumentError,
                               ("q_positions is on meta", "but q is on cpu"), compiles=True),
    "k_positions-list": Bad(_call(ROPE, *QKV(), k_positions=list(range(8))), ArgumentError,
                            ("k_positions must be a torch.Tensor", "got list"), compiles=True),
    "q_positions-without-rope": Bad(_call(CAUSAL, *QKV(), q_positions=torch.arange(8)), ArgumentError,
                                    ("q_positions= given", "attention(causal()) has no rope()"), compiles=True),
    "k_positions-without-rope": Bad(_call(CAUSAL, *QKV(), k_positions=torch.arange(8)), ArgumentError,
                                    ("k_positions= given", "attention(causal()) has no rope()"), compiles=True),
    # -- keywords and options ----------------------------------------------------------------
    "unexpected-keyword": Bad(_call(CAUSAL, *QKV(), is_causal=True), ArgumentError,
                              ("unexpected argument(s) is_causal", "attention(causal())")),
    "unexpected-keywords-2": Bad(_call(CAUSAL, *QKV(), scale=0.5, dropout_p=0.1), ArgumentError,
                                 ("unexpected argument(s) dropout_p, scale",)),
    "return_lse-with-relu": Bad(_call(RELU, *QKV(), return_lse=True), ArgumentError,
                                ("return_lse=True needs softmax()", "relu() attention has no log-sum-exp")),
    "rope_placement-unknown": Bad(lambda: af.compile(ROPE, rope_placement="fuse")(*QKV()), ArgumentError,
                                  ("rope_placement must be one of fused, pre_rotated, q_fused, auto",
                                   "got 'fuse'")),
    "rope_placement-bad-key": Bad(lambda: af.compile(ROPE, rope_placement=("fused", "bogus"))(*QKV()),
                                  ArgumentError, ("rope_placement key must be auto, fused, pre_rotated or given",
                                                  "got 'bogus'")),
    "rope_placement-given-query": Bad(lambda: af.compile(ROPE, rope_placement=("given", "given")),
                                      ArgumentError, ("rope_placement query cannot be 'given'",
                                                      "only keys arrive rotated", "give auto, fused or pre_rotated")),
    "k_positions-with-given-key": Bad(lambda: af.compile(ROPE, rope_placement=("auto", "given"))(
                                          *QKV(), k_positions=torch.arange(8)), ArgumentError,
                                      ("k_positions= has no effect with a given key rotation",
                                       "the keys arrive rotated", "fn.rotate_keys(k, k_positions=...)")),
    "rotate_keys-without-rope": Bad(lambda: af.compile(CAUSAL).rotate_keys(QKV()[1]), ArgumentError,
                                    ("rotate_keys: attention(causal()) has no rope()",)),
    "rope_placement-triple": Bad(lambda: af.compile(ROPE, rope_placement=("fused",) * 3)(*QKV()),
                                 ArgumentError, ("rope_placement must be one of", "(query, key) pair",
                                                 "got ('fused', 'fused', 'fused')")),
    "compile-non-spec": Bad(lambda: af.compile(af.causal()), AttnFuseError,
                            ("compile() takes a spec made by af.attention(...)", "got causal()")),
    "config-block-m-24": Bad(lambda: af.compile(CAUSAL, config=af.TileConfig(24, 32, 4, 1))(*QKV()),
                             PassOptionError, ("lower-to-tile: block-m must be a power of two in [16, 1024]", "got 24")),
    "config-num-warps-3": Bad(lambda: af.compile(CAUSAL, config=af.TileConfig(32, 32, 3, 1))(*QKV()),
                              PassOptionError, ("lower-to-tile: num-warps must be one of 1, 2, 4, 8, 16", "got 3")),
    # -- block parameters (raised when the block is made) ------------------------------------
    "window-0": Bad(lambda: af.sliding_window(0), CompositionError,
                    ("sliding_window: window must be a positive int", "got 0")),
    "window-negative": Bad(lambda: af.sliding_window(-3), CompositionError,
                           ("sliding_window: window must be a positive int", "got -3")),
    "window-float": Bad(lambda: af.sliding_window(4.0), CompositionError,
                        ("sliding_window: window must be a positive int", "got 4.0")),
    "block-size-24": Bad(lambda: af.block_sparse(24), CompositionError,
                         ("block_sparse: block_size must be a power of two in [16, 2^30]", "got 24")),
    "block-size-8": Bad(lambda: af.block_sparse(8), CompositionError,
                        ("block_sparse: block_size must be a power of two in [16, 2^30]", "got 8")),
    "rotary-dim-odd": Bad(lambda: af.rope(rotary_dim=7), CompositionError,
                          ("rope: rotary_dim must be positive, even and below 2^31", "got 7")),
    "rotary-dim-0": Bad(lambda: af.rope(rotary_dim=0), CompositionError,
                        ("rope: rotary_dim must be positive, even and below 2^31", "got 0")),
    "rotary-dim-float": Bad(lambda: af.rope(rotary_dim=16.0), CompositionError,
                            ("rope: rotary_dim must be an int", "got 16.0")),
    "rotary-dim-str": Bad(lambda: af.rope(rotary_dim="16"), CompositionError,
                          ("rope: rotary_dim must be an int", "got '16'")),
    "theta-1": Bad(lambda: af.rope(theta=1.0), CompositionError,
                   ("rope: theta must be a finite number > 1", "got 1.0")),
    "theta-0.5": Bad(lambda: af.rope(theta=0.5), CompositionError,
                     ("rope: theta must be a finite number > 1", "got 0.5")),
    "theta-nan": Bad(lambda: af.rope(theta=math.nan), CompositionError,
                     ("rope: theta must be a finite number > 1", "got nan")),
    "interleaved-int": Bad(lambda: af.rope(interleaved=1), CompositionError,
                           ("rope: interleaved must be a bool", "got 1")),
    "scale-0": Bad(lambda: af.scaled_dot_product(0), CompositionError,
                   ("scaled_dot_product: scale must be a positive finite number", "got 0")),
    "scale-negative": Bad(lambda: af.scaled_dot_product(-0.5), CompositionError,
                          ("scaled_dot_product: scale must be a positive finite number", "got -0.5")),
    "scale-nan": Bad(lambda: af.scaled_dot_product(math.nan), CompositionError,
                     ("scaled_dot_product: scale must be a positive finite number", "got nan")),
    "scale-inf": Bad(lambda: af.scaled_dot_product(math.inf), CompositionError,
                     ("scaled_dot_product: scale must be a positive finite number", "got inf")),
    # 0 in fp32: folded into the softmax's exponent it would turn masked scores into NaN.
    "scale-below-fp32": Bad(lambda: af.scaled_dot_product(1e-46), CompositionError,
                            ("scaled_dot_product: scale must lie in [1.18e-38, 2.36e+38]", "got 1e-46")),
    "scale-above-fp32": Bad(lambda: af.scaled_dot_product(3e38), CompositionError,
                            ("scaled_dot_product: scale must lie in [1.18e-38, 2.36e+38]", "got 3e+38")),
    "alibi-empty": Bad(lambda: af.alibi([]), CompositionError,
                       ("alibi: slopes must be a non-empty list of finite numbers", "got []")),
    "alibi-nan": Bad(lambda: af.alibi([0.5, math.nan]), CompositionError,
                     ("alibi: slopes must be a non-empty list of finite numbers", "got [0.5, nan]")),
    "alibi-str": Bad(lambda: af.alibi(["x"]), CompositionError,
                     ("alibi: slopes must be a sequence of numbers (int or float)", "got ['x']")),
    "alibi-set": Bad(lambda: af.alibi({0.5, 0.25}), CompositionError,
                     ("alibi: slopes must be an ordered sequence, one per head", "got a set")),
    "alibi-dict": Bad(lambda: af.alibi({0.5: 1, 0.25: 2}), CompositionError,
                      ("alibi: slopes must be an ordered sequence, one per head", "got a dict")),
    "alibi-bool": Bad(lambda: af.alibi([True, False]), CompositionError,
                      ("alibi: slopes must be numbers, not bools", "got [True, False]")),
    "alibi-torch-bool": Bad(lambda: af.alibi(torch.tensor([True, False])), CompositionError,
                            ("alibi: slopes must be numbers, not bools", "got tensor([ True, False])")),
    "llama3-high-le-low": Bad(lambda: af.llama3_scaling(high_freq_factor=1.0, low_freq_factor=2.0),
                              CompositionError, ("llama3_scaling: high_freq_factor must exceed low_freq_factor",
                                                 "got 1.0 <= 2.0")),
    # -- composition -------------------------------------------------------------------------
    "repeated-block": Bad(lambda: af.attention(af.causal(), af.rope(), af.causal()), CompositionError,
                          ("causal appears 2 times", "each block may appear once")),
    "two-normalizers": Bad(lambda: af.attention(af.relu(), af.softmax()), CompositionError,
                           ("a variant has one normalizer", "got relu and softmax")),
    "full-with-mask": Bad(lambda: af.attention(af.full(), af.sliding_window(4)), CompositionError,
                          ("full() keeps every key and cannot be combined with sliding_window",)),
    "not-a-block": Bad(lambda: af.attention(af.causal(), "rope"), CompositionError,
                       ("attention() takes building blocks such as af.causal()", "got 'rope'")),
    "uncalled-block": Bad(lambda: af.attention(af.causal), CompositionError,
                          ("attention() takes building blocks",)),
}


def _params():
    for name, case in BAD.items():
        marks = [pytest.mark.interpreter] if case.compiles else []
        yield pytest.param(name, id=name, marks=marks)


@pytest.mark.parametrize("name", list(_params()))
def test_bad_input(name):
    """The exact error class; a message naming the argument, the expected and the given."""
    case = BAD[name]
    with pytest.raises(AttnFuseError, match=case.pattern) as info:
        case.call()
    assert type(info.value) is case.error, f"{type(info.value).__name__}: {info.value}"
    assert isinstance(info.value, ValueError)  # AttnFuseError subclasses ValueError


def test_the_table_has_at_least_30_distinct_bad_inputs():
    assert len(BAD) >= 30
    # Distinct: no two cases expect the same message.
    patterns = [case.pattern for case in BAD.values()]
    assert len(set(patterns)) == len(patterns)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device for a real cpu/cuda mix (meta covers it without)")
def test_cpu_and_cuda_tensors_mixed():
    q, k, v = QKV()
    with pytest.raises(ArgumentError, match=r"q, k, v must be on one device, got cpu, cuda:0, cpu"):
        CAUSAL(q, k.cuda(), v)


@pytest.mark.interpreter
def test_bad_call_time_data_does_not_poison_the_next_call():
    """A rejected call leaves the compiled function usable: the next good call is right."""
    fn = af.compile(af.attention(af.additive_bias(), af.alibi(), af.causal()))
    q, k, v = make_qkv(1, 2, nq=12, d=16, seed=3)
    with pytest.raises(ArgumentError, match="bias"):
        fn(q, k, v, bias=torch.zeros(13, 12))
    with pytest.raises(ArgumentError, match="bias"):
        fn(q, k, v)
    bias = torch.randn(12, 12, generator=torch.Generator().manual_seed(4))
    ref = af.reference_attention(fn.spec, q, k, v, bias=bias)
    assert_close_to_reference(fn(q, k, v, bias=bias), ref, torch.float32)


# --------------------------------------------------------------------------------------------
# Package bugs found by this suite (xfail strict: they fail today)
# --------------------------------------------------------------------------------------------


def test_all_inputs_on_meta():
    q, k, v = (t.to("meta") for t in QKV())
    with pytest.raises(ArgumentError, match="meta"):
        CAUSAL(q, k, v)


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda t: t.to_sparse(), id="sparse-coo"),
        pytest.param(lambda t: torch.nested.nested_tensor(list(t)), id="nested"),
    ],
)
def test_non_dense_q(make):
    q, k, v = QKV()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's 'nested tensors are in prototype' warning
        bad_q = make(q)
    with pytest.raises(ArgumentError, match=r"\bq\b"):
        CAUSAL(bad_q, k, v)


def test_config_not_a_tile_config():
    with pytest.raises(AttnFuseError, match="config"):
        af.compile(CAUSAL, config="fast")(*QKV())


def test_bad_rope_placement_without_rope():
    with pytest.raises(ArgumentError, match="rope_placement"):
        af.compile(CAUSAL, rope_placement="bogus")(*QKV())


def test_bool_scale():
    with pytest.raises(CompositionError, match="scaled_dot_product"):
        af.scaled_dot_product(True)


@pytest.mark.interpreter
def test_alibi_slope_count_checked_on_empty_problems():
    q, k, v = QKV(b=0, hq=2)
    with pytest.raises(ArgumentError, match="alibi: 1 slopes given for 2 query heads"):
        af.attention(af.alibi([0.5]))(q, k, v)


@pytest.mark.interpreter
def test_int32_min_position():
    q, k, v = make_qkv(1, 2, nq=8, d=16, seed=5)
    pos = torch.full((8,), -(2**31), dtype=torch.int32)
    try:
        out = ROPE(q, k, v, q_positions=pos)
    except AttnFuseError:
        return  # rejecting the position is a fine fix too
    ref = af.reference_attention(ROPE, q, k, v, q_positions=pos)
    assert_close_to_reference(out, ref, torch.float32)


@pytest.mark.interpreter
def test_huge_position():
    q, k, v = make_qkv(1, 2, nq=8, d=16, seed=6)
    with pytest.raises(ArgumentError, match="q_positions"):
        ROPE(q, k, v, q_positions=torch.full((8,), 2**62))


@pytest.mark.interpreter
def test_int64_min_position_is_refused():
    """|-2**63| overflows int64: the bound is checked in Python ints (it was read as 0)."""
    q, k, v = make_qkv(1, 2, nq=8, d=16, seed=6)
    positions = torch.zeros(8, dtype=torch.int64)
    positions[3] = -(2**63)
    with pytest.raises(ArgumentError, match=r"q_positions must lie in .*got \|position\| = 9223372036854775808"):
        ROPE(q, k, v, q_positions=positions)
    with pytest.raises(ArgumentError, match="k_positions must lie in"):
        af.compile(ROPE).rotate_keys(k, k_positions=positions)


# --------------------------------------------------------------------------------------------
# Strided and non-contiguous inputs
# --------------------------------------------------------------------------------------------


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _views(name: str, dtype: torch.dtype):
    """(q, k, v) views of one kind; each [B, H, N, D] with D = Dv = 16 (q) and Nq = Nk."""
    g = _gen(VIEWS.index(name))

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(dtype)

    if name == "transposed":  # [B, N, H, D] storage, as a model's projections give
        return tuple(rnd(2, 24, 2, 16).transpose(1, 2) for _ in range(3))
    if name == "seq-step-2":  # every other row of a longer sequence
        return tuple(rnd(1, 2, 48, 16)[:, :, ::2] for _ in range(3))
    if name == "seq-step-3-offset":  # step 3 starting at row 1, and a head slice
        return tuple(rnd(1, 4, 73, 16)[:, 1:3, 1::3] for _ in range(3))
    if name == "last-dim-stride":  # [B, H, D, N] storage seen as [B, H, N, D]: stride(-1) = N
        return tuple(rnd(1, 2, 16, 24).transpose(-1, -2) for _ in range(3))
    if name == "last-dim-stride-2":  # every other column of a wider head: stride(-1) = 2
        return tuple(rnd(1, 2, 24, 32)[..., ::2] for _ in range(3))
    if name == "k-only-last-dim-stride":
        q, v = rnd(1, 2, 24, 16), rnd(1, 2, 24, 16)
        return q, rnd(1, 2, 16, 24).transpose(-1, -2), v
    if name == "permuted":  # [D, B, N, H] storage
        return tuple(rnd(16, 1, 24, 2).permute(1, 3, 2, 0) for _ in range(3))
    if name == "kv-seq-stride-0":  # one key/value row repeated along N (stride 0)
        return rnd(1, 2, 24, 16), rnd(1, 2, 1, 16).expand(1, 2, 24, 16), rnd(1, 2, 1, 16).expand(1, 2, 24, 16)
    if name == "batch-stride-0":
        return tuple(rnd(1, 2, 24, 16).expand(3, 2, 24, 16) for _ in range(3))
    if name == "storage-offset":
        flat = rnd(3 * 1000)
        return tuple(flat[1000 * i + 7 + i: 1000 * i + 7 + i + 768].view(1, 2, 24, 16) for i in range(3))
    raise AssertionError(name)


def assert_dense_in_order_of(out: torch.Tensor, like: torch.Tensor) -> None:
    """`out` is a dense tensor (no gaps, no overlaps) whose dims of size above 1 lie in memory
    in the order of `like`'s (an expanded dim of `like` anywhere), innermost last; contiguous where `like`'s last dim is not
    innermost (the runtime's rule for what it allocates: outputs, gradients, copies)."""
    if like.stride(-1) != 1:
        assert out.is_contiguous(), out.stride()
        return
    dims = [d for d in range(out.dim()) if out.shape[d] > 1]
    ordered = [d for d in dims if like.stride(d) != 0]  # an expanded dim may lie anywhere
    assert sorted(ordered, key=out.stride, reverse=True) == sorted(ordered, key=like.stride, reverse=True), \
        (out.stride(), like.stride())
    # Dense: the strides of that order are the running products of the sizes.
    expected = 1
    for d in sorted(dims, key=out.stride):
        assert out.stride(d) == expected, (out.stride(), out.shape)
        expected *= out.shape[d]


VIEWS = ["transposed", "seq-step-2", "seq-step-3-offset", "last-dim-stride", "last-dim-stride-2",
         "k-only-last-dim-stride", "permuted", "kv-seq-stride-0", "batch-stride-0", "storage-offset"]

STRIDED_SPECS = {
    "rope+causal-fused": (lambda: af.attention(af.rope(), af.causal()), "fused"),
    "rope+causal-pre_rotated": (lambda: af.attention(af.rope(), af.causal()), "pre_rotated"),
    "rope-partial-interleaved": (lambda: af.attention(af.rope(rotary_dim=8, interleaved=True)), "q_fused"),
    "window+alibi": (lambda: af.attention(af.sliding_window(5), af.alibi()), "auto"),
    "relu+causal": (lambda: af.attention(af.relu(), af.causal()), "auto"),
}


def _run(fn, spec, q, k, v, **data):
    if spec.block(Relu) is not None:
        return fn(q, k, v, **data), None
    return fn(q, k, v, return_lse=True, **data)


@pytest.mark.interpreter
@pytest.mark.parametrize("spec_name", list(STRIDED_SPECS))
@pytest.mark.parametrize("view", VIEWS)
def test_strided_inputs_match_reference_and_contiguous(view, spec_name):
    make, placement = STRIDED_SPECS[spec_name]
    spec = make()
    q, k, v = _views(view, torch.float32)
    if view not in ("batch-stride-0", "storage-offset"):
        assert not all(t.is_contiguous() for t in (q, k, v)), view
    fn = af.compile(spec, rope_placement=placement)
    out, lse = _run(fn, spec, q, k, v)
    ref = af.reference_attention(spec, q, k, v)
    assert_close_to_reference(out, ref, torch.float32)
    assert out.shape == (q.shape[0], q.shape[1], q.shape[2], v.shape[3])
    assert_dense_in_order_of(out, q)
    # The same bits as the contiguous copies: strides change addressing, nothing else.
    out_c, lse_c = _run(fn, spec, q.contiguous(), k.contiguous(), v.contiguous())
    assert torch.equal(out, out_c)
    if lse is not None:
        assert torch.equal(lse, lse_c)


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("view", ["transposed", "seq-step-3-offset", "last-dim-stride"])
def test_strided_half_inputs(view, dtype):
    spec = af.attention(af.rope(), af.causal())
    q, k, v = _views(view, dtype)
    out = spec(q, k, v)
    assert_close_to_reference(out, af.reference_attention(spec, q, k, v), dtype)
    assert torch.equal(out, spec(q.contiguous(), k.contiguous(), v.contiguous()))


@pytest.mark.interpreter
def test_strides_change_between_calls_of_one_shape():
    """The plan is cached per shape; strides are read per call, so a contiguous call, then a
    transposed view, then a stepped slice of the same shape are each right."""
    spec = af.attention(af.rope(), af.causal(), af.alibi())
    fn = af.compile(spec)
    for view in ("batch-stride-0", "transposed", "seq-step-2", "last-dim-stride"):
        q, k, v = _views(view, torch.float32)
        q, k, v = (t[:1, :2, :24, :16] for t in (q, k, v))
        assert q.shape == (1, 2, 24, 16)
        assert_close_to_reference(fn(q, k, v), af.reference_attention(spec, q, k, v), torch.float32)


@pytest.mark.interpreter
def test_strided_call_time_data():
    """A bias sliced with a step along Nk and stride(-1) != 1, a transposed (non-contiguous)
    per-head layout and stepped positions are read in place."""
    spec = af.attention(af.rope(), af.additive_bias(), af.block_sparse(16))
    q, k, v = make_qkv(1, 2, nq=40, nk=40, d=16, seed=7, strided=True)
    g = _gen(8)
    bias = torch.randn(1, 2, 80, 40, generator=g).transpose(-1, -2)[..., ::2]  # [1, 2, 40, 40]
    assert bias.stride(-1) != 1 and not bias.is_contiguous()
    layout = (torch.rand(2, 3, 3, generator=g) < 0.7).transpose(-1, -2)  # [Hq, 3, 3], transposed
    layout[:, 0, 0] = True
    assert not layout.is_contiguous()
    q_positions = torch.arange(0, 160, 2)[::2]  # [40], stride 2
    k_positions = torch.arange(40, dtype=torch.int32).flip(0)  # a reversed copy
    data = dict(bias=bias, block_layout=layout, q_positions=q_positions, k_positions=k_positions)
    out, lse = spec(q, k, v, return_lse=True, **data)
    ref, ref_lse = af.reference_attention(spec, q, k, v, return_lse=True, **data)
    assert_close_to_reference(out, ref, torch.float32)
    contiguous = {name: t.contiguous() for name, t in data.items()}
    assert torch.equal(out, af.compile(spec)(q, k, v, **contiguous))


# --------------------------------------------------------------------------------------------
# NaN and inf propagate as in the reference (small shapes: one 32 x 32 tile)
# --------------------------------------------------------------------------------------------


def assert_nonfinite_like_reference(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype):
    """NaN, +inf and -inf at the same positions; the finite entries within tolerance."""
    out, ref = out.detach().double(), ref.detach().double()
    assert torch.equal(torch.isnan(out), torch.isnan(ref)), (
        f"NaN at {torch.isnan(out).sum().item()} entries, the reference at {torch.isnan(ref).sum().item()}: "
        f"out rows {torch.isnan(out).any(-1).nonzero().tolist()}, "
        f"reference rows {torch.isnan(ref).any(-1).nonzero().tolist()}"
    )
    assert torch.equal(torch.isposinf(out), torch.isposinf(ref))
    assert torch.equal(torch.isneginf(out), torch.isneginf(ref))
    finite = torch.isfinite(ref)
    err = (out[finite] - ref[finite]).abs()
    if err.numel():
        limit = 1e-4 if dtype == torch.float32 else 2e-2 * max(1.0, ref[finite].abs().max().item())
        assert err.max().item() <= limit


NONFINITE_SPECS = {
    "full": lambda: af.attention(),
    "causal": lambda: af.attention(af.causal()),
    "rope+causal": lambda: af.attention(af.rope(), af.causal()),
    "window+alibi": lambda: af.attention(af.sliding_window(4), af.alibi()),
    "relu+causal": lambda: af.attention(af.relu(), af.causal()),
}
VALUES = {"nan": math.nan, "+inf": math.inf, "-inf": -math.inf}


def _poisoned(where: str, value: float, dtype: torch.dtype, n: int = 12):
    q, k, v = make_qkv(1, 2, nq=n, d=16, dtype=dtype, seed=9)
    {"q": q, "k": k, "v": v}[where][0, 1, 7, 3] = value
    return q, k, v


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("value", list(VALUES))
@pytest.mark.parametrize("spec_name", list(NONFINITE_SPECS))
def test_nonfinite_v_propagates_like_reference(spec_name, value, dtype):
    spec = NONFINITE_SPECS[spec_name]()
    q, k, v = _poisoned("v", VALUES[value], dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy's 'invalid value' in the interpreter
        out = spec(q, k, v)
    ref = af.reference_attention(spec, q, k, v)
    assert_nonfinite_like_reference(out, ref, dtype)
    assert not torch.isnan(out[:, 0]).any(), "a NaN leaked into another head"


@pytest.mark.interpreter
@pytest.mark.parametrize("where", ["q", "k"])
@pytest.mark.parametrize("value", ["+inf", "-inf"])
def test_inf_q_k_under_relu_like_reference(where, value):
    spec = NONFINITE_SPECS["relu+causal"]()
    q, k, v = _poisoned(where, VALUES[value], torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        out = spec(q, k, v)
    assert_nonfinite_like_reference(out, af.reference_attention(spec, q, k, v), torch.float32)


@pytest.mark.interpreter
def test_minus_inf_bias_like_reference():
    spec = af.attention(af.additive_bias(), af.causal())
    q, k, v = make_qkv(1, 2, nq=12, d=16, seed=10)
    bias = torch.zeros(12, 12)
    bias[4, :3] = -math.inf  # drops keys 0..2 of row 4
    bias[2, :] = -math.inf  # drops every key of row 2: exactly 0, lse -inf
    out, lse = spec(q, k, v, bias=bias, return_lse=True)
    ref, ref_lse = af.reference_attention(spec, q, k, v, bias=bias, return_lse=True)
    assert_nonfinite_like_reference(out, ref, torch.float32)
    assert (out[:, :, 2] == 0).all() and torch.isneginf(lse[:, :, 2]).all()
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("value", list(VALUES))
@pytest.mark.parametrize("where", ["q", "k"])
@pytest.mark.parametrize("spec_name", ["full", "causal", "rope+causal", "window+alibi"])
def test_nonfinite_q_k_under_softmax_propagate_like_reference(spec_name, where, value, dtype):
    spec = NONFINITE_SPECS[spec_name]()
    q, k, v = _poisoned(where, VALUES[value], dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        out = spec(q, k, v)
    ref = af.reference_attention(spec, q, k, v)
    assert_nonfinite_like_reference(out, ref, dtype)


@pytest.mark.interpreter
@pytest.mark.parametrize("value", ["nan", "+inf"])
def test_nonfinite_bias_propagates_like_reference(value):
    spec = af.attention(af.additive_bias())
    q, k, v = make_qkv(1, 2, nq=12, d=16, seed=11)
    bias = torch.zeros(12, 12)
    bias[4, 7] = VALUES[value]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        out = spec(q, k, v, bias=bias)
    assert_nonfinite_like_reference(out, af.reference_attention(spec, q, k, v, bias=bias), torch.float32)


@pytest.mark.interpreter
@pytest.mark.parametrize("where", ["q", "k"])
def test_nan_q_k_under_relu_propagates(where):
    spec = NONFINITE_SPECS["relu+causal"]()
    q, k, v = _poisoned(where, math.nan, torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        out = spec(q, k, v)
    assert_nonfinite_like_reference(out, af.reference_attention(spec, q, k, v), torch.float32)


@pytest.mark.interpreter
def test_nan_row_lse_is_nan():
    spec = af.attention(af.causal())
    q, k, v = _poisoned("q", math.nan, torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        out, lse = spec(q, k, v, return_lse=True)
    _, ref_lse = af.reference_attention(spec, q, k, v, return_lse=True)
    assert torch.isnan(out[0, 1, 7]).all()
    assert torch.equal(torch.isnan(lse), torch.isnan(ref_lse))


@pytest.mark.interpreter
@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="BUG (tiling-dependent NaN): a NaN in v at a key that a row drops still reaches "
                          "that row through 0 * NaN in p @ v. The reference multiplies the whole dense "
                          "matrix (every row NaN); the kernel only visits the tiles the mask keeps "
                          "(rows 64.. here), so which rows are NaN depends on block_m/block_n. The "
                          "semantics should say a dropped key contributes nothing, and both follow")
def test_nan_v_at_a_dropped_key_beyond_one_tile():
    spec = af.attention(af.causal())
    q, k, v = make_qkv(1, 1, nq=100, d=16, seed=12)
    v[0, 0, 90, 3] = math.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        out = spec(q, k, v)
    assert_nonfinite_like_reference(out, af.reference_attention(spec, q, k, v), torch.float32)


# --------------------------------------------------------------------------------------------
# Empty tensors follow the reference
# --------------------------------------------------------------------------------------------

EMPTY_SHAPES = {  # (B, Hq, Hkv, Nq, Nk)
    "B=0": (0, 2, 2, 8, 8),
    "Nq=0": (1, 2, 1, 0, 9),
    "Nk=0": (2, 4, 2, 7, 0),
    "Hq=0": (1, 0, 1, 8, 8),
    "Nq=Nk=0": (1, 2, 2, 0, 0),
    "all=0": (0, 0, 1, 0, 0),
}
EMPTY_SPECS = {
    "none": lambda: af.attention(),
    "causal": lambda: af.attention(af.causal()),
    "rope": lambda: af.attention(af.rope(rotary_dim=8)),
    "window+alibi-default": lambda: af.attention(af.sliding_window(3), af.alibi()),
    "relu": lambda: af.attention(af.relu(), af.causal()),
    "bias": lambda: af.attention(af.additive_bias()),
    "block_sparse": lambda: af.attention(af.block_sparse(16), af.causal()),
}


def _empty_data(spec, hq, nq, nk):
    data = {}
    if spec.block(AdditiveBias) is not None:
        data["bias"] = torch.zeros(nq, nk)
    if spec.block(BlockSparse) is not None:
        data["block_layout"] = torch.ones(-(-nq // 16), -(-nk // 16), dtype=torch.bool)
    return data


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("spec_name", list(EMPTY_SPECS))
@pytest.mark.parametrize("shape", list(EMPTY_SHAPES))
def test_empty_tensors_follow_the_reference(shape, spec_name, dtype):
    b, hq, hkv, nq, nk = EMPTY_SHAPES[shape]
    spec = EMPTY_SPECS[spec_name]()
    q, k, v = make_qkv(b, hq, hkv, nq=nq, nk=nk, d=16, dv=8, dtype=dtype)
    data = _empty_data(spec, hq, nq, nk)
    if spec.block(Relu) is not None:
        out, lse = spec(q, k, v, **data), None
        ref, ref_lse = af.reference_attention(spec, q, k, v, **data), None
    else:
        out, lse = spec(q, k, v, return_lse=True, **data)
        ref, ref_lse = af.reference_attention(spec, q, k, v, return_lse=True, **data)
    assert out.shape == ref.shape == (b, hq, nq, 8)
    assert out.dtype == dtype
    assert torch.equal(out.double(), ref), "an empty problem's output differs from the reference"
    assert (out == 0).all()
    if lse is not None:
        assert lse.shape == ref_lse.shape == (b, hq, nq) and lse.dtype == torch.float32
        assert torch.equal(lse, ref_lse) and torch.isneginf(lse).all()


def test_reference_alibi_no_heads():
    q, k, v = make_qkv(1, 0, 1, nq=8, d=16)
    ref = af.reference_attention(af.attention(af.alibi()), q, k, v)
    assert ref.shape == (1, 0, 8, 16)


def test_zero_heads_for_both_q_and_kv_is_rejected():
    """Hq = Hkv = 0 is not an empty problem but an undefined group size."""
    q, k, v = make_qkv(1, 0, 0, nq=8, d=16)
    with pytest.raises(ArgumentError, match=r"query heads \(0\) must be a multiple of key/value heads \(0\)"):
        CAUSAL(q, k, v)


@pytest.mark.parametrize("shape", ["B=0", "Nq=0", "Nk=0"])
def test_empty_problems_still_check_their_data(shape):
    b, hq, hkv, nq, nk = EMPTY_SHAPES[shape]
    q, k, v = make_qkv(b, hq, hkv, nq=nq, nk=nk, d=16)
    with pytest.raises(ArgumentError, match="q, k, v must share one dtype"):
        CAUSAL(q, k.half(), v)
    with pytest.raises(ArgumentError, match="bias of shape"):
        BIAS(q, k, v, bias=torch.zeros(nq + 1, nk + 1))
    with pytest.raises(ArgumentError, match="block_layout must have shape"):
        SPARSE(q, k, v, block_layout=torch.ones(5, 5, dtype=torch.bool))
    with pytest.raises(ArgumentError, match="q_positions must have shape"):
        ROPE(q, k, v, q_positions=torch.arange(nq + 1))


# --------------------------------------------------------------------------------------------
# Inputs are never modified
# --------------------------------------------------------------------------------------------

UNMODIFIED_CASES = {
    "rope-fused": (lambda: af.attention(af.rope(), af.causal()), "fused", ()),
    "rope-pre_rotated": (lambda: af.attention(af.rope(), af.causal()), "pre_rotated", ()),
    "rope-q_fused-positions": (lambda: af.attention(af.rope(rotary_dim=8)), "q_fused", ("positions",)),
    "alibi+bias+block_sparse": (
        lambda: af.attention(af.alibi(), af.additive_bias(), af.block_sparse(16)), "auto", ("bias", "layout")),
    "relu+window": (lambda: af.attention(af.relu(), af.sliding_window(5)), "auto", ()),
}


@pytest.mark.interpreter
@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
@pytest.mark.parametrize("case", list(UNMODIFIED_CASES))
def test_inputs_are_never_modified(case, strided):
    make, placement, extra = UNMODIFIED_CASES[case]
    spec = make()
    q, k, v = make_qkv(2, 4, 2, nq=20, nk=36, d=16, seed=13, strided=strided)
    data = {}
    if "bias" in extra:
        data["bias"] = torch.randn(4, 1, 36, generator=_gen(14))
    if "layout" in extra:
        data["block_layout"] = torch.rand(4, 2, 3, generator=_gen(15)) < 0.6
    if "positions" in extra:
        data["q_positions"] = torch.arange(20) * 3
        data["k_positions"] = torch.arange(36, dtype=torch.int32)[None].repeat(2, 1)
    tensors = {"q": q, "k": k, "v": v, **data}
    before = {name: (t.clone(), t._version, t.stride(), t.data_ptr()) for name, t in tensors.items()}
    fn = af.compile(spec, rope_placement=placement)
    for _ in range(2):  # the second call reuses the plan (and the block lists)
        if spec.block(Relu) is None:
            fn(q, k, v, return_lse=True, **data)
        else:
            fn(q, k, v, **data)
    for name, t in tensors.items():
        copy, version, stride, ptr = before[name]
        assert torch.equal(t, copy), f"{name} was modified"
        assert t._version == version, f"{name} was written in place (version counter moved)"
        assert t.stride() == stride and t.data_ptr() == ptr


@pytest.mark.interpreter
def test_output_does_not_alias_inputs():
    spec = af.attention(af.rope(), af.causal())
    q, k, v = make_qkv(1, 2, nq=16, d=16, seed=16)
    out = af.compile(spec, rope_placement="pre_rotated")(q, k, v)
    for t in (q, k, v):
        assert out.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()


SPARSE_DATA_CASES = {
    # name: (spec, keyword arguments of the call, whose `name` entry is made sparse; decode?)
    "doc_ids": (lambda: af.attention(af.document()), {"doc_ids": torch.zeros(2, 32, dtype=torch.int64)}),
    "block_layout": (lambda: af.attention(af.block_sparse(16)), {"block_layout": torch.ones(2, 2, dtype=torch.bool)}),
    "q_positions": (lambda: af.attention(af.rope()), {"q_positions": torch.arange(32)}),
    "bias": (lambda: af.attention(af.additive_bias()), {"bias": torch.zeros(32, 32)}),
    "kv_lens": (lambda: af.attention(af.causal()), {"kv_lens": torch.tensor([5, 32], dtype=torch.int32)}),
    "block_table": (lambda: af.attention(af.causal()),
                    {"kv_lens": torch.tensor([5, 16], dtype=torch.int32),
                     "block_table": torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)}),
}


def _nested(t: torch.Tensor) -> torch.Tensor:
    return torch.nested.nested_tensor(list(t.reshape(-1, t.shape[-1]) if t.dim() > 1 else [t]))


@pytest.mark.interpreter
@pytest.mark.parametrize("api", ["compiled", "reference"])
@pytest.mark.parametrize("kind", ["sparse", "nested"])
@pytest.mark.parametrize("name", list(SPARSE_DATA_CASES))
def test_sparse_call_time_data_is_refused_by_name(name, kind, api):
    """A call-time tensor in a sparse layout, or a nested one (no strides for a kernel to
    read), is an `ArgumentError` naming it, in the compiled call and the reference alike,
    never a raw torch error from deep inside."""
    make, data = SPARSE_DATA_CASES[name]
    data = {**data, name: data[name].to_sparse() if kind == "sparse" else _nested(data[name])}
    g = _gen(99)
    if "kv_lens" in data:  # a decode call over a cache: contiguous, or pools of 8-key pages
        keys = (4, 2, 8, 16) if "block_table" in data else (2, 2, 32, 16)
        q, k, v = torch.randn(2, 4, 1, 16, generator=g), torch.randn(*keys, generator=g), torch.randn(*keys, generator=g)
    else:
        q, k, v = (torch.randn(2, h, 32, 16, generator=g) for h in (4, 2, 2))
    spec = make()
    call = af.compile(spec) if api == "compiled" else functools.partial(af.reference_attention, spec)
    what = "layout torch.sparse_coo" if kind == "sparse" else "a nested tensor"
    with pytest.raises(ArgumentError, match=re.escape(f"{name}= must be a dense (strided) tensor, got {what}")):
        call(q, k, v, **data)


@pytest.mark.interpreter
def test_rotate_keys_refuses_sparse_positions():
    fn = af.compile(af.attention(af.rope(), af.causal()), rope_placement=("fused", "given"))
    k = torch.randn(1, 2, 8, 16)
    with pytest.raises(ArgumentError, match=re.escape("k_positions= must be a dense (strided) tensor")):
        fn.rotate_keys(k, torch.arange(8).to_sparse())


@pytest.mark.interpreter
@pytest.mark.parametrize("api", ["compiled", "reference"])
def test_undeclared_data_is_named_before_its_layout(api):
    """Sparse data for a block the program lacks: the missing block is the mistake to name."""
    spec = af.attention(af.causal())
    q, k, v = (torch.randn(1, 2, 16, 16) for _ in range(3))
    call = af.compile(spec) if api == "compiled" else functools.partial(af.reference_attention, spec)
    with pytest.raises(ArgumentError, match=re.escape("doc_ids= given, but")):
        call(q, k, v, doc_ids=torch.zeros(16, dtype=torch.int64).to_sparse())

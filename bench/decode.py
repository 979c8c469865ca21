"""Decode-step attention (KV-cache decoding, split-KV flash-decoding): latency (µs) and effective
bandwidth of AttnFuse beside SDPA's FlashAttention, compiled flex_attention (its flex-decoding
kernel) and flex's paged attention, all in one process, fp16, one query token unless said.

    python bench/decode.py --out DIR [--rows 1,2,5] [--reps 100] [--time-budget 210]
    python bench/decode.py --smoke --out DIR        # CPU, tiny sizes: checks the script end to end

Rows (the issue's):

1. Llama-3-8B 32q/8kv/D128, B=1, L=4096
2. Mistral-7B 32q/8kv/D128, B=1, L=16384
3. Llama-3-70B 64q/8kv/D128, B=1, L=32768
4. Llama-3-8B, B=8, L=8192
5. rows 1-4 with a paged cache, pages of 16 and 64 tokens, pages randomly permuted: AttnFuse and
   flex's paged attention, AttnFuse on the contiguous cache beside them (goal: paged within 10%
   of contiguous)
6. ragged batch: B=16, 32q/8kv/D128, lengths uniform in [1024, 32768] (seed 0, printed),
   contiguous (L_max = the longest) and paged (pages of 64)
7. RoPE on the query fused in the kernel (keys given rotated: `rope_placement=("fused", "given")`)
   against the same attention without RoPE, rows 1-4 (goal: at most 3% more time)
8. Nq = 4 and 16 (speculative decoding) at row 1's geometry, bottom-right causal

Implementations (a row's `impl`):

- `attnfuse`: `af.compile(af.attention(af.causal()))` called `fn(q, k, v, kv_lens=lens)` on the
  contiguous cache `k, v [B, Hkv, L_max, D]`; `attnfuse-paged<P>`: the same function on page
  pools `[num_pages, Hkv, P, D]` with `block_table=` int32 `[B, max_pages]` and `kv_lens=`;
  `attnfuse-paged<P>-unhoisted` (with `--paged-forms hoisted,unhoisted`): the same call through a
  second compiled function whose plans are made under `ATTNFUSE_HOIST_PAGE_ROWS=0`: every key
  step derives its keys' pages and rows from their positions (the paged addressing before
  `hoist_page_rows`), to time both forms in one run;
  `attnfuse-nopdl`, `attnfuse-paged<P>-nopdl` (with `--pdl-forms on,off`): the same calls
  through a compiled function whose plans are made under `ATTNFUSE_DECODE_PDL=0`: the merge
  kernel launched after the split kernel as an ordinary launch, not as its programmatic
  dependent (the default rows, PDL on, are the `on` form; PDL needs a CUDA GPU of capability
  9.0 or more, elsewhere both forms launch the same way); their `vs` is against the PDL row;
  `attnfuse-full`: `fn(q, k, v)` without `kv_lens` (the whole cache, bottom-right causal: what
  works before the decoding API lands; only where every sequence fills the cache);
  `attnfuse-rope` / `attnfuse-rope-full`: `af.attention(af.rope(theta=500000.0), af.causal())`
  compiled with `rope_placement=("fused", "given")`, with / without `kv_lens`.
- `sdpa-flash`: `F.scaled_dot_product_attention` under `sdpa_kernel(FLASH_ATTENTION)` on the
  full contiguous cache, `enable_gqa=True` (if refused: the query heads of a group folded into
  the query length, which reads each kv head once). Nq = 1: no mask. Nq > 1: SDPA's `is_causal`
  is top-left, so `attn_mask=causal_lower_right(Nq, L)` (torch's CausalBias, which runs the
  flash kernel with its bottom-right causal mask when it qualifies).
- `sdpa-mask`: SDPA under `sdpa_kernel(EFFICIENT_ATTENTION)` with a mask `[B, 1, Nq, L_max]`
  (key padding and bottom-right causal; the boolean keep-mask passed as the additive mask in q's
  dtype that SDPA would otherwise make from it on every call, built outside the timing): the
  ragged row (SDPA has no per-sequence length, so it reads the padded L_max cache) and the
  Nq > 1 row. `enable_gqa=True`, else the query group folded into the query length. If
  EFFICIENT refuses both, SDPA's default choice (the row says so).
- `flex`: `torch.compile(flex_attention, dynamic=False)` (one compiled function for every row)
  with a BlockMask from `create_block_mask(mask_mod, B, None, Nq, L_max)`, mask_mod
  `kv_idx <= q_idx + kv_lens[b] - Nq` (kv_lens a captured tensor), `enable_gqa=True`: for
  Nq < 128 inductor lowers it to its flex-decoding kernel.
- `flex-paged<P>`: `torch.nn.attention.experimental._paged_attention.PagedAttention(n_pages, P,
  B)`: `reserve` per sequence (its free list shuffled first, so the pages are a random
  permutation; AttnFuse's block_table is read from the same `page_table`), `assign` of each
  sequence's keys and values into the physical caches `[1, Hkv, n_pages * P, D]`,
  `convert_logical_block_mask` of the logical BlockMask (BLOCK_SIZE (128, P)), whose mask_mod
  maps physical to logical indices; the same compiled flex over the physical caches.
- `copy`: `dst.copy_(src)` of a 1 GiB tensor; bandwidth counted as read + write bytes (the
  reference for the `% copy` column: what the memory system moves per second in a streaming
  copy, ~4.3 TB/s on the H200) and as read bytes only.

Every output is first checked against a float32 reference (per sequence: the kept keys only,
query i at position kv_lens[b] - Nq + i, RoPE in float64); a wrong one is FAIL and not timed.
Anything that raises is recorded with its error text; the run goes on.

Timing (GPU): `us`: CUDA events around each call, a 256 MiB buffer zeroed before each (outside
the events) so every call starts from a cold L2 and the queue ahead of it hides the host's
launch work; the median of `--reps` calls after `--warmup`. `graph us`: the call captured in a
CUDA graph (after warm-up calls on a side stream), each replay timed the same way (removes any
host gap inside a call of several kernels). `loop us`: `--graph-calls` calls captured in one
graph, replay time / calls, no flush (warm L2 where the cache fits in it, ~50 MB): the steady
state of a graph-captured decode loop. `graph us (clean)`: the same graph after a flush that
reads 256 MiB instead: zeroing leaves up to L2's size of dirty lines, whose write-back the timed
call then pays beside its own reads; after a read the call's traffic is its own. A capture that
fails is recorded (`graph error`).
GB/s = bytes of K and V attended (sum over sequences of kv_lens[b] * Hkv * D * 2 tensors * bytes
per element) / `graph us` (`us` where the capture failed); `% copy` = that over the copy's read +
write GB/s (and `GB/s (clean)`, `% copy (clean)` over `graph us (clean)`); the `vs` ratios
divide the graph times after the zeroing flush. Results (markdown, JSON,
a PNG with matplotlib) are rewritten after every case; `--time-budget` stops starting cases.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import importlib.util
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import benchlib

ROWS = {
    "1": "Llama-3-8B 32q/8kv/D128, B=1, L=4096",
    "2": "Mistral-7B 32q/8kv/D128, B=1, L=16384",
    "3": "Llama-3-70B 64q/8kv/D128, B=1, L=32768",
    "4": "Llama-3-8B 32q/8kv/D128, B=8, L=8192",
    "5": "Paged KV cache (rows 1-4), pages of 16 and 64 tokens, randomly permuted; goal: paged <= 1.10x contiguous",
    "6": "Ragged batch: B=16, 32q/8kv/D128, lengths uniform in [1024, 32768]",
    "7": "RoPE on the query fused (keys given rotated) against no RoPE (rows 1-4); goal: <= 1.03x",
    "8": "Speculative decoding: Nq = 4 and 16 at row 1's geometry (bottom-right causal)",
}
PAGED_GOAL, ROPE_GOAL = 1.10, 1.03
ROPE_THETA = 500000.0


@dataclasses.dataclass(frozen=True)
class Geometry:
    name: str
    hq: int
    hkv: int
    d: int


@dataclasses.dataclass(frozen=True)
class Sizes:
    """The problem sizes of a run: the issue's, or tiny ones for --smoke."""

    llama8b: Geometry
    mistral: Geometry
    llama70b: Geometry
    #: (geometry, batch, L) of rows 1-4
    base: dict
    page_sizes: tuple[int, ...]
    ragged_batch: int
    ragged_range: tuple[int, int]
    ragged_page: int
    spec_nq: tuple[int, ...]
    copy_bytes: int


FULL = Sizes(
    llama8b=Geometry("Llama-3-8B", 32, 8, 128), mistral=Geometry("Mistral-7B", 32, 8, 128),
    llama70b=Geometry("Llama-3-70B", 64, 8, 128),
    base={"1": ("llama8b", 1, 4096), "2": ("mistral", 1, 16384), "3": ("llama70b", 1, 32768),
          "4": ("llama8b", 8, 8192)},
    page_sizes=(16, 64), ragged_batch=16, ragged_range=(1024, 32768), ragged_page=64, spec_nq=(4, 16),
    copy_bytes=1 << 30)
SMOKE = Sizes(
    llama8b=Geometry("tiny-8B", 4, 2, 16), mistral=Geometry("tiny-Mistral", 4, 2, 16),
    llama70b=Geometry("tiny-70B", 8, 2, 16),
    base={"1": ("llama8b", 1, 64), "2": ("mistral", 1, 128), "3": ("llama70b", 1, 96), "4": ("llama8b", 2, 64)},
    page_sizes=(16, 32), ragged_batch=3, ragged_range=(16, 100), ragged_page=32, spec_nq=(4, 16),
    copy_bytes=16 << 20)


@dataclasses.dataclass
class Case:
    """One set of inputs (a geometry, a batch of lengths, Nq) and the implementations run on it."""

    row: str
    name: str
    geom: Geometry
    lengths: list[int]
    nq: int
    impls: list[str]
    #: key of the contiguous case this one's flex-paged rows compare with (row 5)
    base_key: str | None = None

    @property
    def batch(self) -> int:
        return len(self.lengths)

    @property
    def lmax(self) -> int:
        return max(self.lengths)

    @property
    def full(self) -> bool:
        """Every sequence fills the cache (calls without kv_lens mean the same thing)."""
        return min(self.lengths) == self.lmax


PAGED_FORMS = ("hoisted", "unhoisted")
"""`--paged-forms`: AttnFuse's paged key steps with their page rows hoisted (the default) or
derived per step (`ATTNFUSE_HOIST_PAGE_ROWS=0`)."""


def paged_suffix(form: str) -> str:
    return "" if form == "hoisted" else f"-{form}"


PDL_FORMS = ("on", "off")
"""`--pdl-forms`: AttnFuse's split decode with the merge launched as the split kernel's
programmatic dependent (on, the default rows) or as an ordinary launch after it (off:
`-nopdl` rows, plans made under `ATTNFUSE_DECODE_PDL=0`)."""

NO_PDL = "-nopdl"


def pdl_twins(impls: list[str], pdl_forms: tuple[str, ...]) -> list[str]:
    """`impls` with, for `--pdl-forms ...off`, a `-nopdl` row after each AttnFuse decode row
    that has kv_lens (contiguous and hoisted paged; not `-full`, `-rope` or `-unhoisted`)."""
    if "off" not in pdl_forms:
        return impls
    out = []
    for name in impls:
        out.append(name)
        if name == "attnfuse" or (name.startswith("attnfuse-paged") and name.removeprefix("attnfuse-paged").isdigit()):
            out.append(name + NO_PDL)
    return out


def ragged_lengths(sizes: Sizes) -> list[int]:
    generator = torch.Generator().manual_seed(0)
    low, high = sizes.ragged_range
    return torch.randint(low, high + 1, (sizes.ragged_batch,), generator=generator).tolist()


def build_cases(sizes: Sizes, rows: list[str], paged_forms: tuple[str, ...] = ("hoisted",),
                pdl_forms: tuple[str, ...] = ("on",)) -> list[Case]:
    geoms = {"llama8b": sizes.llama8b, "mistral": sizes.mistral, "llama70b": sizes.llama70b}
    cases = []

    def base(r: str) -> tuple[Geometry, int, int]:
        key, batch, length = sizes.base[r]
        return geoms[key], batch, length

    for r in ("1", "2", "3", "4"):
        if r in rows:
            geom, batch, length = base(r)
            cases.append(Case(r, f"{geom.name} B={batch} L={length}", geom, [length] * batch, 1,
                              pdl_twins(["attnfuse", "attnfuse-full", "sdpa-flash", "flex"], pdl_forms)))
    if "5" in rows:
        for r in ("1", "2", "3", "4"):
            geom, batch, length = base(r)
            impls = ["attnfuse", "attnfuse-full"]
            impls += [f"attnfuse-paged{p}{paged_suffix(form)}" for p in sizes.page_sizes for form in paged_forms]
            impls += [f"flex-paged{p}" for p in sizes.page_sizes]
            impls = pdl_twins(impls, pdl_forms)
            cases.append(Case("5", f"row {r}: {geom.name} B={batch} L={length}", geom, [length] * batch, 1, impls,
                              base_key=f"{r}"))
    if "6" in rows:
        p = sizes.ragged_page
        cases.append(Case("6", f"{sizes.llama8b.name} B={sizes.ragged_batch} ragged", sizes.llama8b,
                          ragged_lengths(sizes), 1,
                          pdl_twins(["attnfuse", *[f"attnfuse-paged{p}{paged_suffix(form)}" for form in paged_forms],
                                     "flex", f"flex-paged{p}", "sdpa-mask"], pdl_forms), base_key="6"))
    if "7" in rows:
        for r in ("1", "2", "3", "4"):
            geom, batch, length = base(r)
            cases.append(Case("7", f"row {r}: {geom.name} B={batch} L={length}", geom, [length] * batch, 1,
                              ["attnfuse", "attnfuse-rope", "attnfuse-full", "attnfuse-rope-full"]))
    if "8" in rows:
        geom, batch, length = base("1")
        for nq in sizes.spec_nq:
            cases.append(Case("8", f"{geom.name} B={batch} L={length} Nq={nq}", geom, [length] * batch, nq,
                              pdl_twins(["attnfuse", "attnfuse-full", "sdpa-flash", "sdpa-mask", "flex"], pdl_forms)))
    return cases


# --------------------------------------------------------------------------
# Inputs, paged caches, the reference
# --------------------------------------------------------------------------


class Inputs:
    """A case's tensors: q, the contiguous cache, kv_lens, and paged caches built on demand."""

    def __init__(self, case: Case, device: str, dtype: torch.dtype, seed: int):
        self.case, self.device, self.dtype = case, device, dtype
        g = case.geom
        gen = torch.Generator(device=device).manual_seed(seed)
        self.q = torch.randn(case.batch, g.hq, case.nq, g.d, device=device, dtype=dtype, generator=gen)
        self.k = torch.randn(case.batch, g.hkv, case.lmax, g.d, device=device, dtype=dtype, generator=gen)
        self.v = torch.randn(case.batch, g.hkv, case.lmax, g.d, device=device, dtype=dtype, generator=gen)
        self.kv_lens = torch.tensor(case.lengths, device=device, dtype=torch.int32)
        self.seed = seed
        self._paged: dict[int, dict[str, Any]] = {}
        self._refs: dict[bool, torch.Tensor] = {}

    def paged(self, page_size: int) -> dict[str, Any]:
        """The cache in pages of `page_size` tokens, in a random permutation of physical pages:
        flex's physical caches `[1, Hkv, n_pages * P, D]` filled through PagedAttention, and
        AttnFuse's pools `[n_pages, Hkv, P, D]` and block_table from the same page table. Where
        PagedAttention itself fails, AttnFuse's layout is built directly and `flex_error` says
        why flex has none."""
        if page_size not in self._paged:
            self._paged[page_size] = build_paged(self, page_size)
        return self._paged[page_size]

    def reference(self, rope: bool) -> torch.Tensor:
        if rope not in self._refs:
            self._refs[rope] = reference(self.q, self.k, self.v, self.case.lengths, ROPE_THETA if rope else None)
        return self._refs[rope]


def build_paged(inputs: Inputs, page_size: int) -> dict[str, Any]:
    case, device = inputs.case, inputs.device
    b, hkv, _, d = inputs.k.shape
    pages = [math.ceil(n / page_size) for n in case.lengths]
    n_pages, max_pages = sum(pages), max(pages)
    perm = torch.randperm(n_pages, generator=torch.Generator().manual_seed(inputs.seed + page_size)).tolist()
    result: dict[str, Any] = {"n_pages": n_pages, "max_pages": max_pages, "flex_error": None}
    try:
        from torch.nn.attention.experimental._paged_attention import PagedAttention

        paged = PagedAttention(n_pages, page_size, b, device=device)
        # reserve() takes pages from the end of its free list: shuffled, they are a random
        # permutation (each sequence's pages scattered over the pool).
        paged.empty_pages = list(perm)
        for i, n in enumerate(case.lengths):
            paged.reserve(torch.tensor([i], device=device), torch.tensor([n], device=device))
        k_cache = torch.zeros(1, hkv, n_pages * page_size, d, device=device, dtype=inputs.dtype)
        v_cache = torch.zeros_like(k_cache)
        for i, n in enumerate(case.lengths):
            batch_idx = torch.tensor([i], device=device, dtype=torch.int32)
            positions = torch.arange(n, device=device, dtype=torch.int32)
            k_i, v_i = inputs.k[i:i + 1, :, :n], inputs.v[i:i + 1, :, :n]
            try:
                paged.assign(batch_idx, positions[None], k_i, v_i, k_cache, v_cache)
            except RuntimeError:
                paged.assign(batch_idx, positions, k_i, v_i, k_cache, v_cache)  # older API: [S]
        table = paged.page_table[:, :max_pages]
        result.update(paged=paged, k_cache=k_cache, v_cache=v_cache)
        pool_k = k_cache[0].unflatten(1, (n_pages, page_size)).transpose(0, 1).contiguous()
        pool_v = v_cache[0].unflatten(1, (n_pages, page_size)).transpose(0, 1).contiguous()
    except Exception as err:  # noqa: BLE001 - flex's paged attention failing is a cell, not the run
        result["flex_error"] = f"PagedAttention setup: {benchlib.first_line(err)}"
        table = torch.full((b, max_pages), -1, dtype=torch.int64)
        pool_k = torch.zeros(n_pages, hkv, page_size, d, device=device, dtype=inputs.dtype)
        pool_v = torch.zeros_like(pool_k)
        free = list(perm)
        for i, n in enumerate(case.lengths):
            for j in range(pages[i]):
                page = free.pop()
                table[i, j] = page
                lo, hi = j * page_size, min(n, (j + 1) * page_size)
                pool_k[page, :, : hi - lo] = inputs.k[i, :, lo:hi]
                pool_v[page, :, : hi - lo] = inputs.v[i, :, lo:hi]
        table = table.to(device)
    # Unused entries (past a sequence's last page) point at page 0: in bounds whatever reads them.
    result["block_table"] = table.clamp_min(0).to(torch.int32).contiguous()
    result["pool_k"], result["pool_v"] = pool_k, pool_v
    return result


def rotate_half_split(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """RoPE of x [..., N, D] at positions [N], pairs (x_t, x_{t+D/2}), in float64."""
    d = x.shape[-1]
    freq = theta ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float64) / d)
    angle = positions.to(torch.float64)[:, None] * freq[None, :]
    cos, sin = torch.cos(angle), torch.sin(angle)
    x = x.double()
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def reference(q, k, v, lengths: list[int], rope_theta: float | None) -> torch.Tensor:
    """float32 attention per sequence over its kept keys, query i at position L_b - Nq + i
    (bottom-right causal), q rotated at those positions when `rope_theta` is given (keys are
    taken as given rotated)."""
    b, hq, nq, d = q.shape
    hkv = k.shape[1]
    group = hq // hkv
    out = torch.empty(b, hq, nq, d, device=q.device, dtype=torch.float32)
    for i, n in enumerate(lengths):
        qb = q[i].float()
        positions = torch.arange(n - nq, n, device=q.device)
        if rope_theta is not None:
            qb = rotate_half_split(qb, positions, rope_theta).float()
        qf = qb.reshape(hkv, group * nq, d)
        kb, vb = k[i, :, :n].float(), v[i, :, :n].float()
        scores = (qf @ kb.transpose(-1, -2)) / math.sqrt(d)
        rows = torch.arange(group * nq, device=q.device) % nq
        keep = torch.arange(n, device=q.device)[None, :] <= (n - nq + rows)[:, None]
        scores = scores.masked_fill(~keep, float("-inf"))
        out[i] = (torch.softmax(scores, dim=-1) @ vb).reshape(hq, nq, d)
    return out


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).norm() / ref.norm()).item()


# --------------------------------------------------------------------------
# The implementations
# --------------------------------------------------------------------------


class Unavailable(Exception):
    """An implementation that cannot run this case (the reason is the row's error)."""


@dataclasses.dataclass
class Impl:
    fn: Callable[[], torch.Tensor]
    rope: bool = False
    layout: str = "contiguous"
    note: str = ""


class Peers:
    """What every case shares: the compiled AttnFuse functions and the compiled flex."""

    def __init__(self, args: argparse.Namespace, device: str):
        self.args, self.device = args, device
        self.af_error: str | None = None
        self.af: dict[str, Any] = {}
        try:
            import attnfuse as af

            self.af["causal"] = af.compile(af.attention(af.causal()))
            # Its own plans (made under ATTNFUSE_HOIST_PAGE_ROWS=0: `-unhoisted` rows).
            self.af["causal-unhoisted"] = af.compile(af.attention(af.causal()))
            # Its own plans (made under ATTNFUSE_DECODE_PDL=0: `-nopdl` rows).
            self.af["causal-nopdl"] = af.compile(af.attention(af.causal()))
            self.af["rope"] = af.compile(af.attention(af.rope(theta=ROPE_THETA), af.causal()),
                                         rope_placement=("fused", "given"))
        except Exception as err:  # noqa: BLE001 - no xDSL on the machine, say: the peers still run
            self.af_error = f"attnfuse unavailable: {benchlib.first_line(err)}"
        self.flex_error: str | None = None
        self.flex = None
        try:
            from torch.nn.attention.flex_attention import flex_attention

            if args.flex == "compiled":
                benchlib.bench_tool.configure_dynamo()  # one graph per shape: no silent eager fallback
                self.flex = torch.compile(flex_attention, dynamic=False)
            else:
                self.flex = flex_attention
        except Exception as err:  # noqa: BLE001
            self.flex_error = f"flex unavailable: {benchlib.first_line(err)}"

    def build(self, name: str, x: Inputs, causal: str = "causal") -> Impl:
        """The row `name` on `x`; AttnFuse's causal rows call `self.af[causal]`."""
        case = x.case
        if name.startswith("attnfuse"):
            if self.af_error:
                raise Unavailable(self.af_error)
            if name.endswith(NO_PDL):
                return self.without_pdl(self.build(name.removesuffix(NO_PDL), x, causal="causal-nopdl"))
            rope = "rope" in name
            fn = self.af["rope" if rope else causal]
            q, k, v, lens = x.q, x.k, x.v, x.kv_lens
            if name.endswith("-full"):
                if not case.full:
                    raise Unavailable("the sequences do not all fill the cache")
                return Impl(lambda: fn(q, k, v), rope, note="no kv_lens (whole cache)")
            if "-paged" in name:
                page_text, _, form = name.removeprefix("attnfuse-paged").partition("-")
                page = int(page_text)
                paged = x.paged(page)
                pk, pv, table = paged["pool_k"], paged["pool_v"], paged["block_table"]
                if form == "unhoisted":
                    return self.unhoisted(lambda: self.af["causal-unhoisted"](q, pk, pv, block_table=table, kv_lens=lens),
                                          page, paged)
                return Impl(lambda: fn(q, pk, pv, block_table=table, kv_lens=lens), rope, f"paged {page}",
                            f"{paged['n_pages']} pages")
            return Impl(lambda: fn(q, k, v, kv_lens=lens), rope)
        if name.startswith("flex"):
            if self.flex_error:
                raise Unavailable(self.flex_error)
            return self.build_flex(name, x)
        if name == "sdpa-flash":
            return self.build_sdpa_flash(x)
        if name == "sdpa-mask":
            return self.build_sdpa_mask(x)
        raise ValueError(name)

    def unhoisted(self, call: Callable, page: int, paged: dict) -> Impl:
        """An `-unhoisted` paged row: its plan (and kernels) made by the first call, under
        ATTNFUSE_HOIST_PAGE_ROWS=0; later calls replay that plan."""
        from attnfuse.runtime.config import HOIST_PAGE_ROWS_ENV

        previous = os.environ.get(HOIST_PAGE_ROWS_ENV)
        os.environ[HOIST_PAGE_ROWS_ENV] = "0"
        try:
            call()
        finally:
            if previous is None:
                os.environ.pop(HOIST_PAGE_ROWS_ENV, None)
            else:
                os.environ[HOIST_PAGE_ROWS_ENV] = previous
        source = self.af["causal-unhoisted"].last.program.source
        if "page_rows = keys % PAGE_SIZE" not in source:
            raise Unavailable("the unhoisted plan's kernels hoist their page rows (ATTNFUSE_HOIST_PAGE_ROWS ignored)")
        return Impl(call, False, f"paged {page}", f"{paged['n_pages']} pages; page rows per step (unhoisted)")

    def without_pdl(self, pdl: Impl) -> Impl:
        """A `-nopdl` row from its PDL row built on `causal-nopdl` (`pdl`): the call's plan
        (and kernels) made by its first call, under ATTNFUSE_DECODE_PDL=0; later calls
        replay that plan."""
        from attnfuse.runtime.config import DECODE_PDL_ENV

        fn = self.af["causal-nopdl"]
        previous = os.environ.get(DECODE_PDL_ENV)
        os.environ[DECODE_PDL_ENV] = "0"
        try:
            pdl.fn()
        finally:
            if previous is None:
                os.environ.pop(DECODE_PDL_ENV, None)
            else:
                os.environ[DECODE_PDL_ENV] = previous
        if fn.last is None or "decode-pdl=0" not in fn.last.pipeline:
            raise Unavailable("the no-PDL plan's kernels were compiled with PDL (ATTNFUSE_DECODE_PDL ignored)")
        note = "; ".join(n for n in (pdl.note, "merge launched after the split kernel (no PDL)") if n)
        return Impl(pdl.fn, pdl.rope, pdl.layout, note)

    # -- flex ---------------------------------------------------------------------------------

    def build_flex(self, name: str, x: Inputs) -> Impl:
        from torch.nn.attention.flex_attention import create_block_mask

        case, flex = x.case, self.flex
        lens, nq = x.kv_lens, case.nq

        def mask_mod(b, h, q_idx, kv_idx):
            # bottom-right causal per sequence; also drops keys j >= kv_lens[b]
            return kv_idx <= q_idx + (lens[b] - nq)

        q = x.q
        note = "" if self.args.flex == "compiled" else "flex_attention uncompiled (smoke)"
        if name == "flex":
            block_mask = create_block_mask(mask_mod, case.batch, None, nq, case.lmax, device=x.device)
            k, v = x.k, x.v
            return Impl(lambda: flex(q, k, v, block_mask=block_mask, enable_gqa=True), note=note)
        page = int(name.removeprefix("flex-paged"))
        paged = x.paged(page)
        if paged["flex_error"]:
            raise Unavailable(paged["flex_error"])
        logical = create_block_mask(mask_mod, case.batch, None, nq, paged["max_pages"] * page, device=x.device,
                                    BLOCK_SIZE=(128, page))
        block_mask = paged["paged"].convert_logical_block_mask(
            logical, torch.arange(case.batch, device=x.device, dtype=torch.int32))
        k_cache, v_cache = paged["k_cache"], paged["v_cache"]
        note = "; ".join(filter(None, [note, f"{paged['n_pages']} pages"]))
        return Impl(lambda: flex(q, k_cache, v_cache, block_mask=block_mask, enable_gqa=True),
                    layout=f"paged {page}", note=note)

    # -- SDPA ---------------------------------------------------------------------------------

    def _sdpa_attempts(self, backends, attempts: list[tuple[str, Callable]]) -> tuple[Callable, str]:
        """The first attempt that runs under `backends` (None: SDPA's own choice); the notes of
        those refused come along."""
        from torch.nn.attention import sdpa_kernel

        refused = []
        for label, call in attempts:
            def fn(call=call):
                with contextlib.nullcontext() if backends is None else sdpa_kernel(backends):
                    return call()
            try:
                fn()
                benchlib.synchronize(self.device)
                return fn, "; ".join([label] + [f"refused: {r}" for r in refused])
            except Exception as err:  # noqa: BLE001 - a refused form: try the next
                refused.append(f"{label} ({benchlib.first_line(err)[:120]})")
        raise Unavailable("; ".join(refused))

    def build_sdpa_flash(self, x: Inputs) -> Impl:
        from torch.nn.attention import SDPBackend

        case = x.case
        if not case.full:
            raise Unavailable("SDPA has no per-sequence length (see sdpa-mask)")
        q, k, v = x.q, x.k, x.v
        b, hq, nq, d = q.shape
        hkv = k.shape[1]
        group = hq // hkv
        if nq == 1:
            attempts = [("enable_gqa=True, no mask",
                         lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)),
                        ("query group folded into the query length, no mask",
                         lambda: F.scaled_dot_product_attention(q.view(b, hkv, group, d), k, v).view(b, hq, 1, d))]
        else:
            from torch.nn.attention.bias import causal_lower_right

            bias = causal_lower_right(nq, case.lmax)
            k_rep, v_rep = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
            attempts = [("causal_lower_right CausalBias, enable_gqa=True",
                         lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True)),
                        ("causal_lower_right CausalBias, k/v heads repeated outside the timing (reads Hq heads)",
                         lambda: F.scaled_dot_product_attention(q, k_rep, v_rep, attn_mask=bias))]
        fn, note = self._sdpa_attempts([SDPBackend.FLASH_ATTENTION], attempts)
        if self.device != "cuda":
            note += "; CPU flash kernel"
        return Impl(fn, note=note)

    def build_sdpa_mask(self, x: Inputs) -> Impl:
        from torch.nn.attention import SDPBackend

        case = x.case
        q, k, v = x.q, x.k, x.v
        b, hq, nq, d = q.shape
        hkv = k.shape[1]
        group = hq // hkv

        def additive_mask(rows: int) -> torch.Tensor:
            """[B, 1, rows, L_max]: 0 where kept (key j <= kv_lens[b] - Nq + i for row r, query
            i = r % Nq: key padding and bottom-right causal), -inf elsewhere, in q's dtype. The
            boolean keep-mask converted outside the timing (SDPA would convert a bool mask on
            every call), allocated with its last dim padded to 16 (the efficient kernel's
            alignment, else SDPA pads a copy per call) and sliced back."""
            padded = -(-case.lmax // 16) * 16
            j = torch.arange(padded, device=x.device)
            i = torch.arange(rows, device=x.device) % nq
            keep = j[None, None, :] <= (x.kv_lens.long()[:, None, None] - nq + i[None, :, None])
            bias = torch.zeros(keep.shape, device=x.device, dtype=q.dtype).masked_fill_(~keep, float("-inf"))
            return bias[:, None, :, : case.lmax]

        mask, mask_folded = additive_mask(nq), additive_mask(group * nq)
        attempts = [("enable_gqa=True",
                     lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)),
                    ("query group folded into the query length",
                     lambda: F.scaled_dot_product_attention(q.view(b, hkv, group * nq, d), k, v,
                                                            attn_mask=mask_folded).view(b, hq, nq, d))]
        notes = ["padded L_max cache with a key-padding mask (SDPA has no per-sequence length)" if not case.full
                 else "bottom-right causal mask", "bool mask given as an additive mask built outside the timing"]
        try:
            fn, note = self._sdpa_attempts([SDPBackend.EFFICIENT_ATTENTION], attempts)
            notes.append("EFFICIENT, " + note)
        except Unavailable as refused:
            fn, note = self._sdpa_attempts(None, attempts[:1])
            notes.append(f"SDPA's default backend, {note} (EFFICIENT refused: {str(refused)[:100]})")
        return Impl(fn, note="; ".join(notes))


# --------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------


class Timer:
    def __init__(self, args: argparse.Namespace, device: str):
        self.args, self.device = args, device
        self.flush_buffer = torch.empty(256 << 20, dtype=torch.int8, device="cuda") if device == "cuda" else None

    def flush(self) -> None:
        if self.flush_buffer is not None:
            self.flush_buffer.zero_()

    def clean_flush(self) -> None:
        """Evicts L2 by reading 256 MiB: the evicted lines are clean, so the timed call pays only
        its own traffic (after `flush`'s zeroing it also writes back the dirty lines it evicts,
        up to L2's size: the previous kernel's cost)."""
        if self.flush_buffer is not None:
            self.flush_buffer.max()

    def plain(self, fn: Callable) -> tuple[float, float]:
        """Median and spread (µs) of single calls, L2 flushed before each."""
        ms, iqr = benchlib.median_ms(fn, self.device, self.args.warmup, self.args.reps, before=self.flush)
        return ms * 1e3, iqr * 1e3

    def graphs(self, fn: Callable, row: dict) -> None:
        """`graph_us` (one call per graph, L2 flushed by zeroing before each replay),
        `graph_clean_us` (the same after a clean flush, `clean_flush`) and `loop_us`
        (graph_calls calls per graph, warm), or `graph_error`."""
        if self.device != "cuda":
            return  # CPU run: no graphs
        graph = loop = None
        stream = torch.cuda.current_stream()
        try:
            graph = benchlib.capture_graph(fn, 1)
            ms, _ = benchlib.median_ms(graph.replay, "cuda", self.args.warmup, self.args.reps, before=self.flush)
            row["graph_us"] = ms * 1e3
            ms, _ = benchlib.median_ms(graph.replay, "cuda", self.args.warmup, self.args.reps, before=self.clean_flush)
            row["graph_clean_us"] = ms * 1e3
            calls = self.args.graph_calls
            loop = benchlib.capture_graph(fn, calls)
            ms, _ = benchlib.median_ms(loop.replay, "cuda", 2, max(5, self.args.reps // 5))
            row["loop_us"] = ms * 1e3 / calls
        except Exception as err:  # noqa: BLE001 - capture refused: the plain timing stands
            row["graph_error"] = benchlib.first_line(err)
            # torch.cuda.graph's __exit__ skips restoring the stream when capture_end raises
            with contextlib.suppress(Exception):
                torch.cuda.set_stream(stream)
            with contextlib.suppress(Exception):
                torch.cuda.synchronize()
        finally:
            del graph, loop


def copy_bandwidth(timer: Timer, device: str, nbytes: int) -> dict[str, Any]:
    """Device-to-device copy of `nbytes`: GB/s counting read + write bytes and read bytes only."""
    result: dict[str, Any] = {"bytes": nbytes}
    try:
        src = torch.ones(nbytes // 2, device=device, dtype=torch.float16)
        dst = torch.empty_like(src)
        ms, iqr = benchlib.median_ms(lambda: dst.copy_(src), device, 3, max(10, timer.args.reps // 5))
        result.update(ms=ms, iqr_ms=iqr, rw_gbps=2 * nbytes / ms / 1e6, read_gbps=nbytes / ms / 1e6)
    except Exception as err:  # noqa: BLE001
        result["error"] = benchlib.first_line(err)
    return result


# --------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------


def run_case(case: Case, peers: Peers, timer: Timer, args: argparse.Namespace, device: str,
             dtype: torch.dtype, seed: int, copy: dict, progress) -> list[dict]:
    g = case.geom
    elem = torch.tensor([], dtype=dtype).element_size()
    kv_bytes = sum(case.lengths) * g.hkv * g.d * 2 * elem
    base = {"row": case.row, "case": case.name, "model": g.name, "B": case.batch, "Hq": g.hq, "Hkv": g.hkv,
            "D": g.d, "Nq": case.nq, "L_max": case.lmax, "kv_tokens": sum(case.lengths), "kv_bytes": kv_bytes,
            "base_key": case.base_key}
    rows = []
    try:
        x = Inputs(case, device, dtype, seed)
    except Exception as err:  # noqa: BLE001 - out of memory, say
        return [{**base, "impl": name, "status": "error", "error": f"inputs: {benchlib.first_line(err)}"}
                for name in case.impls]
    for name in case.impls:
        progress.step(f"row {case.row} {case.name} {name}")
        row = {**base, "impl": name, "layout": "contiguous", "status": "error", "error": None, "note": ""}
        rows.append(row)
        try:
            impl = peers.build(name, x)
            row["layout"], row["note"] = impl.layout, impl.note
            out = impl.fn()
            benchlib.synchronize(device)
            row["rel_err"] = relative_error(out, x.reference(impl.rope))
            del out
            if not row["rel_err"] <= args.tol:
                row["status"] = "FAIL"
                row["error"] = f"rel err {row['rel_err']:.2e} > {args.tol:g}"
                benchlib.log(f"  {name}: FAIL ({row['error']})")
                continue
            row["us"], row["iqr_us"] = timer.plain(impl.fn)
            row["status"] = "ok"
            timer.graphs(impl.fn, row)
            # Bandwidth and the `vs` ratios use the graph time where the call was captured: a
            # plain call's time carries the host's noise (a decode step runs in a graph in
            # serving systems).
            row["gbps"] = kv_bytes / compared_us(row) / 1e3
            if row.get("graph_us"):
                row["graph_gbps"] = kv_bytes / row["graph_us"] / 1e3
            if row.get("graph_clean_us"):
                row["clean_gbps"] = kv_bytes / row["graph_clean_us"] / 1e3
            if copy.get("rw_gbps"):
                row["pct_copy"] = 100 * row["gbps"] / copy["rw_gbps"]
                if row.get("clean_gbps"):
                    row["pct_copy_clean"] = 100 * row["clean_gbps"] / copy["rw_gbps"]
            benchlib.log(f"  {name}: {row['us']:.2f} us, {row['gbps']:.0f} GB/s"
                         + (f", graph {row['graph_us']:.2f} us" if row.get("graph_us") else "")
                         + (f" (graph: {row['graph_error']})" if row.get("graph_error") else ""))
        except Exception as err:  # noqa: BLE001 - one implementation failing is a cell
            row["status"] = "error"
            row["error"] = benchlib.first_line(err)
            benchlib.log(f"  {name}: {row['error']}")
            if device == "cuda":
                with contextlib.suppress(Exception):
                    torch.cuda.synchronize()
    del x
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return rows


def compared_us(row: dict) -> float:
    """The time a row is compared by: its CUDA-graph time where it has one, else its plain
    call's time."""
    return row.get("graph_us") or row["us"]


def add_ratios(rows: list[dict]) -> None:
    """Each row's comparison (`vs`, `vs_label`, `goal`): a `-nopdl` row against its PDL row, rows 5 and 6's paged rows against the
    contiguous cache, row 7's RoPE against no RoPE, the others against AttnFuse."""
    by_case: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        by_case.setdefault((r["row"], r["case"]), {})[r["impl"]] = r
    contiguous = {r["row"]: r for r in rows if r["row"] in "1234" and r["impl"] == "flex" and r.get("us")}

    def us(r: dict | None) -> float | None:
        return compared_us(r) if r and r.get("us") else None

    for (row_id, _case), impls in by_case.items():
        af_ref = next((impls[n] for n in ("attnfuse", "attnfuse-full") if us(impls.get(n))), None)
        for name, r in impls.items():
            r.pop("vs", None)
            mine, other, label, goal = us(r), None, None, None
            if name.endswith(NO_PDL):
                other, label = impls.get(name.removesuffix(NO_PDL)), "pdl on"
            elif row_id in "56" and "-paged" in name:
                if name.startswith("attnfuse"):
                    other = af_ref
                    label = "contiguous" + ("" if other is None or other["impl"] == "attnfuse" else " (no kv_lens)")
                else:
                    other = impls.get("flex") if row_id == "6" else contiguous.get(r.get("base_key"))
                    label = "flex contiguous"
                goal = PAGED_GOAL
            elif row_id == "7" and "rope" in name:
                other = impls.get(name.replace("-rope", ""))
                label, goal = "no RoPE", ROPE_GOAL
            elif af_ref is not None and name != af_ref["impl"] and not name.startswith("attnfuse"):
                other, label = af_ref, af_ref["impl"]
            if mine and us(other):
                r["vs"], r["vs_label"] = mine / us(other), label
                if goal is not None and name.startswith("attnfuse"):
                    r["goal"], r["meets_goal"] = goal, r["vs"] <= goal


# --------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------


def tables(document: dict) -> list[str]:
    lines: list[str] = []
    copy = document["copy"]
    lines += ["## Copy bandwidth (device to device)", ""]
    if copy.get("error"):
        lines += [f"fails: {copy['error']}", ""]
    elif copy.get("ms"):
        lines += benchlib.markdown_table(
            ["bytes", "ms", "GB/s read + write", "GB/s read only"],
            [[f"{copy['bytes'] / 2**30:.3g} GiB", benchlib.fmt(copy["ms"], ".4f"), benchlib.fmt(copy["rw_gbps"], ".0f"),
              benchlib.fmt(copy["read_gbps"], ".0f")]])
        lines += ["", "`% copy` below is an attention's GB/s (K and V bytes read) over the copy's **read + write** "
                  "GB/s.", ""]
    header = ["case", "impl", "layout", "µs", "graph µs", "loop µs", "GB/s", "% copy", "graph µs (clean)",
              "GB/s (clean)", "% copy (clean)", "vs", "rel err", "notes"]
    for row_id, title in ROWS.items():
        rows = [r for r in document["rows"] if r["row"] == row_id]
        if not rows:
            continue
        lines += [f"## {row_id}. {title}", ""]
        if row_id == "6" and document.get("ragged_lengths"):
            lengths = document["ragged_lengths"]
            lines += [f"Lengths (seed 0, {len(lengths)} sequences, {sum(lengths)} tokens): "
                      + ", ".join(map(str, lengths)), ""]
        cells = []
        for r in rows:
            if r.get("us") is not None:
                time_cell = benchlib.fmt(r["us"], ".2f")
            else:
                time_cell = {"FAIL": "FAIL", "skipped": "skipped"}.get(r["status"], "n/a")
            vs = ""
            if r.get("vs") is not None:
                vs = f"{r['vs']:.2f}x {r['vs_label']}"
                if r.get("goal") is not None:
                    vs += f" ({'meets' if r['meets_goal'] else 'misses'} <= {r['goal']:.2f})"
            notes = "; ".join(filter(None, [r.get("error"), r.get("note"),
                                            f"graph: {r['graph_error']}" if r.get("graph_error") else None]))
            cells.append([r["case"], r["impl"], r.get("layout", ""), time_cell, benchlib.fmt(r.get("graph_us"), ".2f"),
                          benchlib.fmt(r.get("loop_us"), ".2f"), benchlib.fmt(r.get("gbps"), ".0f"),
                          benchlib.fmt(r.get("pct_copy"), ".0f", "%"), benchlib.fmt(r.get("graph_clean_us"), ".2f"),
                          benchlib.fmt(r.get("clean_gbps"), ".0f"), benchlib.fmt(r.get("pct_copy_clean"), ".0f", "%"),
                          vs, benchlib.fmt(r.get("rel_err"), ".1e"),
                          notes])
        lines += benchlib.markdown_table(header, cells) + [""]
    if document["rows"]:
        lines += ["`vs`: this row's µs over the named row's µs in the same case (below 1: faster); paged rows "
                  "against the contiguous cache (flex-paged against row 1-4's flex), RoPE rows against the same "
                  "call without RoPE, `-nopdl` rows against the same call with PDL, peers against AttnFuse (`attnfuse-full` where `attnfuse` has no time). "
                  "`n/a`: the call raised (text in notes); `FAIL`: wrong output, not timed.", ""]
    return lines


def write(document: dict, args: argparse.Namespace, stem: str, final: bool) -> Path:
    meta = document["metadata"]
    markdown = [f"# Decode-step attention ({meta['gpu'] or 'CPU'})", ""]
    markdown += benchlib.metadata_lines(meta)
    markdown += [f"- dtype: {args.dtype}; sizes: {'smoke (tiny)' if args.smoke else 'the issue'}",
                 "- timing: " + ("µs = CUDA events per call, L2 flushed (256 MiB zeroed) before each, median of "
                                 f"{args.reps} after {args.warmup}; graph µs = the call as a CUDA graph, replayed "
                                 f"the same way; loop µs = {args.graph_calls} calls in one graph, replay / "
                                 f"{args.graph_calls}, warm L2; graph µs (clean) = the graph replayed after a 256 MiB read "
                                 "instead (clean lines: the call pays no write-back of the flush's dirty lines)"
                                 if document["device"] == "cuda" else
                                 "CPU wall clock (smoke test: the times mean nothing)"),
                 "- GB/s = K and V bytes attended (sum of kv_lens * Hkv * D * 2 * bytes per element) / µs",
                 f"- flex: {args.flex}; attnfuse: {meta.get('attnfuse_path')}; "
                 f"TRITON_INTERPRET={meta.get('triton_interpret')}"]
    if not final:
        markdown.append("- **partial: the run was still going (or was cut short) when this was written**")
    markdown.append("")
    markdown += tables(document)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / f"{stem}.json"
    json_path.write_text(json.dumps(benchlib.json_safe({**document, "final": final}), indent=1) + "\n")
    (out / f"{stem}.md").write_text("\n".join(markdown) + "\n")
    return json_path


def plot(document: dict, path: Path) -> None:
    """GB/s and µs against the K/V bytes attended, per implementation (Nq = 1 rows 1-6)."""
    gbps: dict[str, dict[float, float]] = {}
    times: dict[str, dict[float, float]] = {}
    for r in document["rows"]:
        if r.get("us") and r["Nq"] == 1 and r["row"] in "123456" and not r["impl"].endswith("-full"):
            label = r["impl"] + (" (ragged)" if r["row"] == "6" else "")
            mib = r["kv_bytes"] / 2**20
            gbps.setdefault(label, {})[mib] = r["gbps"]
            times.setdefault(label, {})[mib] = r["us"]
    if not gbps:
        return
    copy = document["copy"].get("rw_gbps")
    panels = [{"series": gbps, "xlabel": "K and V bytes attended (MiB)", "ylabel": "effective GB/s",
               "xscale": "log2", "yscale": "linear",
               "hline": (copy, f"copy, read + write ({copy:.0f} GB/s)") if copy else None},
              {"series": times, "xlabel": "K and V bytes attended (MiB)", "ylabel": "µs per decode call",
               "xscale": "log2", "yscale": "log"}]
    title = f"decode attention, {document['config']['dtype']}, on {document['metadata']['gpu'] or 'CPU'}"
    with contextlib.suppress(Exception):
        written = benchlib.plot_panels(path, title, panels)
        if written:
            print(f"wrote {written}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default=",".join(ROWS), help="comma-separated subset of 1-8 (default all)")
    parser.add_argument("--reps", type=int, default=None, help="timed calls per measurement (default 100; smoke 2)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed calls first (default 10; smoke 1)")
    parser.add_argument("--graph-calls", type=int, default=16, help="calls per graph in the loop timing")
    parser.add_argument("--dtype", choices=["fp16", "bf16", "fp32"], default=None, help="default fp16 (smoke fp32)")
    parser.add_argument("--flex", choices=["compiled", "eager"], default=None,
                        help="torch.compile(flex_attention) (default) or flex uncompiled (smoke default: compiling "
                        "flex on the CPU costs ~12 s a shape)")
    parser.add_argument("--tol", type=float, default=2e-2, help="relative error allowed against the reference")
    parser.add_argument("--time-budget", type=float, default=210.0,
                        help="seconds after which no new case starts (default 210; the rows say what was skipped)")
    parser.add_argument("--out", type=Path, default=benchlib.ROOT / "bench" / "results")
    parser.add_argument("--paged-forms", default="hoisted",
                        help=f"comma-separated AttnFuse paged forms for rows 5 and 6, of {', '.join(PAGED_FORMS)} "
                        "(default hoisted; unhoisted adds attnfuse-paged<P>-unhoisted rows)")
    parser.add_argument("--pdl-forms", default="on",
                        help=f"comma-separated forms of AttnFuse's split-decode merge launch, of {', '.join(PDL_FORMS)} "
                        "(default on: launched as the split kernel's programmatic dependent; off adds "
                        "attnfuse-nopdl / attnfuse-paged<P>-nopdl rows, ordinary launches)")
    parser.add_argument("--smoke", action="store_true",
                        help="CPU, tiny sizes (4q/2kv/D16, L <= 128), fp32, 1 warmup + 2 timed calls, flex eager")
    args = parser.parse_args(argv)
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    paged_forms = tuple(f.strip() for f in args.paged_forms.split(",") if f.strip())
    if not paged_forms or any(f not in PAGED_FORMS for f in paged_forms):
        parser.error(f"--paged-forms takes {', '.join(PAGED_FORMS)}, got {args.paged_forms!r}")
    pdl_forms = tuple(f.strip() for f in args.pdl_forms.split(",") if f.strip())
    if not pdl_forms or any(f not in PDL_FORMS for f in pdl_forms):
        parser.error(f"--pdl-forms takes {', '.join(PDL_FORMS)}, got {args.pdl_forms!r}")
    for r in rows:
        if r not in ROWS:
            parser.error(f"unknown row {r!r}; choose from {', '.join(ROWS)}")

    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    if device == "cpu" and not args.smoke:
        print("decode.py: no CUDA device; pass --smoke to check the script on the CPU", file=sys.stderr)
        return 2
    if device == "cuda" and os.environ.get("TRITON_INTERPRET") == "1":
        benchlib.log("decode.py: TRITON_INTERPRET=1 is set: AttnFuse's kernels run in Triton's interpreter")
    sizes = SMOKE if args.smoke else FULL
    args.reps = args.reps if args.reps is not None else (2 if args.smoke else 100)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.smoke else 10)
    args.dtype = args.dtype or ("fp32" if args.smoke else "fp16")
    args.flex = args.flex or ("eager" if args.smoke else "compiled")
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    if importlib.util.find_spec("attnfuse") is None:
        sys.path.append(str(benchlib.ROOT))  # run as `python3 bench/decode.py` without PYTHONPATH
    attnfuse_path = None
    with contextlib.suppress(Exception):
        import attnfuse  # picks Triton's interpreter (CPU) before torch.compile imports Triton

        attnfuse_path = attnfuse.__file__
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False

    started = time.perf_counter()
    meta = benchlib.metadata(device)
    meta["triton_interpret"] = os.environ.get("TRITON_INTERPRET")
    meta["attnfuse_path"] = attnfuse_path
    timer = Timer(args, device)
    copy = copy_bandwidth(timer, device, sizes.copy_bytes)
    benchlib.log(f"copy: {copy}")
    peers = Peers(args, device)
    cases = build_cases(sizes, rows, paged_forms, pdl_forms)
    config = {key: (str(value) if isinstance(value, Path) else value) for key, value in vars(args).items()}
    document: dict[str, Any] = {"metadata": meta, "device": device, "config": config, "copy": copy,
                                "sizes": dataclasses.asdict(sizes), "rows": []}
    if "6" in rows:
        document["ragged_lengths"] = ragged_lengths(sizes)
        print(f"ragged lengths (seed 0): {document['ragged_lengths']}", flush=True)
    stem = f"{benchlib.stamp()}-decode"
    with benchlib.CaseProgress(sum(len(c.impls) for c in cases)) as progress:
        for index, case in enumerate(cases):
            if time.perf_counter() - started > args.time_budget:
                for name in case.impls:
                    progress.step(f"row {case.row} {case.name} {name} (skipped)")
                document["rows"] += [{"row": case.row, "case": case.name, "impl": name, "Nq": case.nq,
                                      "status": "skipped", "kv_bytes": 0,
                                      "error": f"skipped: time budget of {args.time_budget:g} s spent"}
                                     for name in case.impls]
                continue
            benchlib.log(f"row {case.row}: {case.name} (Nq={case.nq}, {sum(case.lengths)} tokens)")
            document["rows"] += run_case(case, peers, timer, args, device, dtype, 1000 + index, copy, progress)
            add_ratios(document["rows"])
            write(document, args, stem, final=False)
    document["elapsed_s"] = time.perf_counter() - started
    add_ratios(document["rows"])
    json_path = write(document, args, stem, final=True)
    print("\n".join(tables(document)))
    print(f"wrote {json_path}\nwrote {json_path.with_suffix('.md')}")
    plot(document, json_path.with_suffix(".png"))
    benchlib.log(f"decode.py: {document['elapsed_s']:.0f} s")
    return 1 if any(r["status"] == "FAIL" for r in document["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())

"""An independent float64 reference of the public semantics (DESIGN.md, docs/semantics.md),
written for the semantic audit (`test_semantics_audit.py`) from the documents alone: it shares
no code with `attnfuse.runtime.reference`, so a misreading of the contract there shows up here.

It takes its block parameters as keywords, not a spec, to stay independent of the DSL's
objects: `audit_attention(q, k, v, causal=True, window=8, ...)`.
"""

from __future__ import annotations

import math

import torch


def default_alibi_slopes(n: int) -> torch.Tensor:
    """The ALiBi paper's slopes for `n` heads, its rule for a non-power-of-two count included."""

    def power_of_two(m: int) -> list[float]:
        return [2.0 ** (-8.0 * (h + 1) / m) for h in range(m)]

    m = 2 ** int(math.floor(math.log2(n)))
    slopes = power_of_two(m)
    if m != n:
        slopes += power_of_two(2 * m)[0::2][: n - m]
    return torch.tensor(slopes, dtype=torch.float64)


def llama3_frequencies(f: torch.Tensor, factor, low, high, original) -> torch.Tensor:
    wavelength = 2 * math.pi / f
    s = (original / wavelength - low) / (high - low)
    blended = (1 - s) * f / factor + s * f
    return torch.where(wavelength < original / high, f,
                       torch.where(wavelength > original / low, f / factor, blended))


def rotate(x: torch.Tensor, pos: torch.Tensor, theta: float, rotary_dim: int | None,
           interleaved: bool, scaling: tuple | None) -> torch.Tensor:
    """`R(pos) x` for `x [B, H, N, D]` (float64) and `pos` `[N]` or `[B, N]`."""
    d = x.shape[-1]
    r = rotary_dim or d
    t = torch.arange(r // 2, dtype=torch.float64)
    f = theta ** (-2.0 * t / r)
    if scaling is not None:
        f = llama3_frequencies(f, *scaling)
    pos = pos.to(torch.float64)
    if pos.dim() == 1:
        pos = pos.expand(x.shape[0], -1)
    angle = pos[:, None, :, None] * f  # [B, 1, N, r/2]
    cos, sin = torch.cos(angle), torch.sin(angle)
    rot, rest = x[..., :r], x[..., r:]
    if interleaved:
        a, b = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    else:
        a, b = rot[..., : r // 2], rot[..., r // 2:]
        out = torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)
    return torch.cat((out, rest), dim=-1)


def audit_attention(
    q, k, v, *, scale=None, rope=None, softcap=None, alibi=None, bias=None, causal=False,
    window=None, block_size=None, block_layout=None, doc_ids=None, normalizer="softmax",
    sigmoid_bias=None, q_positions=None, k_positions=None,
):
    """Output `[B, Hq, Nq, Dv]` and lse `[B, Hq, Nq]` (softmax; None otherwise), float64,
    differentiable with respect to q, k, v and the bias.

    `rope`: a dict of `theta`, `rotary_dim`, `interleaved`, `scaling` (a 4-tuple) or None;
    `alibi`: True for the default slopes or a list of slopes."""
    q, k, v = q.double(), k.double(), v.double()
    b, hq, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    q_pos = torch.arange(nq) + (nk - nq)
    k_pos = torch.arange(nk)
    if rope is not None:
        args = (rope.get("theta", 10000.0), rope.get("rotary_dim"), rope.get("interleaved", False),
                rope.get("scaling"))
        q = rotate(q, q_pos if q_positions is None else q_positions, *args)
        k = rotate(k, k_pos if k_positions is None else k_positions, *args)
    group = hq // hkv
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scale = d ** -0.5 if scale is None else scale
    s = scale * q @ k.transpose(-1, -2)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    dist = (k_pos[None, :] - q_pos[:, None]).double()  # [Nq, Nk]
    if alibi is not None:
        slopes = default_alibi_slopes(hq) if alibi is True else torch.tensor(alibi, dtype=torch.float64)
        s = s + slopes[:, None, None] * dist
    if bias is not None:
        s = s + bias.double()
    kept = torch.ones(b, hq, nq, nk, dtype=torch.bool)
    if causal:
        kept &= dist <= 0
    if window is not None:
        kept &= dist.abs() < window
    if block_layout is not None:
        rows = torch.arange(nq) // block_size
        cols = torch.arange(nk) // block_size
        lay = block_layout.cpu()
        if lay.dim() == 2:
            kept &= lay[rows][:, cols]
        else:
            kept &= lay[:, rows][:, :, cols][None]
    if doc_ids is not None:
        ids = doc_ids.cpu().long()
        if ids.dim() == 1:
            ids = ids.expand(b, -1)
        inside = (q_pos >= 0) & (q_pos < nk)
        q_ids = torch.full((b, nq), -1, dtype=torch.long)
        q_ids[:, inside] = ids[:, q_pos[inside]]
        same = (q_ids[:, :, None] == ids[:, None, :]) & (ids[:, None, :] >= 0)
        kept &= same[:, None]
    if normalizer == "softmax":
        kept = kept & ~torch.isneginf(s.detach())
        masked = torch.where(kept, s, torch.full_like(s, -math.inf))
        m = masked.detach().amax(dim=-1, keepdim=True)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        e = torch.where(kept, torch.exp(torch.where(kept, s, torch.zeros_like(s)) - m), torch.zeros_like(s))
        total = e.sum(-1, keepdim=True)
        safe = torch.where(total > 0, total, torch.ones_like(total))
        p = e / safe
        lse = torch.where(total > 0, torch.log(safe) + m, torch.full_like(total, -math.inf)).squeeze(-1)
    elif normalizer == "relu":
        p = torch.where(kept, torch.relu(s) / nk, torch.zeros_like(s))
        lse = None
    else:
        sb = -math.log(nk) if sigmoid_bias is None else sigmoid_bias
        p = torch.where(kept, torch.sigmoid(s + sb), torch.zeros_like(s))
        lse = None
    return p @ v, lse

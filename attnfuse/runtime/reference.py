"""A plain-PyTorch reference, written from DESIGN.md's semantics and nothing else.

It shares no code with the compiler: it materializes the whole score matrix in float64 (by
default) and applies each block as the brief defines it. Tests compare the generated kernels
against it; it is also the readable statement of what each block means.
"""

from __future__ import annotations

import math

import torch

from attnfuse.dsl.blocks import Causal, Rope, ScaledDotProduct, SlidingWindow
from attnfuse.dsl.spec import AttentionSpec


def rope_inverse_frequencies(theta: float, rotary_dim: int) -> torch.Tensor:
    """`theta^(-2t/r)` for `t < r/2`, rounded to fp32 (the rotation is computed in fp32)."""
    t = torch.arange(rotary_dim // 2, dtype=torch.float64)
    return (theta ** (-2.0 * t / rotary_dim)).to(torch.float32)


def rotate(x: torch.Tensor, positions: torch.Tensor, block: Rope) -> torch.Tensor:
    """`R(pos) x` over the last dim of `x [..., N, D]`, in the dtype of `x` (fp64 here)."""
    d = x.shape[-1]
    r = block.rotary_dim or d
    # The angle is an fp32 product, as the semantics say the rotation is computed in fp32.
    inv_freq = rope_inverse_frequencies(block.theta, r).to(positions.device)
    angle = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    cos, sin = angle.double().cos().to(x.dtype), angle.double().sin().to(x.dtype)
    if block.interleaved:
        a, b = x[..., 0:r:2], x[..., 1:r:2]
    else:
        a, b = x[..., : r // 2], x[..., r // 2 : r]
    a_rot, b_rot = a * cos - b * sin, a * sin + b * cos
    out = x.clone()
    if block.interleaved:
        out[..., 0:r:2], out[..., 1:r:2] = a_rot, b_rot
    else:
        out[..., : r // 2], out[..., r // 2 : r] = a_rot, b_rot
    return out


def keep_mask(spec: AttentionSpec, n_q: int, n_k: int) -> torch.Tensor:
    """`[Nq, Nk]` bool: key j kept for query i by every mask of the spec."""
    q_pos = torch.arange(n_q)[:, None] + (n_k - n_q)
    k_pos = torch.arange(n_k)[None, :]
    keep = torch.ones(n_q, n_k, dtype=torch.bool)
    if spec.block(Causal) is not None:
        keep &= k_pos <= q_pos
    window = spec.block(SlidingWindow)
    if isinstance(window, SlidingWindow):
        keep &= (q_pos - k_pos).abs() < window.window
    return keep


def reference_attention(
    spec: AttentionSpec,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    return_lse: bool = False,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str = "cpu",
):
    """The variant's output (and log-sum-exp) computed naively in `dtype` on `device`
    (float64 on the CPU by default: slow and plainly right)."""
    q, k, v = (t.detach().to(device, dtype) for t in (q, k, v))
    b, h_q, n_q, d = q.shape
    h_kv, n_k = k.shape[1], k.shape[2]
    group = h_q // h_kv
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    rope = spec.block(Rope)
    if isinstance(rope, Rope):
        q = rotate(q, torch.arange(n_q, device=device) + (n_k - n_q), rope)
        k = rotate(k, torch.arange(n_k, device=device), rope)
    sdp = spec.block(ScaledDotProduct)
    scale = sdp.scale if isinstance(sdp, ScaledDotProduct) and sdp.scale is not None else 1 / math.sqrt(d)
    scores = scale * q @ k.transpose(-1, -2)
    keep = keep_mask(spec, n_q, n_k).to(device)
    scores = scores.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # -inf on rows with no kept key
    # exp(s - lse) is NaN on empty rows (-inf - -inf): those rows output 0 by definition.
    probs = torch.where(keep, torch.exp(scores - lse[..., None]), torch.zeros((), dtype=dtype))
    out = probs @ v
    if return_lse:
        return out, lse.to(torch.float32)
    return out

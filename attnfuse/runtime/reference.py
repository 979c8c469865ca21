"""A plain-PyTorch reference, written from DESIGN.md's semantics and nothing else.

It shares no code with the compiler: it materializes the whole score matrix in float64 (by
default) and applies each block as the brief defines it. Tests compare the generated kernels
against it; it is also the readable statement of what each block means.
"""

from __future__ import annotations

import math

import torch

from attnfuse.dsl.blocks import (
    AdditiveBias,
    Alibi,
    BlockSparse,
    Causal,
    Llama3Scaling,
    Relu,
    Rope,
    ScaledDotProduct,
    SlidingWindow,
)
from attnfuse.dsl.spec import AttentionSpec


def rope_inverse_frequencies(
    theta: float, rotary_dim: int, scaling: Llama3Scaling | None = None
) -> torch.Tensor:
    """`theta^(-2t/r)` for `t < r/2` (with Llama-3.1 scaling if given), computed in float64
    and rounded to fp32 (the rotation is computed in fp32)."""
    t = torch.arange(rotary_dim // 2, dtype=torch.float64)
    freq = theta ** (-2.0 * t / rotary_dim)
    if scaling is not None:
        # Llama 3.1: keep high frequencies, divide low ones by `factor`, blend in between.
        wavelength = 2 * math.pi / freq
        low_wavelength = scaling.original_max_position / scaling.low_freq_factor
        high_wavelength = scaling.original_max_position / scaling.high_freq_factor
        smooth = (scaling.original_max_position / wavelength - scaling.low_freq_factor) / (
            scaling.high_freq_factor - scaling.low_freq_factor
        )
        blended = (1 - smooth) * freq / scaling.factor + smooth * freq
        freq = torch.where(
            wavelength < high_wavelength,
            freq,
            torch.where(wavelength > low_wavelength, freq / scaling.factor, blended),
        )
    return freq.to(torch.float32)


def default_alibi_slopes(heads: int) -> list[float]:
    """The ALiBi paper's slopes for `heads` heads (its rule for non-powers of two included)."""

    def geometric(n: int) -> list[float]:
        first = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [first * first**i for i in range(n)]

    if heads == 0:
        return []
    if math.log2(heads).is_integer():
        return geometric(heads)
    closest = 2 ** math.floor(math.log2(heads))
    return geometric(closest) + default_alibi_slopes(2 * closest)[0::2][: heads - closest]


def rotate(x: torch.Tensor, positions: torch.Tensor, block: Rope) -> torch.Tensor:
    """`R(pos) x` over the last dim of `x [B, H, N, D]`, in the dtype of `x` (fp64 here);
    `positions` is `[N]` or per batch `[B, N]`."""
    d = x.shape[-1]
    r = block.rotary_dim or d
    # The angle is an fp32 product, as the semantics say the rotation is computed in fp32.
    inv_freq = rope_inverse_frequencies(block.theta, r, block.scaling).to(positions.device)
    angle = positions.to(torch.float32)[..., None] * inv_freq
    if angle.dim() == 3:  # [B, N, r/2]: broadcast over heads
        angle = angle[:, None]
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


def keep_mask(
    spec: AttentionSpec, n_q: int, n_k: int, block_layout: torch.Tensor | None = None
) -> torch.Tensor:
    """`[Nq, Nk]` (or `[Hq, Nq, Nk]` for a per-head layout) bool: key j kept for query i by
    every mask of the spec."""
    q_pos = torch.arange(n_q)[:, None] + (n_k - n_q)
    k_pos = torch.arange(n_k)[None, :]
    keep = torch.ones(n_q, n_k, dtype=torch.bool)
    if spec.block(Causal) is not None:
        keep &= k_pos <= q_pos
    window = spec.block(SlidingWindow)
    if isinstance(window, SlidingWindow):
        keep &= (q_pos - k_pos).abs() < window.window
    sparse = spec.block(BlockSparse)
    if isinstance(sparse, BlockSparse) and block_layout is not None:
        rows = torch.arange(n_q) // sparse.block_size
        cols = torch.arange(n_k) // sparse.block_size
        layout = block_layout.cpu()
        keep = keep & layout[..., rows, :][..., cols]
    return keep


def reference_attention(
    spec: AttentionSpec,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    return_lse: bool = False,
    bias: torch.Tensor | None = None,
    block_layout: torch.Tensor | None = None,
    q_positions: torch.Tensor | None = None,
    k_positions: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str = "cpu",
    differentiable: bool = False,
):
    """The variant's output (and log-sum-exp) computed naively in `dtype` on `device`
    (float64 on the CPU by default: slow and plainly right). With `differentiable`, the
    result stays in the autograd graph of q, k, v and bias (see `reference_gradients`)."""

    def convert(t: torch.Tensor) -> torch.Tensor:
        return (t if differentiable else t.detach()).to(device, dtype)

    q, k, v = (convert(t) for t in (q, k, v))
    b, h_q, n_q, d = q.shape
    h_kv, n_k = k.shape[1], k.shape[2]
    group = h_q // h_kv
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    rope = spec.block(Rope)
    if isinstance(rope, Rope):
        # RoPE positions: given per call ([N] or [B, N]), else the default ones.
        q_at = torch.arange(n_q) + (n_k - n_q) if q_positions is None else q_positions.cpu()
        k_at = torch.arange(n_k) if k_positions is None else k_positions.cpu()
        q = rotate(q, q_at.to(device), rope)
        k = rotate(k, k_at.to(device), rope)
    sdp = spec.block(ScaledDotProduct)
    scale = sdp.scale if isinstance(sdp, ScaledDotProduct) and sdp.scale is not None else 1 / math.sqrt(d)
    scores = scale * q @ k.transpose(-1, -2)
    alibi = spec.block(Alibi)
    if isinstance(alibi, Alibi):
        slopes = alibi.slopes if alibi.slopes is not None else default_alibi_slopes(h_q)
        slope = torch.tensor(slopes, dtype=dtype, device=device)[None, :, None, None]
        distance = (torch.arange(n_k)[None, :] - (torch.arange(n_q)[:, None] + (n_k - n_q)))
        scores = scores + slope * distance.to(device, dtype)
    if spec.block(AdditiveBias) is not None and bias is not None:
        scores = scores + convert(bias)
    keep = keep_mask(spec, n_q, n_k, block_layout).to(device)
    if keep.dim() == 3:
        keep = keep[None]
    scores = scores.masked_fill(~keep, float("-inf"))
    if spec.block(Relu) is not None:
        probs = torch.where(keep, torch.relu(scores) / n_k, torch.zeros((), dtype=dtype, device=device))
        return probs @ v
    # Rows with no kept key output 0 and have lse -inf by definition, as do rows whose every
    # kept score is -inf (a bias of -inf drops a key like a mask). Their scores are replaced by
    # 0 before the softmax so that neither exp(-inf - -inf) nor its gradient is NaN. NaN and
    # +inf scores are not special: they propagate as in any softmax.
    empty = torch.isneginf(torch.logsumexp(scores.detach(), dim=-1))
    scores = scores.masked_fill(empty[..., None], 0.0)
    lse = torch.logsumexp(scores, dim=-1)
    weighted = keep & ~empty[..., None]
    probs = torch.where(weighted, torch.exp(scores - lse[..., None]), torch.zeros((), dtype=dtype, device=device))
    lse = lse.masked_fill(empty, float("-inf"))
    out = probs @ v
    if return_lse:
        return out, (lse if differentiable else lse.to(torch.float32))
    return out


def reference_gradients(
    spec: AttentionSpec,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    grad_out: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    grad_lse: torch.Tensor | None = None,
    **kwargs,
) -> dict[str, torch.Tensor]:
    """Gradients of `sum(out * grad_out) + sum(lse * grad_lse)` with respect to q, k, v (and
    `bias`, at its own broadcast shape, when given), by autograd through the float64 reference.
    """
    leaves = {name: t.detach().double().requires_grad_() for name, t in (("q", q), ("k", k), ("v", v))}
    if bias is not None:
        leaves["bias"] = bias.detach().double().requires_grad_()
    result = reference_attention(
        spec, leaves["q"], leaves["k"], leaves["v"], bias=leaves.get("bias"),
        return_lse=grad_lse is not None, differentiable=True, **kwargs,
    )
    if grad_lse is not None:
        out, lse = result
        # The returned lse is fp32 (the kernels' type): differentiate the fp64 one instead.
        loss = (out * grad_out.double()).sum() + (lse.double().masked_fill(torch.isneginf(lse), 0.0) * grad_lse.double()).sum()
    else:
        loss = (result * grad_out.double()).sum()
    names = list(leaves)
    grads = torch.autograd.grad(loss, [leaves[n] for n in names], allow_unused=True)
    return {n: (torch.zeros_like(leaves[n]) if g is None else g) for n, g in zip(names, grads)}


def gradient_errors(got: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> dict[str, float]:
    """`||g - ref|| / ||ref||` per gradient in `got` (names as `reference_gradients` returns
    them), the measure the backward's bounds are stated in. A gradient whose reference is
    tiny against dv's (a bias constant along keys: softmax is shift-invariant) is measured
    against 1e-3 of dv's norm instead, not against rounding noise."""
    floor = reference["v"].norm().item() * 1e-3
    return {
        name: (grad.double() - reference[name].to(grad.device)).norm().item()
        / max(reference[name].norm().item(), floor)
        for name, grad in got.items()
    }

"""Merging two attentions over disjoint key sets: `merge_states(o1, lse1, o2, lse2)`.

Softmax attention over a key set `K1 ∪ K2` (disjoint) is a mix of the attentions over `K1`
and over `K2`, each given by its output and the log-sum-exp of its scores:

    lse = log(exp(lse1) + exp(lse2))
    o   = exp(lse1 - lse) · o1 + exp(lse2 - lse) · o2

Cascade (shared-prefix) decoding attends to a prefix shared by a batch and to each sequence's
own keys separately and merges the two; context parallelism merges the partial attentions of
the devices that hold the key shards. Merging is exact and associative, so any number of parts
merge in any order.

A set in which a row keeps no key has `lse = -inf` (and an `o` row of 0, as AttnFuse returns),
and contributes nothing: the merged row is the other set's, exactly. A row empty in both is 0
with `lse = -inf`. Neither the forward nor the gradients ever produce NaN for such rows: the
weights are formed from a finite shift (the larger lse, or 0 when both are -inf), and the
normalizer of an empty row is replaced by 1 before it divides or enters the log.

This is plain PyTorch: it is differentiable with respect to all four inputs and traces into a
`torch.compile(fullgraph=True)` graph with no break (no host syncs, no branches on values).
"""

from __future__ import annotations

import torch

from attnfuse.errors import ArgumentError

OUTPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
"""The dtypes of `o1`/`o2`: the kernels' three, and float64 (the reference's)."""


def merge_states(
    o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor, lse2: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention over the union of two disjoint key sets, from the attention over each.

    `o1`, `o2`: `[B, H, N, Dv]`, each set's output (float16, bfloat16, float32 or float64, the
    same for both); `lse1`, `lse2`: `[B, H, N]` float32, each set's natural-log log-sum-exp
    (`fn(q, k, v, return_lse=True)`; `-inf` for a row with no kept key). Returns `(o, lse)`:
    `lse = logaddexp(lse1, lse2)`, `o = exp(lse1 - lse) o1 + exp(lse2 - lse) o2`, computed in
    float32 (float64 for float64 outputs), `o` in `o1`'s dtype and `lse` in float32. With
    float64 outputs the lse may be float64 too, and is then returned in float64.

    Raises `ArgumentError` naming the argument for a non-tensor, a wrong rank, mismatched
    shapes, dtypes or devices, or an lse that is not float32."""
    _check(o1, lse1, o2, lse2)
    compute = torch.float64 if o1.dtype == torch.float64 else torch.float32
    a, b = lse1.to(compute), lse2.to(compute)
    # Shift by the larger lse; a row empty in both (-inf, -inf) is shifted by 0 instead, so
    # that no weight is exp(-inf - -inf). The merge does not depend on the shift, so it takes
    # no gradient.
    shift = torch.maximum(a, b).detach()
    shift = torch.where(torch.isneginf(shift), 0.0, shift)
    w1, w2 = torch.exp(a - shift), torch.exp(b - shift)  # in [0, 1]; one is 1 unless empty
    total = w1 + w2
    empty = total == 0
    # An empty row divides by 1 and takes no log: its weights are 0 and its lse -inf, with
    # zero gradients (a log(0) or x / 0 would send inf · 0 = NaN back through `where`).
    total = torch.where(empty, 1.0, total)
    lse = torch.where(empty, float("-inf"), shift + torch.log(total))
    # The products promote half outputs to the weights' float32 (no copy of o1, o2 is made).
    part1, part2 = (w1 / total)[..., None] * o1, (w2 / total)[..., None] * o2
    # A row empty in one set is the other's, bit for bit: not `0 · o1 + o2`, which turns a
    # -0.0 of o2 into +0.0 (and whatever o1 holds there, an inf say, into NaN).
    o = torch.where((w1 == 0)[..., None], part2, torch.where((w2 == 0)[..., None], part1, part1 + part2))
    o = torch.where(empty[..., None], 0.0, o)  # empty in both: +0 whichever order
    return o.to(o1.dtype), lse.to(lse1.dtype)


def _check(o1: object, lse1: object, o2: object, lse2: object) -> None:
    """One `ArgumentError` per mistake, naming the argument at fault."""
    args = {"o1": o1, "lse1": lse1, "o2": o2, "lse2": lse2}
    for name, t in args.items():
        if not isinstance(t, torch.Tensor):
            raise ArgumentError(
                f"merge_states: {name} must be a torch.Tensor, got {type(t).__name__}"
            )
    for name in ("o1", "o2"):
        if args[name].dim() != 4:
            raise ArgumentError(
                f"merge_states: {name} must be 4-D [batch, heads, seq, dim], "
                f"got shape {tuple(args[name].shape)}"
            )
    for name in ("lse1", "lse2"):
        if args[name].dim() != 3:
            raise ArgumentError(
                f"merge_states: {name} must be 3-D [batch, heads, seq], "
                f"got shape {tuple(args[name].shape)}"
            )
    if o1.shape != o2.shape:
        raise ArgumentError(
            f"merge_states: o2 must have o1's shape {tuple(o1.shape)}, got {tuple(o2.shape)}"
        )
    for name, o in (("lse1", o1), ("lse2", o2)):
        if args[name].shape != o.shape[:3]:
            raise ArgumentError(
                f"merge_states: {name} must have shape {tuple(o.shape[:3])} (the o's "
                f"[batch, heads, seq]), got {tuple(args[name].shape)}"
            )
    if o1.dtype not in OUTPUT_DTYPES:
        raise ArgumentError(
            f"merge_states: o1 has dtype {o1.dtype}; supported: float16, bfloat16, float32, float64"
        )
    if o2.dtype != o1.dtype:
        raise ArgumentError(f"merge_states: o2 must have o1's dtype {o1.dtype}, got {o2.dtype}")
    lse_dtypes = (torch.float32, torch.float64) if o1.dtype == torch.float64 else (torch.float32,)
    for name in ("lse1", "lse2"):
        if args[name].dtype not in lse_dtypes:
            raise ArgumentError(
                f"merge_states: {name} must be float32"
                + (" or float64" if len(lse_dtypes) == 2 else "")
                + f" (a log-sum-exp), got {args[name].dtype}"
            )
    if lse2.dtype != lse1.dtype:
        raise ArgumentError(
            f"merge_states: lse2 must have lse1's dtype {lse1.dtype}, got {lse2.dtype}"
        )
    for name, t in args.items():
        if t.device != o1.device:
            raise ArgumentError(
                f"merge_states: {name} must be on o1's device {o1.device}, got {t.device}"
            )

"""The reference: an interpreter of the attn dialect in plain PyTorch.

It evaluates a variant's attn program op by op on whole tensors: the score matrix is
materialized in float64 (by default), and each op applies its meaning as its block defines it
(`evaluate` of the op's interface, in the block's file under `attnfuse/blocks/`; the core ops,
rotation, scores and value product, are here). It shares nothing with the kernels' lowering:
no tiles, no online softmax, no block lists. Tests compare the generated kernels against it,
for DSL variants and for hand-written attn IR alike.

Values of the interpreter: operands are `[B, Hq, N, D]` tensors (key and value heads repeated
over their GQA group), scores are (scores, keep) pairs, `keep` the bool mask of entries no
filter dropped (a dropped entry is a mark, whatever a modifier does to its score).
"""

from __future__ import annotations

import math

import torch

from dataclasses import dataclass, field
from typing import Any

from xdsl.ir import Operation, SSAValue

from attnfuse.dialects import attn
from attnfuse.dialects.interfaces import KeyFilter, Normalizer, ScoreModifier, normalizer_semantics
from attnfuse.errors import ArgumentError
from attnfuse.runtime.call_data import given_positions, refuse_non_strided, refuse_undeclared_data
from attnfuse.runtime.config import KEY_POSITIONS_WITH_GIVEN_KEY, check_placement_request
from attnfuse.runtime.inputs import REFERENCE_DTYPES, check_inputs, check_tensor
from attnfuse.runtime.program import DATA_KEYWORDS, as_program
from attnfuse.transforms.place_rope import give_key_rotation, key_rotation


def rope_inverse_frequencies(
    theta: float, rotary_dim: int, scaling: Any = None
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
        # In [0, 1] where it is used; clamped against the quotients' rounding (with the two
        # factors a few ulps apart it can leave the range and the blend exceed both ends).
        smooth = smooth.clamp(0.0, 1.0)
        blended = (1 - smooth) * freq / scaling.factor + smooth * freq
        freq = torch.where(
            wavelength < high_wavelength,
            freq,
            torch.where(wavelength > low_wavelength, freq / scaling.factor, blended),
        )
    return freq.to(torch.float32)


def rotate(x: torch.Tensor, positions: torch.Tensor, block: Any) -> torch.Tensor:
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


@dataclass
class Evaluation:
    """What the ops' `evaluate` methods see of a call: its shapes, the default positions
    (query `i + Nk - Nq`, key `j`), the call-time data by name (`bias`, `block_layout`,
    `doc_ids`, as the caller gave them) and
    the dtype and device the reference computes in."""

    batch: int
    heads_q: int
    seq_q: int
    seq_k: int
    dtype: torch.dtype
    device: torch.device | str
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def q_pos(self) -> torch.Tensor:
        return (torch.arange(self.seq_q) + (self.seq_k - self.seq_q)).to(self.device)

    @property
    def k_pos(self) -> torch.Tensor:
        return torch.arange(self.seq_k).to(self.device)


@dataclass(frozen=True)
class Llama3Params:
    """Llama-3.1's frequency scaling (the fields of `af.llama3_scaling`)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position: float


@dataclass(frozen=True)
class Rotation:
    """What `rotate` needs of a rotation (the fields of `af.rope`; a DSL `Rope` block will
    do too)."""

    theta: float
    rotary_dim: int | None
    interleaved: bool
    scaling: Llama3Params | None


def rope_block(op: attn.RopeOp) -> Rotation:
    """The rotation an `attn.rope` op applies."""
    theta, rotary_dim, interleaved, scaling = op.rope_key
    return Rotation(theta, rotary_dim, interleaved, None if scaling is None else Llama3Params(*scaling))


def evaluate_variant(variant: attn.VariantOp, inputs: dict[str, Any], env: Evaluation) -> tuple[Any, Any]:
    """Runs a variant's program on `inputs` (q, k, v and the call-time position tensors);
    returns the output and the log-sum-exp (None for normalizers without one)."""
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    group = q.shape[1] // k.shape[1]
    values: dict[SSAValue, Any] = {
        variant.query: q,
        variant.key: k.repeat_interleave(group, dim=1),
        variant.value: v.repeat_interleave(group, dim=1),
    }
    for arg in variant.body.block.args[3:]:
        if isinstance(arg.type, attn.PositionsType):
            values[arg] = inputs.get(f"{arg.type.role.data[0]}_positions")
    lse = None
    live = live_ops(variant)
    for op in variant.body.block.ops:
        if isinstance(op, attn.YieldOp):
            return values[op.output], lse
        if op not in live:
            continue  # nothing reads its result: it computes nothing, and reads no data
        result, op_lse = evaluate_op(op, values, env)
        if op_lse is not None:
            lse = op_lse
        values[op.results[0]] = result
    raise AssertionError("a verified variant ends in attn.yield")


def live_ops(variant: attn.VariantOp) -> set[Operation]:
    """The ops the variant's output depends on (walking back from `attn.yield`)."""
    live: set[Operation] = set()
    pending = [variant.body.block.last_op]
    while pending:
        op = pending.pop()
        if op is None or op in live:
            continue
        live.add(op)
        pending += [v.owner for v in op.operands if isinstance(v.owner, Operation)]
    return live


def evaluate_op(op: Operation, values: dict[SSAValue, Any], env: Evaluation) -> tuple[Any, Any]:
    """One op's result from its operands' values (and a log-sum-exp, for a normalizer)."""
    if isinstance(op, attn.RopeOp):
        if op.given:
            return values[op.input], None  # the key arrives rotated: used as it is
        default = env.q_pos if isinstance(op.input.type, attn.QueryType) else env.k_pos
        given = values.get(op.positions) if op.positions is not None else None
        positions = default if given is None else given.to(env.device)
        return rotate(values[op.input], positions, rope_block(op)), None
    if isinstance(op, attn.ScoresOp):
        q, k = values[op.query], values[op.key]
        scale = op.scale.value.data if op.scale is not None else 1 / math.sqrt(q.shape[-1])
        scores = scale * q @ k.transpose(-1, -2)
        return (scores, torch.ones((), dtype=torch.bool, device=scores.device)), None
    if isinstance(op, attn.PVOp):
        return values[op.probs] @ values[op.value], None
    if (modifier := op.get_trait(ScoreModifier)) is not None:
        scores, keep = values[op.operands[0]]
        return (modifier.evaluate(op, scores, env), keep), None
    if (key_filter := op.get_trait(KeyFilter)) is not None:
        scores, keep = values[op.operands[0]]
        return (scores, keep & key_filter.evaluate(op, env).to(scores.device)), None
    if (normalizer := op.get_trait(Normalizer)) is not None:
        scores, keep = values[op.operands[0]]
        keep = keep.expand(scores.shape)
        return normalizer.evaluate(op, scores, keep, env)
    raise ArgumentError(f"the reference cannot evaluate {op.name}")


def keep_mask(
    source: object, n_q: int, n_k: int, block_layout: torch.Tensor | None = None
) -> torch.Tensor:
    """`[Nq, Nk]` (or `[Hq, Nq, Nk]` for a per-head layout) bool: key j kept for query i by
    every filter of the variant (a spec or attn IR)."""
    variant = as_program(source).default()
    env = Evaluation(1, 1, n_q, n_k, torch.float64, "cpu", {} if block_layout is None else {"block_layout": block_layout})
    keep = torch.ones(n_q, n_k, dtype=torch.bool)
    for op in variant.chain:
        trait = op.get_trait(KeyFilter)
        if trait is not None:
            keep = keep & trait.evaluate(op, env)
    # Filters give masks broadcastable to [B, Hq, Nq, Nk] whose leading dims are 1 here: keep
    # the query head dim only for a per-head layout.
    dims = 3 if block_layout is not None and block_layout.dim() == 3 else 2
    return keep.reshape(keep.shape[-dims:])


def reference_attention(
    source: object,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    return_lse: bool = False,
    bias: torch.Tensor | None = None,
    block_layout: torch.Tensor | None = None,
    q_positions: torch.Tensor | None = None,
    k_positions: torch.Tensor | None = None,
    rope_placement: str | tuple[str, str] = "auto",
    dtype: torch.dtype = torch.float64,
    device: torch.device | str = "cpu",
    differentiable: bool = False,
    kv_lens: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    **data: torch.Tensor,
):
    """The variant's output (and log-sum-exp) computed naively in `dtype` on `device`
    (float64 on the CPU by default: slow and plainly right), by interpreting its attn
    program (`source`: a spec, attn IR text or module). Other call-time data (`doc_ids=`)
    comes by keyword, as for a compiled call, and reaches the ops as it was given. With
    `differentiable`, the result stays in the autograd graph of q, k, v and bias (see
    `reference_gradients`).

    `rope_placement` takes what `af.compile` takes; only a key placed `"given"` changes the
    result: the key rotation is then `#attn<placement given>` and k is used as passed
    (already rotated), as the kernels of such a compile do.

    Decoding: with `kv_lens=` (an integer tensor `[B]`), k and v are a cache `[B, Hkv, L_max,
    D]` of which sequence b has keys `j < kv_lens[b]`; with `block_table=` too (an integer
    `[B, max_pages]`), k and v are page pools `[num_pages, Hkv, page_size, D]` and key j of
    sequence b is row `j % page_size` of page `block_table[b, j // page_size]`. Each sequence
    is evaluated alone, on its own keys (`Nk = kv_lens[b]`: query i at position
    `kv_lens[b] - Nq + i`), see `_decode_attention`."""

    def convert(t: torch.Tensor) -> torch.Tensor:
        return (t if differentiable else t.detach()).to(device, dtype)

    program = as_program(source)
    explicit = (q_positions is not None, k_positions is not None)
    if kv_lens is None and block_table is not None:
        raise ArgumentError("block_table= needs kv_lens= (the number of keys of each sequence)")
    unexpected = [name for name in data if name not in DATA_KEYWORDS]
    if unexpected:
        raise ArgumentError(f"unexpected argument(s) {', '.join(sorted(unexpected))} for the reference")
    if kv_lens is None:
        _check_call(program, explicit, q, k, v, {"bias": bias, "block_layout": block_layout, **data},
                    (q_positions, k_positions))
    else:  # the caches and their data are checked where they are read (`_decode_attention`)
        refuse_non_strided({"bias": bias, "block_layout": block_layout, "q_positions": q_positions,
                            "k_positions": k_positions, "kv_lens": kv_lens, "block_table": block_table, **data})
        check_tensor("q", q, REFERENCE_DTYPES)
    fixed = program.explicit_positions_of()
    module = program.module(explicit if fixed is None else fixed)
    variant = next(op for op in module.ops if isinstance(op, attn.VariantOp))
    if check_placement_request(rope_placement)[1] == "given":
        if k_positions is not None:
            raise ArgumentError(KEY_POSITIONS_WITH_GIVEN_KEY)
        give_key_rotation(variant)
    elif k_positions is not None and (rope := key_rotation(variant)) is not None and rope.given:
        raise ArgumentError(KEY_POSITIONS_WITH_GIVEN_KEY)
    q, k, v = (convert(t) for t in (q, k, v))
    b, h_q, n_q, _d = q.shape
    n_k = k.shape[2]
    tensors: dict[str, torch.Tensor] = {name: t for name, t in data.items() if t is not None}
    if bias is not None:
        tensors["bias"] = convert(bias)
    if block_layout is not None:
        tensors["block_layout"] = block_layout
    inputs = {"q": q, "k": k, "v": v, "q_positions": q_positions, "k_positions": k_positions}
    if kv_lens is None:
        env = Evaluation(b, h_q, n_q, n_k, dtype, device, tensors)
        out, lse = evaluate_variant(variant, inputs, env)
    else:
        out, lse = _decode_attention(variant, inputs, tensors, kv_lens, block_table, dtype, device)
    if return_lse:
        if lse is None:
            raise ArgumentError("return_lse=True needs a normalizer with a log-sum-exp (softmax)")
        return out, (lse if differentiable else lse.to(torch.float32))
    return out


def _check_call(program: Any, explicit: tuple[bool, bool], q: object, k: object, v: object,
                data: dict[str, Any], positions: tuple[object, object]) -> None:
    """A compiled call's checks of q, k, v, their positions and call-time data against each
    other and the program (an `ArgumentError` naming what is wrong), before any of them is
    read: the shapes, dtypes (float64 too) and devices as given; an attn program's declared
    positions passed exactly; each data tensor as the op that reads it binds it."""
    problem = check_inputs(program, q, k, v, kernels=False)  # type: ignore[arg-type]
    canonical = program.canonical(explicit)
    given_positions(program, problem, dict(zip(("q_positions", "k_positions"), positions)))
    refuse_undeclared_data(program, canonical.arguments, data, DATA_KEYWORDS)
    refuse_non_strided(data)  # before any binding reads them
    # The reference moves data to its own device and dtype: each tensor is checked as one of its
    # shape on q's device would be (float64 as float32; a broadcast stand-in, no copy).
    data = {name: torch.empty((), dtype=torch.float32 if t.dtype == torch.float64 else t.dtype,
                              device=problem.device).expand(t.shape)
            if isinstance(t, torch.Tensor) else t for name, t in data.items()}
    for binding in canonical.bindings:
        if binding.use.argument is not None:
            binding.bind(problem, data)


def _integer_tensor(t: object, name: str, shape: list[int], what: str) -> torch.Tensor:
    """`t` checked to be an int32/int64 tensor of `shape` (an `ArgumentError` naming it)."""
    if not isinstance(t, torch.Tensor):
        raise ArgumentError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in (torch.int32, torch.int64):
        raise ArgumentError(f"{name} must be int32 (or int64), got {t.dtype}")
    if list(t.shape) != shape:
        raise ArgumentError(f"{name} must have shape {what}, got {list(t.shape)}")
    return t


def gather_pages(pool: torch.Tensor, block_table: torch.Tensor, lens: list[int], l_max: int) -> torch.Tensor:
    """The contiguous cache `[B, Hkv, L_max, D]` of page pools `[num_pages, Hkv, page_size,
    D]`: sequence b's key j is row `j % page_size` of page `block_table[b, j // page_size]`.
    Only the pages holding keys `j < lens[b]` are read; the rest of the cache is 0."""
    num_pages, heads, page_size, dim = pool.shape
    caches = []
    for b, n in enumerate(lens):
        pages = [int(p) for p in block_table[b, : -(-n // page_size)].tolist()]
        for slot, page in enumerate(pages):
            if not 0 <= page < num_pages:
                raise ArgumentError(
                    f"block_table[{b}, {slot}] = {page} is not a page of the pool "
                    f"({num_pages} pages), yet sequence {b} has {n} keys"
                )
        rows = [pool[page] for page in pages]  # each [Hkv, page_size, D]
        rows.append(pool.new_zeros(heads, l_max - len(pages) * page_size, dim))
        caches.append(torch.cat(rows, dim=1))
    return torch.stack(caches)


def _decode_attention(
    variant: attn.VariantOp,
    inputs: dict[str, Any],
    tensors: dict[str, torch.Tensor],
    kv_lens: object,
    block_table: object,
    dtype: torch.dtype,
    device: torch.device | str,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`reference_attention` with `kv_lens=` (and `block_table=`): the pages gathered into a
    contiguous cache `[B, Hkv, L_max, D]`, then each sequence b evaluated alone, with its
    Nq queries against its first `Nk = kv_lens[b]` keys, so that the program's own positions
    (query i at `i + Nk - Nq`, key j at j) and `Nk` (relu's `/Nk`, sigmoid's `-ln(Nk)`) are
    the sequence's. Per-sequence data is sliced: `bias` (broadcast to `[B, Hq, Nq, L_max]`)
    and `doc_ids` (`[L_max]` or `[B, L_max]`) to the sequence's keys, `q_positions` `[B, Nq]`
    and `k_positions` (`[L_max]` or `[B, L_max]`) to the sequence's. A sequence with no key
    outputs 0 with lse -inf. The outputs (and lses) are the sequences' concatenated."""
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    if q.dim() != 4:
        raise ArgumentError(f"q must be 4-D [B, Hq, Nq, D], got shape {list(q.shape)}")
    b_size, h_q, n_q, _d = q.shape
    kv_lens = _integer_tensor(kv_lens, "kv_lens", [b_size], f"[B] = [{b_size}] (one length per sequence)")
    lens = [int(n) for n in kv_lens.tolist()]
    if k.dim() != 4 or v.dim() != 4:
        layout = "page pools [num_pages, Hkv, page_size, D]" if block_table is not None else "caches [B, Hkv, L_max, D]"
        raise ArgumentError(f"with kv_lens=, k and v must be 4-D {layout}, got k {list(k.shape)}, v {list(v.shape)}")
    if k.shape[:3] != v.shape[:3]:
        raise ArgumentError(f"k {list(k.shape)} and v {list(v.shape)} must agree in all but the last dim")
    h_kv = k.shape[1]
    if h_kv == 0 or h_q % h_kv != 0:
        raise ArgumentError(f"Hq = {h_q} query heads are not a multiple of Hkv = {h_kv} key/value heads")
    if block_table is None:
        if k.shape[0] != b_size:
            raise ArgumentError(f"k and v caches must have batch {b_size} (q's), got {k.shape[0]}")
        l_max = k.shape[2]
    else:
        shape = list(block_table.shape) if isinstance(block_table, torch.Tensor) else []
        max_pages = shape[1] if len(shape) == 2 else -1  # any other rank: a shape error below
        block_table = _integer_tensor(block_table, "block_table", [b_size, max_pages],
                                      f"[B, max_pages] = [{b_size}, max_pages]")
        l_max = max_pages * k.shape[2]
    for b, n in enumerate(lens):
        if not 0 <= n <= l_max:
            raise ArgumentError(f"kv_lens[{b}] = {n} is outside [0, {l_max}] (L_max, the cache's length)")
    if block_table is not None:
        k, v = gather_pages(k, block_table, lens, l_max), gather_pages(v, block_table, lens, l_max)

    bias = tensors.get("bias")
    if bias is not None:
        try:
            bias = bias.expand(b_size, h_q, n_q, l_max)
        except RuntimeError:
            raise ArgumentError(
                f"bias of shape {list(bias.shape)} does not broadcast to [B, Hq, Nq, L_max] = "
                f"{[b_size, h_q, n_q, l_max]}"
            ) from None
    doc_ids = tensors.get("doc_ids")
    if doc_ids is not None:
        from attnfuse.blocks.document import check_doc_ids

        doc_ids = check_doc_ids(doc_ids, b_size, l_max)  # [B, L_max]
    q_positions, k_positions = inputs.get("q_positions"), inputs.get("k_positions")
    if q_positions is not None and list(q_positions.shape) not in ([n_q], [b_size, n_q]):
        raise ArgumentError(f"q_positions must have shape [{n_q}] or [{b_size}, {n_q}], got {list(q_positions.shape)}")
    if k_positions is not None and list(k_positions.shape) not in ([l_max], [b_size, l_max]):
        raise ArgumentError(
            f"with kv_lens=, k_positions must have shape [L_max] = [{l_max}] or [B, L_max] = "
            f"[{b_size}, {l_max}], got {list(k_positions.shape)}"
        )
    has_lse = next(
        normalizer_semantics(op) for op in variant.body.block.ops if op.get_trait(Normalizer) is not None
    ).has_lse

    group = h_q // h_kv
    outs, lses = [], []
    for b, n in enumerate(lens):
        q_b, k_b, v_b = q[b : b + 1], k[b : b + 1, :, :n], v[b : b + 1, :, :n]
        if n == 0:
            # No key: the output is 0 (lse -inf) whatever the variant, whose ops need not be
            # defined at Nk = 0 (sigmoid's -ln(Nk)). An empty product keeps q and v in the graph.
            outs.append(q_b[..., :0] @ v_b.repeat_interleave(group, dim=1))
            lses.append(torch.full((1, h_q, n_q), float("-inf"), dtype=dtype, device=q.device))
            continue
        seq_tensors = dict(tensors)
        if bias is not None:
            seq_tensors["bias"] = bias[b : b + 1, :, :, :n]
        if doc_ids is not None:
            seq_tensors["doc_ids"] = doc_ids[b : b + 1, :n]
        seq_inputs = {"q": q_b, "k": k_b, "v": v_b, "q_positions": q_positions, "k_positions": k_positions}
        if q_positions is not None and q_positions.dim() == 2:
            seq_inputs["q_positions"] = q_positions[b : b + 1]
        if k_positions is not None:
            seq_inputs["k_positions"] = k_positions[b : b + 1, :n] if k_positions.dim() == 2 else k_positions[:n]
        env = Evaluation(1, h_q, n_q, n, dtype, device, seq_tensors)
        out_b, lse_b = evaluate_variant(variant, seq_inputs, env)
        outs.append(out_b)
        lses.append(lse_b)
    return torch.cat(outs), (torch.cat(lses) if has_lse else None)


def reference_gradients(
    spec: object,
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

"""The printed exact-score products (`KernelEmitter.split_products`) evaluated as written: the
statements the Triton printer emits for a ReLU + RoPE dQ kernel's scores in bf16 are executed
with torch standing in for `tl` (half-precision operands, fp32 products and sums, as on tensor
cores), and their error is checked against float64.

The CPU test suite runs bf16 kernels with fp32 products in the interpreter, so without this
test the bf16 form of these statements would be checked only as text (lit) and on a GPU."""

from __future__ import annotations

import re
from types import SimpleNamespace

import torch

import attnfuse as af
from attnfuse.runtime.compiler import generate_program
from attnfuse.runtime.inputs import Problem

SPEC = af.attention(af.relu(), af.causal(), af.rope(theta=500000.0))


def printed_score_statements(dtype: torch.dtype) -> list[str]:
    """The dQ kernel's `tile.scores` statements as printed for a GPU, up to the scaling."""
    fn = af.compile(SPEC, config=af.TileConfig(64, 64, 4, 3, 64, 32, 4, 3, 64, 64, 4, 3))
    problem = Problem(1, 2, 2, 256, 256, 64, 64, dtype, torch.device("cuda"))
    program, _path, _key = generate_program(SPEC, fn.compile_key(problem), False)
    kernel = program.source.split("def attention_bwd_dq(", 1)[1]
    block = kernel.split("# tile.scores:", 1)[1].split("scores = scores * sm_scale", 1)[0]
    return [line.strip() for line in block.splitlines()[1:] if line.strip()]


def fake_tl(dtype: torch.dtype) -> SimpleNamespace:
    """`tl` as the statements use it: half-precision operands, products summed in fp32."""
    def dot(a, b, acc=None):
        assert a.dtype == b.dtype == dtype, "every product takes element-type operands"
        out = a.float() @ b.float()  # products of bf16/fp16 values are exact in fp32
        return out if acc is None else acc + out

    return SimpleNamespace(dot=dot, trans=lambda x: x.T, float32=torch.float32,
                           bfloat16=torch.bfloat16, float16=torch.float16)


def run_scores(dtype: torch.dtype, operands: dict[str, torch.Tensor]) -> torch.Tensor:
    namespace = {"tl": fake_tl(dtype), **operands}
    for statement in printed_score_statements(dtype):
        exec(statement, namespace)  # noqa: S102 - the printer's own output, nothing else
    return namespace["scores"]


def rotated_operands(seed: int = 0) -> dict[str, torch.Tensor]:
    """fp32 values as in-register rotation leaves them: not representable in bf16."""
    gen = torch.Generator().manual_seed(seed)
    return {name: torch.randn(64, 32, generator=gen) for name in ("q_lo_rot", "q_hi_rot", "k_lo_rot", "k_hi_rot")}


def exact_scores(ops: dict[str, torch.Tensor]) -> torch.Tensor:
    q = torch.cat([ops["q_lo_rot"], ops["q_hi_rot"]], 1).double()
    k = torch.cat([ops["k_lo_rot"], ops["k_hi_rot"]], 1).double()
    return q @ k.T


def scaled_error(got: torch.Tensor, ops: dict[str, torch.Tensor]) -> float:
    """max |got - exact| / (|q_i| |k_j|): the error relative to the products' own size."""
    q = torch.cat([ops["q_lo_rot"], ops["q_hi_rot"]], 1).double()
    k = torch.cat([ops["k_lo_rot"], ops["k_hi_rot"]], 1).double()
    norms = q.norm(dim=1)[:, None] * k.norm(dim=1)[None, :]
    return ((got.double() - exact_scores(ops)).abs() / norms).max().item()


def test_printed_statements_are_split_products():
    statements = printed_score_statements(torch.bfloat16)
    assert sum(s.startswith("scores = tl.dot(") for s in statements) == 6  # 3 per rotary half
    assert all(re.search(r"_(head|rest)\b", s) for s in statements if "tl.dot" in s)


def test_bf16_split_scores_are_within_2_pow_minus_15_of_exact():
    ops = rotated_operands()
    got = run_scores(torch.bfloat16, ops)
    assert scaled_error(got, ops) < 2.0**-15
    # Rounding the operands once, as before the split, errs by about 2^-8: the bound bites.
    rounded = {name: t.to(torch.bfloat16).float() for name, t in ops.items()}
    assert scaled_error(exact_scores(rounded), ops) > 2.0**-11


def test_fp16_split_scores_are_within_2_pow_minus_20_of_exact():
    ops = rotated_operands(seed=1)
    got = run_scores(torch.float16, ops)
    assert scaled_error(got, ops) < 2.0**-20

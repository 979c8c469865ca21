"""The Gluon target without a GPU: the printed kernels compile for sm_90 ahead of time with the
installed Triton (registers and spills read from the cubin), what it refuses it refuses with
the op at fault, and the runtime's choice of target follows its rules. The kernels' numbers are
checked on the H200 (test/python/test_gpu_gluon.py)."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from xdsl.dialects import arith
from xdsl.dialects import math as math_dialect
from xdsl.dialects.builtin import FloatAttr, f32
from xdsl.irdl import IRDLOperation, irdl_op_definition, operand_def, result_def, traits_def
from xdsl.traits import Pure

import attnfuse as af
from attnfuse.dialects.attn import SOFTMAX_FLOOR, ScoresType
from attnfuse.dialects.interfaces import ScoreModifier
from attnfuse.dsl.blocks import Block
from attnfuse.dialects import make_context
from attnfuse.dialects.flash_shape import HEAD_DIMS as HEAD_DIMS_COVERED, flash_kernel
from attnfuse.errors import ArgumentError
from attnfuse.lowering.gluon import GluonUnsupported, emit_gluon_kernel
from attnfuse.runtime import gluon_forward
from attnfuse.runtime.compiler import CompileKey, lower_spec
from attnfuse.runtime.config import LISTED_FORWARD_HOPPER_D64, LISTED_GLUON_FORWARD, TileConfig
from attnfuse.runtime.inputs import Problem
from attnfuse.transforms.warp_specialize import WarpSpecializePass
from conftest import gluon_forward_for_sm90


def forward_kernel(spec, head_dim=128, placement=("fused", "fused"), dtype="bf16", config=TileConfig(64, 64, 4, 2),
                   **options):
    """The forward kernel of `spec` lowered with `config`'s tiles, after `warp-specialize`
    (scheduled where it is flash-shaped), with the pass's `options`."""
    key = CompileKey(head_dim, head_dim, dtype, config, placement)
    module = lower_spec(spec, key)
    WarpSpecializePass(**options).apply(make_context(), module)
    return next(op for op in module.ops if op.sym_name.data == "attention_fwd")


def check_launch_matches_signature(launch, tensors: dict, source: str, name: str) -> list[str]:
    """Run a Gluon launch (`GluonLaunch`, `GluonBackwardLaunch`) on CPU tensors with its runner
    stood in for, and check what it hands the printed entry `name` of `source` against the
    entry's parameters: as many, in order (descriptors, then pointers and their int strides),
    the descriptors counted as such. Returns the entry's runtime parameter names."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    header = source.split(f"def {name}(", 1)[1].split("):", 1)[0]
    runtime = [p.strip() for p in header.split(",") if p.strip() and "constexpr" not in p]
    calls = []

    class Runner:
        def replay(self, key, pointers):
            return False

        def __call__(self, args, scalars, specialization, descriptors, key):
            calls.append((args, scalars, descriptors))

    launch.__dict__["runner"] = Runner()  # the cached property's slot
    launch({role: tensors[role] for role in launch.launch.roles})
    (args, scalars, descriptors), = calls
    assert len(args) + len(scalars) == len(runtime), (runtime, len(args), len(scalars))
    assert descriptors == len([p for p in runtime if p.endswith("_desc")])
    kinds = {"_desc": TensorDescriptor, "_ptr": torch.Tensor}
    for param, arg in zip(runtime, args):
        kind = int if param.startswith("stride_") else next(k for suffix, k in kinds.items() if param.endswith(suffix))
        assert isinstance(arg, kind), (param, type(arg))
    return runtime


def _cuobjdump(cubin: bytes, flag: str) -> str:
    """What Triton's bundled cuobjdump prints for `cubin` with `flag` (`-res-usage`, `-sass`)."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        pytest.skip("Triton's cuobjdump is not bundled")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, flag, f.name], capture_output=True, text=True, check=True).stdout


def _registers_and_spills(cubin: bytes) -> tuple[int, int]:
    text = _cuobjdump(cubin, "-res-usage")
    return int(re.search(r"REG:(\d+)", text).group(1)), int(re.search(r"STACK:(\d+)", text).group(1))


@dataclass(frozen=True)
class _RoundedScores(ScoreModifier):
    """A scores-only modifier whose map uses the body ops Gluon must print too: a correctly
    rounded `divf` (`tl.div_rn`), `floor`, and comparisons joined by `ori`, `andi` and
    `xori`: `floor(s / 3)` where exactly one of `floor(s / 3) > 0` and `s < 0` holds, else `s`."""

    rank: int = 20

    @staticmethod
    def rounded_where_one(b, s):
        """(`floor(s / 3)`, whether exactly one of its predicates holds) in a map body."""
        three = b.insert(arith.ConstantOp(FloatAttr(3.0, f32))).result
        zero = b.insert(arith.ConstantOp(FloatAttr(0.0, f32))).result
        rounded = b.insert(math_dialect.FloorOp(b.insert(arith.DivfOp(s, three)).result)).result
        positive = b.insert(arith.CmpfOp(rounded, zero, "ogt")).result
        negative = b.insert(arith.CmpfOp(s, zero, "olt")).result
        either = b.insert(arith.OrIOp(positive, negative)).result
        both = b.insert(arith.AndIOp(positive, negative)).result
        return rounded, b.insert(arith.XOrIOp(either, both)).result

    def lower(self, op, kernel, scores):
        def body(b, args):
            rounded, one = self.rounded_where_one(b, args[0])
            return b.insert(arith.SelectOp(one, rounded, args[0])).result

        return kernel.scalar_map([scores], "scores", body)

    def vjp(self, op, kernel, scores_in, grad):
        def body(b, args):  # floor's derivative is 0, the identity's 1
            _rounded, one = self.rounded_where_one(b, args[0])
            zero = b.insert(arith.ConstantOp(FloatAttr(0.0, f32))).result
            return b.insert(arith.SelectOp(one, zero, args[1])).result

        return kernel.scalar_map([scores_in, grad], "grad_scores", body)

    def evaluate(self, op, scores, env):
        rounded = torch.floor(scores / 3.0)
        positive, negative = rounded > 0, scores < 0
        return torch.where((positive | negative) ^ (positive & negative), rounded, scores)


@irdl_op_definition
class _RoundedScoresOp(IRDLOperation):
    name = "attn.test_rounded_scores"
    input = operand_def(ScoresType)
    result = result_def(ScoresType)
    traits = traits_def(Pure(), _RoundedScores())


@dataclass(frozen=True, repr=False)
class _RoundedScoresBlock(Block):
    category: ClassVar[str] = "modifier"

    def build(self, variant, value):
        return _RoundedScoresOp.create(operands=[value], result_types=[ScoresType()])


def test_map_body_logic_and_division_run_against_the_reference():
    """The map of `_RoundedScoresBlock` (division, floor, ori/andi/xori) through the portable
    kernels on the CPU, forward and backward, against its `evaluate` (scores scaled up so the
    floor and both predicates vary)."""
    from conftest import check_forward_backward, make_qkv

    q, k, v = make_qkv(1, 2, 2, 20, 28, 16, seed=8)
    check_forward_backward(af.attention(_RoundedScoresBlock(), af.causal()), q * 8, k, v)


@pytest.mark.parametrize("name,spec,dim,consumers,persistent", [
    ("causal", af.attention(af.causal()), 128, 2, False),
    # A map with a correctly rounded division, floor and i1 logic (`tl.div_rn`, `tl.floor`,
    # `|`, `^`): Gluon prints the portable target's map expressions.
    ("rounded-map", af.attention(_RoundedScoresBlock(), af.causal()), 128, 2, False),
    ("window-alibi", af.attention(af.sliding_window(256), af.alibi(), af.causal()), 64, 2, False),
    # FA3's head-dim-64 shape: 160 registers per consumer, a diagonal and a full key loop.
    ("causal-3", af.attention(af.causal()), 64, 3, False),
    # Three consumers at head dim 128 (64-key blocks, `gluon_forward.SCHEDULES`).
    ("causal-3", af.attention(af.causal()), 128, 3, False),
    # The persistent grid (one program per SM walking the tiles), with ALiBi's slope per tile.
    ("causal", af.attention(af.causal()), 128, 2, True),
    ("window-alibi", af.attention(af.sliding_window(256), af.alibi(), af.causal()), 64, 2, True),
    # The table's default for dense kernels at head dim 128: the persistent grid (ALiBi too).
    ("dense", af.attention(), 128, 2, True),
    ("dense-alibi", af.attention(af.alibi()), 128, 2, True),
    # Head dim 256: 64-key blocks (what fits shared memory), the table's two consumers.
    ("causal", af.attention(af.causal()), 256, 2, False),
    ("window-alibi", af.attention(af.sliding_window(256), af.alibi(), af.causal()), 256, 2, False),
    # An additive bias (read block by block through its pointer) and the pointwise normalizers,
    # with the consumer counts the runtime gives them (`gluon_forward.gluon_consumers`).
    ("bias-causal", af.attention(af.additive_bias(), af.causal()), 128, 2, False),
    ("bias-causal", af.attention(af.additive_bias(), af.causal()), 64, 2, False),
    ("relu", af.attention(af.relu()), 128, 2, True),
    ("relu-causal", af.attention(af.relu(), af.causal()), 64, 3, False),
    ("sigmoid-causal", af.attention(af.sigmoid(), af.causal()), 128, 2, False),
    ("sigmoid", af.attention(af.sigmoid()), 64, 3, False),
])
def test_printed_kernel_compiles_for_sm90(sm90, name, spec, dim, consumers, persistent, tmp_path, monkeypatch):
    """Valid Gluon for this Triton, within the register cap, its products on HGMMA; the
    plain causal kernel does not spill (persistent or not), nor, with Triton 3.6 (the H200's),
    the three-consumer one."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    import triton

    program, compiled = gluon_forward_for_sm90(spec, dim, consumers, persistent)
    assert program.kernels[0].persistent == persistent
    registers, spills = _registers_and_spills(compiled.asm["cubin"])
    assert registers <= 255
    assert compiled.metadata.shared <= 232448, f"{compiled.metadata.shared} bytes of shared memory"
    assert "HGMMA" in _cuobjdump(compiled.asm["cubin"], "-sass"), "the products must be warpgroup MMAs"
    if name == "causal":
        # A few bytes of stack frame come and go with Triton versions (0-8 seen with 3.6 and
        # 3.9); a consumer that runs out of registers spills kilobytes.
        assert spills <= 64, f"{spills} bytes of stack"
    if name.startswith(("bias", "relu", "sigmoid")) and triton.__version__.startswith("3.6"):
        # With the consumer counts the runtime gives them: no spills (Triton 3.6, the H200's).
        assert spills <= 8, f"{spills} bytes of stack"
    if name == "causal-3" and triton.__version__.startswith("3.6"):
        # One step function for both key loops: 0 bytes (two inlined ones spilled 88 at head
        # dim 64). Triton 3.9.0 spills at head dim 64 (184 bytes of stack), as it does the
        # hand-written probe (72).
        assert spills <= 8, f"{spills} bytes of stack"


@pytest.mark.parametrize("spec,placement,op", [
    (af.attention(af.rope(), af.causal()), ("fused", "fused"), "tile.load"),
])
def test_refused_kernels_name_the_op(spec, placement, op):
    with pytest.raises(GluonUnsupported) as err:
        emit_gluon_kernel(forward_kernel(spec, placement=placement))
    if op is not None:
        assert f"({op})" in str(err.value)
    assert err.value.op is not None


def test_pre_rotated_operands_are_descriptors():
    """With both rotations pre-applied the forward is flash-shaped over the copies."""
    program = emit_gluon_kernel(forward_kernel(af.attention(af.rope(), af.causal()),
                                               placement=("pre_rotated", "pre_rotated")))
    assert program.kernels[0].operands == ("q_rot", "k_rot", "v", "o")


def test_head_dims_without_a_schedule_are_refused():
    kernel = forward_kernel(af.attention(), head_dim=96)
    assert kernel.schedule is None
    with pytest.raises(GluonUnsupported, match="head dim 96"):
        emit_gluon_kernel(kernel)


def test_the_schedule_sets_the_tile_sizes():
    kernel = forward_kernel(af.attention(af.causal()))
    assert kernel.schedule == "warp_specialized"
    assert [kernel.get(key) for key in ("block_m", "block_n", "num_warps", "num_stages",
                                        "producer_warps", "consumer_registers")] == [128, 128, 8, 2, 1, 240]
    kernel.verify()


def problem(n_q, n_k, d=128, dtype=torch.bfloat16):
    return Problem(1, 8, 8, n_q, n_k, d, d, dtype, torch.device("cpu"))


def test_auto_rule_and_fit(monkeypatch):
    monkeypatch.setattr(gluon_forward, "triton_release", lambda: (3, 6))
    assert gluon_forward.prefers_gluon(problem(8192, 8192), causal=False)
    assert gluon_forward.prefers_gluon(problem(8192, 8192), causal=True)
    assert gluon_forward.prefers_gluon(problem(4096, 4096), causal=True)
    assert not gluon_forward.prefers_gluon(problem(2048, 2048), causal=True)
    # Head dim 64: from 16M pairs (causal 5793, dense 4096); the portable kernel at causal 4096.
    assert gluon_forward.prefers_gluon(problem(8192, 8192, d=64), causal=True)
    assert gluon_forward.prefers_gluon(problem(4096, 4096, d=64), causal=False)
    assert not gluon_forward.prefers_gluon(problem(4096, 4096, d=64), causal=True)
    assert not gluon_forward.prefers_gluon(problem(8192, 8192, d=96), causal=False)
    assert gluon_forward.prefers_gluon(problem(4096, 4096, d=256), causal=True)
    assert not gluon_forward.prefers_gluon(problem(2048, 2048, d=256), causal=True)
    assert gluon_forward.fits(problem(256, 384, d=256))
    # Measured with Triton 3.6 only: with 3.9 the three-consumer kernel spills; head dim 128 stays.
    monkeypatch.setattr(gluon_forward, "triton_release", lambda: (3, 9))
    assert not gluon_forward.prefers_gluon(problem(8192, 8192, d=64), causal=True)
    assert gluon_forward.prefers_gluon(problem(8192, 8192), causal=True)
    assert gluon_forward.fits(problem(256, 384))
    assert gluon_forward.fits(problem(250, 383))  # descriptors clip at the sequence end
    assert not gluon_forward.fits(problem(256, 384, d=96))
    assert not gluon_forward.fits(problem(256, 384, dtype=torch.float32))


def test_plain_softmax_variants_take_the_gluon_forward_from_a_lower_size(monkeypatch):
    """On a (pretended) Hopper GPU under `auto`: at head dim 128 a plain softmax variant takes
    the Gluon forward from 2M (query, key) pairs per head (`SOFTMAX_MIN_WORK`: causal 2048,
    with RoPE too, and causal 4093, which `GLUON_MIN_WORK`'s 8M left to the portable kernel);
    the classes measured from 4096 only (sigmoid, ReLU, block lists) keep `GLUON_MIN_WORK`;
    head dim 64 is unchanged."""
    monkeypatch.setattr(gluon_forward, "hopper", lambda problem: True)
    monkeypatch.setattr(gluon_forward, "triton_release", lambda: (3, 6))
    monkeypatch.delenv("ATTNFUSE_FORWARD_TARGET", raising=False)

    def takes(spec, n, d=128):
        variant = af.compile(spec).program.canonical((False, False))
        return gluon_forward.takes_gluon_forward(problem(n, n, d=d), variant)

    causal, rope = af.attention(af.causal()), af.attention(af.rope(), af.causal())
    for n in (2048, 3072, 4093):
        assert takes(causal, n) and takes(rope, n)
    assert not takes(causal, 1024) and not takes(rope, 1448)
    assert takes(af.attention(), 1449) and not takes(af.attention(), 1448)  # dense: 1449^2 >= 2M pairs
    sigmoid = af.attention(af.sigmoid(), af.causal())
    assert not takes(sigmoid, 4093) and takes(sigmoid, 4096)
    assert not takes(causal, 4096, d=64) and takes(af.attention(), 4096, d=64)


def test_schedules_by_head_dim(monkeypatch):
    """Every head dim the schedule covers has options; three consumers at head dim 64 (two with
    ALiBi), two at 128; persistent only at 128 for kernels of uniform tiles (dense, not causal);
    `ATTNFUSE_GLUON_CONSUMERS` and `ATTNFUSE_GLUON_PERSISTENT` force them, checked."""
    from attnfuse.dialects.flash_shape import HEAD_DIMS

    monkeypatch.delenv("ATTNFUSE_GLUON_CONSUMERS", raising=False)
    assert set(gluon_forward.SCHEDULES) == set(HEAD_DIMS)
    monkeypatch.delenv("ATTNFUSE_GLUON_PERSISTENT", raising=False)
    assert gluon_forward.schedule_options(64) == {"consumers": 3, "block_n": 128, "persistent": False}
    assert gluon_forward.schedule_options(128) == {"consumers": 2, "block_n": 128, "persistent": False}
    key = CompileKey(64, 64, "f16", TileConfig(64, 64, 4, 2), ("fused", "fused"))
    alibi = lower_spec(af.attention(af.alibi(), af.causal()), key)
    assert gluon_forward.schedule_options(64, alibi)["consumers"] == 2
    # A bias too: three consumers' 160 registers spill with its block beside the scores.
    bias = lower_spec(af.attention(af.additive_bias(), af.causal()), key)
    assert gluon_forward.schedule_options(64, bias)["consumers"] == 2
    assert gluon_forward.schedule_options(64, lower_spec(af.attention(af.causal()), key))["consumers"] == 3
    key128 = CompileKey(128, 128, "f16", TileConfig(64, 64, 4, 2), ("fused", "fused"))
    dense, causal = (lower_spec(spec, key128) for spec in (af.attention(), af.attention(af.causal())))
    assert gluon_forward.schedule_options(128, dense) == {"consumers": 2, "block_n": 128, "persistent": True}
    assert gluon_forward.schedule_options(128, causal)["persistent"] is False
    assert gluon_forward.schedule_options(64, lower_spec(af.attention(), key))["persistent"] is False
    key256 = CompileKey(256, 256, "bf16", TileConfig(64, 64, 4, 2), ("fused", "fused"))
    assert gluon_forward.schedule_options(256, lower_spec(af.attention(), key256)) == {
        "consumers": 2, "block_n": 64, "persistent": False}
    monkeypatch.setenv("ATTNFUSE_GLUON_PERSISTENT", "0")
    assert gluon_forward.schedule_options(128, dense)["persistent"] is False  # forced off
    monkeypatch.delenv("ATTNFUSE_GLUON_PERSISTENT")
    monkeypatch.setenv("ATTNFUSE_GLUON_CONSUMERS", "2")
    assert gluon_forward.schedule_options(64) == {"consumers": 2, "block_n": 128, "persistent": False}
    monkeypatch.setenv("ATTNFUSE_GLUON_CONSUMERS", "3")
    monkeypatch.setenv("ATTNFUSE_GLUON_PERSISTENT", "1")
    assert gluon_forward.schedule_options(128) == {"consumers": 3, "block_n": 64, "persistent": True}
    assert gluon_forward.schedule_options(64, alibi)["consumers"] == 3  # forced is forced
    monkeypatch.setenv("ATTNFUSE_GLUON_PERSISTENT", "yes")
    with pytest.raises(ArgumentError, match="ATTNFUSE_GLUON_PERSISTENT"):
        gluon_forward.schedule_options(64)
    monkeypatch.setenv("ATTNFUSE_GLUON_CONSUMERS", "4")
    with pytest.raises(ArgumentError, match="ATTNFUSE_GLUON_CONSUMERS"):
        gluon_forward.schedule_options(64)
    monkeypatch.setenv("ATTNFUSE_GLUON_PERSISTENT", "0")
    monkeypatch.setenv("ATTNFUSE_GLUON_CONSUMERS", "3")
    with pytest.raises(ArgumentError, match="head dim 256 takes 1, 2 consumer"):
        gluon_forward.schedule_options(256)
    monkeypatch.setenv("ATTNFUSE_GLUON_CONSUMERS", "2")
    assert gluon_forward.schedule_options(256) == {"consumers": 2, "block_n": 64, "persistent": False}


@pytest.mark.parametrize("spec,kind", [
    (af.attention(af.causal()), "softmax"), (af.attention(af.alibi(), af.softcap(20.0)), "softmax"),
    (af.attention(af.additive_bias(), af.causal()), "bias"), (af.attention(af.relu()), "relu"),
    (af.attention(af.relu(), af.causal()), "relu"), (af.attention(af.sigmoid()), "pointwise"),
    (af.attention(af.additive_bias(), af.relu()), "bias"), (af.attention(af.additive_bias(), af.sigmoid()), "bias"),
    (af.attention(af.block_sparse(64), af.causal()), "softmax+listed"),
    (af.attention(af.block_sparse(64), af.relu()), "relu+listed"),
    (af.attention(af.block_sparse(64), af.additive_bias()), "bias+listed"),
    (af.attention(af.document(), af.causal()), "softmax+document"),
    (af.attention(af.document(), af.block_sparse(128), af.relu()), "relu+listed+document"),
    # An op defined outside the package (this file's): measured by nobody.
    (af.attention(_RoundedScoresBlock(), af.causal()), "softmax+outside")])
def test_variant_classes_of_the_auto_rule(spec, kind):
    """`auto` decides per variant class (`AUTO_VARIANT_CLASSES`): a bias is its own class, ReLU
    and the other pointwise normalizers theirs; a block-sparse layout adds `listed`, document
    ids `document`, an op of a block module `outside`."""
    variant = af.compile(spec).program.canonical((False, False))
    assert "+".join(gluon_forward.variant_classes(variant)) == kind
    assert set(gluon_forward.AUTO_VARIANT_CLASSES) == {"softmax", "bias", "relu", "pointwise", "listed", "document",
                                                       "outside"}
    assert gluon_forward.AUTO_VARIANT_CLASSES["bias"] == ()  # measured slower than the portable kernel
    assert gluon_forward.AUTO_VARIANT_CLASSES["outside"] == ()  # unmeasured: auto keeps the portable kernels


@pytest.mark.parametrize("spec,uniform", [
    (af.attention(), True), (af.attention(af.alibi()), True), (af.attention(af.softcap(30.0)), True),
    (af.attention(af.additive_bias()), True), (af.attention(af.causal()), False),
    (af.attention(af.sliding_window(256)), False), (af.attention(af.rope(), af.causal()), False),
    (af.attention(af.block_sparse(64)), False), (af.attention(af.document()), False)])
def test_uniform_tiles_are_those_no_band_or_list_trims(spec, uniform):
    """`uniform_tiles`: a forward whose key loop no band bounds and that skips no block."""
    key = CompileKey(128, 128, "f16", TileConfig(64, 64, 4, 2), ("fused", "fused"))
    assert gluon_forward.uniform_tiles(lower_spec(spec, key)) is uniform


@pytest.mark.parametrize("dim", HEAD_DIMS_COVERED)
@pytest.mark.parametrize("spec", [af.attention(), af.attention(af.causal()), af.attention(af.alibi()),
                                  af.attention(af.sliding_window(256), af.alibi(), af.causal())],
                         ids=["dense", "causal", "alibi", "window-alibi"])
def test_table_schedules_verify(dim, spec, monkeypatch):
    """Every head dim's schedule from the table, for each tile class, passes the verifier (its
    buffers fit shared memory): the runtime's error for a schedule that does not is only for
    forced options."""
    monkeypatch.delenv("ATTNFUSE_GLUON_CONSUMERS", raising=False)
    monkeypatch.delenv("ATTNFUSE_GLUON_PERSISTENT", raising=False)
    module = lower_spec(spec, CompileKey(dim, dim, "bf16", TileConfig(64, 64, 4, 2), ("fused", "fused")))
    WarpSpecializePass(**gluon_forward.schedule_options(dim, module)).apply(make_context(), module)
    forward = next(op for op in module.ops if op.sym_name.data == "attention_fwd")
    assert forward.schedule is not None
    module.verify()


def test_rope_is_pre_rotated_only_for_a_forward_gluon_takes(monkeypatch):
    """The Gluon forward reads q and k whole, so on Hopper a RoPE call whose forward it takes is
    pre-rotated; a variant class `auto` keeps portable (an additive bias) keeps the fused
    rotation, which the portable kernel does faster than a separate pass."""
    monkeypatch.setattr(gluon_forward, "hopper", lambda problem: True)
    monkeypatch.setattr(gluon_forward, "triton_release", lambda: (3, 6))
    monkeypatch.delenv("ATTNFUSE_FORWARD_TARGET", raising=False)
    taken = af.compile(af.attention(af.rope(), af.causal())).compile_key(problem(4096, 4096))
    kept = af.compile(af.attention(af.rope(), af.additive_bias(), af.causal())).compile_key(problem(4096, 4096))
    assert taken.placement == ("pre_rotated", "pre_rotated")
    assert kept.placement[0] != "pre_rotated"


def test_forced_schedule_that_does_not_fit_is_an_argument_error(monkeypatch):
    """`ATTNFUSE_GLUON_PERSISTENT=1` at head dim 256: the persistent grid's output buffer takes
    the buffers past shared memory; the call names the variable and the verifier's sizes."""
    monkeypatch.setattr(gluon_forward, "takes_gluon", lambda problem, causal, table=None: True)
    monkeypatch.setenv("ATTNFUSE_GLUON_PERSISTENT", "1")
    monkeypatch.delenv("ATTNFUSE_GLUON_CONSUMERS", raising=False)
    problem = Problem(1, 4, 4, 4096, 4096, 256, 256, torch.bfloat16, torch.device("cpu"))
    key = CompileKey(256, 256, "bf16", TileConfig(64, 64, 4, 2), ("fused", "fused"))
    with pytest.raises(ArgumentError, match=r"ATTNFUSE_GLUON_PERSISTENT=1: a warp-specialized kernel's buffers "
                                            r"need 256 KB.*no persistent grid"):
        gluon_forward.gluon_forward([], problem, 0.1, lambda: lower_spec(af.attention(af.causal()), key),
                                    af.compile(af.attention(af.causal())).program.canonical((False, False)))


def test_target_choice_is_checked(monkeypatch):
    monkeypatch.setenv("ATTNFUSE_FORWARD_TARGET", "cuda")
    with pytest.raises(ArgumentError, match="ATTNFUSE_FORWARD_TARGET"):
        gluon_forward.forward_target()


def test_cpu_calls_keep_the_portable_launches(monkeypatch):
    monkeypatch.setenv("ATTNFUSE_FORWARD_TARGET", "gluon")
    fn = af.compile(af.attention(af.causal()))
    q = torch.randn(1, 2, 128, 64)
    plan = fn.plan(q, q, q)
    assert not any(isinstance(launch, gluon_forward.GluonLaunch) for launch in plan.launches)


def test_gpu_source_printed_without_a_gpu_keeps_its_placement():
    """Planning a CUDA problem's source on a machine without CUDA asks no device (the Gluon
    choice is off there) and keeps the Rotation Calculus' placement."""
    fn = af.compile(af.attention(af.rope(), af.causal()), config=TileConfig(64, 64, 4, 2))
    problem = Problem(1, 8, 8, 8192, 8192, 128, 128, torch.bfloat16, torch.device("cuda"))
    assert not gluon_forward.takes_gluon(problem, causal=True)
    assert fn.compile_key(problem).placement == fn.compile_key(
        Problem(1, 8, 8, 8192, 8192, 128, 128, torch.bfloat16, torch.device("cpu"))).placement


def test_hand_written_data_flow_the_schedule_does_not_follow_is_refused():
    """The consumer hard-codes (acc, row max, row sum) as the loop's carried state: a kernel
    whose loop yields them in another order is not flash-shaped, never printed otherwise."""
    from attnfuse.transforms.warp_specialize import NotFlashShaped, flash_kernel

    key = CompileKey(128, 128, "bf16", TileConfig(64, 64, 4, 2), ("fused", "fused"))
    module = lower_spec(af.attention(af.causal()), key)
    kernel = next(op for op in module.ops if op.sym_name.data == "attention_fwd")
    flash_kernel(kernel)  # as lowered: flash-shaped
    loop = next(op for op in kernel.body.block.ops if op.name == "tile.kv_loop")
    end = loop.body.block.last_op
    acc, row_max, row_sum = end.operands
    end.operands = [acc, row_sum, row_max]
    with pytest.raises(NotFlashShaped, match="carries the accumulator, row max and row sum"):
        flash_kernel(kernel)
    WarpSpecializePass().apply(make_context(), module)
    assert kernel.schedule is None


class _TorchLanguage:
    """Enough of `triton.language` / Gluon's language, on float64 torch tensors, to run a printed
    step function's and finalize's text on the CPU (layouts are ignored)."""

    float32 = torch.float64

    class math:
        exp2 = staticmethod(torch.exp2)
        log2 = staticmethod(torch.log2)

    @staticmethod
    def arange(start, end, layout=None):
        return torch.arange(start, end)

    @staticmethod
    def SliceLayout(dim, parent):  # noqa: N802 - Gluon's name
        return None

    @staticmethod
    def where(cond, a, b):
        return torch.where(torch.as_tensor(cond), torch.as_tensor(a, dtype=torch.float64),
                           torch.as_tensor(b, dtype=torch.float64))

    class PropagateNan:  # noqa: D106 - triton.language's enum (torch.maximum propagates NaN)
        ALL = "all"

    @staticmethod
    def maximum(a, b, propagate_nan=None):
        return torch.maximum(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64))

    @staticmethod
    def max(x, axis):
        return x.amax(axis)

    @staticmethod
    def sum(x, axis):
        return x.sum(axis)


def test_printed_online_softmax_matches_reference():
    """The printed step function's online softmax (the row max in base-2 units) and the
    consumer's finalize, run block by block on the CPU in float64 as the consumer runs them
    (acc * alpha + p @ v), give softmax(s * scale) @ v and lse = logsumexp(s * scale) of a
    reference written from the semantics: dense at head dim 128 (the scale unfolded into the
    exponent), causal, keys past n_k masked in the last block, and a row with no key (empty
    output, lse -inf)."""
    import textwrap

    for spec, causal in ((af.attention(), False), (af.attention(af.causal()), True)):
        source = emit_gluon_kernel(forward_kernel(spec, 128, **gluon_forward.SCHEDULES[128].options(2, False))).source
        step = re.search(r"@gluon.jit\n(def attention_fwd_step\(.*?\n)(?=\n\n@gluon.jit)", source, re.S).group(1)
        finalize = re.search(r"\n( +# tile.softmax_finalize.*?\n +lse = .*?\n)", source, re.S).group(1)
        env = {"tl": _TorchLanguage, "gl": _TorchLanguage}
        exec(step.replace(": gl.constexpr", ""), env)
        torch.manual_seed(0)
        rows, n_k, block_n, dim, scale = 4, 20, 8, 4, 0.3
        s_all = torch.randn(rows, 24, dtype=torch.float64) * 4
        v = torch.randn(24, dim, dtype=torch.float64)
        n_q = rows
        # The consumer's state_init: the row max starts at the softmax's floor, in base-2 units.
        init = re.search(r"row_max = gl.full\(\[ROWS\], (\S+), gl.float32", source).group(1)
        assert float(init) == SOFTMAX_FLOOR * 1.4426950408889634
        row_max = torch.full((rows,), float(init), dtype=torch.float64)
        row_sum = torch.zeros(rows, dtype=torch.float64)
        acc = torch.zeros(rows, dim, dtype=torch.float64)
        # The last block (keys 16..23) is partial: n_k = 20; its loop (bound_1) masks it.
        bound_1 = (n_k // block_n) * block_n
        # Query row r sits at key position r + (n_k - n_q) (bottom-right aligned).
        for start_n in range(0, n_k, block_n):
            scores = s_all[:, start_n:start_n + block_n].clone()
            if causal:
                keys = torch.arange(start_n, start_n + block_n)
                q_pos = torch.arange(rows) + (n_k - n_q)
                scores = torch.where(keys[None, :] <= q_pos[:, None], scores, float("-inf"))
            scores[0] = float("-inf")  # a row with no kept key
            probs, alpha, row_max, row_sum = env["attention_fwd_step"](
                scores, row_max, row_sum, start_n, 0, bound_1, scale, n_q, n_k, rows, block_n, None)
            acc = acc * alpha[:, None] + probs @ v[start_n:start_n + block_n]
        local = {"tl": _TorchLanguage, "acc": acc, "row_max": row_max, "row_sum": row_sum}
        exec(textwrap.dedent(finalize), local)
        # The reference: softmax over the kept keys of the scaled scores.
        kept = s_all[:, :n_k] * scale
        if causal:
            keys, q_pos = torch.arange(n_k), torch.arange(rows) + (n_k - n_q)
            kept = torch.where(keys[None, :] <= q_pos[:, None], kept, float("-inf"))
        ref_lse = torch.logsumexp(kept[1:], 1)
        ref_out = torch.softmax(kept[1:], 1) @ v[:n_k]
        torch.testing.assert_close(local["lse"][1:], ref_lse)
        torch.testing.assert_close(local["out"][1:], ref_out)
        assert torch.isneginf(local["lse"][0]) and (local["out"][0] == 0).all()


LISTED_TILES = TileConfig(128, 128, 8, 2)
"""The tiles a block-sparse call on the Gluon forward is lowered with (`config.LISTED_GLUON_FORWARD`)."""


@pytest.mark.parametrize("name,spec,dim", [
    ("sparse-causal", af.attention(af.block_sparse(128), af.causal()), 128),
    ("sparse", af.attention(af.block_sparse(128)), 64),
    ("sparse-alibi-softcap", af.attention(af.block_sparse(256), af.alibi(), af.softcap(30.0)), 128),
    # Documents walk lists too; their partial blocks read the ids per query row and per key.
    ("document-causal", af.attention(af.document(), af.causal()), 128),
    ("document-causal", af.attention(af.document(), af.causal()), 64),
    ("document-sparse-relu", af.attention(af.document(), af.block_sparse(128), af.relu()), 128),
])
def test_block_sparse_kernel_compiles_for_sm90(sm90, name, spec, dim, monkeypatch):
    """A block-sparse (or document) forward keeps its lowered tiles under the schedule (the
    lists name them): 128 x 128 tiles are two consumers of 128-key blocks; printed, it is valid
    Gluon for this Triton, its products on HGMMA, without spills (Triton 3.6; these cases:
    documents with a window, ALiBi or sigmoid spill 24-28 bytes there)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    import triton
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    module = lower_spec(spec, CompileKey(dim, dim, "bf16", LISTED_TILES, ("fused", "fused")))
    WarpSpecializePass(**gluon_forward.schedule_options(dim, module)).apply(make_context(), module)
    kernel = next(op for op in module.ops if op.sym_name.data == "attention_fwd")
    assert kernel.schedule is not None
    assert (kernel.get("block_m"), kernel.get("block_n"), kernel.get("num_warps")) == (128, 128, 8)
    assert kernel.int_attr("persistent") is None
    program = emit_gluon_kernel(kernel)
    module = gluon_forward._gluon_module(program.source)
    x = torch.empty(1, 256, 4, dim, dtype=torch.bfloat16).transpose(1, 2)
    rows = gl.NVMMASharedLayout.get_default_for([1, 1, 64, dim], gl.bfloat16)
    keys = gl.NVMMASharedLayout.get_default_for([1, 1, 128, dim], gl.bfloat16)
    descs = [TensorDescriptor(x, list(x.shape), list(x.stride()), [1, 1, n, dim], layout)
             for n, layout in ((64, rows), (128, keys), (128, keys), (64, rows))]
    lists = torch.empty(1, 4, 2, 2, dtype=torch.int32)
    counts = torch.empty(1, 4, 2, dtype=torch.int32)
    pointers = []
    for role in program.kernels[0].roles:
        if role in program.kernels[0].operands:
            continue
        table = {"lse": torch.empty(1, 4, 256), "full_blocks": lists, "partial_blocks": lists,
                 "full_count": counts, "partial_count": counts,
                 "doc_ids": torch.empty(1, 256, dtype=torch.int32)}.get(role)
        pointers += [table, *table.stride()] if table is not None else [torch.empty(4)]
    compiled = module.attention_fwd.warmup(*descs, *pointers, 0.1, 256, 256, 4, 1, grid=(1,), num_warps=4)
    registers, spills = _registers_and_spills(compiled.asm["cubin"])
    assert registers <= 255
    assert compiled.metadata.shared <= 232448
    assert "HGMMA" in _cuobjdump(compiled.asm["cubin"], "-sass")
    if triton.__version__.startswith("3.6"):
        assert spills <= 8, f"{spills} bytes of stack"


def test_block_sparse_tiles_the_schedule_cannot_take_stay_portable():
    """The lists name the lowered tiles: a block-sparse kernel is scheduled with its own sizes or
    not at all (64-row tiles: one consumer; options asking for other tiles: unscheduled)."""
    spec = af.attention(af.block_sparse(128))
    assert forward_kernel(spec, 128, config=LISTED_TILES, consumers=3).schedule is None
    assert forward_kernel(spec, 128, config=LISTED_TILES, block_n=64).schedule is None
    one = forward_kernel(spec, 128, config=TileConfig(64, 64, 4, 2))
    assert (one.get("block_m"), one.get("block_n"), one.get("num_warps")) == (64, 64, 4)
    assert forward_kernel(spec, 256, config=TileConfig(64, 64, 4, 2)).schedule is None
    assert forward_kernel(spec, 128, config=LISTED_TILES, persistent=True).int_attr("persistent") is None


def test_block_sparse_calls_are_lowered_for_the_gluon_tiles(monkeypatch):
    """On a (pretended) Hopper GPU: a block-sparse call that takes the Gluon forward is lowered
    with `LISTED_GLUON_FORWARD`'s 128 x 128 tiles (the block lists are built for them) and its
    kernel is scheduled with them; `auto` takes it from the measured sizes (`GLUON_MIN_WORK`),
    and layouts of blocks under 128, document ids and head dim 256 never take it."""
    monkeypatch.setattr(gluon_forward, "hopper", lambda problem: True)
    hopper = (9, 0)
    p = problem(4096, 4096)
    spec = af.attention(af.block_sparse(128), af.causal())
    sparse = af.compile(spec)
    monkeypatch.setattr(gluon_forward, "triton_release", lambda: (3, 6))
    monkeypatch.setenv("ATTNFUSE_FORWARD_TARGET", "triton")
    portable = sparse.tile_config(p, hopper)
    assert (portable.block_m, portable.block_n) == (64, 64)
    monkeypatch.setenv("ATTNFUSE_FORWARD_TARGET", "auto")
    small = sparse.tile_config(problem(2048, 2048), hopper)
    assert (small.block_m, small.block_n) == (64, 64), "below GLUON_MIN_WORK: the portable tiles"
    config = sparse.tile_config(p, hopper)
    assert (config.block_m, config.block_n, config.num_warps, config.num_stages) == LISTED_GLUON_FORWARD
    assert config.backward() == portable.backward(), "the backward keeps its own tiles"
    module = lower_spec(spec, CompileKey(128, 128, "bf16", config, None))
    WarpSpecializePass(**gluon_forward.schedule_options(128, module)).apply(make_context(), module)
    forward = next(op for op in module.ops if op.sym_name.data == "attention_fwd")
    assert forward.schedule is not None and (forward.get("block_m"), forward.get("block_n")) == (128, 128)
    # RoPE placed by the caller may rotate inside the kernel, which the Gluon forward does not
    # take: the portable tiles (left to AttnFuse, q and k are pre-rotated for Gluon).
    # Under `auto` the variant's own class must be taken too: never with a bias, sigmoid at 128;
    # and block sparsity's (`listed`) at head dim 128 only: at 64 the portable kernel on its
    # head-major grid and `LISTED_FORWARD_HOPPER_D64`'s tiles.
    for spec_d, taken in (((af.attention(af.block_sparse(128), af.additive_bias()), 128), False),
                          ((af.attention(af.block_sparse(128), af.sigmoid()), 64), False),
                          ((af.attention(af.block_sparse(128), af.sigmoid()), 128), True),
                          ((af.attention(af.block_sparse(128), af.relu()), 128), True),
                          ((af.attention(af.block_sparse(128), af.relu()), 64), False),
                          ((af.attention(af.block_sparse(128)), 64), False)):
        (other, d) = spec_d
        tiles = af.compile(other).tile_config(problem(4096, 4096, d=d), hopper)
        assert ((tiles.block_m, tiles.block_n, tiles.num_stages) == (128, 128, 2)) == taken, other
    d64 = af.compile(af.attention(af.block_sparse(128))).tile_config(problem(4096, 4096, d=64, dtype=torch.float16), hopper)
    assert (d64.block_m, d64.block_n, d64.num_warps, d64.num_stages) == LISTED_FORWARD_HOPPER_D64
    rope_spec = af.attention(af.rope(), af.block_sparse(128), af.causal())
    assert af.compile(rope_spec, rope_placement=("fused", "fused")).tile_config(p, hopper).block_m == 64
    assert af.compile(rope_spec).tile_config(p, hopper).block_m == 128
    for other, d in ((af.attention(af.block_sparse(64)), 128), (af.attention(af.block_sparse(128)), 256)):
        assert af.compile(other).tile_config(problem(4096, 4096, d=d), hopper).block_m == 64, other
    # Document ids take the Gluon tiles (any tiles fit their lists) where the document class
    # is taken: forced, or by `auto` at the head dims `AUTO_VARIANT_CLASSES` lists for it.
    documents = af.compile(af.attention(af.document(), af.causal()))
    for d in (64, 128):
        tiles = documents.tile_config(problem(8192, 8192, d=d), hopper)
        taken = d in gluon_forward.AUTO_VARIANT_CLASSES["document"]
        assert ((tiles.block_m, tiles.block_n) == (128, 128)) == taken
    small = documents.tile_config(problem(4096, 4096, d=64), hopper)
    assert (small.block_m, small.block_n) != (128, 128), "below GLUON_MIN_WORK at head dim 64"
    assert documents.tile_config(problem(4096, 4096, d=256), hopper).block_m == 64
    monkeypatch.setenv("ATTNFUSE_FORWARD_TARGET", "gluon")
    forced = documents.tile_config(problem(4096, 4096, d=64), hopper)
    assert (forced.block_m, forced.block_n, forced.num_warps, forced.num_stages) == LISTED_GLUON_FORWARD
    both = af.compile(af.attention(af.document(), af.block_sparse(64)))
    assert both.tile_config(problem(4096, 4096, d=64), hopper).block_m == 64, "64-key layout blocks"


def test_block_sparse_kernels_on_other_tiles_keep_the_portable_launch(monkeypatch):
    """A block-sparse forward lowered with tiles other than `LISTED_GLUON_FORWARD`'s (a layout of
    64-key blocks, a user's config) keeps the portable launch even where the Gluon target is
    forced: the schedule would take it (one consumer), but only the 128 x 128 kernel is measured
    and tested; a 128 x 128 one is replaced."""
    monkeypatch.setattr(gluon_forward, "hopper", lambda problem: True)
    monkeypatch.setenv("ATTNFUSE_FORWARD_TARGET", "gluon")

    class Portable:
        info = type("Info", (), {"name": "attention_fwd"})()

    spec = af.attention(af.block_sparse(64))
    small = lambda: lower_spec(spec, CompileKey(128, 128, "bf16", TileConfig(64, 64, 4, 2), None))  # noqa: E731
    launches = [Portable()]
    variant = af.compile(spec).program.canonical((False, False))
    assert gluon_forward.gluon_forward(launches, problem(4096, 4096), 0.1, small, variant) == launches
    wide = af.attention(af.block_sparse(128))
    listed = lambda: lower_spec(wide, CompileKey(128, 128, "bf16", TileConfig(*LISTED_GLUON_FORWARD), None))  # noqa: E731
    variant = af.compile(wide).program.canonical((False, False))
    taken = gluon_forward.gluon_forward(launches, problem(4096, 4096), 0.1, listed, variant)
    assert isinstance(taken[0], gluon_forward.GluonLaunch)


@pytest.mark.parametrize("spec", [af.attention(af.causal()), af.attention(af.block_sparse(128), af.causal()),
                                  af.attention(af.block_sparse(128), af.relu()),
                                  af.attention(af.document(), af.causal())])
def test_launch_passes_the_printed_kernels_parameters(spec):
    """`GluonLaunch` hands the printed entry kernel its parameters in their order: the four
    descriptors, each other role's pointer and strides (a block-sparse kernel's four lists
    among them), then the scalars (CPU tensors, the launch itself stood in for)."""
    module = lower_spec(spec, CompileKey(128, 128, "bf16", TileConfig(*LISTED_GLUON_FORWARD), ("fused", "fused")))
    WarpSpecializePass(**gluon_forward.schedule_options(128, module)).apply(make_context(), module)
    forward = next(op for op in module.ops if op.sym_name.data == "attention_fwd")
    program = emit_gluon_kernel(forward)
    info = program.kernels[0]
    b, h, n, d = 1, 4, 256, 128
    tensors = {role: torch.zeros(b, h, n, d, dtype=torch.bfloat16) for role in ("q", "k", "v", "o")}
    tensors |= {"lse": torch.zeros(b, h, n), "full_blocks": torch.zeros(b, h, 2, 2, dtype=torch.int32),
                "partial_blocks": torch.zeros(b, h, 2, 2, dtype=torch.int32),
                "full_count": torch.zeros(b, h, 2, dtype=torch.int32),
                "partial_count": torch.zeros(b, h, 2, dtype=torch.int32),
                "doc_ids": torch.zeros(n, dtype=torch.int32).expand(b, n)}
    p = Problem(b, h, h, n, n, d, d, torch.bfloat16, torch.device("cpu"))
    launch = gluon_forward.GluonLaunch(None, None, info, p, 0.1, info.operands)
    runtime = check_launch_matches_signature(launch, tensors, program.source, "attention_fwd")
    assert len([name for name in runtime if name.endswith("_desc")]) == 4
    assert ("full_blocks_ptr" in runtime) == flash_kernel(forward).listed

"""A block defined outside the package, in one file following docs/architecture.md §10.1:
`score_offset(offset)`, `s <- s + offset` (`score_offset_block.py`, beside this file),
registered with `attnfuse.blocks.register_block_module`.

What it shows works end to end from one file: the DSL builds it, hand-written IR with the op
parses (`af.compile(text)`), canonicalize-attn orders it by its own algebra (additive, rank 12:
after ALiBi, before the mask), the kernels apply it (a `tile.map` in every loop; derivative 1 in
the backward), and the interpreted kernels match the float64 reference and a formula written out
by hand. Under relu and sigmoid the offset changes the output (softmax ignores it), so the
comparison can fail.
"""

from __future__ import annotations

import math
import sys

import pytest
import torch
from conftest import check_forward_backward, make_qkv

import score_offset_block
from score_offset_block import score_offset

import attnfuse as af
from attnfuse.blocks import register_block_module, unregister_block_module
from attnfuse.errors import AttnFuseError, CompositionError

pytestmark = pytest.mark.interpreter


# --- the tests ----------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def registered():
    """The block is part of the attn dialect for each test, and only then (the dialect docs'
    test must not see it)."""
    module = score_offset_block
    register_block_module(module)
    yield
    unregister_block_module(module)


HAND_WRITTEN = """
attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %m = attn.mask %s [#attn.causal]
  %o1 = attn.score_offset %m {offset = 7.500000e-01 : f64}
  %a = attn.alibi %o1
  %p = attn.relu %a
  %o = attn.pv %p, %v
  attn.yield %o
}
"""


def test_dsl_and_canonical_ir():
    spec = af.attention(af.causal(), score_offset(0.75), af.alibi(), af.relu())
    assert "attn.score_offset %kept {offset = 7.500000e-01 : f64}" in spec.ir()
    canonical = af.compile(HAND_WRITTEN).variant.text  # hand-written IR with the op parses
    # Its own algebra: additive, rank 12, so ALiBi (10) moves above it and the mask below.
    assert canonical.index("attn.alibi") < canonical.index("attn.score_offset") < canonical.index("attn.mask")


@pytest.mark.parametrize("normalizer", [af.relu(), af.sigmoid(), af.softmax()], ids=["relu", "sigmoid", "softmax"])
def test_kernels_forward_backward(normalizer):
    q, k, v = make_qkv(1, 2, 1, 29, 37, 16, seed=5)
    spec = af.attention(af.causal(), score_offset(0.75), af.alibi(), normalizer)
    check_forward_backward(spec, q, k, v)


def test_hand_written_ir_matches_a_formula():
    """relu(s + 0.75 + alibi) / Nk on kept keys, written out in float64 by hand."""
    q, k, v = make_qkv(1, 2, 2, 24, 40, 16, seed=7)
    fn = af.compile(HAND_WRITTEN)
    out = fn(q, k, v).double()
    nq, nk = 24, 40
    s = q.double() @ k.double().transpose(-1, -2) / math.sqrt(16) + 0.75
    slopes = torch.tensor([2.0 ** -4, 2.0 ** -8], dtype=torch.float64).view(1, 2, 1, 1)  # 2 heads
    qpos = torch.arange(nq, dtype=torch.float64).view(-1, 1) + (nk - nq)
    kpos = torch.arange(nk, dtype=torch.float64).view(1, -1)
    s = s + slopes * (kpos - qpos)
    p = torch.where(kpos <= qpos, torch.relu(s), torch.zeros(())) / nk
    ref = p @ v.double()
    assert (out - ref).abs().max().item() < 1e-5
    # The printed kernels apply the offset as a map in every key loop.
    assert fn.source.count("+ 0.75") >= 2


def test_bad_offsets():
    with pytest.raises(CompositionError, match="score_offset: offset must be a finite"):
        score_offset(float("inf"))
    bad = HAND_WRITTEN.replace("7.500000e-01", "0x7FF0000000000000")
    with pytest.raises(AttnFuseError, match="score_offset offset must be a finite fp32 number"):
        af.compile(bad)


def test_unregistered_op_does_not_parse():
    unregister_block_module(score_offset_block)
    # (Another text: programs parsed while the op was registered stay cached.)
    with pytest.raises(AttnFuseError, match="attn.score_offset") as err:
        af.compile(HAND_WRITTEN.replace("7.500000e-01", "2.500000e-01"))
    assert "attnfuse.blocks.register_block_module(module)" in str(err.value)  # says how


@pytest.mark.parametrize("normalizer", [af.relu(), af.sigmoid(), af.softmax()], ids=["relu", "sigmoid", "softmax"])
def test_the_hopper_schedule_takes_the_block(normalizer):
    """The block, defined in this file only, reaches the warp-specialized (Gluon) kernels too:
    `warp-specialize` schedules its forward and its fused backward (its `tile.map` among the
    score ops, its derivative among the VJP ops) and the Gluon target prints both; nothing in
    the package names it."""
    from attnfuse.dialects import make_context
    from attnfuse.lowering.gluon import emit_gluon_kernel
    from attnfuse.runtime.compiler import CompileKey, lower_spec
    from attnfuse.runtime.config import TileConfig
    from attnfuse.transforms.warp_specialize import WarpSpecializePass

    spec = af.attention(score_offset(0.5), normalizer, af.causal())
    module = lower_spec(spec, CompileKey(128, 128, "bf16", TileConfig(64, 64, 4, 2), None, bwd_dq="ordered"))
    WarpSpecializePass().apply(make_context(), module)
    kernels = {op.sym_name.data: op for op in module.ops}
    for name in ("attention_fwd", "attention_bwd_dkdv_dq"):
        assert kernels[name].schedule is not None, name
        source = emit_gluon_kernel(kernels[name]).source
        assert "+ 0.5" in source, f"{name} applies the offset"


EDITED_BLOCK = '''
from dataclasses import dataclass
from typing import Any, ClassVar
from xdsl.dialects import arith
from xdsl.dialects.builtin import FloatAttr, f32
from xdsl.irdl import IRDLOperation, irdl_op_definition, operand_def, result_def, traits_def
from xdsl.traits import Pure
from attnfuse.dialects.attn import ScoresType
from attnfuse.dialects.interfaces import ScoreModifier
from attnfuse.dsl.blocks import Block

SHIFT = {shift}


@dataclass(frozen=True)
class ShiftSemantics(ScoreModifier):
    rank: int = 13
    additive: bool = True

    def lower(self, op, kernel, scores):
        def body(b, args):
            constant = b.insert(arith.ConstantOp(FloatAttr(SHIFT, f32))).result
            return b.insert(arith.AddfOp(args[0], constant)).result
        return kernel.scalar_map([scores], "scores", body)

    def evaluate(self, op, scores, env):
        return scores + SHIFT


@irdl_op_definition
class ShiftOp(IRDLOperation):
    name = "attn.prototype_shift"
    input = operand_def(ScoresType)
    result = result_def(ScoresType)
    traits = traits_def(Pure(), ShiftSemantics())

    def __init__(self, scores):
        super().__init__(operands=[scores], result_types=[ScoresType()])


@dataclass(frozen=True, repr=False)
class Shift(Block):
    category: ClassVar[str] = "modifier"
    hint: ClassVar[str] = "shifted"

    def build(self, variant, value):
        return ShiftOp(value)


OPS = (ShiftOp,)
'''


def test_an_edited_unregistered_block_gets_new_kernels(tmp_path, monkeypatch):
    """A prototype block used from the DSL without `register_block_module`, edited on disk
    between two compiles (same op, same IR, another lowering): the second compile's kernels are
    the edited ones, not the cached kernels of the first (the compile cache fingerprints the
    code of every op of the program defined outside the package)."""
    import importlib

    path = tmp_path / "prototype_shift.py"
    monkeypatch.syspath_prepend(str(tmp_path))
    q, k, v = make_qkv(1, 1, 1, 9, 9, 16, seed=3)
    outputs = []
    for shift in (0.5, 2.0):
        path.write_text(EDITED_BLOCK.format(shift=shift))
        module = importlib.reload(sys.modules["prototype_shift"]) if "prototype_shift" in sys.modules \
            else importlib.import_module("prototype_shift")
        spec = af.attention(module.Shift(), af.relu())  # relu: the shift changes the output
        out = af.compile(spec)(q, k, v)
        assert torch.allclose(out.double(), af.reference_attention(spec, q, k, v), atol=1e-5), shift
        outputs.append(out)
    assert not torch.allclose(outputs[0], outputs[1])
    sys.modules.pop("prototype_shift", None)


# --- a block author's mistakes: each named where it is made ------------------------------------


def _op_class(name: str, traits: tuple):
    """An op like `attn.score_offset` (same operand, result, property and syntax) under `name`
    with `traits`."""
    from xdsl.dialects.builtin import FloatAttr
    from xdsl.irdl import (IRDLOperation, ParsePropInAttrDict, irdl_op_definition, operand_def, prop_def,
                           result_def, traits_def)

    from attnfuse.dialects.attn import ScoresType

    namespace = {"name": name, "input": operand_def(ScoresType), "result": result_def(ScoresType),
                 "offset": prop_def(FloatAttr), "assembly_format": "$input attr-dict",
                 "irdl_options": (ParsePropInAttrDict(),), "traits": traits_def(*traits)}
    return irdl_op_definition(type("MistakeOp", (IRDLOperation,), namespace))


def _module(*ops):
    import types

    module = types.ModuleType("a_block_authors_module")
    module.OPS = ops
    return module


def _variant_with(op_name: str) -> str:
    return HAND_WRITTEN.replace("attn.score_offset", op_name)


def test_modules_that_cannot_join_the_dialect_are_refused():
    from xdsl.traits import Pure

    from attnfuse.blocks import block_module_problem

    assert "OPS must list" in block_module_problem(_module())
    assert "not an IRDL op class" in block_module_problem(_module(object))
    assert "must be named attn.<name>" in block_module_problem(_module(_op_class("mine.offset", (Pure(),))))
    clash = _module(_op_class("attn.softcap", (Pure(), score_offset_block.ScoreOffsetSemantics())))
    with pytest.raises(CompositionError, match="'attn.softcap' is already defined in the attn dialect"):
        register_block_module(clash)


def test_a_class_two_modules_list_is_one_op_but_two_classes_of_one_name_clash():
    """A block split over two files: one module defines the op, another lists it again (a
    re-export). That is one op, registered once; a second class of the same name is not."""
    from xdsl.traits import Pure

    from attnfuse.blocks import attn_dialect, block_module_problem

    semantics = score_offset_block.ScoreOffsetSemantics()
    op = _op_class("attn.offset_twice", (Pure(), semantics))
    defining, reexporting = _module(op), _module(op)
    register_block_module(defining)
    try:
        assert block_module_problem(reexporting) is None
        register_block_module(reexporting)
        try:
            assert [o for o in attn_dialect().operations if o.name == "attn.offset_twice"] == [op]
            other = _module(_op_class("attn.offset_twice", (Pure(), semantics)))
            assert "'attn.offset_twice' is already defined" in block_module_problem(other)
        finally:
            unregister_block_module(reexporting)
    finally:
        unregister_block_module(defining)
    twice_in_one = _module(op, _op_class("attn.offset_twice", (Pure(), semantics)))
    assert "'attn.offset_twice' is already defined" in block_module_problem(twice_in_one)


def test_a_split_block_reloaded_in_one_file_names_the_other_and_hints_list_its_op_once():
    """A block split over two files, its defining file reloaded (a new class of the op) while the
    other still lists the old one: re-registering the first says to reload the other too. Before
    that, an unregistered op's hint names the split block's op once, not once per file."""
    import importlib
    import sys
    from pathlib import Path

    from attnfuse.blocks import unregistered_op_hint

    inputs = str(Path(__file__).parents[2] / "lit" / "inputs")
    sys.path.append(inputs)
    try:
        import no_vjp_block
        import sibling_import_block

        register_block_module(no_vjp_block)
        register_block_module(sibling_import_block)
        try:
            hint = unregistered_op_hint("Operation attn.square_score is not registered", "load it")
            assert "closest: attn.square_scores;" in hint and hint.count("attn.square_scores") == 1
            importlib.reload(no_vjp_block)
            with pytest.raises(CompositionError, match="still listed, as it was before a reload, by another "
                                                       "registered module: reload and register that module too"):
                register_block_module(no_vjp_block)
        finally:
            unregister_block_module(sibling_import_block)
            unregister_block_module(no_vjp_block)
    finally:
        sys.path.remove(inputs)
        for name in ("no_vjp_block", "sibling_import_block"):
            sys.modules.pop(name, None)


def test_an_op_without_a_role_is_a_verifier_error_at_the_op():
    """An op implementing none of ScoreModifier, KeyFilter, Normalizer would reach the passes
    as nothing: the variant's verifier refuses it, naming it (and attnfuse-opt locates it)."""
    from xdsl.traits import Pure

    module = _module(_op_class("attn.offset_without_role", (Pure(),)))
    register_block_module(module)
    try:
        with pytest.raises(AttnFuseError, match="'attn.offset_without_role' inside attn.variant implements none of"):
            af.compile(_variant_with("attn.offset_without_role"))
    finally:
        unregister_block_module(module)


def test_a_lowering_that_returns_nothing_is_named():
    from xdsl.traits import Pure

    class ForgetfulSemantics(score_offset_block.ScoreOffsetSemantics):
        @staticmethod
        def offset(op):
            return op.offset.value.data

        def lower(self, op, kernel, scores):
            super().lower(op, kernel, scores)  # the map is added, its result not returned

    module = _module(_op_class("attn.forgetful_offset", (Pure(), ForgetfulSemantics())))
    register_block_module(module)
    try:
        q, k, v = make_qkv(1, 1, 1, 8, 8, 16, seed=5)
        with pytest.raises(AttnFuseError, match=r"'attn.forgetful_offset': its interface's lower\(\) returned NoneType"):
            af.compile(_variant_with("attn.forgetful_offset"))(q, k, v)
    finally:
        unregister_block_module(module)


def test_text_parsed_before_a_registration_change_is_parsed_again():
    """Fix a block, register the fixed module: the same program text now means the fixed op."""
    from xdsl.traits import Pure

    text = _variant_with("attn.changing_offset")
    broken = _module(_op_class("attn.changing_offset", (Pure(),)))
    class Semantics(score_offset_block.ScoreOffsetSemantics):
        @staticmethod
        def offset(op):
            return op.offset.value.data

    fixed = _module(_op_class("attn.changing_offset", (Pure(), Semantics())))
    q, k, v = make_qkv(1, 1, 1, 8, 8, 16, seed=6)
    register_block_module(broken)
    try:
        with pytest.raises(AttnFuseError, match="implements none of"):
            af.compile(text)
    finally:
        unregister_block_module(broken)
    register_block_module(fixed)
    try:
        assert torch.equal(af.compile(text)(q, k, v), af.compile(HAND_WRITTEN)(q, k, v))
    finally:
        unregister_block_module(fixed)


def test_a_category_typo_is_a_composition_error():
    class Typo(score_offset_block.ScoreOffset):
        category = "modifer"

    with pytest.raises(CompositionError, match="category 'modifer' is none of transform, scores, modifier"):
        af.attention(Typo(0.5), af.causal())


def test_a_reloaded_module_registered_again_takes_its_new_ops():
    """`importlib.reload` makes new op classes: registering the module again puts them in the
    dialect (a name clash with its own old ops is no clash)."""
    from attnfuse.blocks import attn_dialect, registry_generation

    from xdsl.traits import Pure

    before = registry_generation()
    module = _module(_op_class("attn.reloaded_offset", (Pure(),)))
    register_block_module(module)
    try:
        new_op = _op_class("attn.reloaded_offset", (Pure(),))  # stands in for the reloaded class
        module.OPS = (new_op,)
        register_block_module(module)
        assert registry_generation() > before + 1
        ops = {op.name: op for op in attn_dialect().operations}
        assert ops["attn.reloaded_offset"] is new_op
    finally:
        unregister_block_module(module)


def test_an_unhashable_category_is_a_composition_error():
    class Listed(score_offset_block.ScoreOffset):
        category = ["modifier"]

    with pytest.raises(CompositionError, match=r"category \['modifier'\] is none of"):
        af.attention(Listed(0.5))


@pytest.mark.parametrize("method", ["probs", "init_state", "finalize"])
def test_a_normalizer_method_that_returns_nothing_is_named(method, monkeypatch, tmp_path):
    """The Normalizer interface's methods are checked as the modifiers' are (a softmax with one
    method broken stands in for an out-of-tree normalizer)."""
    from attnfuse.blocks import softmax
    from attnfuse.runtime import compiler

    # An empty kernel cache, on disk and in memory, so that the lowering runs: the cache's key
    # does not see a package block's patched method.
    monkeypatch.setenv("ATTNFUSE_CACHE_DIR", str(tmp_path))
    compiler.forget_compiled()
    monkeypatch.setattr(softmax.SoftmaxSemantics, method, lambda self, *args: None)
    spec = af.attention(af.softcap(3.217), af.causal())  # parameters no other test compiles
    q, k, v = make_qkv(1, 1, 1, 8, 8, 16, seed=7)
    q.requires_grad_()
    with pytest.raises(AttnFuseError, match=rf"'attn.softmax': its interface's {method}\(\) returned NoneType"):
        af.compile(spec)(q, k, v).sum().backward()


# --- the compile cache's key follows the block's code -------------------------------------------


def _fingerprint() -> str:
    from attnfuse.runtime.code_fingerprint import foreign_fingerprint
    from attnfuse.runtime.program import as_program

    return foreign_fingerprint(as_program(af.attention(af.causal(), score_offset(0.5))).module((False, False)))


def test_the_compile_cache_key_follows_the_block_modules_data(monkeypatch):
    """A lowering may read a module-level dict or list: editing one must change the key (it
    reused the previous kernels from the disk cache: wrong numbers)."""
    monkeypatch.setattr(score_offset_block, "SETTINGS", {"remainder": 0.0, "rows": [1, 2]}, raising=False)
    before = _fingerprint()
    assert _fingerprint() == before
    score_offset_block.SETTINGS["rows"].append(3)
    assert _fingerprint() != before


def test_the_compile_cache_key_follows_helper_modules(monkeypatch, tmp_path):
    """Code the block module imports from a module of the user's (not from the libraries) is
    part of the key, imported as a module or by name; the libraries' modules are not."""
    import importlib

    helper = tmp_path / "offset_helper_for_key.py"
    helper.write_text("def body(x):\n    return x + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("offset_helper_for_key")
    try:
        monkeypatch.setattr(score_offset_block, "helper", module, raising=False)
        before = _fingerprint()
        monkeypatch.setattr(module, "body", lambda x: x + 2)
        as_module = _fingerprint()
        assert as_module != before
        monkeypatch.delattr(score_offset_block, "helper")
        monkeypatch.setattr(score_offset_block, "body", module.body, raising=False)  # from helper import body
        by_name = _fingerprint()
        monkeypatch.setattr(module, "body", lambda x: x + 3)
        monkeypatch.setattr(score_offset_block, "body", module.body)
        assert _fingerprint() != by_name
        monkeypatch.setattr(score_offset_block, "torch_module", torch, raising=False)  # a library: not hashed
        assert _fingerprint() == _fingerprint()
    finally:
        sys.modules.pop("offset_helper_for_key", None)


def test_the_compile_cache_key_is_the_same_in_every_process():
    """The key must not depend on the process (string hashing, set order), or no run would
    find the kernels an earlier one stored."""
    import os
    import subprocess
    from pathlib import Path

    here = Path(__file__).resolve().parent
    script = ("import sys; sys.path[:0] = [%r, %r]\n"
              "import attnfuse as af, score_offset_block\n"
              "from attnfuse.blocks import register_block_module\n"
              "register_block_module(score_offset_block)\n"
              "score_offset_block.SETTINGS = {'b': {1, 2, 'x'}, 'a': [0.5]}\n"
              "from attnfuse.runtime.code_fingerprint import foreign_fingerprint\n"
              "from attnfuse.runtime.program import as_program\n"
              "spec = af.attention(af.causal(), score_offset_block.score_offset(0.5))\n"
              "print(foreign_fingerprint(as_program(spec).module((False, False))))\n") % (str(here), str(here.parent))
    keys = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr
        keys.add(done.stdout.strip().splitlines()[-1])
    assert len(keys) == 1, keys


def test_the_compile_cache_key_takes_any_module_contents(monkeypatch):
    """Names a block module may hold that are neither code nor data of its own (a type whose
    `__code__` is a descriptor, torch's op namespaces, a container holding itself) neither
    crash the key nor make it differ between two reads."""
    import types

    monkeypatch.setattr(score_offset_block, "FunctionType", types.FunctionType, raising=False)
    monkeypatch.setattr(score_offset_block, "ops", torch.ops, raising=False)
    looped: dict = {"a": [1, 2]}
    looped["self"] = looped
    monkeypatch.setattr(score_offset_block, "LOOPED", looped, raising=False)
    assert _fingerprint() == _fingerprint()


def test_the_compile_cache_key_follows_lazy_and_namespace_imports(monkeypatch, tmp_path):
    """A helper imported inside a lowering function when it runs, or through a namespace
    package (a directory without `__init__.py`), is part of the key."""
    import importlib

    (tmp_path / "lazy_helper_for_key.py").write_text("FACTOR = 2.0\n")
    (tmp_path / "ns_for_key").mkdir()
    (tmp_path / "ns_for_key" / "scale.py").write_text("FACTOR = 2.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    lazy = importlib.import_module("lazy_helper_for_key")
    namespace = importlib.import_module("ns_for_key.scale")
    try:
        def reads_lazily():
            import lazy_helper_for_key

            return lazy_helper_for_key.FACTOR

        reads_lazily.__module__ = score_offset_block.__name__
        monkeypatch.setattr(score_offset_block, "reads_lazily", reads_lazily, raising=False)
        before = _fingerprint()
        monkeypatch.setattr(lazy, "FACTOR", 3.0)
        assert _fingerprint() != before

        monkeypatch.setattr(score_offset_block, "ns_for_key", sys.modules["ns_for_key"], raising=False)
        before = _fingerprint()
        monkeypatch.setattr(namespace, "FACTOR", 3.0)
        assert _fingerprint() != before
    finally:
        for name in ("lazy_helper_for_key", "ns_for_key", "ns_for_key.scale"):
            sys.modules.pop(name, None)


def test_an_interactive_sessions_history_is_not_part_of_the_key():
    """A block defined in a notebook (`__main__` without a file): the shell's history (`In`,
    `Out`, `_i3`, `_`) changes with every cell run and is left out, the user's data is not."""
    import types

    from attnfuse.runtime.code_fingerprint import _loaded_code

    main = types.ModuleType("__main__")
    main.In, main.Out, main._i3, main._ = ["", "x = 1"], {1: 2}, "x = 1", 2
    main.SCALE = 2.0
    before = _loaded_code(main)
    main.In.append("y = 2")
    main._i4, main._ = "y = 2", 3
    assert _loaded_code(main) == before
    main.SCALE = 3.0
    assert _loaded_code(main) != before


@pytest.mark.parametrize("method", ["step", "probs", "grad_scores"])
def test_a_normalizer_method_building_an_invalid_tile_op_is_located_at_its_op(method, monkeypatch):
    """A normalizer's lowering method whose `tile.map` holds an op no target prints (here
    softmax's, broken on purpose) is an `IRError` at the normalizer naming the method, not a
    verifier error of the kernel the pass made."""
    from xdsl.dialects import math as xmath

    from attnfuse.blocks import softmax
    from attnfuse.errors import IRError
    from attnfuse.runtime.compiler import CompileKey, lower_spec
    from attnfuse.runtime.config import TileConfig

    original = getattr(softmax.SoftmaxSemantics, method)

    def sine(k, value):
        return k.scalar_map([value], "bad", lambda b, args: b.insert(xmath.SinOp(args[0])).result)

    def broken(self, op, k, *args):
        out = original(self, op, k, *args)
        return (sine(k, out[0]), *out[1:]) if method == "step" else sine(k, out)

    monkeypatch.setattr(softmax.SoftmaxSemantics, method, broken)
    with pytest.raises(AttnFuseError, match=rf"'attn.softmax': its interface's {method}\(\) built an invalid tile "
                                            r"op: tile.map bodies hold only .*got math.sin") as caught:
        lower_spec(af.attention(af.causal()), CompileKey(16, 16, "f32", TileConfig(16, 16, 4, 1), None))
    located = caught.value.__cause__  # the pass's error, at the op (attnfuse-opt points there)
    assert isinstance(located, IRError) and located.op is not None and located.op.name == "attn.softmax"

"""`canonicalize-attn` writes an attn op's narrow float attributes at f64 only where the op
still verifies (the lit test `canonicalize-attn-float-width.mlir` shows the rewrite itself)."""

from __future__ import annotations

from xdsl.dialects.builtin import FloatAttr, f32, f64
from xdsl.utils.exceptions import VerifyException

from attnfuse.blocks.softcap import SoftcapOp
from attnfuse.dialects import make_context
from attnfuse.runtime.program import parse_attn
from attnfuse.transforms.canonicalize_attn import CanonicalizeAttnPass

PROGRAM = """
attn.variant @v(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %c = attn.softcap %s {cap = 3.0e+01 : f32}
  %p = attn.softmax %c
  %o = attn.pv %p, %v
  attn.yield %o
}
"""


def softcap_cap(module) -> FloatAttr:
    (op,) = [op for op in module.walk() if isinstance(op, SoftcapOp)]
    return op.properties["cap"]


def test_a_narrow_float_is_written_at_f64():
    module = parse_attn(PROGRAM)
    CanonicalizeAttnPass().apply(make_context(), module)
    cap = softcap_cap(module)
    assert cap.type == f64 and cap.value.data == 30.0


def test_a_width_the_op_requires_is_kept(monkeypatch):
    """An op whose verifier refuses f64 (stood in for: attn.softcap's, made to) keeps its f32."""
    original = SoftcapOp.verify_

    def wants_f32(self):
        if self.properties["cap"].type != f32:
            raise VerifyException("cap must be f32 here")
        original(self)

    monkeypatch.setattr(SoftcapOp, "verify_", wants_f32)
    module = parse_attn(PROGRAM)
    CanonicalizeAttnPass().apply(make_context(), module)
    assert softcap_cap(module).type == f32
    module.verify()

"""The printers' Python names: every name a printed kernel uses (assigns, reads, takes as a
parameter or defines as a function) is a Python built-in, one the printer reserved for
itself or one its `Namer` handed to an SSA value, so no IR value can take a name the printed
code also writes or reads (a hand-written `%splits` in a split merge, which the merge loop
would overwrite; a `%BLOCK_N`, which would shadow the tile width), and every IR name hint
becomes a Python identifier that means what the IR says (`%for`, `%a-b`, `%scores.x`,
`%float`)."""

from __future__ import annotations

import ast
import builtins

import pytest

import attnfuse as af
from attnfuse.dialects import make_context
from attnfuse.lowering.gluon import GluonEmitter
from attnfuse.lowering.gluon_backward import GluonBackwardEmitter
from attnfuse.lowering.gluon_persistent import PersistentGluonEmitter
from attnfuse.lowering.triton.emitter import KernelEmitter
from attnfuse.lowering.triton.names import Namer, identifier
from attnfuse.runtime.compiler import CompileKey, lower_spec
from attnfuse.runtime.config import TileConfig
from attnfuse.runtime.kv_cache import CacheLayout
from attnfuse.transforms.warp_specialize import WarpSpecializePass

SPECS = {
    "causal": af.attention(af.causal()),
    "rope-alibi-window": af.attention(af.rope(), af.alibi(), af.sliding_window(64), af.causal()),
    "bias-softcap": af.attention(af.additive_bias(), af.softcap(20.0)),
    "sigmoid-bias-alibi": af.attention(af.sigmoid(), af.additive_bias(), af.alibi()),
    "relu-causal": af.attention(af.relu(), af.causal()),
    "document-causal": af.attention(af.document(), af.causal()),
    "sparse-causal": af.attention(af.block_sparse(64), af.causal()),
}

FORMS = {
    "training": {},
    "ordered-backward": {"bwd_dq": "ordered"},
    "decode": {"decode": True},
    "paged-decode": {"decode": True, "cache": CacheLayout(kv_lens=True, page_size=16)},
}


def used_names(source: str) -> set[str]:
    """The names the code assigns or reads, its functions' names and their parameters."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.FunctionDef):
            names.add(node.name)
    return names


def unreserved_names(kernel, emitter_class) -> set[str]:
    emitter = emitter_class(kernel)
    source = "\n".join(emitter.run())
    return used_names(source) - emitter.namer.taken - set(dir(builtins))


REFUSED = {
    "listed-decode": "decode kernels",
}
"""Why `lower-to-tile` has no kernels of a form for a variant, by design (docs/architecture.md:
the split decode has no block lists)."""


def refusal(name: str, form: dict) -> str | None:
    """The `REFUSED` message `name`'s variant gets for `form`, or None if it lowers."""
    if name == "sparse-causal" and form.get("decode"):
        return REFUSED["listed-decode"]
    return None


def lowered(name: str, form: dict, rotation: str = "fused"):
    """The kernels of variant `name` in one form, or None where the form is refused by design
    (checked to be refused so, `refusal`); RoPE placed `rotation` (the Gluon forward takes
    pre-rotated operands only). A listed variant's dK/dV kernel gets the Gluon backward's
    tiles (the only ones `warp-specialize` schedules it on)."""
    spec = SPECS[name]
    canonical = af.compile(spec).program.canonical((False, False))
    placement = (rotation, rotation) if canonical.rope is not None else None
    gluon_tiles = canonical.listed and (canonical.block_size or 128) % 128 == 0
    config = TileConfig(64, 64, 4, 2, **({"dkdv_block_m": 128, "dkdv_block_n": 64} if gluon_tiles else {}))
    key = CompileKey(64, 64, "bf16", config, placement, **form)
    expected = refusal(name, form)
    if expected is None:
        return lower_spec(spec, key)
    with pytest.raises(af.AttnFuseError, match=expected):
        lower_spec(spec, key)
    return None


@pytest.mark.parametrize("form", FORMS, ids=list(FORMS))
@pytest.mark.parametrize("name", SPECS)
def test_triton_kernels_assign_only_names_the_namer_knows(name, form):
    module = lowered(name, FORMS[form])
    for kernel in module.ops if module is not None else ():
        assert not unreserved_names(kernel, KernelEmitter), kernel.sym_name.data


@pytest.mark.parametrize("form", [(False, "separate"), (True, "separate"), (False, "fused"), (False, "ordered")],
                         ids=["one-tile", "persistent", "fused-backward", "ordered-backward"])
@pytest.mark.parametrize("name", SPECS)
def test_gluon_kernels_assign_only_names_the_namer_knows(name, form):
    persistent, bwd_dq = form
    module = lowered(name, {"bwd_dq": bwd_dq}, rotation="pre_rotated")
    if module is None:
        return
    WarpSpecializePass(persistent=persistent).apply(make_context(), module)
    scheduled = [k for k in module.ops if k.get_attr_or_prop("schedule") is not None]
    assert scheduled, "warp-specialize scheduled no kernel"
    for kernel in scheduled:
        if kernel.grid == "key_blocks":
            emitter_class = GluonBackwardEmitter
        else:
            emitter_class = PersistentGluonEmitter if kernel.int_attr("persistent") == 1 else GluonEmitter
        assert not unreserved_names(kernel, emitter_class), kernel.sym_name.data


@pytest.mark.parametrize("hint, name", [
    ("scores", "scores"), ("for", "v_for"), ("a-b", "a_b"), ("scores.x", "scores_x"), ("float", "v_float"),
    ("range", "v_range"), ("$x", "_x"), ("0", "v_0"), ("", "value"),
])
def test_name_hints_become_identifiers(hint, name):
    assert identifier(hint) == name
    assert name.isidentifier()


def test_aliased_and_pinned_names_are_taken():
    """A name bound to a value by `alias` or `pin` (the Gluon target's loop-carried and
    in-place names) is never handed to another value."""
    namer = Namer(set())
    namer.alias(object(), "acc")
    namer.pin(object(), "scores")
    assert namer.fresh("acc") == "acc_1"
    assert namer.fresh("scores") == "scores_1"

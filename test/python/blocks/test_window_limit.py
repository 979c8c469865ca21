"""The widest sliding window the kernels compute right: band offsets are added to positions
in int32, so a window of 2**31 - 1 overflowed there (on the interpreter it kept the wrong keys,
error 0.4; 2**31 raised Triton's InterpreterError). Windows above `MAX_WINDOW` are refused
where they are written; the widest allowed one matches the reference."""

from __future__ import annotations

import pytest
import torch
from conftest import make_qkv

import attnfuse as af
from attnfuse.blocks.masks import MAX_WINDOW
from attnfuse.errors import AttnFuseError, CompositionError
from attnfuse.runtime.reference import reference_attention

pytestmark = pytest.mark.interpreter

IR = """attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {{
  %s = attn.scores %q, %k
  %m = attn.mask %s [#attn.window<{w}>]
  %p = attn.relu %m
  %o = attn.pv %p, %v
  attn.yield %o
}}
"""


@pytest.mark.parametrize("window", [MAX_WINDOW + 1, 2**31 - 1, 2**31, 2**70])
def test_too_wide_windows_are_refused(window):
    with pytest.raises(CompositionError, match=f"sliding_window: window size must be at most {MAX_WINDOW}"):
        af.sliding_window(window)
    with pytest.raises(AttnFuseError, match=f"window size must be at most {MAX_WINDOW}"):
        af.compile(IR.format(w=window))


@pytest.mark.parametrize("source", ["dsl", "ir"])
def test_widest_window_matches_the_reference(source):
    spec = af.attention(af.sliding_window(MAX_WINDOW), af.relu()) if source == "dsl" else IR.format(w=MAX_WINDOW)
    q, k, v = make_qkv(1, 2, 1, 20, 36, 16, seed=2)
    out = af.compile(spec)(q, k, v).double()
    ref = reference_attention(spec, q, k, v)
    # relu attention over every key (the window keeps them all): the test fails if keys drop.
    assert (out - ref).abs().max().item() < 1e-5
    assert ref.abs().max().item() > 1e-3

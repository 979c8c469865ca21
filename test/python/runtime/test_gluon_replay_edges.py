"""The descriptor replay's edges (`GluonRunner`, `call_key`, `descriptor_encoding`), with the
fakes of test_triton_launcher: a keyed call encodes each descriptor once, keys tell dtypes
apart, and descriptors the kernel was not lowered to TMA for are never kept."""

from __future__ import annotations

import pytest
import torch
import test_triton_launcher as fakes
from test_gluon_launch import DESCRIPTOR_PARAMS, DescriptorKernel
from test_triton_launcher import cuda  # noqa: F401 (a fixture)

from attnfuse.runtime import triton_launcher
from attnfuse.runtime.gluon_launch import GluonRunner, call_key


def test_a_keyed_first_call_encodes_each_descriptor_once(cuda, monkeypatch):  # noqa: F811
    monkeypatch.setattr(triton_launcher, "triton_version", lambda: (3, 6))
    encoded = []
    real = fakes.make_tensordesc_arg
    monkeypatch.setattr(fakes, "make_tensordesc_arg", lambda arg, meta: encoded.append(arg) or real(arg, meta))
    runner = GluonRunner(DescriptorKernel([], DESCRIPTOR_PARAMS), (1, 1), 8)
    runner(["a", "b", "x"], (0.5,), ("spec",), descriptors=2)  # the JIT call; makes the direct launcher
    encoded.clear()
    runner(["a", "b", "x"], (0.5,), ("spec",), descriptors=2, key=("new addresses",))
    assert encoded == ["a", "b"], encoded


def test_call_key_tells_dtypes_apart():
    a = torch.empty(2, 3, 8, 16, dtype=torch.bfloat16)
    assert call_key([a]) != call_key([a.view(torch.float16)])


def test_no_encoding_for_descriptors_without_metadata():
    inner = fakes.wrap_handle_tensordesc(print, [None, None])
    assert triton_launcher.descriptor_encoding(inner) is None

"""`gluon_launch.GluonRunner` with a fake Gluon kernel: the first call of each specialization
goes through the JIT, later ones through the compiled kernel's direct launcher with the
constexpr defaults appended, and a kernel whose parameters the launcher cannot lay out keeps
the JIT. The real kernels are launched on the H200 (test_gpu_gluon_backward.py)."""

from __future__ import annotations

import pytest
import torch
from test_triton_launcher import DescriptorLauncher, FakeCompiled, cuda  # noqa: F401 (cuda: a fixture)

from attnfuse.runtime import gluon_launch, triton_launcher
from attnfuse.runtime.gluon_launch import GluonRunner, call_key, specialization_of


class Param:
    def __init__(self, name, constexpr=False, default=None):
        self.name, self.is_constexpr, self.default = name, constexpr, default


class FakeKernel:
    """A JIT function: `params`, and `kernel[grid](...)` recording the launch and returning a
    compiled kernel."""

    def __init__(self, log, params):
        self.log, self.params = log, params

    def __getitem__(self, grid):
        def launch(*args, **options):
            self.log.append(("jit", grid, args, options))
            return FakeCompiled(self.log)
        return launch


PARAMS = [Param("q_desc"), Param("x_ptr"), Param("stride"), Param("sm_scale"), Param("n"),
          Param("BLOCK", True, 64), Param("num_warps", True, 8)]


def test_second_call_goes_direct(cuda):  # noqa: F811
    log: list = []
    runner = GluonRunner(FakeKernel(log, PARAMS), (3, 5), 8)
    args, scalars = ["desc", 1024, 1], (0.5, 77)
    runner(args, scalars, ("key",))
    assert log[-1][0] == "jit" and log[-1][3] == {"num_warps": 8}
    runner(args, scalars, ("key",))
    kind, launched = log[-1][0], log[-1][1]
    assert kind in ("c", "run") and launched[:3] == (3, 5, 1), "the direct launcher (C or CudaLauncher), not the JIT"
    assert launched[-len(args) - 4:] == (*args, *scalars, 64, 8), "runtime arguments, scalars, constexpr defaults"
    runner(args, scalars, ("other",))
    assert log[-1][0] == "jit", "a new specialization goes through the JIT first"


def test_kernels_the_launcher_cannot_lay_out_keep_the_jit(cuda):  # noqa: F811
    log: list = []
    params = [Param("q_desc"), Param("BLOCK", True, 64), Param("n")]  # a constexpr before a runtime parameter
    runner = GluonRunner(FakeKernel(log, params), (2,), 4)
    for _ in range(3):
        runner(["desc"], (9,), ("key",))
    assert [entry[0] for entry in log] == ["jit"] * 3


def test_runners_are_bounded(cuda, monkeypatch):  # noqa: F811
    monkeypatch.setattr(gluon_launch, "MAX_RUNNERS", 2)
    log: list = []
    runner = GluonRunner(FakeKernel(log, PARAMS), (1, 1), 8)
    for key in range(5):
        runner(["desc", 0, 1], (0.5, 1), (key,))
    assert len(runner.runners) <= 2


def test_specialization_holds_strides_alignment_and_dtype():
    a = torch.empty(2, 3, 8, 16)
    b = a.transpose(1, 2)
    assert specialization_of([a], []) != specialization_of([b], [])
    assert specialization_of([a], [a]) != specialization_of([a], [a.half()])
    assert specialization_of([a], []) == specialization_of([torch.empty(2, 3, 8, 16)], [])


class DescriptorCompiled(FakeCompiled):
    """A compiled kernel whose launcher is Triton 3.6's tensor-descriptor wrapper."""

    def __init__(self, log):
        super().__init__(log)
        self.run = DescriptorLauncher(log)


class DescriptorKernel(FakeKernel):
    def __getitem__(self, grid):
        def launch(*args, **options):
            self.log.append(("jit", grid, args, options))
            return DescriptorCompiled(self.log)
        return launch


DESCRIPTOR_PARAMS = [Param("a_desc"), Param("b_desc"), Param("x_ptr"), Param("sm_scale"), Param("BLOCK", True, 64)]


def test_replay_launches_the_encoded_descriptors_of_a_keyed_call(cuda, monkeypatch):  # noqa: F811
    monkeypatch.setattr(triton_launcher, "triton_version", lambda: (3, 6))
    log: list = []
    runner = GluonRunner(DescriptorKernel(log, DESCRIPTOR_PARAMS), (3, 5), 8)
    assert runner.replay(("key",), ["x"]) is False and log == [], "nothing to replay yet"
    runner(["desc a", "desc b", "x"], (0.5,), ("spec",), descriptors=2, key=("key",))
    assert log[-1][0] == "jit"
    assert runner.replay(("key",), ["x2"]) is True
    kind, launched = log[-1]
    assert kind == "c" and launched[:3] == (3, 5, 1)
    assert launched[-9:] == (("tensor map", "desc a", 1), 32, 128, ("tensor map", "desc b", 2), 32, 128,
                             "x2", 0.5, 64), "encoded descriptors, this call's pointers, scalars, constexprs"
    assert runner.replay(("other key",), ["x"]) is False
    runner(["desc c", "desc d", "x"], (0.5,), ("spec",), descriptors=2)
    assert len(runner.described) == 1, "a call without a key is not kept"


def test_described_calls_are_bounded(cuda, monkeypatch):  # noqa: F811
    monkeypatch.setattr(triton_launcher, "triton_version", lambda: (3, 6))
    monkeypatch.setattr(gluon_launch, "MAX_DESCRIBED", 3)
    runner = GluonRunner(DescriptorKernel([], DESCRIPTOR_PARAMS), (1, 1), 8)
    for key in range(5):
        runner(["a", "b", "x"], (0.5,), ("spec",), descriptors=2, key=(key,))
    assert list(runner.described) == [(2,), (3,), (4,)], "the oldest go first"


def test_call_key_holds_address_strides_and_shape():
    a = torch.empty(2, 3, 8, 16)
    assert call_key([a]) == call_key([a]) != call_key([a.transpose(1, 2)])
    assert call_key([a]) != call_key([a[:, :, 1:]])
    assert call_key([a[:1]]) != call_key([a])

"""The Gluon launches' call path without a GPU (`GluonLaunch`, `GluonBackwardLaunch`): with a
recording stand-in for the compiled kernel, each call hands the kernel the descriptors over the
right tensors in the launch ABI's order, then the other roles' pointers and strides and the
plan's scalars; an input a descriptor cannot cover is copied (backward) or the call goes to the
portable launch (forward inputs, backward outputs), counted. The kernels themselves run on the
H200 (test_gpu_gluon.py, test_gpu_gluon_backward.py)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton.experimental.gluon.nvidia.hopper")

from attnfuse.lowering.gluon import GluonKernel  # noqa: E402
from attnfuse.runtime.gluon_backward import GluonBackwardLaunch  # noqa: E402
from attnfuse.runtime.gluon_forward import GluonLaunch  # noqa: E402
from attnfuse.runtime.inputs import Problem  # noqa: E402


class Param:
    def __init__(self, name, constexpr=False, default=None):
        self.name, self.is_constexpr, self.default = name, constexpr, default


class RecordingKernel:
    """A JIT function that records its launches (grid, arguments) and compiles nothing."""

    def __init__(self, params):
        self.params, self.launches = params, []

    def __getitem__(self, grid):
        def launch(*args, **options):
            self.launches.append((grid, args, options))
        return launch


class RecordingPortable:
    def __init__(self):
        self.info, self.calls = None, []

    def __call__(self, tensors):
        self.calls.append(tensors)


def problem(b=2, hq=4, hkv=2, n=256, d=128):
    return Problem(b, hq, hkv, n, n, d, d, torch.bfloat16, torch.device("cpu"))


def backward_tensors(p: Problem):
    bf = torch.bfloat16
    q = torch.randn(p.batch, p.heads_q, p.seq_q, p.head_dim, dtype=bf)
    k = torch.randn(p.batch, p.heads_kv, p.seq_k, p.head_dim, dtype=bf)
    return {"q": q, "k": k, "v": torch.randn_like(k), "do": torch.randn_like(q), "dk": torch.empty_like(k),
            "dv": torch.empty_like(k), "dq_acc": torch.zeros(q.shape), "lse": torch.randn(q.shape[:-1]),
            "delta": torch.randn(q.shape[:-1])}


ROLES = ("q", "k", "v", "do", "lse", "delta", "dk", "dv", "dq_acc")


def backward_launch(p: Problem):
    info = GluonKernel("attention_bwd_dkdv_dq", ROLES, ("q", "k", "v", "do"), 128, 64, 8)
    params = [Param(f"arg{i}") for i in range(9 + 5 + 5)] + [Param("BLOCK_M", True, 128)]
    kernel, portable = RecordingKernel(params), RecordingPortable()
    return GluonBackwardLaunch(portable, kernel, info, p, 0.125), kernel, portable


def test_backward_call_hands_the_abi_its_tensors():
    p = problem()
    launch, kernel, portable = backward_launch(p)
    tensors = backward_tensors(p)
    launch(tensors)
    assert not portable.calls and not launch.fallbacks
    grid, args, options = kernel.launches[0]
    assert grid == (p.batch * p.heads_kv, 2) and options == {"num_warps": 8}
    descs, rest = args[:9], args[9:]
    for desc, role in zip(descs, ("q", "k", "v", "do", "dk", "dv", "dq_acc", "lse", "delta")):
        assert desc.base is tensors[role], role
    assert list(descs[1].block_shape) == [1, 1, 128, 128] and list(descs[0].block_shape) == [1, 1, 64, 128]
    assert list(descs[7].shape) == [tensors["lse"].numel()] and list(descs[7].block_shape) == [64]
    dk = tensors["dk"]
    assert rest == (dk, *dk.stride(), 0.125, p.seq_q, p.seq_k, p.heads_kv, p.group_size)


def test_backward_copies_an_expanded_grad_and_falls_back_on_foreign_outputs():
    p = problem()
    launch, kernel, portable = backward_launch(p)
    tensors = backward_tensors(p)
    tensors["do"] = torch.randn(1, 1, 1, 128, dtype=torch.bfloat16).expand_as(tensors["q"])
    launch(tensors)
    copied = kernel.launches[0][1][3].base
    assert copied is not tensors["do"] and copied.is_contiguous() and torch.equal(copied, tensors["do"])
    tensors["lse"] = torch.randn(p.batch, p.seq_q, p.heads_q).transpose(1, 2)  # not contiguous
    launch(tensors)
    assert len(portable.calls) == 1 and launch.fallbacks == {"lse": 1}


def forward_launch(p: Problem):
    info = GluonKernel("attention_fwd", ("q", "k", "v", "o", "lse"), ("q", "k", "v", "o"), 128, 128, 4)
    kernel = RecordingKernel([Param(f"arg{i}") for i in range(4 + 4 + 5)] + [Param("BLOCK_M", True, 128)])
    portable = RecordingPortable()
    return GluonLaunch(portable, kernel, info, p, 0.125, info.operands), kernel, portable


def forward_tensors(p: Problem):
    t = backward_tensors(p)
    return {"q": t["q"], "k": t["k"], "v": t["v"], "o": torch.empty_like(t["q"]), "lse": t["lse"]}


def test_forward_call_hands_the_abi_its_tensors_and_falls_back_on_expanded_keys():
    p = problem()
    launch, kernel, portable = forward_launch(p)
    tensors = forward_tensors(p)
    t = tensors
    launch(tensors)
    grid, args, _ = kernel.launches[0]
    assert grid == (p.batch * p.heads_q, 2)
    assert [d.base for d in args[:4]] == [tensors[r] for r in ("q", "k", "v", "o")]
    assert args[4:] == (tensors["lse"], *tensors["lse"].stride(), 0.125, p.seq_q, p.seq_k, p.heads_q, p.group_size)
    tensors["k"] = t["k"][:, :1].expand_as(t["k"])
    launch(tensors)
    assert len(portable.calls) == 1 and len(kernel.launches) == 1


class ReplayingRunner:
    """A `GluonRunner` stand-in: keeps the keys it was given and replays them."""

    def __init__(self):
        self.kept, self.calls, self.replays = set(), [], []

    def replay(self, key, rest):
        if key in self.kept:
            self.replays.append(rest)
            return True
        return False

    def __call__(self, args, scalars, specialization, descriptors=0, key=None):
        self.calls.append((args, descriptors, key))
        if key is not None:
            self.kept.add(key)


def test_backward_replays_a_call_with_the_same_tensors_only():
    p = problem()
    launch, _kernel, _portable = backward_launch(p)
    launch.__dict__["runner"] = runner = ReplayingRunner()
    tensors = backward_tensors(p)
    launch(tensors)
    assert runner.calls[0][1] == 9 and runner.calls[0][2] is not None, "nine descriptors, keyed"
    launch(dict(tensors))
    assert len(runner.calls) == 1 and len(runner.replays) == 1, "the same tensors: replayed"
    launch({**tensors, "dk": torch.empty_like(tensors["dk"])})
    assert len(runner.calls) == 2, "another output tensor: a new launch"
    expanded = {**tensors, "do": tensors["do"][:, :1].expand_as(tensors["do"])}
    launch(expanded)
    launch(expanded)
    assert [call[2] for call in runner.calls[2:]] == [None, None], "a copied input is never replayed"


def test_forward_replays_a_call_with_the_same_tensors():
    p = problem()
    launch, _kernel, portable = forward_launch(p)
    launch.__dict__["runner"] = runner = ReplayingRunner()
    tensors = forward_tensors(p)
    launch(tensors)
    launch(dict(tensors))
    assert len(runner.calls) == 1 and len(runner.replays) == 1 and runner.calls[0][1] == 4
    launch({**tensors, "q": tensors["q"].clone()})
    assert len(runner.calls) == 2

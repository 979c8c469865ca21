"""`LaunchGraphs`' choices, without a GPU: when a schedule's launches are captured, replayed or
launched directly. The graphs and the CUDA queries are stood in for (recorded calls), the
tensors are CPU tensors (their addresses, strides and dtypes make the keys). The replays'
results, bitwise those of the direct launches, are checked on the GPU (test_gpu.py)."""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch

from attnfuse.runtime import launch_graphs
from attnfuse.runtime.launch_graphs import MAX_GRAPHS, LaunchGraphs


class FakeGraph:
    """Records its capture and replays; `fail` makes capture_end raise, as an invalidated
    capture does."""

    made: ClassVar[list[FakeGraph]] = []
    fail = False

    def __init__(self):
        self.captured: list[str] = []
        self.replays = 0
        self.capturing = False
        FakeGraph.made.append(self)

    def capture_begin(self, capture_error_mode="global"):
        assert capture_error_mode == "relaxed"
        self.capturing = True

    def capture_end(self):
        self.capturing = False
        if FakeGraph.fail:
            raise RuntimeError("operation not permitted when stream is capturing")

    def replay(self):
        self.replays += 1


@pytest.fixture
def cuda_stand_ins(monkeypatch):
    """CUDA's queries answered as on an idle device 0; `state` changes the answers."""
    state = {"capturing": False, "device": 0, "hooks_idle": True, "allocations": 0}
    monkeypatch.setattr(launch_graphs, "_native_allocator", lambda: True)
    monkeypatch.setattr(launch_graphs, "_capturing", lambda: state["capturing"])
    monkeypatch.setattr(launch_graphs, "_allocations", lambda device: state["allocations"])
    monkeypatch.setattr(launch_graphs, "current_device", lambda: state["device"])
    monkeypatch.setattr(launch_graphs, "hooks_idle", lambda: state["hooks_idle"])
    monkeypatch.setattr(launch_graphs, "_side_stream", lambda device: None)
    monkeypatch.setattr(launch_graphs.torch.cuda, "stream", lambda stream: _NoContext())
    monkeypatch.setattr(launch_graphs, "ENABLED", True)
    FakeGraph.made, FakeGraph.fail = [], False
    return state


class _NoContext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def schedule(log: list[str], fail_on: str | None = None):
    """Two launches that record their names (and whether a graph was capturing them)."""
    def launch(name):
        def run(tensors):
            capturing = any(g.capturing for g in FakeGraph.made)
            log.append(f"{name}{' (captured)' if capturing else ''}")
            if name == fail_on:
                raise RuntimeError("launch failed")
        return run
    return [launch("dq"), launch("dkdv")]


def tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return {"q": torch.randn(1, 2, 8, 4), "k": torch.randn(1, 2, 8, 4), "dq": torch.empty(1, 2, 8, 4)}


def graphs_for(log, **kwargs):
    return LaunchGraphs(schedule(log, **kwargs), ["q", "k", "dq"], torch.device("cuda", 0), new_graph=FakeGraph)


def test_a_key_is_captured_the_second_time_and_replayed_after(cuda_stand_ins):
    log: list[str] = []
    graphs = graphs_for(log)
    call = tensors()
    assert graphs(call) is False and log == []  # first sighting: the caller launches
    assert graphs(call) is True
    assert log == ["dq (captured)", "dkdv (captured)"]  # recorded once, in order, while capturing
    assert [g.replays for g in FakeGraph.made] == [1]  # and run through the graph
    for _ in range(3):
        assert graphs(call) is True
    assert len(log) == 2 and FakeGraph.made[0].replays == 4


def test_another_address_strides_or_dtype_is_another_key(cuda_stand_ins):
    """Each changes one thing a launch fixes, all else equal: a tensor of the same shape and
    strides elsewhere; the same address with other strides; the same address, shape and
    strides read as another dtype."""
    log: list[str] = []
    graphs = graphs_for(log)
    call = tensors()
    graphs(call), graphs(call)
    k = call["k"]
    changed = {
        "address": dict(call, q=torch.randn(1, 2, 8, 4)),
        "strides": dict(call, k=k.as_strided(k.shape, (64, 32, 1, 8))),
        "dtype": dict(call, dq=call["dq"].view(torch.int32)),
    }
    assert changed["strides"]["k"].data_ptr() == k.data_ptr()
    assert changed["dtype"]["dq"].data_ptr() == call["dq"].data_ptr()
    assert changed["dtype"]["dq"].stride() == call["dq"].stride()
    for other in changed.values():
        assert graphs(other) is False
    assert len(FakeGraph.made) == 1
    # Each captures on its second call, into a graph of its own.
    for count, other in enumerate(changed.values(), start=2):
        assert graphs(other) is True and len(FakeGraph.made) == count
    assert graphs(call) is True and FakeGraph.made[0].replays == 2


@pytest.mark.parametrize("why", ["capturing", "hooks", "device", "disabled"])
def test_launches_go_direct_where_a_graph_must_not_replay(cuda_stand_ins, monkeypatch, why):
    """Inside the caller's capture (its graph records the launches), under a launch hook, on
    another current device, or with ATTNFUSE_LAUNCH_GRAPHS=off: nothing is captured or
    replayed, even for a key already captured."""
    log: list[str] = []
    graphs = graphs_for(log)
    call = tensors()
    graphs(call), graphs(call)
    if why == "capturing":
        cuda_stand_ins["capturing"] = True
    elif why == "hooks":
        cuda_stand_ins["hooks_idle"] = False
    elif why == "device":
        cuda_stand_ins["device"] = 1
    else:
        monkeypatch.setattr(launch_graphs, "ENABLED", False)
    assert graphs(call) is False
    assert FakeGraph.made[0].replays == 1


def test_a_failed_capture_leaves_the_schedule_on_direct_launches(cuda_stand_ins):
    log: list[str] = []
    graphs = graphs_for(log)
    FakeGraph.fail = True
    call = tensors()
    graphs(call)
    assert graphs(call) is False  # the capture failed: the caller launches
    assert graphs.failed and "not permitted" in graphs.failed
    FakeGraph.fail = False
    assert graphs(call) is False and graphs(tensors(1)) is False and graphs(tensors(1)) is False
    assert len(FakeGraph.made) == 1


def test_a_launch_failing_while_captured_is_left_to_the_direct_launch(cuda_stand_ins):
    log: list[str] = []
    graphs = graphs_for(log, fail_on="dkdv")
    call = tensors()
    graphs(call)
    assert graphs(call) is False and "launch failed" in graphs.failed
    assert not FakeGraph.made[0].capturing  # the capture was ended


def test_graphs_kept_per_schedule_are_bounded_and_never_thrash(cuda_stand_ins):
    """Past MAX_GRAPHS keys, new ones launch directly and the graphs kept still replay: a cycle
    of more keys than that (a deep model's layers) never captures on every call."""
    log: list[str] = []
    graphs = graphs_for(log)
    calls = [tensors(i) for i in range(MAX_GRAPHS + 8)]
    for _cycle in range(3):
        results = [graphs(call) for call in calls]
    assert len(FakeGraph.made) == MAX_GRAPHS
    assert results == [True] * MAX_GRAPHS + [False] * 8


def test_a_capture_that_allocates_is_dropped(cuda_stand_ins):
    """A launch that allocates while captured (a copy of an input) would keep that memory in
    the graph's pool: the graph is not kept and the schedule launches directly."""
    log: list[str] = []
    launches = schedule(log)

    def copying(tensors):
        launches[0](tensors)
        if any(g.capturing for g in FakeGraph.made):
            cuda_stand_ins["allocations"] += 1  # a copy, freed again: the count stays up

    graphs = LaunchGraphs([copying, launches[1]], ["q", "k", "dq"], torch.device("cuda", 0), new_graph=FakeGraph)
    call = tensors()
    graphs(call)
    assert graphs(call) is False and "allocated memory" in graphs.failed
    assert graphs.graphs == {} and FakeGraph.made[0].replays == 0


def test_what_beginning_and_ending_a_capture_allocates_is_not_a_launchs(cuda_stand_ins):
    """Beginning a capture allocates the CUDA generator's graph-safe state (the first time):
    that is the graph's, not a launch copying an input, and the graph is kept (on the GPU
    every capture was dropped while the count spanned capture_begin and capture_end)."""
    class AllocatingGraph(FakeGraph):
        def capture_begin(self, **kwargs):
            cuda_stand_ins["allocations"] += 2
            super().capture_begin(**kwargs)

        def capture_end(self):
            cuda_stand_ins["allocations"] += 1
            super().capture_end()

    log: list[str] = []
    graphs = LaunchGraphs(schedule(log), ["q", "k", "dq"], torch.device("cuda", 0), new_graph=AllocatingGraph)
    call = tensors()
    assert [graphs(call) for _ in range(3)] == [False, True, True]
    assert graphs.failed is None and len(graphs.graphs) == 1


def test_schedules_key_every_role_their_launches_read(cuda_stand_ins):
    """`KernelExecution._graphs`: a graph per schedule of several launches, keyed by the union
    of their roles and a Gluon launch's own (`keyed_roles`), a pre-rotation kernel's copy
    among them; none for one launch, or with a launch that allocates on every call (a Gluon
    backward padding its rows)."""
    from types import SimpleNamespace

    from attnfuse.runtime.execution import KernelExecution

    def launch(roles, keyed=()):
        fake = SimpleNamespace(info=SimpleNamespace(roles=roles), allocates=False)  # as KernelLaunch
        if keyed:
            fake.keyed_roles = keyed
        return fake

    plan = SimpleNamespace(problem=SimpleNamespace(device=torch.device("cuda", 0)))
    dtype = torch.float16
    schedule_ = ((launch(("q", "k", "dq")), None, dtype), (launch(("q", "dk"), keyed=("q", "dk", "dq_acc")), None, dtype))
    graphs = KernelExecution._graphs(plan, schedule_)
    call = {name: torch.empty(2, 3) for name in ("q", "k", "dq", "dk", "dq_acc", "v")}
    assert len(graphs.key(call)) == 3 * 5  # q, k, dq, dk, dq_acc: not v, which no launch reads
    for name in ("q", "k", "dq", "dk", "dq_acc"):
        assert graphs.key(dict(call, **{name: torch.empty(2, 3)})) != graphs.key(call), name
    assert KernelExecution._graphs(plan, schedule_[:1]) is None
    rotating = ((launch(("q", "q_rot", "rope_table")), "q_rot", dtype), *schedule_)
    rotating_graphs = KernelExecution._graphs(plan, rotating)
    call |= {"q_rot": torch.empty(2, 3), "rope_table": torch.empty(2, 3)}
    assert rotating_graphs.key(dict(call, q_rot=torch.empty(2, 3))) != rotating_graphs.key(call), \
        "the rotated copy's address is part of the key"
    padding = launch(("q", "dk"), keyed=("q", "dk", "dq_acc"))
    padding.allocates = True
    assert KernelExecution._graphs(plan, (schedule_[0], (padding, None, dtype))) is None
    padding.allocates = False
    assert KernelExecution._graphs(plan, (schedule_[0], (padding, None, dtype))) is not None


@pytest.mark.parametrize("backend, usable", [("native", True), ("cudaMallocAsync", False), (None, False)])
def test_native_allocator_reads_the_backend(backend, usable, monkeypatch):
    """`_native_allocator`: PyTorch's caching allocator only; a build without CUDA (whose query
    raises) counts as not native."""
    def get_allocator_backend():
        if backend is None:
            raise AttributeError("module 'torch._C' has no attribute '_cuda_getAllocatorBackend'")
        return backend

    monkeypatch.setattr(launch_graphs.torch.cuda, "get_allocator_backend", get_allocator_backend)
    assert launch_graphs._native_allocator() is usable


def test_cpu_schedules_never_use_graphs():
    graphs = LaunchGraphs(schedule([]), ["q"], torch.device("cpu"))
    assert not graphs.usable and graphs(tensors()) is False
    assert not LaunchGraphs(schedule([])[:1], ["q"], torch.device("cuda", 0)).usable  # one launch


def test_only_the_caching_allocator_lets_launches_replay(cuda_stand_ins, monkeypatch):
    """Under `cudaMallocAsync` PyTorch's statistics hold no allocation counts, so a launch that
    copies an input while captured could not be seen: its schedules launch directly."""
    assert LaunchGraphs(schedule([]), ["q"], torch.device("cuda", 0)).usable
    monkeypatch.setattr(launch_graphs, "_native_allocator", lambda: False)
    graphs = LaunchGraphs(schedule([]), ["q"], torch.device("cuda", 0), new_graph=FakeGraph)
    call = tensors()
    assert not graphs.usable and [graphs(call) for _ in range(3)] == [False] * 3 and FakeGraph.made == []


def test_the_setting_is_checked(monkeypatch):
    monkeypatch.setenv(launch_graphs.LAUNCH_GRAPHS_ENV, "sometimes")
    with pytest.raises(Exception, match="ATTNFUSE_LAUNCH_GRAPHS must be on or off"):
        launch_graphs._launch_graphs_setting()
    for value, enabled in ((" OFF ", False), ("0", False), ("false", False), ("on", True), ("1", True), ("", True)):
        monkeypatch.setenv(launch_graphs.LAUNCH_GRAPHS_ENV, value)
        assert launch_graphs._launch_graphs_setting() is enabled, value


@pytest.mark.parametrize("replayed", [True, False], ids=["replayed", "direct"])
def test_a_rotated_copy_is_allocated_before_the_graph_is_asked(replayed):
    """`KernelExecution._run` allocates a pre-rotation kernel's copy before it asks the
    schedule's graphs, so the graph's key holds the copy's address and a replay writes the
    copy the call returns; launched directly, every launch sees the same copy."""
    from types import SimpleNamespace

    from attnfuse.runtime.execution import KernelExecution

    seen: list[dict[str, torch.Tensor]] = []

    class Launch:
        def __init__(self, name):
            self.info = SimpleNamespace(name=name)

        def __call__(self, tensors):
            seen.append(dict(tensors))

    def graphs(tensors):
        seen.append(dict(tensors))
        return replayed

    schedule = ((Launch("rotate_query"), "q_rot", torch.float16), (Launch("attention_fwd"), None, torch.float16))
    kernels = ("attention_fwd",)
    plan = SimpleNamespace(schedules={(kernels, False, False): (schedule, graphs)})
    tensors = {"q": torch.randn(1, 2, 8, 4, dtype=torch.float16).transpose(1, 2)}
    KernelExecution()._run(plan, tensors, kernels)
    assert len(seen) == (1 if replayed else 3)
    copy = seen[0]["q_rot"]
    assert copy.shape == tensors["q"].shape and copy.stride() == tensors["q"].stride(), "in q's memory order"
    assert all(call["q_rot"] is copy for call in seen) and tensors["q_rot"] is copy

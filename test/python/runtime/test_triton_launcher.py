"""`triton_launcher.direct_launcher`: which of Triton's interfaces a direct launch calls, with
what, on which stream. Triton's compiled kernel, launcher and the CUDA queries are fakes that
record their calls, so these run anywhere; the GPU tests launch the real ones
(test_gpu.py::test_direct_launches_*)."""

from __future__ import annotations

import pytest
from triton import knobs
from triton.knobs import HookChain

from attnfuse.runtime import triton_launcher

GRID = (4, 5, 1)
TRAILING = (0.5, 7, 64)
ARGS = [1024, 64, 1, 2048, 8, 1]


class FakeLauncher:
    """A `CudaLauncher` whose `__call__` and C launcher record what they are given."""

    def __init__(self, log: list, scratch: int = 0):
        self.log = log
        self.launch_cooperative_grid, self.launch_pdl = False, True
        self.global_scratch_size, self.profile_scratch_size = scratch, 0

    def __call__(self, *args):
        self.log.append(("run", args))

    def launch(self, *args):
        self.log.append(("c", args))


def fake_launcher_class(name: str, module: str) -> type:
    return type(name, (FakeLauncher,), {"__module__": module})


NVIDIA = fake_launcher_class("CudaLauncher", "triton.backends.nvidia.driver")


class FakeCompiled:
    function, packed_metadata = 77, (4, 1, 0)

    def __init__(self, log: list, launcher_class: type = NVIDIA, scratch: int = 0):
        self.log = log
        self.run = launcher_class(log, scratch)

    def __getitem__(self, grid):
        return lambda *args: self.log.append(("runner", grid, args))


@pytest.fixture
def cuda(monkeypatch):
    """The current device (index 0) and stream (0x100 + the device), as settable state."""
    state = {"device": 0, "stream": 0x100}
    monkeypatch.setattr(triton_launcher, "current_device", lambda: state["device"])
    monkeypatch.setattr(triton_launcher, "raw_stream", lambda device: state["stream"] + device)
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", HookChain())
    monkeypatch.setattr(knobs.runtime, "launch_exit_hook", HookChain(reversed=True))
    return state


def with_version(monkeypatch, version: tuple[int, int]) -> None:
    monkeypatch.setattr(triton_launcher, "triton_version", lambda: version)


def test_triton_3_6_calls_the_c_launcher_with_no_scratch_hooks_or_metadata(cuda, monkeypatch):
    with_version(monkeypatch, (3, 6))
    log: list = []
    launch = triton_launcher.direct_launcher(FakeCompiled(log), GRID, TRAILING)
    assert launch.path == "c"
    assert launch(ARGS) is True
    assert log == [("c", (4, 5, 1, 0x100, 77, False, True, None, None, (4, 1, 0), None, None, None,
                          *ARGS, *TRAILING))]


def test_triton_3_9_calls_the_launcher_as_its_runner_does(cuda, monkeypatch):
    with_version(monkeypatch, (3, 9))
    log: list = []
    launch = triton_launcher.direct_launcher(FakeCompiled(log), GRID, TRAILING)
    assert launch.path == "launcher"
    launch(ARGS)
    assert log == [("run", (4, 5, 1, 0x100, 77, (4, 1, 0), None, None, None, *ARGS, *TRAILING))]


def test_a_launcher_that_allocates_scratch_is_called_as_the_runner_does(cuda, monkeypatch):
    with_version(monkeypatch, (3, 6))
    log: list = []
    triton_launcher.direct_launcher(FakeCompiled(log, scratch=256), GRID, TRAILING)(ARGS)
    assert log[0][0] == "run"


def test_another_launcher_class_is_never_called_in_c(cuda, monkeypatch):
    with_version(monkeypatch, (3, 6))
    log: list = []
    other = fake_launcher_class("CudaLauncher", "some.other.backend")
    triton_launcher.direct_launcher(FakeCompiled(log, other), GRID, TRAILING)(ARGS)
    assert log[0][0] == "run"


@pytest.mark.parametrize("version", [(3, 5), (3, 10), (4, 0), (0, 0)])
def test_an_unknown_triton_goes_through_its_runner(cuda, monkeypatch, version):
    with_version(monkeypatch, version)
    log: list = []
    launch = triton_launcher.direct_launcher(FakeCompiled(log), GRID, TRAILING)
    assert launch.path == "runner"
    assert launch(ARGS) is True
    assert log == [("runner", GRID, (*ARGS, *TRAILING))]


def test_without_torch_cuda_queries_it_goes_through_the_runner(cuda, monkeypatch):
    with_version(monkeypatch, (3, 6))
    monkeypatch.setattr(triton_launcher, "raw_stream", None)
    log: list = []
    triton_launcher.direct_launcher(FakeCompiled(log), GRID, TRAILING)(ARGS)
    assert log[0][0] == "runner"


@pytest.mark.parametrize("version", [(3, 6), (3, 9)])
def test_each_launch_takes_the_stream_current_then(cuda, monkeypatch, version):
    # A torch.cuda.stream context (or a graph capture) changes the current stream between
    # calls: the launch must follow it, never keep the first one.
    with_version(monkeypatch, version)
    log: list = []
    launch = triton_launcher.direct_launcher(FakeCompiled(log), GRID, TRAILING)
    launch(ARGS)
    cuda["stream"] = 0x900
    launch(ARGS)
    assert [entry[1][3] for entry in log] == [0x100, 0x900]


@pytest.mark.parametrize("version", [(3, 6), (3, 9)])
def test_another_current_device_declines(cuda, monkeypatch, version):
    with_version(monkeypatch, version)
    log: list = []
    launch = triton_launcher.direct_launcher(FakeCompiled(log), GRID, TRAILING)
    cuda["device"] = 1
    assert launch(ARGS) is False and log == []
    cuda["device"] = 0
    assert launch(ARGS) is True and len(log) == 1


@pytest.mark.parametrize("hook", ["launch_enter_hook", "launch_exit_hook"])
def test_an_installed_launch_hook_sends_launches_through_the_runner(cuda, monkeypatch, hook):
    # A profiler (proton) adds hooks at any time: from then on Triton's runner, which builds
    # the launch metadata the hooks read, launches; removed, the direct path again.
    with_version(monkeypatch, (3, 6))
    log: list = []
    launch = triton_launcher.direct_launcher(FakeCompiled(log), GRID, TRAILING)

    def profiler(metadata):
        pass

    getattr(knobs.runtime, hook).add(profiler)
    launch(ARGS)
    getattr(knobs.runtime, hook).remove(profiler)
    launch(ARGS)
    assert [entry[0] for entry in log] == ["runner", "c"]


def test_a_hook_set_as_a_plain_function_counts_as_installed(cuda, monkeypatch):
    with_version(monkeypatch, (3, 9))
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", lambda metadata: None)
    assert not triton_launcher.hooks_idle()
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", None)
    assert triton_launcher.hooks_idle()

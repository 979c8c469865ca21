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


# Triton 3.6's tensor-descriptor wrapper, as its driver.py shapes it: a closure `inner` over
# the C launcher, the descriptors' argument indices and their metadata, encoding each
# descriptor with the module's `make_tensordesc_arg(arg, metadata)` on every launch.
BASE_ARGS = 13


def make_tensordesc_arg(arg, metadata):
    return [("tensor map", arg, metadata["swizzle"]), 32, 128]


def wrap_handle_tensordesc(launcher, tensordesc_meta):
    tensordesc_indices = set(range(len(tensordesc_meta)))

    def inner(*args):
        final_args = list(args[:BASE_ARGS])
        for i, arg in enumerate(args[BASE_ARGS:]):
            if i in tensordesc_indices:
                final_args.extend(make_tensordesc_arg(arg, tensordesc_meta[i]))
            else:
                final_args.append(arg)
        return launcher(*final_args)
    return inner


def _descriptor_launcher_init(self, log: list, scratch: int = 0):
    FakeLauncher.__init__(self, log, scratch)
    self.launch = wrap_handle_tensordesc(lambda *args: log.append(("c", args)), [{"swizzle": 1}, {"swizzle": 2}])


DescriptorLauncher = type("CudaLauncher", (NVIDIA,), {"__init__": _descriptor_launcher_init,
                                                    "__module__": "triton.backends.nvidia.driver"})
"""A `CudaLauncher` of a kernel whose two leading arguments are TMA descriptors."""


def test_descriptors_encoded_apart_launch_what_the_wrapper_launches(cuda, monkeypatch):  # noqa: F811
    with_version(monkeypatch, (3, 6))
    log: list = []
    compiled = FakeCompiled(log)
    compiled.run = DescriptorLauncher(log)
    launch = triton_launcher.direct_launcher(compiled, GRID, TRAILING)
    args = ["desc a", "desc b", 4096, 1]
    launch(args)
    encoded = launch.encode(args[:2])
    assert encoded == [("tensor map", "desc a", 1), 32, 128, ("tensor map", "desc b", 2), 32, 128]
    assert launch.encoded([*encoded, *args[2:]]) is True
    assert log[0] == log[1], "the same C launch as through the wrapper"
    cuda["device"] = 1
    assert launch.encoded([*encoded, *args[2:]]) is False and len(log) == 2, "declines on another device"
    cuda["device"] = 0
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", lambda *a: None)
    assert launch.encoded([*encoded, *args[2:]]) is False, "declines under a launch hook (the runner takes descriptors)"


def test_no_encoding_without_the_known_wrapper(cuda, monkeypatch):  # noqa: F811
    with_version(monkeypatch, (3, 6))
    assert triton_launcher.descriptor_encoding(lambda *args: None) is None
    assert triton_launcher.descriptor_encoding(FakeLauncher([]).launch) is None
    # descriptors that do not lead the runtime arguments
    inner = wrap_handle_tensordesc(print, [{"swizzle": 1}])
    inner.__closure__[1].cell_contents = {1}
    assert triton_launcher.descriptor_encoding(inner) is None
    launch = triton_launcher.direct_launcher(FakeCompiled([]), GRID, TRAILING)
    assert not hasattr(launch, "encoded")

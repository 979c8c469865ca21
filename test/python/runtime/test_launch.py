"""`KernelLaunch`: arguments in the generated kernels' order, the out-of-shared-memory retry,
and the direct-launch cache (a compiled kernel is reused only for arguments Triton would have
specialized the same way). The JIT is replaced by a recording fake, so these run anywhere;
its compiled kernel has only a runner (`__getitem__`), so the direct launches go through it
(`triton_launcher`'s own paths: test_triton_launcher.py)."""

from __future__ import annotations

import inspect

import pytest
import torch
from triton.runtime.errors import OutOfResources

import attnfuse as af
from attnfuse.errors import ArgumentError
from attnfuse.lowering.triton import KernelInfo
from attnfuse.runtime.launch import (
    MAX_GRID_BLOCKS,
    MAX_RUNNERS,
    KernelLaunch,
    launch_grid,
)


class FakeParam:
    def __init__(self, name: str, default: object = inspect.Parameter.empty, constexpr: bool = False):
        self.name, self.default, self.is_constexpr = name, default, constexpr


class FakeCompiled:
    """What the JIT returns on a GPU: indexable by grid, with launch metadata."""

    packed_metadata = object()

    def __init__(self, log: list):
        self.log = log

    def __getitem__(self, grid):
        assert len(grid) == 3, "a compiled kernel's launcher reads grid[0], grid[1] and grid[2]"
        return lambda *args: self.log.append(("direct", grid, args))


class FakeJit:
    """Records launches through the JIT; can fail a number of times for lack of shared memory."""

    def __init__(self, params: list[FakeParam], compiled: bool = True, out_of_memory: int = 0):
        self.params, self.compiled, self.out_of_memory = params, compiled, out_of_memory
        self.log: list = []

    def __getitem__(self, grid):
        def launch(*args, num_warps, num_stages):
            if self.out_of_memory:
                self.out_of_memory -= 1
                raise OutOfResources(1, 0, "shared memory")
            self.log.append(("jit", grid, args, num_stages))
            return FakeCompiled(self.log) if self.compiled else None

        return launch


def make_launch(jit: FakeJit, stages: int = 3) -> KernelLaunch:
    """A launch of a two-role kernel (q strided 4 ways, lse 3 ways) on a (2, 3) grid."""
    info = KernelInfo("attention_fwd", ("q", "lse"), "query_blocks", 64, 4, stages)
    return KernelLaunch(info, jit, (2, 3), (0.5, 7), (True, True), [stages])


def params() -> list[FakeParam]:
    """The fake kernel's parameters: pointers and strides, two scalars, two constexprs."""
    names = ["q_ptr", "sq_b", "sq_h", "sq_n", "sq_d", "lse_ptr", "sl_b", "sl_h", "sl_n", "sm_scale", "n"]
    return [FakeParam(n) for n in names] + [FakeParam("BLOCK_M", 64, True), FakeParam("HEAD_DIM", 32, True)]


def tensors(q: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """The launch's tensors by role (contiguous unless `q` is given)."""
    return {"q": torch.zeros(1, 2, 8, 4) if q is None else q, "lse": torch.zeros(1, 2, 8)}


def test_first_call_goes_through_the_jit_with_strides_and_scalars_in_order():
    jit = FakeJit(params())
    t = tensors()
    make_launch(jit)(t)
    kind, grid, args, stages = jit.log[0]
    assert (kind, grid, stages) == ("jit", (2, 3), 3)
    assert args == (t["q"], 64, 32, 4, 1, t["lse"], 16, 8, 1, 0.5, 7)


def test_later_calls_launch_the_compiled_kernel_with_constexprs_appended():
    jit = FakeJit(params())
    launch = make_launch(jit)
    t = tensors()
    launch(t)
    launch(t)
    kind, grid, args = jit.log[1]
    assert (kind, grid) == ("direct", (2, 3, 1))  # the launcher takes three dimensions
    # Pointers as ints (what the launcher would read from the tensors), then the strides.
    assert args == (t["q"].data_ptr(), 64, 32, 4, 1, t["lse"].data_ptr(), 16, 8, 1, 0.5, 7, 64, 32)


def test_other_strides_alignment_or_dtype_go_back_to_the_jit():
    jit = FakeJit(params())
    launch = make_launch(jit)
    launch(tensors())
    launch(tensors(torch.zeros(1, 8, 2, 4).transpose(1, 2)))  # same shape, other strides
    launch(tensors(torch.zeros(1 * 2 * 8 * 4 + 1)[1:].view(1, 2, 8, 4)))  # 4-byte offset
    launch(tensors(torch.zeros(1, 2, 8, 4, dtype=torch.float16)))
    assert [entry[0] for entry in jit.log] == ["jit", "jit", "jit", "jit"]
    launch(tensors(torch.zeros(1, 8, 2, 4).transpose(1, 2)))
    assert jit.log[-1][0] == "direct"


def test_interpreter_launches_always_go_through_the_jit():
    jit = FakeJit(params(), compiled=False)
    launch = make_launch(jit)
    launch(tensors())
    launch(tensors())
    assert [entry[0] for entry in jit.log] == ["jit", "jit"]


def test_a_kernel_whose_parameters_do_not_match_is_never_launched_directly():
    jit = FakeJit(params()[:-1] + [FakeParam("extra")])  # a runtime parameter after a constexpr
    launch = make_launch(jit)
    launch(tensors())
    launch(tensors())
    assert [entry[0] for entry in jit.log] == ["jit", "jit"]


def test_out_of_shared_memory_retries_with_fewer_stages_and_remembers():
    jit = FakeJit(params(), out_of_memory=2)
    launch = make_launch(jit, stages=3)
    launch(tensors())
    assert jit.log[0][3] == 1 and launch.stages == [1]


def test_out_of_shared_memory_at_one_stage_raises():
    jit = FakeJit(params(), out_of_memory=5)
    with pytest.raises(OutOfResources):
        make_launch(jit, stages=2)(tensors())


def test_direct_launchers_are_bounded():
    jit = FakeJit(params())
    launch = make_launch(jit)
    storage = torch.zeros(64)
    for batch_stride in range(64, 64 + MAX_RUNNERS + 8):
        # Same shape, another (unused) batch stride each time: a new specialization.
        launch(tensors(storage.as_strided((1, 2, 8, 4), (batch_stride, 32, 4, 1))))
    assert 0 < len(launch.runners) <= MAX_RUNNERS


def test_grid_puts_heads_on_axis_0_and_blocks_on_axis_1():
    # The emitted prologue reads the block from axis 1 (longest programs first).
    assert launch_grid(rows=1000, block_rows=64, batch_heads=96) == (96, 16)
    assert launch_grid(rows=64, block_rows=64, batch_heads=200_000) == (200_000, 1)


def test_prepare_sizes_query_grids_by_queries_and_key_grids_by_keys():
    # Nq != Nk and Hq != Hkv, so a swapped axis or length shows.
    spec = af.attention(af.causal())
    q, k = torch.zeros(2, 6, 100, 32), torch.zeros(2, 3, 300, 32)
    plan = af.compile(spec, config=af.TileConfig(32, 32, 4, 1, 32, 16, 4, 1, 16, 32, 4, 1)).plan(q, k, k)
    grids = {launch.info.name: launch.grid for launch in plan.launches}
    assert grids["attention_fwd"] == (2 * 6, 4)  # cdiv(100, 32) query blocks per query head
    assert grids["attention_bwd_dq"] == (2 * 6, 4)
    assert grids["attention_bwd_dkdv"] == (2 * 3, 19)  # cdiv(300, 16) key blocks per kv head


def test_too_many_row_blocks_is_a_clear_error():
    jit = FakeJit(params())
    info = KernelInfo("attention_bwd_dkdv", ("q", "lse"), "key_blocks", 16, 4, 1)
    launch = KernelLaunch(info, jit, launch_grid(MAX_GRID_BLOCKS * 16 + 1, 16, 1), (0.5, 7), (True, True), [1])
    with pytest.raises(ArgumentError, match=r"attention_bwd_dkdv: the key sequence needs 65536 blocks of "
                                            r"16 rows, more than the 65535 .* at most 1048560 keys per call"):
        launch.check_grid()
    assert not jit.log  # nothing was launched


def test_a_head_major_grid_holds_its_blocks_on_axis_0_and_the_gluon_grid_is_still_checked():
    """A head-major kernel (`KernelInfo.head_major`) launches over `(B x H x blocks, 1)`: past
    axis 1's limit it runs. The Gluon forward that may stand in for it keeps its blocks on axis
    1, so its own grid is checked (a clear error, not a failed launch)."""
    from types import SimpleNamespace

    from attnfuse.runtime.gluon_forward import GluonLaunch
    from attnfuse.runtime.inputs import Problem

    n_q = MAX_GRID_BLOCKS * 128 + 1
    problem = Problem(1, 2, 2, n_q, 256, 64, 64, torch.float16, torch.device("cpu"))
    info = KernelInfo("attention_fwd", ("q", "o"), "query_blocks", 64, 4, 2, head_major=True)
    grid = launch_grid(n_q, 64, 2)
    portable = KernelLaunch(info, FakeJit(params()), (grid[0] * grid[1], 1), (0.5, n_q), (True, True), [2])
    portable.check_grid()  # does not raise: 2 x 131071 programs on axis 0
    gluon = GluonLaunch(portable, None, SimpleNamespace(persistent=False, block_m=128), problem, 0.125,
                        ("q", "k", "v", "o"))
    with pytest.raises(ArgumentError, match=r"attention_fwd: the query sequence needs 65536 blocks of 128 rows"):
        gluon.check_grid()
    persistent = GluonLaunch(portable, None, SimpleNamespace(persistent=True, block_m=128), problem, 0.125,
                             ("q", "k", "v", "o"))
    persistent.check_grid()  # one program per SM: no blocks on axis 1


def test_a_decode_call_with_more_keys_than_the_backward_grid_holds_runs_its_forward():
    # The dK/dV kernel (never launched here) would need more key blocks than a grid holds;
    # the forward's grid has one query block.
    spec = af.attention(af.causal())
    tiles = af.TileConfig(32, 32, 4, 1, 32, 16, 4, 1, 16, 32, 4, 1)
    q, k = torch.randn(1, 1, 1, 16), torch.zeros(1, 1, MAX_GRID_BLOCKS * 16 + 1, 16)
    fn = af.compile(spec, config=tiles)
    # The plan a traced backward uses (forward and backward kernels, no split decode).
    plan = fn.plan(q, k, k, backward=True)
    assert {launch.info.name: launch.grid for launch in plan.launches}["attention_bwd_dkdv"][1] > MAX_GRID_BLOCKS
    fwd = next(launch for launch in plan.launches if launch.info.name == "attention_fwd")
    fwd.check_grid()  # does not raise
    # An inference call runs the split decode, whose grid holds its splits on axis 1.
    decode = next(launch for launch in fn.plan(q, k, k).launches if launch.info.name == "attention_decode")
    assert decode.grid[1] <= MAX_GRID_BLOCKS
    decode.check_grid()


class FlagRecordingJit(FakeJit):
    """A fake JIT that also records the constexpr keywords it is launched with."""

    def __getitem__(self, grid):
        def launch(*args, num_warps, num_stages, **constexprs):
            self.log.append(("jit", constexprs))
            return FakeCompiled(self.log)

        return launch


@pytest.mark.parametrize("flag_last", [True, False], ids=["flag-last", "flag-first"])
def test_shared_offsets_follows_the_strides_on_both_launch_paths(flag_last):
    """`SHARED_OFFSETS` is set exactly when dO's row and column strides equal q's, through the
    JIT and through the direct launcher cached for those strides (at its own place among the
    constexprs, found by name)."""
    names = ["q_ptr", "sq_b", "sq_h", "sq_n", "sq_d", "do_ptr", "sd_b", "sd_h", "sd_n", "sd_d", "sm_scale", "n"]
    flags = [FakeParam("BLOCK_M", 64, True), FakeParam("SHARED_OFFSETS", False, True)]
    jit = FlagRecordingJit([FakeParam(n) for n in names] + (flags if flag_last else flags[::-1]))
    info = KernelInfo("attention_bwd_dkdv", ("q", "do"), "key_blocks", 64, 4, 3, shared_offsets=("do", "q"))
    launch = KernelLaunch(info, jit, (2, 3), (0.5, 7), (True, True), [3])
    q = torch.zeros(1, 2, 8, 4)
    same = {"q": q, "do": torch.zeros(1, 2, 8, 4)}
    # Other head and batch strides, same row and column strides: still shared.
    sliced = {"q": q, "do": torch.zeros(2, 3, 8, 4)[1:, 1:]}
    transposed = {"q": q, "do": torch.zeros(1, 8, 2, 4).transpose(1, 2)}
    for t in (same, transposed, sliced, same, transposed):
        launch(t)
    constexprs = [entry[2][len(names):] for entry in jit.log if entry[0] == "direct"]
    assert constexprs == ([(64, True), (64, False)] if flag_last else [(True, 64), (False, 64)])
    seen = [entry[1] if entry[0] == "jit" else "direct" for entry in jit.log]
    assert seen == [{"SHARED_OFFSETS": True}, {"SHARED_OFFSETS": False}, {"SHARED_OFFSETS": True},
                    "direct", "direct"]


class FakeCompiledWithLauncher(FakeCompiled):
    """A compiled kernel with the handles a direct launch calls (Triton 3.9's interface)."""

    function = 5

    def run(self, *args):
        self.log.append(("run", args))


class LauncherJit(FakeJit):
    def __getitem__(self, grid):
        def launch(*args, num_warps, num_stages):
            self.log.append(("jit", grid, args, num_stages))
            return FakeCompiledWithLauncher(self.log)
        return launch


def test_a_launch_on_another_current_device_goes_back_to_the_jit(monkeypatch):
    """The direct launcher holds the function loaded on the device current at the first
    launch; with another device current, the JIT (which loads it there) launches."""
    from attnfuse.runtime import triton_launcher

    device = [0]
    monkeypatch.setattr(triton_launcher, "current_device", lambda: device[0])
    monkeypatch.setattr(triton_launcher, "raw_stream", lambda index: 0x100 + index)
    monkeypatch.setattr(triton_launcher, "triton_version", lambda: (3, 9))
    jit = LauncherJit(params())
    launch = make_launch(jit)
    t = tensors()
    launch(t)
    launch(t)
    device[0] = 1
    launch(t)
    device[0] = 0
    launch(t)
    assert [entry[0] for entry in jit.log] == ["jit", "run", "jit", "run"]
    assert jit.log[1][1][3] == 0x100  # the stream of device 0

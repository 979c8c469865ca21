"""Tile configurations chosen per problem: the Hopper rows of docs/architecture.md's table,
checked on the CPU with the device capability faked. The tuples are written out, so that a
change of the table is a deliberate change of these tests."""

from __future__ import annotations

import pytest
import torch

from attnfuse.runtime import config
from attnfuse.runtime.inputs import Problem


def hopper_tiles(head_dim: int, seq: int, dtype=torch.bfloat16) -> config.TileConfig:
    problem = Problem(1, 32, 8, seq, seq, head_dim, head_dim, dtype, torch.device("cuda"))
    return config.choose_tile_config(problem)


def forward(tiles: config.TileConfig) -> tuple[int, int, int, int]:
    return (tiles.block_m, tiles.block_n, tiles.num_warps, tiles.num_stages)


@pytest.fixture
def hopper(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))


@pytest.mark.parametrize("seq", [1, 4096, 16384])
def test_hopper_d128_programs_own_64_rows_at_every_length(hopper, seq):
    tiles = hopper_tiles(128, seq)
    assert forward(tiles) == (64, 64, 4, 3)
    assert tiles.backward() == (64, 64, 4, 2)
    assert tiles.dkdv() == (64, 32, 4, 3)


@pytest.mark.parametrize(("seq", "expected"), [
    (4096, (64, 64, 4, 3)),
    (8191, (64, 64, 4, 3)),
    (8192, (128, 64, 8, 3)),
    (16384, (128, 64, 8, 3)),
])
def test_hopper_d64_forward_switches_to_128_row_programs_from_8192_rows(hopper, seq, expected):
    tiles = hopper_tiles(64, seq, torch.float16)
    assert forward(tiles) == expected
    assert tiles.backward() == (64, 32, 4, 3)
    assert tiles.dkdv() == (64, 64, 4, 3)


@pytest.mark.parametrize(("keys_per_row", "expected"), [
    (1024, (64, 64, 4, 3)),
    (4096, (64, 64, 4, 3)),
    (8192, (128, 64, 8, 3)),
    (None, (128, 64, 8, 3)),
])
def test_hopper_d64_forward_counts_a_window_as_its_length(hopper, keys_per_row, expected):
    problem = Problem(4, 12, 12, 16384, 16384, 64, 64, torch.float16, torch.device("cuda"))
    assert forward(config.choose_tile_config(problem, keys_per_row=keys_per_row)) == expected


@pytest.mark.parametrize(("blocks", "expected"), [
    (lambda af: [af.causal()], (128, 64, 8, 3)),
    (lambda af: [af.causal(), af.sliding_window(4096)], (64, 64, 4, 3)),
    (lambda af: [af.sliding_window(4097)], (128, 64, 8, 3)),  # both sides: 8193 keys per row
    (lambda af: [af.sliding_window(4096)], (64, 64, 4, 3)),  # 8191
    (lambda af: [af.sliding_window(1024), af.alibi()], (64, 64, 4, 3)),
    (lambda af: [af.causal(), af.sliding_window(8192)], (128, 64, 8, 3)),  # exactly 8192 keys
    (lambda af: [af.causal(), af.sliding_window(8191)], (64, 64, 4, 3)),
])
def test_compiled_attention_passes_its_window_to_the_dispatcher(hopper, blocks, expected):
    import attnfuse as af

    problem = Problem(4, 12, 12, 16384, 16384, 64, 64, torch.float16, torch.device("cuda"))
    assert forward(af.compile(af.attention(*blocks(af))).tile_config(problem)) == expected


@pytest.mark.parametrize(("head_dim", "seq", "blocks", "expected"), [
    (128, 4096, lambda af: [af.causal(), af.additive_bias()], (128, 64, 8, 3)),
    (128, 2048, lambda af: [af.causal(), af.additive_bias()], (128, 64, 8, 3)),
    (128, 2047, lambda af: [af.causal(), af.additive_bias()], (64, 64, 4, 3)),  # not measured: default
    (128, 1, lambda af: [af.additive_bias()], (64, 64, 4, 3)),  # decoding: no 128-row padding
    (96, 4096, lambda af: [af.causal(), af.additive_bias()], (64, 64, 4, 3)),
    (128, 4096, lambda af: [af.causal()], (64, 64, 4, 3)),
    (64, 4096, lambda af: [af.causal(), af.additive_bias()], (64, 64, 4, 3)),
])
def test_a_bias_takes_two_warpgroups_at_head_dim_128(hopper, head_dim, seq, blocks, expected):
    import attnfuse as af

    problem = Problem(1, 32, 8, seq, seq, head_dim, head_dim, torch.bfloat16, torch.device("cuda"))
    tiles = af.compile(af.attention(*blocks(af))).tile_config(problem)
    assert forward(tiles) == expected
    assert tiles.dkdv() == ((64, 64, 4, 3) if head_dim == 64 else (64, 32, 4, 3))  # backward unchanged


def test_block_sparse_rows_below_128_take_one_warpgroup(hopper):
    import attnfuse as af

    problem = Problem(1, 32, 8, 4096, 4096, 128, 128, torch.bfloat16, torch.device("cuda"))
    spec = af.attention(af.causal(), af.additive_bias(), af.block_sparse(64))
    assert forward(af.compile(spec).tile_config(problem)) == (64, 64, 4, 3)
    # A configuration the user gives is only clamped, never re-chosen.
    given = config.TileConfig(128, 64, 8, 3)
    assert forward(af.compile(spec, config=given).tile_config(problem)) == (64, 64, 8, 3)


def test_a_bias_keeps_64_row_programs_at_head_dim_64_at_every_length(hopper):
    import attnfuse as af

    problem = Problem(4, 12, 12, 16384, 16384, 64, 64, torch.float16, torch.device("cuda"))
    assert forward(af.compile(af.attention(af.causal(), af.additive_bias())).tile_config(problem)) == (64, 64, 4, 3)
    assert forward(af.compile(af.attention(af.causal())).tile_config(problem)) == (128, 64, 8, 3)


def test_fp32_keeps_small_tiles(hopper):
    tiles = hopper_tiles(128, 4096, torch.float32)
    assert forward(tiles) == (64, 32, 4, 2)
    assert tiles.dkdv() == (64, 32, 4, 2)


def test_pre_hopper_gpus_keep_their_own_row(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    tiles = hopper_tiles(128, 16384)
    assert forward(tiles) == (64, 64, 4, 2)
    assert tiles.dkdv() == (64, 32, 4, 2)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_explicit_capability_gives_that_gpus_tiles_for_any_problem(hopper, head_dim):
    """`capability=` picks a GPU's configuration for a problem on the CPU (tools that compile
    for a GPU without one), the same as for that problem on such a GPU."""
    cpu = Problem(1, 32, 8, 4096, 4096, head_dim, head_dim, torch.bfloat16, torch.device("cpu"))
    assert config.choose_tile_config(cpu, capability=(9, 0)) == hopper_tiles(head_dim, 4096)
    assert config.choose_tile_config(cpu) != hopper_tiles(head_dim, 4096)  # the interpreter's own

"""Tile configurations chosen per problem: the Hopper table (docs/performance.md), checked on
the CPU with the device capability faked."""

from __future__ import annotations

import pytest
import torch

from attnfuse.runtime import config
from attnfuse.runtime.inputs import Problem


def hopper_problem(head_dim: int, seq: int, dtype=torch.bfloat16) -> Problem:
    return Problem(1, 32, 8, seq, seq, head_dim, head_dim, dtype, torch.device("cuda"))


@pytest.fixture
def hopper(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))


@pytest.mark.parametrize("seq", [1, 4096, 16384])
def test_hopper_d128_forward_programs_own_64_rows_at_every_length(hopper, seq):
    tiles = config.choose_tile_config(hopper_problem(128, seq))
    assert (tiles.block_m, tiles.block_n, tiles.num_warps, tiles.num_stages) == config.FORWARD_HOPPER
    assert tiles.backward() == config.BACKWARD_HOPPER_D128[:4]
    assert tiles.dkdv() == config.BACKWARD_HOPPER_D128[4:]


@pytest.mark.parametrize(("seq", "forward"), [
    (4096, config.FORWARD_HOPPER),
    (config.FORWARD_HOPPER_D64_LONG_FROM - 1, config.FORWARD_HOPPER),
    (config.FORWARD_HOPPER_D64_LONG_FROM, config.FORWARD_HOPPER_D64_LONG),
    (16384, config.FORWARD_HOPPER_D64_LONG),
])
def test_hopper_d64_forward_switches_to_128_row_programs_for_long_sequences(hopper, seq, forward):
    tiles = config.choose_tile_config(hopper_problem(64, seq, torch.float16))
    assert (tiles.block_m, tiles.block_n, tiles.num_warps, tiles.num_stages) == forward
    assert tiles.backward() == config.BACKWARD_HOPPER_D64[:4]


def test_fp32_keeps_small_tiles(hopper):
    tiles = config.choose_tile_config(hopper_problem(128, 4096, torch.float32))
    assert (tiles.block_m, tiles.block_n) == (64, 32)

"""`af.TileConfig` checks its fields when made: a mistake is named there, never found later by a
pass option's parser, a JSON encoder or a block list's division."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import attnfuse as af


def test_integers_of_other_libraries_are_ints():
    config = af.TileConfig(np.int64(32), np.int32(16), torch.tensor(4), 1, bwd_block_m=np.int64(16))
    assert (config.block_m, config.block_n, config.num_warps, config.bwd_block_m) == (32, 16, 4, 16)
    assert all(type(v) is int for v in (config.block_m, config.block_n, config.num_warps, config.bwd_block_m))
    af.compile(af.attention(af.causal()), config=config)  # its operator key is JSON


@pytest.mark.parametrize("args, kwargs, message", [
    ((32.0, 32, 4, 1), {}, "TileConfig.block_m must be an integer, got 32.0"),
    ((True, 32, 4, 1), {}, "TileConfig.block_m must be an integer, got True"),
    ((None, 32, 4, 1), {}, "TileConfig.block_m must be an integer, got None"),
    (("32", 32, 4, 1), {}, "TileConfig.block_m must be an integer, got '32'"),
    ((32, 32, 4, 0), {}, "TileConfig.num_stages must be positive, got 0"),
    ((32, 32, 4, 1), {"bwd_block_m": 0}, "TileConfig.bwd_block_m must be positive"),
    ((32, 32, 4, 1), {"dkdv_block_n": 0}, "TileConfig.dkdv_block_n must be positive"),
    ((32, 32, 4, 1), {"dkdv_num_stages": 1.5}, "TileConfig.dkdv_num_stages must be a positive integer or None"),
    ((32, 32, 4, 1), {"page_lookahead": 2}, "TileConfig.page_lookahead must be 0 or 1, got 2"),
    ((torch.tensor(32.0), 32, 4, 1), {}, "TileConfig.block_m must be an integer, got tensor(32.)"),
    ((torch.tensor(True), 32, 4, 1), {}, "TileConfig.block_m must be an integer, got tensor(True)"),
    ((np.array([32]), 32, 4, 1), {}, "TileConfig.block_m must be an integer, got array([32])"),
])
def test_bad_fields_are_argument_errors(args, kwargs, message):
    with pytest.raises(af.ArgumentError, match=re.escape(message)):
        af.TileConfig(*args, **kwargs)

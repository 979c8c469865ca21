"""Tuning files (`runtime/tuning.py`): entries measured by `attnfuse-tune` steer the dispatcher's
tiles for the calls they match, and nothing else; malformed files are refused by name."""

from __future__ import annotations

import json
import os
import re

import pytest
import torch

import attnfuse as af
from attnfuse.runtime import tuning
from attnfuse.runtime.reference import reference_gradients
from conftest import assert_close_to_reference

SPEC = af.attention(af.rope(), af.causal())


def tensors(n: int = 64, d: int = 16, dtype: torch.dtype = torch.float32, requires_grad: bool = False):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, n, d, generator=g).to(dtype)
    k, v = (torch.randn(1, 1, n, d, generator=g).to(dtype) for _ in range(2))
    return tuple(t.requires_grad_(requires_grad) for t in (q, k, v))


def entry(kind: str = "forward", n: int = 64, config: dict | None = None, **overrides) -> dict:
    fields = {"device": "cpu", "variant": af.compile(SPEC).variant.text, "dtype": "fp32",
              "head_dim": 16, "head_dim_v": 16, "seq_q": n, "seq_k": n, "kind": kind,
              "config": config or dict(zip(tuning.KINDS[kind], (16, 16, 2, 1)))}
    return {**fields, **overrides}


@pytest.fixture
def tuning_file(tmp_path, monkeypatch):
    """Writes a tuning file of the given entries and names it in ATTNFUSE_TUNING."""
    path = tmp_path / "tuning.json"

    def write(*entries: dict, document: object = None) -> str:
        content = document if document is not None else {"format": tuning.FORMAT, "entries": list(entries)}
        path.write_text(json.dumps(content) if not isinstance(content, str) else content)
        # Each write gets its own modification time: a rewrite within the filesystem's
        # timestamp resolution must still be seen.
        write.count += 1
        stamp = 1_700_000_000 * 10**9 + write.count * 10**9
        os.utime(path, ns=(stamp, stamp))
        monkeypatch.setenv(tuning.TUNING_ENV, str(path))
        return str(path)
    write.count = 0
    return write


def test_a_matching_entry_sets_the_tiles(tuning_file):
    q, k, v = tensors()
    before = af.compile(SPEC).plan(q, k, v).config
    tuning_file(entry("forward", config={"block_m": 16, "block_n": 64, "num_warps": 2, "num_stages": 1}),
                entry("dkdv", config={"dkdv_block_m": 64, "dkdv_block_n": 16, "dkdv_num_warps": 8,
                                      "dkdv_num_stages": 2}))
    config = af.compile(SPEC).plan(q, k, v).config
    assert (config.block_m, config.block_n, config.num_warps, config.num_stages) == (16, 64, 2, 1)
    assert config.dkdv() == (64, 16, 8, 2)
    assert config.backward() == before.backward()  # no backward entry: the dispatcher's


@pytest.mark.parametrize("overrides", [
    {"variant": af.compile(af.attention(af.causal())).variant.text},
    {"dtype": "fp16"},
    {"head_dim": 32},
    {"device": "NVIDIA H200"},
])
def test_entries_for_another_call_are_ignored(tuning_file, overrides):
    q, k, v = tensors()
    before = af.compile(SPEC).plan(q, k, v).config
    tuning_file(entry(**overrides))
    assert af.compile(SPEC).plan(q, k, v).config == before


def test_the_nearest_length_is_taken_ties_to_the_longer(tuning_file):
    shorter = entry(n=32, config={"block_m": 16, "block_n": 16, "num_warps": 1, "num_stages": 1})
    longer = entry(n=128, config={"block_m": 64, "block_n": 64, "num_warps": 8, "num_stages": 2})
    far = entry(n=1024, config={"block_m": 128, "block_n": 128, "num_warps": 4, "num_stages": 3})
    tuning_file(shorter, longer, far)
    fn = af.compile(SPEC)
    assert fn.plan(*tensors(n=40)).config.block_m == 16  # 40/32 is nearer than 128/40
    assert fn.plan(*tensors(n=64)).config.block_m == 64  # 2x either way: the longer
    assert fn.plan(*tensors(n=4096)).config.block_m == 128


def test_a_given_config_is_never_overridden(tuning_file):
    tuning_file(entry())
    given = af.TileConfig(32, 32, 4, 1)
    assert af.compile(SPEC, config=given).plan(*tensors()).config == given


def test_block_sparse_tiles_stay_within_the_block_size(tuning_file):
    spec = af.attention(af.block_sparse(16))
    tuning_file(entry(variant=af.compile(spec).variant.text,
                      config={"block_m": 64, "block_n": 64, "num_warps": 4, "num_stages": 1}))
    config = af.compile(spec).plan(*tensors()).config
    assert (config.block_m, config.block_n) == (16, 16)


def test_tuned_warps_are_kept_for_block_sparse_variants(tuning_file):
    """The dispatcher's own 8-warp forwards drop to 4 warps below 128 rows; a tuned entry was
    measured as it is (the tuner compiles with its config), so it is kept."""
    spec = af.attention(af.block_sparse(32))
    tuning_file(entry(variant=af.compile(spec).variant.text,
                      config={"block_m": 32, "block_n": 32, "num_warps": 8, "num_stages": 1}))
    assert af.compile(spec).plan(*tensors()).config.num_warps == 8


def test_a_dq_entry_alone_keeps_the_dispatchers_dkdv_tiles(tuning_file):
    q, k, v = tensors()
    before = af.compile(SPEC).plan(q, k, v).config
    tuning_file(entry("backward", config={"bwd_block_m": 64, "bwd_block_n": 64, "bwd_num_warps": 8,
                                          "bwd_num_stages": 2}))
    config = af.compile(SPEC).plan(q, k, v).config
    assert config.backward() == (64, 64, 8, 2)
    assert config.dkdv() == before.dkdv()


def test_a_rewritten_file_and_a_changed_variable_are_read_again(tuning_file, tmp_path, monkeypatch):
    q, k, v = tensors()
    tuning_file(entry(config={"block_m": 16, "block_n": 16, "num_warps": 1, "num_stages": 1}))
    assert af.compile(SPEC).plan(q, k, v).config.num_warps == 1
    tuning_file(entry(config={"block_m": 16, "block_n": 16, "num_warps": 2, "num_stages": 1}))
    assert af.compile(SPEC).plan(q, k, v).config.num_warps == 2
    monkeypatch.setenv(tuning.TUNING_ENV, "")
    assert af.compile(SPEC).plan(q, k, v).config.num_warps == 4  # the CPU default


@pytest.mark.parametrize("document, message", [
    ("{not json", "cannot read tuning file"),
    ({"entries": []}, "is not a tuning file"),
    ({"format": tuning.FORMAT, "entries": {}}, "\"entries\" must be a list"),
    ({"format": tuning.FORMAT, "entries": [{**entry(), "kind": "sideways"}]}, "entry 0: kind must be one of"),
    ({"format": tuning.FORMAT, "entries": [entry(config={"block_m": 48, "block_n": 16, "num_warps": 4,
                                                           "num_stages": 1})]},
     "config block_m must be a power of two in [16, 1024], got 48"),
    ({"format": tuning.FORMAT, "entries": [entry(config={"block_m": 8, "block_n": 16, "num_warps": 4,
                                                           "num_stages": 1})]},
     "config block_m must be a power of two in [16, 1024], got 8"),
    ({"format": tuning.FORMAT, "entries": [entry(config={"block_m": 16, "block_n": 16, "num_warps": 2048,
                                                           "num_stages": 1})]},
     "config num_warps must be one of 1, 2, 4, 8, 16, got 2048"),
    ({"format": tuning.FORMAT, "entries": [entry(config={"block_m": 16, "block_n": 16, "num_warps": 4,
                                                           "num_stages": 2**40})]},
     "config num_stages must be in [1, 8], got 1099511627776"),
    ({"format": tuning.FORMAT, "entries": [entry(config={"block_m": 16})]}, "config has exactly"),
    ({"format": tuning.FORMAT, "entries": [entry(seq_q=0)]}, "seq_q must be an integer in [1, 2147483647]"),
    ({"format": tuning.FORMAT, "entries": [entry(seq_q=10**400)]}, "seq_q must be an integer in [1, 2147483647]"),
    ("[" * 100000 + "]" * 100000, "cannot read tuning file"),
    ('{"format": "attnfuse-tuning/1", "entries": [], "x": ' + "9" * 5000 + "}", "cannot read tuning file"),
    ({"format": tuning.FORMAT, "entries": [{**entry(), "extra": 1}]}, "unknown extra"),
])
def test_malformed_files_are_refused_by_name(tuning_file, document, message):
    path = tuning_file(document=document)
    with pytest.raises(af.ArgumentError, match=re.escape(message)) as info:
        af.compile(SPEC).plan(*tensors())
    assert path in str(info.value)


def test_a_missing_file_is_refused_by_name(monkeypatch, tmp_path):
    missing = tmp_path / "nowhere.json"
    monkeypatch.setenv(tuning.TUNING_ENV, str(missing))
    with pytest.raises(af.ArgumentError, match=f"cannot read tuning file {missing}"):
        af.compile(SPEC).plan(*tensors())


def test_merged_replaces_entries_of_the_same_measurement():
    old = [tuning.parse_entry(entry(n=64), "old"), tuning.parse_entry(entry(n=128), "old")]
    new = [tuning.parse_entry(entry(n=64, config={"block_m": 32, "block_n": 32, "num_warps": 4,
                                                  "num_stages": 1}), "new")]
    table = tuning.merged(old, new)
    assert len(table) == 2
    assert [e.config["block_m"] for e in table if e.seq_q == 64] == [32]


@pytest.mark.interpreter
def test_a_tuned_call_computes_the_reference(tuning_file):
    """The tuned tiles are the ones the kernels run with, and they compute the semantics:
    output and gradients against the float64 reference."""
    tuning_file(entry(config={"block_m": 16, "block_n": 32, "num_warps": 4, "num_stages": 1}),
                entry("backward", config={"bwd_block_m": 32, "bwd_block_n": 16, "bwd_num_warps": 4,
                                          "bwd_num_stages": 1}),
                entry("dkdv", config={"dkdv_block_m": 16, "dkdv_block_n": 16, "dkdv_num_warps": 4,
                                      "dkdv_num_stages": 1}))
    fn = af.compile(SPEC)
    q, k, v = tensors(n=48, requires_grad=True)
    ir = fn.tile_ir(q, k, v)
    assert "block_m = 16" in ir and "block_n = 32" in ir
    out = fn(q, k, v)
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    qd, kd, vd = (t.detach().double() for t in (q, k, v))
    assert_close_to_reference(out.detach(), af.reference_attention(SPEC, qd, kd, vd), torch.float32)
    expected = reference_gradients(SPEC, qd, kd, vd, grad_out.double())
    for name, got in (("q", q.grad), ("k", k.grad), ("v", v.grad)):
        assert_close_to_reference(got, expected[name], torch.float32)

"""`attnfuse-tune` on the CPU (Triton's interpreter): it sweeps the grid, checks every candidate
against the dispatcher's result, writes a tuning file the dispatcher then reads, and reports bad
input as one error line."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

import attnfuse as af
from attnfuse.runtime import tuning
from attnfuse.tools import tune

pytestmark = pytest.mark.interpreter

TINY = ["--shape", "1,2,1,16", "--seq-lens", "40", "--device", "cpu", "--warmup-ms", "0",
        "--rep-ms", "0", "--num-warps", "4", "--num-stages", "1"]


def test_sweep_writes_entries_the_dispatcher_reads(tmp_path, monkeypatch, capsys):
    out = tmp_path / "cpu.json"
    rc = tune.main(["af.attention(af.rope(), af.causal())", *TINY, "--block-m", "16,32", "--block-n", "16",
                    "--mode", "forward,backward", "--dtype", "fp32", "--out", str(out)])
    assert rc == 0, capsys.readouterr()
    entries = tuning.read_file(str(out))
    assert sorted(e.kind for e in entries) == ["backward", "dkdv", "forward"]
    spec = af.attention(af.rope(), af.causal())
    assert {e.variant for e in entries} == {af.compile(spec).variant.text}
    assert {(e.device, e.dtype, e.head_dim, e.seq_q) for e in entries} == {("cpu", "fp32", 16, 40)}
    # Only grid points (or the dispatcher's own, always measured) are chosen.
    forward = next(e for e in entries if e.kind == "forward")
    assert forward.config["block_m"] in (16, 32)
    printed = capsys.readouterr().out
    assert "config=af.TileConfig(block_m=" in printed

    monkeypatch.setenv(tuning.TUNING_ENV, str(out))
    q = torch.randn(1, 2, 40, 16)
    k, v = torch.randn(1, 1, 40, 16), torch.randn(1, 1, 40, 16)
    config = af.compile(spec).plan(q, k, v).config
    chosen = {field: value for e in entries for field, value in e.config.items()}
    assert {field: getattr(config, field) for field in chosen} == chosen

    # A second run merges into the file: the same measurement is replaced, others kept.
    rc = tune.main(["af.attention(af.causal())", *TINY, "--block-m", "16", "--block-n", "16",
                    "--dtype", "fp32", "--out", str(out)])
    assert rc == 0
    assert len(tuning.read_file(str(out))) == 4


def test_the_environment_is_restored(monkeypatch, tmp_path):
    monkeypatch.setenv(tuning.TUNING_ENV, "keep.json")
    monkeypatch.delenv("ATTNFUSE_FORWARD_TARGET", raising=False)
    rc = tune.main(["af.attention()", *TINY, "--block-m", "16", "--block-n", "16", "--dtype", "fp32"])
    assert rc == 0
    import os
    assert os.environ[tuning.TUNING_ENV] == "keep.json" and "ATTNFUSE_FORWARD_TARGET" not in os.environ


def args_for(*extra: str) -> argparse.Namespace:
    return tune.build_parser().parse_args(["af.attention()", *TINY, *extra])


@pytest.mark.parametrize("spec, data", [
    (af.attention(af.additive_bias(), af.causal()), "bias"),
    (af.attention(af.document()), "doc_ids"),
    (af.attention(af.block_sparse(16)), "block_layout"),
])
def test_candidates_are_checked_against_the_dispatcher(spec, data):
    """Every timed row reproduced the dispatcher's result (relative error within tolerance);
    a tolerance nothing meets marks every differing row FAIL and leaves it untimed; tiles above
    a block-sparse layout's block size are refused, not clamped into a duplicate."""
    tuner = tune.Tuner(spec, args_for("--block-m", "16,32", "--block-n", "16", "--dtype", "fp32"), "cpu", 40)
    assert data in tuner.data
    rows = tuner.sweep("forward", tuner.base, tune.candidates(args_for("--block-m", "16,32", "--block-n", "16"),
                                                              "cpu"), lambda _: None)
    assert any(row.dispatcher for row in rows)
    for row in rows:
        if row.status == "ok":
            assert row.error <= tuner.tolerance and row.ms is not None
    if data == "block_layout":
        big = [row for row in rows if row.candidate.block_m > 16]
        assert big and all(row.status == "error" and "block size" in row.message for row in big)

    tuner.tolerance = -1.0  # nothing is within it: every row is a failure, none is timed
    rows = tuner.sweep("forward", tuner.base, [tune.Candidate(16, 16, 4, 1)], lambda _: None)
    assert all(row.status in ("FAIL", "error") and row.ms is None for row in rows)
    assert tune.best(rows) is None


def test_an_attn_program_file_is_a_variant(tmp_path, capsys):
    program = tmp_path / "v.mlir"
    program.write_text(af.attention(af.causal()).ir())
    rc = tune.main([str(program), *TINY, "--block-m", "16", "--block-n", "16", "--dtype", "fp32"])
    assert rc == 0, capsys.readouterr()


@pytest.mark.parametrize("variant, extra, message", [
    ("af.attention(af.nope())", [], "does not evaluate: AttributeError"),
    ("1 + 1", [], "evaluates to int, not an af.attention(...) spec"),
    ("missing.mlir", [], "cannot read missing.mlir"),
    ("af.attention()", ["--seq-lens", "8"], "split-KV decode kernels"),
    ("af.attention(af.causal())", ["--out", "/nonexistent-dir/x.json"], "cannot write /nonexistent-dir/x.json"),
    ("af.attention(af.causal())", ["--num-stages", "2,9"], "--num-stages: at most 8, got 9"),
])
def test_bad_input_is_one_error_line(variant, extra, message, capsys):
    # (A later option replaces an earlier one: `extra` overrides TINY's.)
    rc = tune.main([variant, *TINY, "--block-m", "16", "--block-n", "16", *extra])
    err = capsys.readouterr().err
    assert rc == 1 and message in err and "Traceback" not in err


@pytest.mark.parametrize("args, message", [
    (["--shape", "1,2,16"], "expected 4 integers"),
    (["--shape", "1,2,1,16", "--tolerance", "-1"], "a relative error is at least 0"),
])
def test_bad_arguments_are_argparse_errors(capsys, args, message):
    with pytest.raises(SystemExit) as info:
        tune.main(["af.attention()", *args])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_zero_tolerance_is_kept(capsys):
    """0 is a tolerance (only the dispatcher's exact result passes), not "the default"."""
    tuner = tune.Tuner(af.attention(af.causal()), args_for("--tolerance", "0", "--dtype", "fp16"), "cpu", 40)
    assert tuner.tolerance == 0.0


def test_an_existing_output_file_is_checked_before_the_sweep(tmp_path, monkeypatch, capsys):
    out = tmp_path / "old.json"
    out.write_text('{"format": "attnfuse-tuning/1", "entries": [{"device": "cpu"}]}')
    monkeypatch.setattr(tune.Tuner, "__init__", lambda *a: pytest.fail("swept before reading --out"))
    rc = tune.main(["af.attention()", *TINY, "--out", str(out)])
    assert rc == 1 and "entry 0: missing" in capsys.readouterr().err


def test_entries_round_trip_through_json(tmp_path):
    entry = tuning.TuningEntry("cpu", "v", "fp16", 64, 64, 128, 128, "forward",
                               {"block_m": 64, "block_n": 32, "num_warps": 4, "num_stages": 2})
    path = tmp_path / "t.json"
    tuning.write_file(str(path), [entry], {"note": "test"})
    assert json.loads(path.read_text())["metadata"] == {"note": "test"}
    assert tuning.read_file(str(path)) == [entry]

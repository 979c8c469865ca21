"""`attnfuse-bench` on the CPU: a smoke run is correctness-gated against its own float32
reference and records what produced it (versions, command, the sources' digest)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import attnfuse
from attnfuse.tools.bench import main, source_digest


def test_cpu_forward_backward_run_is_gated_and_recorded(tmp_path):
    argv = ["--allow-cpu", "--mode", "fwdbwd", "--variants", "rope_causal", "--impls",
            "attnfuse,sdpa-math", "--seq-lens", "48", "--batch", "1", "--heads", "2",
            "--kv-heads", "1", "--head-dim", "32", "--warmup", "1", "--rep", "1",
            "--out", str(tmp_path)]
    assert main(argv) == 0
    (json_path,) = tmp_path.glob("*-custom-fwdbwd.json")
    document = json.loads(json_path.read_text())
    assert document["metadata"]["source_digest"] == source_digest()
    rows = {row["impl"]: row for row in document["results"]}
    assert set(rows) == {"attnfuse", "sdpa-math"}
    for row in rows.values():
        assert row["status"] == "ok"
        assert set(row["rel_err"]) == {"out", "dq", "dk", "dv"}
        assert row["rel_err_max"] < 1e-4  # fp32 on the CPU
    markdown = json_path.with_suffix(".md").read_text()
    assert f"- source_digest: {source_digest()}" in markdown


def test_source_digest_names_the_sources(tmp_path):
    package = Path(attnfuse.__file__).parent
    copy = tmp_path / "attnfuse"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert source_digest(copy) == source_digest(package)
    (copy / "runtime" / "launch.py").write_text((copy / "runtime" / "launch.py").read_text() + "\n# edit\n")
    assert source_digest(copy) != source_digest(package)


@pytest.mark.parametrize("bad", [["--mode", "sideways"], ["--dtype", "fp8"]])
def test_bad_options_exit_with_a_usage_error(bad, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--allow-cpu", *bad])
    assert exit_info.value.code == 2
    assert "Traceback" not in capsys.readouterr().err

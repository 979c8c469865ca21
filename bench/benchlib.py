"""What the `bench/` scripts share: the device and dtype of a run, timing (CUDA events on the
GPU, the wall clock on the CPU), a results document's metadata, markdown tables, writing the
`.json` and `.md` files, and the progress display and plots of `attnfuse-bench`.

The scripts run as `python bench/<name>.py`, so this directory is on `sys.path`. Progress and
plots come from `attnfuse/tools/bench.py`, loaded from its file where the `attnfuse` package
itself cannot be imported (no xDSL on the machine): that module needs only torch.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import importlib.util
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]


def _load_bench_tool() -> Any:
    """`attnfuse.tools.bench`, imported, or loaded from its file without the package."""
    with contextlib.suppress(Exception):
        import attnfuse.tools.bench as tool

        return tool
    spec = importlib.util.spec_from_file_location("attnfuse_bench_tool", ROOT / "attnfuse" / "tools" / "bench.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


bench_tool = _load_bench_tool()
CaseProgress = bench_tool.CaseProgress
plot_panels = bench_tool.plot_panels
time_and_ratio_panels = bench_tool.time_and_ratio_panels


def log(message: str) -> None:
    """A progress line on stderr (stdout keeps the tables)."""
    print(message, file=sys.stderr, flush=True)


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def median_ms(step: Callable[[], Any], device: str, warmup: int, reps: int,
              before: Callable[[], Any] = lambda: None) -> tuple[float, float]:
    """Median and interquartile spread (ms) of `step()` over `reps` timed calls after `warmup`
    untimed ones. On the GPU each call is bracketed by its own pair of CUDA events, all
    enqueued back to back and read after one synchronize; `before()` runs outside the events
    (resetting gradients, say). On the CPU: the wall clock per call."""
    for _ in range(warmup):
        before()
        step()
    synchronize(device)
    times: list[float] = []
    if device == "cuda":
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(reps)]
        for start, end in events:
            before()
            start.record()
            step()
            end.record()
        torch.cuda.synchronize()
        times = [start.elapsed_time(end) for start, end in events]
    else:
        for _ in range(reps):
            before()
            t0 = time.perf_counter()
            step()
            times.append((time.perf_counter() - t0) * 1e3)
    quartiles = statistics.quantiles(times, n=4) if len(times) >= 2 else [times[0]] * 3
    return statistics.median(times), quartiles[2] - quartiles[0]


def interleaved_median_ms(steps: dict[str, Callable[[], Any]], device: str, warmup: int, reps: int,
                          rounds: int = 6, before: Callable[[], Any] = lambda: None) -> dict[str, tuple[float, float]]:
    """`median_ms` of several implementations of one workload, measured side by side: `rounds`
    rounds, each timing `reps // rounds` calls of every step in turn (the order rotating
    from round to round), so that none of them is measured only after the others have heated
    the GPU (a long dense kernel runs near the power limit, where the clock follows what ran
    before). `before()` runs ahead of each call, outside its timing (an L2 flush, say).
    Name -> (median, interquartile spread) over all of its calls."""
    names = list(steps)
    if not names:
        return {}
    per_round = max(1, reps // rounds)
    for name in names:
        for _ in range(warmup):
            steps[name]()
    synchronize(device)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            step = steps[name]
            if device == "cuda":
                events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                          for _ in range(per_round)]
                for start, end in events:
                    before()
                    start.record()
                    step()
                    end.record()
                torch.cuda.synchronize()
                times[name] += [start.elapsed_time(end) for start, end in events]
            else:
                for _ in range(per_round):
                    before()
                    t0 = time.perf_counter()
                    step()
                    times[name].append((time.perf_counter() - t0) * 1e3)
    result = {}
    for name, values in times.items():
        quartiles = statistics.quantiles(values, n=4) if len(values) >= 2 else [values[0]] * 3
        result[name] = (statistics.median(values), quartiles[2] - quartiles[0])
    return result


def capture_graph(step: Callable[[], Any], calls: int) -> torch.cuda.CUDAGraph:
    """A CUDA graph of `calls` calls of `step`, after two warm-up calls on a side stream (so
    that lazy work, compiles and allocations, stays out of the capture)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            step()
    torch.cuda.synchronize()
    return graph


def _git_commit() -> str | None:
    with contextlib.suppress(Exception):
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain"], capture_output=True,
                               text=True, timeout=10, check=True).stdout.strip()
        return head + ("-dirty" if dirty else "")
    return None


def metadata(device: str) -> dict[str, Any]:
    """Versions, device and command of a run (what its results need to be compared)."""
    cuda = device == "cuda"
    triton_version = None
    with contextlib.suppress(Exception):
        import triton

        triton_version = triton.__version__
    return {
        "timestamp_utc": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": shlex.join(getattr(sys, "orig_argv", sys.argv)),
        "device": device,
        "gpu": torch.cuda.get_device_name() if cuda else None,
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "python": platform.python_version(),
        "git_commit": _git_commit(),
        "source_digest": bench_tool.source_digest(ROOT / "attnfuse"),
    }


def metadata_lines(meta: dict[str, Any]) -> list[str]:
    """The markdown header lines of a results file."""
    keys = ("timestamp_utc", "gpu", "device", "torch", "triton", "cuda", "cudnn", "python",
            "git_commit", "source_digest")
    return [f"- {key}: {meta.get(key)}" for key in keys] + ["", "```", meta["command"], "```", ""]


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """A GitHub markdown table (cells are str()-ed; `|` inside a cell is escaped)."""

    def cell(value: Any) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(map(cell, header)) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(map(cell, row)) + " |" for row in rows]


def fmt(value: float | None, spec: str = ".3f", suffix: str = "") -> str:
    """A number for a table; '-' when absent."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:{spec}}{suffix}"


def json_safe(value: Any) -> Any:
    """NaN and inf (invalid JSON) as their names, all the way down."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value


def write_outputs(out_dir: Path, stem: str, document: dict[str, Any], markdown: Sequence[str]) -> tuple[Path, Path]:
    """`<out>/<stem>.json` and `<out>/<stem>.md`; prints both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / f"{stem}.json", out_dir / f"{stem}.md"
    json_path.write_text(json.dumps(json_safe(document), indent=1) + "\n")
    md_path.write_text("\n".join(markdown) + "\n")
    print(f"wrote {json_path}\nwrote {md_path}")
    return json_path, md_path


def stamp() -> str:
    """The UTC time, as the results files' names start."""
    return _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%SZ")


def record_checked(row: dict[str, Any], name: str, error: float, tol: float, time: Callable[[], float]) -> bool:
    """A column's relative error into `row` (`{name}_rel_err`), then its time (`{name}_ms`,
    from `time()`) if the error is at most `tol`, else `{name}_error` = FAIL and no time.
    Returns whether it passed."""
    row[f"{name}_rel_err"] = error
    if not error <= tol:
        row[f"{name}_error"] = f"FAIL: rel err {error:.1e}"
        return False
    row[f"{name}_ms"] = time()
    return True


def first_line(err: BaseException) -> str:
    """`Type: first line of the message`, for a table cell."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:200]


@contextlib.contextmanager
def environment(settings: dict[str, str | None]):
    """`os.environ` with `settings` applied (None: unset), restored afterwards: for the
    columns that force an AttnFuse choice read when a plan is made."""
    def apply(values: dict[str, str | None]) -> None:
        for name, value in values.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    before = {name: os.environ.get(name) for name in settings}
    apply(settings)
    try:
        yield
    finally:
        apply(before)


def rotate_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on half-split pairs (x_t, x_{t + D/2}) in fp32, cast back: the pre-rotation the
    peers get (wrapped in `torch.compile` by the scripts)."""
    half = x.shape[-1] // 2
    lo, hi = x[..., :half].float(), x[..., half:].float()
    return torch.cat([lo * cos - hi * sin, lo * sin + hi * cos], dim=-1).to(x.dtype)


def cudnn_takes_gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether cuDNN's SDPA runs with fewer key/value heads than query heads (`enable_gqa`)
    for tensors like these."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    try:
        with torch.no_grad(), sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return True
    except RuntimeError:
        return False

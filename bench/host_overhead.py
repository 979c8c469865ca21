"""Host (CPU) cost of an attention call beside SDPA's: what Python and the launches cost per
forward call and per training step when the kernels themselves are tiny.

    python bench/host_overhead.py --out DIR [--seq-lens 128,512] [--profile] [--launches]
    python bench/host_overhead.py --smoke --out DIR      # CPU, tiny sizes: checks the script
    python bench/host_overhead.py --rope --out DIR       # RoPE + causal (SDPA after torch's rotation)

Default problem: B=1, H=8, D=64, fp16, causal, N=128 and 512. Implementations: AttnFuse
(`af.compile(af.attention(af.causal()))`), SDPA with its default backend choice
(`is_causal=True`, no `sdpa_kernel`), AttnFuse with its autograd node made through
`Function.apply` (`attnfuse-function-apply`: the A/B of `runtime/direct_apply.py`'s direct C
apply, which the `attnfuse` row uses where `attention_autograd.DIRECT_APPLY`), AttnFuse with
every kernel launched through the launcher (`attnfuse-direct-launches`: the A/B of
`runtime/launch_graphs.py`, whose CUDA graphs replay the `attnfuse` row's backward launches),
and SDPA pinned to FlashAttention (`sdpa_kernel` entered once around the whole measurement,
not per call). Modes: `fwd` (one call under `no_grad`)
and `train` (the inputs' `.grad` reset to None, the call, `out.backward(g)`).

`--rope` makes the problem RoPE + causal: AttnFuse `af.attention(af.rope(), af.causal())`, its
rotation fused or pre-rotated as the runtime places it, beside SDPA after q and k are rotated by
torch ops (half-split pairs from a precomputed cos / sin table, as a Hugging Face model does).

Three numbers per (implementation, mode, N), each the median over rounds of back-to-back
calls, per call:

- `host_us`: how long min(K, 64) Python calls take to return while the GPU is held busy by a
  `torch.cuda._sleep` kernel enqueued first, so that every launch goes into a queue the GPU
  is not draining yet: the host's own cost per call, the GPU never the bottleneck. (If the
  sleep ended before the host did, the round says so in `sleep_outlasted_host`.)
- `gpu_us`: CUDA events recorded around the same calls, after the sleep: the device time
  per call with the queue kept full (no host gaps between the kernels).
- `wall_us`: K calls back to back with a synchronize before and after, on the host clock: what
  a loop of such calls costs, max(host, device) per call plus the gaps.

Rounds are interleaved: every (implementation, mode) runs one round in turn, in an order
rotated from round to round, so the machine's drift falls on all alike. Ratios are AttnFuse
over each SDPA column, as the ratio of the medians and (in parentheses) as the median over
rounds of the ratio within a round, which the targets are judged by. The issue's targets: a forward call's host cost at
most SDPA's + 10% (ratio <= 1.10), a training step's at most 1.3x SDPA's; the table marks each
against SDPA's default backend and against flash.

`--profile` adds cProfile's top entries for AttnFuse's training step; `--launches` the host
time of each kernel launch of an AttnFuse training step alone (through the runtime's plan:
an internal interface, so it is skipped with a note when that changes).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

import benchlib

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
TARGETS = {"fwd": 1.10, "train": 1.30}  # AttnFuse host time over SDPA's, at most
MODES = {"fwd": "forward call", "train": "training step (fwd + bwd)"}
QUEUED_CALLS = 64  # calls enqueued behind the sleep kernel per round (see measure)


def host_ms(step: Callable[[], object], iters: int = 300) -> float:
    """Mean host time per `step()` when enqueued back to back (synchronized before and after
    the loop; the time stops when the last call returns)."""
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        step()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / iters * 1e3


def print_profile(step: Callable[[], object], iters: int, top: int = 30) -> None:
    """cProfile's `top` entries, by own time, over `iters` calls of `step()`."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(iters):
        step()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    print(text.getvalue())


class SleepCalibration:
    """`torch.cuda._sleep(cycles)` holds the GPU for a while; this learns cycles per ms."""

    def __init__(self) -> None:
        cycles = 10_000_000
        torch.cuda._sleep(cycles)  # load the kernel
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        torch.cuda.synchronize()
        self.cycles_per_ms = cycles / max(start.elapsed_time(end), 1e-3)

    def cycles(self, ms: float) -> int:
        return int(self.cycles_per_ms * ms)


def warm(step: Callable[[], object], device: str) -> None:
    """A few untimed calls: the first compiles and caches, the rest settle allocators."""
    for _ in range(5 if device == "cuda" else 1):
        step()
    benchlib.synchronize(device)


def measure_round(step: Callable[[], object], device: str, calls: int,
                  sleep: SleepCalibration | None) -> dict[str, float | bool | None]:
    """One round of `step` (see the module docstring): host_us, gpu_us, wall_us per call."""
    # Wall: back to back, synchronized around.
    benchlib.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(calls):
        step()
    benchlib.synchronize(device)
    wall = (time.perf_counter() - t0) / calls * 1e6
    if sleep is None:  # CPU: the call is the work; host time is the wall time
        return {"host_us": wall, "gpu_us": None, "wall_us": wall, "sleep_outlasted_host": None}
    # Host and device: the GPU held by a sleep long enough for the host's whole loop
    # (estimated from the wall time, with room to spare), then K calls between events.
    # Fewer calls here: CUDA's queue of pending launches is finite (about a thousand), and
    # a host that fills it waits for the GPU, which would count as host time.
    queued = min(calls, QUEUED_CALLS)
    sleep_ms = max(2.0, 3.0 * wall * queued / 1e3)
    before, start, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    torch.cuda.synchronize()
    before.record()
    torch.cuda._sleep(sleep.cycles(sleep_ms))
    start.record()
    t0 = time.perf_counter()
    for _ in range(queued):
        step()
    host_s = time.perf_counter() - t0
    end.record()
    torch.cuda.synchronize()
    return {"host_us": host_s / queued * 1e6, "gpu_us": start.elapsed_time(end) / queued * 1e3,
            "wall_us": wall, "sleep_outlasted_host": before.elapsed_time(start) >= host_s * 1e3}


def summarize(rounds: list[dict[str, float | bool | None]]) -> dict[str, object]:
    """The medians over rounds, and the per-round host times (for paired ratios)."""
    out: dict[str, object] = {"host_rounds_us": [r["host_us"] for r in rounds]}
    for what in ("host_us", "gpu_us", "wall_us"):
        values = [r[what] for r in rounds if r[what] is not None]
        out[what] = statistics.median(values) if values else None
    outlasted = [r["sleep_outlasted_host"] for r in rounds if r["sleep_outlasted_host"] is not None]
    out["sleep_outlasted_host"] = all(outlasted) if outlasted else None
    return out


def torch_rope(n: int, head_dim: int, device, dtype) -> Callable[[torch.Tensor], torch.Tensor]:
    """RoPE (theta 10000, half-split pairs) by torch ops from a table made once: what a model
    runs before SDPA."""
    inv_freq = 10000.0 ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(n, device=device, dtype=torch.float32), inv_freq)
    cos, sin = (torch.cat([t, t], dim=-1).to(dtype) for t in (angles.cos(), angles.sin()))

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    return rotate


def implementations(rope: bool = False) -> dict[str, Callable]:
    """name -> builder(q, k, v) returning `(call, context)`: `call()` runs one attention
    (RoPE + causal with `rope`: SDPA's rows rotate q and k by torch ops first)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def attnfuse(q, k, v):
        import attnfuse as af

        fn = af.compile(af.attention(af.rope(), af.causal()) if rope else af.attention(af.causal()))
        return (lambda: fn(q, k, v)), None

    def sdpa_call(q, k, v):
        if not rope:
            return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
        rotate = torch_rope(q.shape[-2], q.shape[-1], q.device, q.dtype)
        return lambda: F.scaled_dot_product_attention(rotate(q), rotate(k), v, is_causal=True)

    def sdpa_default(q, k, v):
        return sdpa_call(q, k, v), None

    def sdpa_flash(q, k, v):
        return sdpa_call(q, k, v), (lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION))

    def attnfuse_function_apply(q, k, v):
        # The same call with its autograd node made through Function.apply (the path a torch
        # without the known preamble takes, runtime/direct_apply.py): an A/B of the direct
        # C apply in the same run. Only where the direct path is in use (else the same row).
        from attnfuse.runtime import api, attention_autograd

        if not attention_autograd.DIRECT_APPLY:
            raise RuntimeError("attention_autograd.DIRECT_APPLY is False here: attnfuse already uses Function.apply")
        call, _ = attnfuse(q, k, v)

        @contextlib.contextmanager
        def function_apply():
            api.apply_attention = attention_autograd._AttentionFunction.apply
            try:
                yield
            finally:
                api.apply_attention = attention_autograd._apply_direct

        return call, function_apply

    def attnfuse_direct_launches(q, k, v):
        # The same call with every kernel launched through the launcher, none replayed as a
        # CUDA graph (`ATTNFUSE_LAUNCH_GRAPHS=off`): the A/B of runtime/launch_graphs.py.
        from attnfuse.runtime import launch_graphs

        call, _ = attnfuse(q, k, v)

        @contextlib.contextmanager
        def direct_launches():
            saved = launch_graphs.ENABLED
            launch_graphs.ENABLED = False
            try:
                yield
            finally:
                launch_graphs.ENABLED = saved

        return call, direct_launches

    return {"attnfuse": attnfuse, "attnfuse-function-apply": attnfuse_function_apply,
            "attnfuse-direct-launches": attnfuse_direct_launches,
            "sdpa-default": sdpa_default, "sdpa-flash": sdpa_flash}


def steps(call: Callable, leaves: tuple[torch.Tensor, ...], grad_out: torch.Tensor) -> dict[str, Callable]:
    """The two timed units of one implementation."""

    def fwd():
        with torch.no_grad():
            call()

    def train():
        for leaf in leaves:
            leaf.grad = None
        call().backward(grad_out)

    return {"fwd": fwd, "train": train}


def launch_times(q, k, v, grad_out, rope: bool = False) -> list[str]:
    """Host time of each kernel launch of an AttnFuse training step (RoPE + causal with
    `rope`, else causal), launched alone."""
    import attnfuse as af

    fn = af.compile(af.attention(af.rope(), af.causal()) if rope else af.attention(af.causal()))
    plan = fn.plan(q, k, v, training=True)  # a training step's plan (never a split decode's)
    rotated: dict[str, torch.Tensor] = {}  # a RoPE plan's pre-rotated copies, which its launches read
    with torch.no_grad():
        out, lse = fn.forward(plan, {}, q, k, v, rotated)
    tensors = {"q": q.detach(), "k": k.detach(), "v": v.detach(), "o": out, "lse": lse,
               "do": grad_out, "dq": torch.empty_like(q), "dk": torch.empty_like(k),
               "dv": torch.empty_like(v), "delta": torch.empty_like(lse), **plan.constants, **rotated}
    lines = []
    for launch in plan.launches:
        missing = [role for role in launch.info.roles if role not in tensors]
        if missing:
            # (The fused backward's accumulators, say: this step feeds the split's roles.)
            lines.append(f"launch {launch.info.name}: not timed, reads {', '.join(missing)}")
            continue
        launch(tensors)
        us = host_ms(lambda launch=launch: launch(tensors), iters=1000) * 1e3
        lines.append(f"launch {launch.info.name}: {len(launch.info.roles)} roles, {us:.1f} us")
    return lines


def launch_graph_census() -> dict[str, object]:
    """How many CUDA graphs AttnFuse's launch schedules hold now (`LaunchGraphs` objects alive:
    the plans' own), and why any failed to capture: whether the `attnfuse` rows replayed their
    backward as graphs, read after the run, so the timed calls carry no counting."""
    import gc

    from attnfuse.runtime.launch_graphs import LaunchGraphs

    schedules = [o for o in gc.get_objects() if isinstance(o, LaunchGraphs)]
    return {"schedules": len(schedules), "graphs": sum(len(g.graphs) for g in schedules),
            "failed": sorted({g.failed for g in schedules if g.failed})}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-lens", default="128,512")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp16")
    parser.add_argument("--calls", type=int, default=200, help="calls per round (K)")
    parser.add_argument("--rounds", type=int, default=15, help="rounds; the medians are over them")
    parser.add_argument("--out", type=Path, default=benchlib.ROOT / "bench" / "results")
    parser.add_argument("--smoke", action="store_true",
                        help="CPU, N=16, H=2, D=16, fp32, 1 round of 2 calls: checks the script, times nothing useful")
    parser.add_argument("--profile", action="store_true", help="cProfile of AttnFuse's training step")
    parser.add_argument("--launches", action="store_true", help="host time of each AttnFuse launch alone")
    parser.add_argument("--rope", action="store_true", help="RoPE + causal (SDPA after torch's rotation)")
    args = parser.parse_args(argv)

    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    if args.smoke:
        args.seq_lens, args.heads, args.head_dim, args.dtype = "16", 2, 16, "fp32"
        args.calls, args.rounds = 2, 1
    elif device == "cpu":
        print("host_overhead.py: no CUDA device; pass --smoke to check the script on the CPU", file=sys.stderr)
        return 2
    if device == "cpu":
        import attnfuse  # noqa: F401 - picks Triton's interpreter before torch imports Triton
    dtype = DTYPES[args.dtype]
    seq_lens = [int(x) for x in args.seq_lens.split(",")]
    sleep = SleepCalibration() if device == "cuda" else None
    rows = []
    impls = implementations(args.rope)
    total = len(seq_lens) * args.rounds
    with benchlib.CaseProgress(total) as progress:
        for n in seq_lens:
            torch.manual_seed(0)
            q, k, v = (torch.randn(args.batch, args.heads, n, args.head_dim, device=device, dtype=dtype,
                                   requires_grad=True) for _ in range(3))
            grad_out = torch.randn_like(q)
            # Every (implementation, mode) gets one round in turn, the order rotated from round
            # to round: the machine's drift (its load, its clocks) then falls on all of them
            # alike, and each AttnFuse round has SDPA rounds beside it for a paired ratio.
            units = []
            for name, build in impls.items():
                try:
                    call, context = build(q, k, v)
                except Exception as err:  # noqa: BLE001 - one implementation missing is a row
                    for mode in MODES:
                        rows.append({"n": n, "impl": name, "mode": mode, "error": benchlib.first_line(err)})
                    continue
                for mode, step in steps(call, (q, k, v), grad_out).items():
                    units.append(({"n": n, "impl": name, "mode": mode, "error": None}, step, context))
            measured: dict[int, list] = {i: [] for i in range(len(units))}
            for i, (row, step, context) in enumerate(units):
                try:
                    with context() if context else contextlib.nullcontext():
                        warm(step, device)
                except Exception as err:  # noqa: BLE001
                    row["error"] = benchlib.first_line(err)
            for r in range(args.rounds):
                progress.step(f"N={n} round {r + 1}/{args.rounds}")
                for i in [(r + j) % len(units) for j in range(len(units))]:
                    row, step, context = units[i]
                    if row["error"]:
                        continue
                    try:
                        with context() if context else contextlib.nullcontext():
                            measured[i].append(measure_round(step, device, args.calls, sleep))
                    except Exception as err:  # noqa: BLE001
                        row["error"] = benchlib.first_line(err)
            for i, (row, _step, _context) in enumerate(units):
                if not row["error"]:
                    row.update(summarize(measured[i]))
                rows.append(row)
    add_ratios(rows)
    graphs = launch_graph_census()

    meta = benchlib.metadata(device)
    shape = f"B={args.batch} H={args.heads} D={args.head_dim} {args.dtype} {'RoPE + causal' if args.rope else 'causal'}"
    config = {"shape": shape, "seq_lens": seq_lens, "calls": args.calls, "rounds": args.rounds,
              "targets": TARGETS}
    markdown = [f"# Host overhead per call beside SDPA ({meta['gpu'] or 'CPU'})", ""]
    markdown += benchlib.metadata_lines(meta)
    markdown += [f"- problem: {shape}; {args.rounds} rounds of {args.calls} back-to-back calls, medians",
                 ("- host_us: time for a call to return while the GPU is held busy (the host's own cost); "
                  "gpu_us: device time per call with the queue full (CUDA events); wall_us: back-to-back "
                  "calls, synchronized around (host clock)"),
                 (f"- targets: AttnFuse host_us / SDPA host_us <= {TARGETS['fwd']} (forward), "
                  f"<= {TARGETS['train']} (training step)"),
                 f"- launch graphs (runtime/launch_graphs.py) after the run: {graphs['graphs']} captured over "
                 f"{graphs['schedules']} schedules" + (f"; failed: {graphs['failed']}" if graphs["failed"] else ""),
                 ""]
    markdown += table(rows)
    print("\n".join(table(rows)))
    benchlib.write_outputs(args.out, f"{benchlib.stamp()}-host-overhead",
                           {"metadata": meta, "config": config, "rows": rows, "launch_graphs": graphs}, markdown)

    if device == "cuda" and (args.launches or args.profile):
        n = seq_lens[0]
        q, k, v = (torch.randn(args.batch, args.heads, n, args.head_dim, device=device, dtype=dtype,
                               requires_grad=True) for _ in range(3))
        grad_out = torch.randn_like(q)
        if args.launches:
            try:
                print("\n".join(launch_times(q, k, v, grad_out, args.rope)))
            except Exception as err:  # noqa: BLE001 - an internal interface that may move
                print(f"--launches skipped: {benchlib.first_line(err)}")
        if args.profile:
            call, _ = implementations(args.rope)["attnfuse"](q, k, v)
            print_profile(steps(call, (q, k, v), grad_out)["train"], 200)
            torch.cuda.synchronize()
    return 0


def add_ratios(rows: list[dict]) -> None:
    """`host_ratio_<peer>` and `wall_ratio_<peer>` (AttnFuse over peer) on AttnFuse's rows,
    and whether the host ratio meets the mode's target."""
    by_key = {(row["n"], row["impl"], row["mode"]): row for row in rows}
    for row in rows:
        if not row["impl"].startswith("attnfuse") or row.get("error"):
            continue
        for peer in ("sdpa-default", "sdpa-flash"):
            other = by_key.get((row["n"], peer, row["mode"]))
            if not other or other.get("error"):
                continue
            for what in ("host", "wall", "gpu"):
                mine, theirs = row.get(f"{what}_us"), other.get(f"{what}_us")
                row[f"{what}_ratio_{peer}"] = mine / theirs if mine and theirs else None
            # Paired: the median over rounds of this round's host time over the peer's in the
            # same round (interleaved), less exposed to the machine's drift than a ratio of medians.
            mine_rounds, theirs_rounds = row.get("host_rounds_us") or [], other.get("host_rounds_us") or []
            pairs = [a / b for a, b in zip(mine_rounds, theirs_rounds) if b]
            row[f"host_ratio_paired_{peer}"] = statistics.median(pairs) if pairs else None
            ratio = row[f"host_ratio_paired_{peer}"] or row[f"host_ratio_{peer}"]
            row[f"meets_target_{peer}"] = None if ratio is None else ratio <= TARGETS[row["mode"]]


def paired(row: dict, peer: str) -> str:
    """`ratio of medians (median of paired ratios)`."""
    plain, pair = row.get(f"host_ratio_{peer}"), row.get(f"host_ratio_paired_{peer}")
    text = benchlib.fmt(plain, ".2f", "x")
    return text + (f" ({pair:.2f}x)" if pair is not None else "")


def table(rows: list[dict]) -> list[str]:
    """The markdown table: one line per (N, mode, implementation)."""
    header = ["N", "mode", "impl", "host us/call", "gpu us/call (queue full)", "wall us/call",
              "host ratio vs default (paired)", "host ratio vs flash (paired)", "wall ratio vs default", "target"]
    cells = []
    for row in sorted(rows, key=lambda r: (r["n"], list(MODES).index(r["mode"]))):
        if row.get("error"):
            cells.append([row["n"], row["mode"], row["impl"], f"fails: {row['error']}", "", "", "", "", "", ""])
            continue
        target = ""
        if row["impl"].startswith("attnfuse"):
            verdicts = []
            for peer, short in (("sdpa-default", "default"), ("sdpa-flash", "flash")):
                met = row.get(f"meets_target_{peer}")
                if met is not None:
                    verdicts.append(f"{'meets' if met else 'misses'} <= {TARGETS[row['mode']]}x {short}")
            target = "; ".join(verdicts)
        note = "" if row.get("sleep_outlasted_host") in (True, None) else " (sleep ended early)"
        cells.append([row["n"], row["mode"], row["impl"], benchlib.fmt(row["host_us"], ".1f") + note,
                      benchlib.fmt(row.get("gpu_us"), ".1f"), benchlib.fmt(row["wall_us"], ".1f"),
                      paired(row, "sdpa-default"), paired(row, "sdpa-flash"),
                      benchlib.fmt(row.get("wall_ratio_sdpa-default"), ".2f", "x"), target])
    return benchlib.markdown_table(header, cells)


if __name__ == "__main__":
    sys.exit(main())

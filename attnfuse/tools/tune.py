"""attnfuse-tune: measure the portable kernels' tile configurations for one variant on the GPU at
hand, and write the best into a tuning file that the dispatcher reads (`runtime/tuning.py`).

    attnfuse-tune "af.attention(af.rope(), af.causal())" --shape 1,32,8,128 \\
        --seq-lens 2048,4096 --dtype bf16 --mode forward,backward --out my-gpu.json
    ATTNFUSE_TUNING=my-gpu.json python train.py

The built-in rules (`choose_tile_config`) were measured on an H200; on any other GPU the tiles
are untuned defaults. Method, per sequence length N (Nq = Nk = N):

1. Inputs are drawn with `torch.randn` from a fixed seed; call-time data the variant reads is
   made too (`sample_call_data`: a random bias, a block layout of density 0.5 with its
   diagonal kept, four equal documents).
2. The dispatcher's configuration (its built-in rules; tuning files are ignored while tuning)
   runs first: its output (and, for `backward`, its gradients) is what every candidate must
   reproduce, to `--tolerance` in relative error. A candidate that computes something else is
   marked FAIL (a compiler bug: tiles change only the order of the sums), never chosen, and
   makes the exit status 1.
3. Each candidate of the grid `--block-m` x `--block-n` x `--num-warps` x `--num-stages` is
   timed: `triton.testing.do_bench` (median, L2 flushed) on a GPU; on the CPU the wall-clock
   median of the interpreter, which checks the tool and says nothing about any GPU. A
   candidate that does not compile or fit (shared memory, registers) is reported and skipped.
   `backward` tunes the dQ side (`bwd_*`: the preprocess and dQ kernels) with dK/dV fixed at
   the dispatcher's, then dK/dV (`dkdv_*`) with the best dQ side, timing a training step
   (forward + backward) with the forward at the dispatcher's tiles.

The sweep runs the portable (`tl`) kernels: `ATTNFUSE_FORWARD_TARGET` and
`ATTNFUSE_BACKWARD_TARGET` are set to `triton` in the tuner's process. On Hopper the Gluon
target's kernels have their own schedules and are not what a tuning file steers.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import itertools
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

ATTN_SUFFIXES = (".mlir", ".attn")
"""File suffixes read as attn programs; any other argument is a Python expression."""

KIND_LABELS = {"forward": "forward", "backward": "dQ side (bwd_*)", "dkdv": "dK/dV (dkdv_*)"}


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One point of the grid: (block_m, block_n, num_warps, num_stages) of one kernel kind."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int

    def fields(self, kind: str) -> dict[str, int]:
        """The `TileConfig` fields this candidate sets for `kind` (`tuning.KINDS`)."""
        from attnfuse.runtime.tuning import KINDS

        return dict(zip(KINDS[kind], dataclasses.astuple(self)))


@dataclasses.dataclass
class Row:
    """A measured candidate: its time in ms, or why it has none."""

    candidate: Candidate
    status: str  # "ok", "FAIL" (wrong numbers), "error" (did not compile or run)
    ms: float | None = None
    error: float | None = None
    message: str = ""
    dispatcher: bool = False


def build_parser() -> argparse.ArgumentParser:
    """The command line (see the module's docstring)."""
    parser = argparse.ArgumentParser(
        prog="attnfuse-tune",
        description="Sweep the portable kernels' tiles for one variant on this GPU and write the "
                    "best into a tuning file (read through ATTNFUSE_TUNING).")
    parser.add_argument("variant", help="a Python expression with `af` bound, e.g. "
                        "\"af.attention(af.rope(), af.causal())\", or a file holding an attn program (.mlir)")
    parser.add_argument("--shape", required=True, type=_ints(4), metavar="B,HQ,HKV,D",
                        help="batch, query heads, key/value heads, head dim")
    parser.add_argument("--seq-lens", default="4096", type=_ints(None), metavar="N,...",
                        help="sequence lengths to tune (Nq = Nk = N; default 4096)")
    parser.add_argument("--dtype", default="fp16", choices=("fp16", "bf16", "fp32"))
    parser.add_argument("--mode", default="forward", type=_modes, metavar="forward,backward",
                        help="what to tune: forward, backward (dQ side then dK/dV), or both")
    parser.add_argument("--device", default=None, choices=("cuda", "cpu"),
                        help="default: cuda when there is a GPU")
    for name, gpu, cpu in (("block-m", "32,64,128", "16,32"), ("block-n", "32,64,128", "16,32"),
                           ("num-warps", "4,8", "4"), ("num-stages", "2,3,4", "1")):
        parser.add_argument(f"--{name}", type=_ints(None), default=None, metavar="V,...",
                            help=f"candidates (default {gpu} on a GPU, {cpu} on the CPU)")
    parser.add_argument("--tolerance", type=_tolerance, default=None,
                        help="largest relative error against the dispatcher's result "
                             "(default 1e-2 for fp16/bf16, 1e-4 for fp32)")
    parser.add_argument("--warmup-ms", type=float, default=25.0)
    parser.add_argument("--rep-ms", type=float, default=100.0)
    parser.add_argument("--out", type=Path, default=None,
                        help="tuning file to write (entries merged into it if it exists)")
    return parser


def _ints(count: int | None) -> Callable[[str], list[int]]:
    def parse(text: str) -> list[int]:
        try:
            values = [int(part) for part in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
        if count is not None and len(values) != count:
            raise argparse.ArgumentTypeError(f"expected {count} integers, got {len(values)}")
        if any(v <= 0 for v in values):
            raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
        return values
    return parse


def _tolerance(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"a relative error is at least 0, got {text}")
    return value


def _modes(text: str) -> list[str]:
    modes = [part for part in text.split(",") if part]
    bad = [m for m in modes if m not in ("forward", "backward")]
    if bad or not modes:
        raise argparse.ArgumentTypeError(f"modes are forward and backward, got {text!r}")
    return modes


def load_source(text: str) -> Any:
    """The variant to tune: an attn program's text from a file, or the value of a Python
    expression with `af` bound (a spec)."""
    import attnfuse as af
    from attnfuse.errors import ArgumentError

    if text.endswith(ATTN_SUFFIXES):
        try:
            return Path(text).read_text(encoding="utf-8")
        except OSError as err:
            raise ArgumentError(f"cannot read {text}: {err.strerror}") from None
    try:
        value = eval(text, {"af": af, "attnfuse": af})  # noqa: S307 - the user's own command line
    except Exception as err:  # noqa: BLE001 - reported as the argument's error
        raise ArgumentError(f"the variant {text!r} does not evaluate: {type(err).__name__}: {err}") from None
    if not isinstance(value, af.AttentionSpec):
        raise ArgumentError(f"the variant {text!r} evaluates to {type(value).__name__}, not an "
                            "af.attention(...) spec")
    return value


def sample_call_data(fn: Any, batch: int, heads_q: int, n: int, dtype: torch.dtype,
                     device: str, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Call-time data for each keyword the variant's ops read: a `[B, Hq, N, N]` bias from
    randn, a block layout of density 0.5 with its diagonal kept (no row without keys), and
    four equal documents (`doc_ids`)."""
    from attnfuse.errors import ArgumentError

    data: dict[str, torch.Tensor] = {}
    for binding in fn.variant.bindings:
        name = binding.use.argument
        if name is None or name in data:
            continue
        if name == "bias":
            data[name] = torch.randn(batch, heads_q, n, n, generator=generator).to(dtype).to(device)
        elif name == "block_layout":
            blocks = math.ceil(n / fn.variant.block_size)
            layout = torch.rand(blocks, blocks, generator=generator) < 0.5
            data[name] = (layout | torch.eye(blocks, dtype=torch.bool)).to(device)
        elif name == "doc_ids":
            data[name] = (torch.arange(n) // math.ceil(n / 4)).to(torch.int32).to(device)
        else:
            raise ArgumentError(f"attnfuse-tune cannot make call-time data {name}= for this variant")
    return data


def candidates(args: argparse.Namespace, device: str) -> list[Candidate]:
    """The grid, with the device's defaults for the lists not given."""
    gpu = device == "cuda"
    lists = [getattr(args, name) or defaults for name, defaults in (
        ("block_m", [32, 64, 128] if gpu else [16, 32]), ("block_n", [32, 64, 128] if gpu else [16, 32]),
        ("num_warps", [4, 8] if gpu else [4]), ("num_stages", [2, 3, 4] if gpu else [1]))]
    return [Candidate(*values) for values in itertools.product(*lists)]


class Tuner:
    """One variant, shape, dtype and device: measures candidates against the dispatcher's."""

    def __init__(self, source: Any, args: argparse.Namespace, device: str, n: int):
        import attnfuse as af
        from attnfuse.errors import ArgumentError
        from attnfuse.runtime.kv_cache import MAX_DECODE_QUERIES

        self.af, self.source, self.args, self.device, self.n = af, source, args, device, n
        batch, heads_q, heads_kv, head_dim = args.shape
        self.dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
        self.tolerance = (args.tolerance if args.tolerance is not None
                          else 1e-4 if self.dtype == torch.float32 else 1e-2)
        generator = torch.Generator().manual_seed(0)

        def draw(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=generator).to(self.dtype).to(device)
        self.q = draw(batch, heads_q, n, head_dim)
        self.k, self.v = draw(batch, heads_kv, n, head_dim), draw(batch, heads_kv, n, head_dim)
        self.dout = draw(batch, heads_q, n, head_dim)
        if n <= MAX_DECODE_QUERIES:
            raise ArgumentError(f"--seq-lens {n}: calls of at most {MAX_DECODE_QUERIES} queries run the "
                                "split-KV decode kernels, whose tiles this tool does not tune")
        self.dispatcher_fn = af.compile(source)
        self.data = sample_call_data(self.dispatcher_fn, batch, heads_q, n, self.dtype, device, generator)
        # The configuration the dispatcher chooses for this shape (block sizes bounded by a
        # block-sparse layout's block size, as every candidate is).
        self.base = self.dispatcher_fn.plan(self.q, self.k, self.v).config
        self.block_size = self.dispatcher_fn.variant.block_size

    def run(self, fn: Any, backward: bool) -> tuple[torch.Tensor, ...]:
        """One call's output (and, for `backward`, the gradients of q, k and v)."""
        if not backward:
            with torch.no_grad():
                return (fn(self.q, self.k, self.v, **self.data),)
        q, k, v = (t.detach().requires_grad_(True) for t in (self.q, self.k, self.v))
        fn(q, k, v, **self.data).backward(self.dout)
        return q.grad, k.grad, v.grad

    def time_ms(self, fn: Any, backward: bool) -> float:
        """The median ms of a call (forward) or of a training step (`backward`)."""
        from attnfuse.tools.bench import cpu_median_ms

        leaves = [t.detach().requires_grad_(backward) for t in (self.q, self.k, self.v)]

        def step() -> None:
            if backward:
                fn(*leaves, **self.data).backward(self.dout)
            else:
                with torch.no_grad():
                    fn(*leaves, **self.data)
        if self.device == "cuda":
            from triton.testing import do_bench

            return float(do_bench(step, warmup=self.args.warmup_ms, rep=self.args.rep_ms,
                                  grad_to_none=leaves if backward else None, return_mode="median"))
        return cpu_median_ms(step, self.args.warmup_ms, self.args.rep_ms, leaves if backward else [])

    def sweep(self, kind: str, start: Any, grid: Sequence[Candidate],
              progress: Callable[[str], None]) -> list[Row]:
        """Measures `kind`'s candidates, each set into `start` (a TileConfig), against the
        dispatcher's result."""
        from attnfuse.tools.bench import relative_error

        backward = kind != "forward"
        expected = self.run(self.dispatcher_fn, backward)
        base = self.base
        dispatcher = Candidate(*{"forward": (base.block_m, base.block_n, base.num_warps, base.num_stages),
                                 "backward": base.backward(), "dkdv": base.dkdv()}[kind])
        rows = []
        for candidate in dict.fromkeys([dispatcher, *grid]):
            progress(f"N={self.n} {KIND_LABELS[kind]} {dataclasses.astuple(candidate)}")
            row = Row(candidate, "ok", dispatcher=candidate == dispatcher)
            rows.append(row)
            if self.block_size is not None and max(candidate.block_m, candidate.block_n) > self.block_size:
                row.status, row.message = "error", f"blocks above the layout's block size {self.block_size}"
                continue
            config = dataclasses.replace(start, **candidate.fields(kind))
            try:
                fn = self.af.compile(self.source, config=config)
                got = self.run(fn, backward)
                row.error = max(relative_error(a, b) for a, b in zip(got, expected))
                if not row.error <= self.tolerance:
                    row.status = "FAIL"
                    continue
                row.ms = self.time_ms(fn, backward)
            except Exception as err:  # noqa: BLE001 - a candidate that does not compile or fit
                row.status, row.message = "error", f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        return rows


def best(rows: Sequence[Row]) -> Row | None:
    """The fastest row that ran and reproduced the dispatcher's result."""
    timed = [row for row in rows if row.status == "ok" and row.ms is not None]
    return min(timed, key=lambda row: row.ms) if timed else None


def report(rows: Sequence[Row], title: str) -> None:
    """The rows as a table, fastest first (rich when installed, else plain text)."""
    ordered = sorted(rows, key=lambda row: (row.ms is None, row.ms or 0.0))
    dispatcher_ms = next((row.ms for row in rows if row.dispatcher), None)
    header = ["block_m", "block_n", "warps", "stages", "ms", "speedup", "rel. err", "status"]
    table = []
    for row in ordered:
        speedup = f"{dispatcher_ms / row.ms:.2f}x" if row.ms and dispatcher_ms else ""
        table.append([*map(str, dataclasses.astuple(row.candidate)),
                      f"{row.ms:.4f}" if row.ms is not None else "",
                      speedup, f"{row.error:.1e}" if row.error is not None else "",
                      (row.status + (", dispatcher's" if row.dispatcher else "")
                       + (f": {row.message}" if row.message else ""))])
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(title)
        for line in [header, *table]:
            print("  ".join(line))
        return
    rich_table = Table(title=title, caption="speedup: the dispatcher's time / this time")
    for name in header:
        rich_table.add_column(name)
    for line in table:
        rich_table.add_row(*line)
    Console().print(rich_table)


TUNER_ENVIRONMENT = {"ATTNFUSE_FORWARD_TARGET": "triton", "ATTNFUSE_BACKWARD_TARGET": "triton",
                     "ATTNFUSE_TUNING": None}
RESTORED = (*TUNER_ENVIRONMENT, "TRITON_INTERPRET")
"""What `main` puts back as it was: the tuner's environment, and the interpreter switch it sets
for a CPU run."""
"""What the tuner's process runs with (None: unset): the portable kernels, which a tuning file
steers, and no tuning file, so that the dispatcher's reference configuration is its own."""


def main(argv: Sequence[str] | None = None) -> int:
    """The `attnfuse-tune` command (see the module's docstring). The environment it sets
    (`TUNER_ENVIRONMENT`) is restored when it returns."""
    args = build_parser().parse_args(argv)
    saved = {name: os.environ.get(name) for name in RESTORED}
    try:
        for name, value in TUNER_ENVIRONMENT.items():
            _set_environment(name, value)
        return _tune(args)
    finally:
        for name, value in saved.items():
            _set_environment(name, value)


def _set_environment(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def _tune(args: argparse.Namespace) -> int:
    """The sweep of `main`, in the tuner's environment."""
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu" and "triton" not in sys.modules:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from attnfuse.errors import ArgumentError, AttnFuseError
    from attnfuse.runtime import tuning
    from attnfuse.tools.bench import CaseProgress

    if device == "cuda" and not torch.cuda.is_available():
        print("attnfuse-tune: error: --device cuda, but torch sees no GPU", file=sys.stderr)
        return 1
    if device == "cpu":
        print("attnfuse-tune: on the CPU the kernels run in Triton's interpreter: these times say "
              "nothing about any GPU (use it to check a variant and the tool).", file=sys.stderr)
    try:
        if args.out is not None and not args.out.parent.is_dir():
            # Known before a sweep of minutes, not after it.
            raise ArgumentError(f"cannot write {args.out}: no directory {args.out.parent}")
        # An existing file is read (and checked) before the sweep: its entries are merged into.
        old = tuning.read_file(str(args.out)) if args.out is not None and args.out.exists() else []
        if args.num_stages and max(args.num_stages) > tuning.MAX_STAGES:
            # A tuning file holds at most that many (`tuning.MAX_STAGES`).
            raise ArgumentError(f"--num-stages: at most {tuning.MAX_STAGES}, got {max(args.num_stages)}")
        source = load_source(args.variant)
        entries: list[tuning.TuningEntry] = []
        failed = False
        grid = candidates(args, device)
        steps = len(args.seq_lens) * (len(grid) + 1) * (2 * ("backward" in args.mode) + ("forward" in args.mode))
        with CaseProgress(steps) as progress:
            for n in args.seq_lens:
                tuner = Tuner(source, args, device, n)
                name = tuning.device_name(torch.device(device))
                kinds = (["forward"] if "forward" in args.mode else []) + (
                    ["backward", "dkdv"] if "backward" in args.mode else [])
                # dK/dV is swept with the best dQ side fixed; the dQ side with dK/dV pinned at
                # the dispatcher's (a None dkdv field would follow the dQ side's).
                start = dataclasses.replace(tuner.base, **Candidate(*tuner.base.dkdv()).fields("dkdv"))
                for kind in kinds:
                    rows = tuner.sweep(kind, start, grid, progress.step)
                    failed |= any(row.status == "FAIL" for row in rows)
                    chosen = best(rows)
                    report(rows, f"{KIND_LABELS[kind]}, N={n}, {args.dtype}, shape {args.shape} on {name}")
                    if chosen is None:
                        continue
                    start = dataclasses.replace(start, **chosen.candidate.fields(kind))
                    head_dim = args.shape[3]
                    entries.append(tuning.TuningEntry(
                        name, tuner.dispatcher_fn.variant.text, args.dtype, head_dim, head_dim, n, n, kind,
                        chosen.candidate.fields(kind)))
                tuned = ", ".join(f"{field}={getattr(start, field)}" for kind in tuning.KINDS
                                  for field in tuning.KINDS[kind])
                print(f"N={n}: config=af.TileConfig({tuned})")
        if args.out is not None:
            metadata = {"written_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                        "command": " ".join(getattr(sys, "orig_argv", sys.argv)), "torch": torch.__version__}
            try:
                tuning.write_file(str(args.out), tuning.merged(old, entries), metadata)
            except OSError as err:
                raise ArgumentError(f"cannot write {args.out}: {err.strerror}") from None
            print(f"wrote {len(entries)} entries to {args.out} (ATTNFUSE_TUNING={args.out} to use them)")
    except AttnFuseError as err:
        print(f"attnfuse-tune: error: {err}", file=sys.stderr)
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Issue 17's table ("Faster than cuDNN on Hopper") from one session's result files: each
workload of the issue with the portable (tl) kernel, what a call runs by default (`auto`: the
Gluon target where it takes the call) and cuDNN, and whether the done criterion holds.

    python bench/issue17_table.py --forward F.json --sweep S.json --backward B.json --layer L.json --out DIR

The inputs are the JSON files of one H200 session (`bash bench/gpu_session.sh issue17` runs them
all, then this script):

- `--forward`: `bench/gluon_forward.py --columns auto,triton` (the issue cases);
- `--sweep`: `bench/gluon_forward.py --cases rope-sweep --columns auto` (RoPE + causal, 1k-16k);
- `--backward`: `bench/backward_targets.py --cases causal,rope+causal --columns default`;
- `--layer`: `bench/llama_layer.py --modes fwdbwd --compile off`.

Any of them may be left out (its rows are then missing). Ratios are cuDNN / AttnFuse (> 1:
AttnFuse faster); a criterion row says `meets` when every ratio it covers is at least 1.00.
Writes `<stamp>-issue17-table.md` (and prints it).
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

import benchlib


def _rows(path: Path | None) -> list[dict]:
    return json.loads(path.read_text())["rows"] if path is not None else []


def _ms(value) -> float | None:
    """A time from a result file (`"nan"` or None where the column did not run)."""
    if value is None or isinstance(value, str):
        return None
    return None if math.isnan(value) else float(value)


def _case(row: dict) -> tuple[str, int, int, str]:
    """(variant, head dim, N, dtype) of a forward or backward case name such as
    `rope+causal B4 H12/12 D64 N4096 float16`."""
    match = re.match(r"(\S+) B\d+ H\d+/\d+ D(\d+) N(\d+) (\S+)", row["case"])
    if match is None:
        raise ValueError(f"unrecognized case {row['case']!r}")
    variant, dim, n, dtype = match.groups()
    return variant, int(dim), int(n), dtype


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ratio(peer: float | None, mine: float | None) -> float | None:
    return None if peer is None or mine is None else peer / mine


def forward_rows(rows: list[dict], variant: str, dim: int, sizes: tuple[int, ...] | None = None) -> list[tuple]:
    """(N, tl ms, auto ms, cuDNN ms) of the forward rows of `variant` at `dim`."""
    out = []
    for row in rows:
        v, d, n, _ = _case(row)
        if v == variant and d == dim and (sizes is None or n in sizes):
            out.append((n, _ms(row.get("triton_ms")), _ms(row.get("auto_ms")), _ms(row.get("cudnn_ms"))))
    return sorted(out)


def backward_rows(rows: list[dict], variant: str) -> list[tuple]:
    """(N, AttnFuse default fwd+bwd ms, cuDNN fwd+bwd ms) of `variant`'s training rows."""
    out = []
    for row in rows:
        v, _, n, _ = _case(row)
        if v == variant:
            out.append((n, _ms(row.get("default_fwdbwd_ms")), _ms(row.get("cudnn_fwdbwd_ms"))))
    return sorted(out)


def layer_rows(rows: list[dict]) -> list[tuple]:
    """(N, AttnFuse ms, cuDNN ms) of the eager layer's fwd+bwd."""
    times: dict[tuple[str, int], float | None] = {}
    for row in rows:
        if row.get("layer") == "eager" and row.get("mode") == "fwdbwd":
            times[(row["impl"], row["n"])] = _ms(row.get("ms"))
    sizes = sorted({n for _, n in times})
    return [(n, times.get(("attnfuse", n)), times.get(("sdpa-cudnn", n))) for n in sizes]


def table(forward: list[dict], sweep: list[dict], backward: list[dict], layer: list[dict]) -> list[str]:
    """The markdown table: one row per workload, then one per done criterion."""
    header = ["workload", "AttnFuse tl", "AttnFuse default (auto)", "cuDNN", "cuDNN / default"]
    body: list[list[str]] = []
    criteria: list[tuple[str, list[float | None]]] = []

    def forward_line(label: str, found: list[tuple]) -> list[float | None]:
        if not found:
            return []
        sizes = " / ".join(str(n) for n, *_ in found)
        ratios = [_ratio(cudnn, auto) for _, _, auto, cudnn in found]
        body.append([f"{label}, N={sizes}", " / ".join(_fmt(t) for _, t, _, _ in found),
                     " / ".join(_fmt(a) for _, _, a, _ in found), " / ".join(_fmt(c) for *_, c in found),
                     " / ".join(_fmt(r, 2) for r in ratios)])
        return ratios

    def training_line(label: str, found: list[tuple]) -> list[float | None]:
        if not found:
            return []
        sizes = " / ".join(str(n) for n, *_ in found)
        ratios = [_ratio(cudnn, mine) for _, mine, cudnn in found]
        body.append([f"{label}, N={sizes}", "-", " / ".join(_fmt(m) for _, m, _ in found),
                     " / ".join(_fmt(c) for *_, c in found), " / ".join(_fmt(r, 2) for r in ratios)])
        return ratios

    causal64 = forward_line("causal fwd, B4 H12 D64 fp16", forward_rows(forward, "causal", 64, (4096, 8192, 16384)))
    dense64 = forward_line("dense fwd, B4 H12 D64 fp16", forward_rows(forward, "dense", 64))
    causal128 = forward_line("causal fwd, Llama heads D128 bf16", forward_rows(forward, "causal", 128))
    dense128 = forward_line("dense fwd, Llama heads D128 bf16", forward_rows(forward, "dense", 128))
    rope = forward_line("RoPE + causal fwd (+ pre-rotation for cuDNN), B4 H12 D64 fp16",
                        forward_rows(sweep, "rope+causal", 64))
    forward_line("RoPE + causal fwd, Llama heads D128 bf16", forward_rows(forward, "rope+causal", 128))
    training = training_line("fwd+bwd causal, Llama heads bf16", backward_rows(backward, "causal"))
    training += training_line("fwd+bwd RoPE + causal (+ pre-rotation), Llama heads bf16",
                              backward_rows(backward, "rope+causal"))
    whole = training_line("one Llama-3-8B layer, fwd+bwd", layer_rows(layer))
    criteria += [("causal and dense forward at N >= 4096 at least as fast as cuDNN",
                  causal64 + dense64 + causal128 + dense128),
                 ("RoPE + causal forward at least as fast as cuDNN + pre-rotation at every N from 1k to 16k", rope),
                 ("fwd+bwd (causal, RoPE + causal) at N=4096 and 8192 at least as fast as cuDNN", training),
                 ("the Llama-3-8B layer fwd+bwd at least as fast as with cuDNN", whole)]
    lines = benchlib.markdown_table(header, body)
    verdicts = []
    for what, ratios in criteria:
        known = [r for r in ratios if r is not None]
        if not known:
            verdicts.append([what, "not in these files"])
            continue
        worst = min(known)
        verdicts.append([what, f"{'meets' if worst >= 1.0 else 'misses'} (lowest ratio {worst:.2f})"])
    return lines + [""] + benchlib.markdown_table(["done criterion", "this run"], verdicts)


def _provenance(path: Path) -> str:
    """Where a result file comes from: its GPU, time and commit."""
    meta = json.loads(path.read_text()).get("metadata", {})
    return ", ".join(str(meta.get(key, "?")) for key in ("gpu", "timestamp_utc", "git_commit", "source_digest"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name in ("forward", "sweep", "backward", "layer"):
        parser.add_argument(f"--{name}", type=Path, help=f"the {name} result JSON")
    parser.add_argument("--out", type=Path, default=None, help="write <stamp>-issue17-table.md here")
    args = parser.parse_args(argv)
    sources = {name: getattr(args, name) for name in ("forward", "sweep", "backward", "layer")}
    lines = ["# Issue 17's table from these result files", "",
             *[f"- {name}: `{path.name}` ({_provenance(path)})" for name, path in sources.items() if path is not None],
             "", "Times in ms; ratios are cuDNN / AttnFuse's default (> 1: AttnFuse faster).", "",
             *table(*(_rows(path) for path in sources.values()))]
    print("\n".join(lines))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"{benchlib.stamp()}-issue17-table.md"
        path.write_text("\n".join(lines) + "\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

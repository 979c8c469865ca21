"""One Llama-3-8B decoder layer, timed with three attentions side by side: where a fused
attention meets the rest of a model (projections, norms, MLP, the optimizer).

    python bench/llama_layer.py --out DIR [--seq-lens 2048,4096,8192] [--compile both]
    python bench/llama_layer.py --quick --out DIR        # CPU, tiny layer, fp32: checks the script

The layer: hidden 4096, 32 query and 8 key/value heads of dimension 128, RMSNorm before the
attention and before the MLP (eps 1e-5, computed in float32 as Llama does), RoPE with theta
500000 on half-split pairs (x_t, x_{t+64}), a SwiGLU MLP of width 14336
(down(silu(gate(x)) * up(x))), residual adds; no biases; weights drawn by torch's default
initialisation, bf16, batch 1. The attention, switched by `--impls`:

- `sdpa-cudnn`: q and k rotated by a `torch.compile`d function (fp32 angles, cast back), then
  `F.scaled_dot_product_attention(is_causal=True, enable_gqa=True)` under
  `sdpa_kernel(SDPBackend.CUDNN_ATTENTION)`; if cuDNN refuses GQA, k and v are repeated to 32
  heads inside the step (the row says so). On the CPU: SDPA's default backend.
- `flex`: the same compiled rotation, then `torch.compile(flex_attention)` with a causal
  BlockMask built once per N, `enable_gqa=True`.
- `attnfuse`: `af.compile(af.attention(af.rope(theta=500000.0), af.causal()))` on the
  unrotated q and k, 8 key/value heads passed as they are.

Modes: `fwd` (the layer under `no_grad`), `fwdbwd` (the layer and `out.backward(g)`, the input
requiring grad as inside a stack of layers; gradients reset to None before each step),
`step` (fwdbwd, then `torch.optim.AdamW.step()`, fused on CUDA). With `--compile on` (or
`both`) the whole layer's forward runs under `torch.compile(fullgraph=True, dynamic=False)`,
the attention inside it uncompiled (for AttnFuse that needs its torch.library op); a case
that fails (to compile, say) is reported as `fails: <first line>` and the run goes on.

Correctness, once per attention and layer kind, at the first N in `--check-seq-lens`
(default 2048): the whole layer's update to the residual stream (out - x) and, in an eager
layer, the attention sublayer's output (`wo(attention(q, k, v))` from the normed input) and
its input gradient, against a float32 copy of the
layer with float64 RoPE tables and math attention; relative error over `--tol` is a FAIL
(still timed; the table says so). Timing: CUDA events around each step, `--warmup` untimed
steps, the median of `--reps` (interquartile spread kept in the JSON). Results (markdown,
JSON, PNG plots with matplotlib) are rewritten after every case, so a run cut short keeps what
it measured; `--time-budget` stops starting new cases after that many seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import gc
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import benchlib


@dataclasses.dataclass(frozen=True)
class LayerShape:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    eps: float = 1e-5
    theta: float = 500000.0


LLAMA3_8B = LayerShape(hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=14336)
QUICK = LayerShape(hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=128)

IMPLS = ("sdpa-cudnn", "flex", "attnfuse")

DETERMINISTIC = [True]
"""`af.compile(..., deterministic=)` of the attnfuse column (`--nondeterministic` allows the
fused backward: the Gluon one on the H200, runtime/gluon_backward.py)."""
MODES = {"fwd": "forward (no_grad)", "fwdbwd": "forward + backward", "step": "forward + backward + AdamW"}


# --------------------------------------------------------------------------
# The layer
# --------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """x / rms(x) * weight, the statistics in float32 (Llama's)."""

    def __init__(self, dim: int, eps: float, **factory: Any):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, **factory))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class LlamaLayer(nn.Module):
    """A pre-norm decoder layer; `self.attention(q, k, v)` ([B, H, N, D] each, q and k
    unrotated) is set from outside, so one set of weights serves every attention."""

    def __init__(self, shape: LayerShape, **factory: Any):
        super().__init__()
        self.shape = shape
        h, d = shape.hidden, shape.head_dim
        self.attn_norm = RMSNorm(h, shape.eps, **factory)
        self.wq = nn.Linear(h, shape.heads * d, bias=False, **factory)
        self.wk = nn.Linear(h, shape.kv_heads * d, bias=False, **factory)
        self.wv = nn.Linear(h, shape.kv_heads * d, bias=False, **factory)
        self.wo = nn.Linear(shape.heads * d, h, bias=False, **factory)
        self.mlp_norm = RMSNorm(h, shape.eps, **factory)
        self.gate = nn.Linear(h, shape.ffn, bias=False, **factory)
        self.up = nn.Linear(h, shape.ffn, bias=False, **factory)
        self.down = nn.Linear(shape.ffn, h, bias=False, **factory)
        self.attention: Callable = None

    def attention_block(self, xn: torch.Tensor) -> torch.Tensor:
        b, n, _ = xn.shape
        s = self.shape
        q = self.wq(xn).view(b, n, s.heads, s.head_dim).transpose(1, 2)
        k = self.wk(xn).view(b, n, s.kv_heads, s.head_dim).transpose(1, 2)
        v = self.wv(xn).view(b, n, s.kv_heads, s.head_dim).transpose(1, 2)
        o = self.attention(q, k, v)
        return self.wo(o.transpose(1, 2).reshape(b, n, s.heads * s.head_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention_block(self.attn_norm(x))
        y = self.mlp_norm(h)
        return h + self.down(F.silu(self.gate(y)) * self.up(y))


# --------------------------------------------------------------------------
# RoPE and the attentions
# --------------------------------------------------------------------------


def rope_tables(n: int, head_dim: int, theta: float, device: str, dtype: torch.dtype = torch.float32):
    """cos, sin of shape [n, head_dim / 2]: angle pos * theta^(-2t / head_dim)."""
    freq = theta ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float64) / head_dim)
    angle = torch.arange(n, device=device, dtype=torch.float64)[:, None] * freq[None, :]
    return torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)


def rotate_qk(q, k, cos, sin):
    """Half-split RoPE of q and k (pairs (x_t, x_{t+D/2})), in float32, cast back."""

    def rotate(x):
        half = x.shape[-1] // 2
        xf = x.float()
        x1, x2 = xf[..., :half], xf[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)

    return rotate(q), rotate(k)


_COMPILED: dict[str, Callable] = {}


def _compiled(name: str, fn: Callable) -> Callable:
    """One `torch.compile(fn, dynamic=False)` per name, shared by every case."""
    if name not in _COMPILED:
        _COMPILED[name] = torch.compile(fn, dynamic=False)
    return _COMPILED[name]


@dataclasses.dataclass
class Attention:
    """An attention for one N: `fn(q, k, v)`, and a note for the table."""

    fn: Callable
    note: str = ""
    #: entered around the check and the timing, not per call (SDPA's backend pin); inside a
    #: compiled layer it is active while the layer is traced, which is when SDPA's backend is
    #: chosen
    context: Callable = contextlib.nullcontext


def build_attention(impl: str, shape: LayerShape, n: int, device: str, whole_layer_compiled: bool,
                    repeat_kv: bool = False) -> Attention:
    """The attention `impl` at length `n`. Inside a compiled layer the rotation and flex are
    left to the layer's compile; in an eager layer they are compiled on their own."""
    if impl == "attnfuse":
        import attnfuse as af

        fn = _COMPILED.get("attnfuse") or af.compile(af.attention(af.rope(theta=shape.theta), af.causal()),
                                                     deterministic=DETERMINISTIC[0])
        _COMPILED["attnfuse"] = fn
        return Attention(fn)

    cos, sin = rope_tables(n, shape.head_dim, shape.theta, device)
    rotate = rotate_qk if whole_layer_compiled else _compiled("rotate", rotate_qk)
    if impl == "flex":
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        def causal(b, h, q_idx, kv_idx):
            return q_idx >= kv_idx

        block_mask = create_block_mask(causal, None, None, n, n, device=device)
        flex = flex_attention if whole_layer_compiled else _compiled("flex", flex_attention)

        def run_flex(q, k, v):
            q, k = rotate(q, k, cos, sin)
            return flex(q, k, v, block_mask=block_mask, enable_gqa=True)

        return Attention(run_flex)

    assert impl == "sdpa-cudnn", impl
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = [SDPBackend.CUDNN_ATTENTION] if device == "cuda" else None
    group = shape.heads // shape.kv_heads

    def run_sdpa(q, k, v):
        q, k = rotate(q, k, cos, sin)
        if repeat_kv:
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=not repeat_kv)

    note = "" if device == "cuda" else "SDPA's default backend (CPU)"
    if repeat_kv:
        note = "; ".join(filter(None, [note, "k, v repeated to Hq heads in the step (cuDNN refused enable_gqa)"]))
    context = contextlib.nullcontext if backends is None else (lambda: sdpa_kernel(backends))
    return Attention(run_sdpa, note, context)


def reference_attention(shape: LayerShape, n: int, device: str) -> Callable:
    """float32 math attention with float64 RoPE tables (the checks' reference)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    cos, sin = rope_tables(n, shape.head_dim, shape.theta, device, torch.float64)
    group = shape.heads // shape.kv_heads

    def attention(q, k, v):
        q, k = rotate_qk(q.double(), k.double(), cos, sin)
        q, k = q.float(), k.float()
        k, v = k.repeat_interleave(group, dim=1), v.float().repeat_interleave(group, dim=1)
        with sdpa_kernel([SDPBackend.MATH]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    return attention


# --------------------------------------------------------------------------
# Steps, checks, timing
# --------------------------------------------------------------------------


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual.float() - expected.float()).norm() / expected.float().norm()).item()


class Bench:
    """The layer, its optimizer, the inputs of one N, and the rows measured so far."""

    def __init__(self, args: argparse.Namespace, shape: LayerShape, device: str, dtype: torch.dtype):
        self.args, self.shape, self.device, self.dtype = args, shape, device, dtype
        torch.manual_seed(0)
        self.layer = LlamaLayer(shape, device=device, dtype=dtype)
        self.initial = copy.deepcopy(self.layer.state_dict())
        fused = {"fused": True} if device == "cuda" else {}
        self.optimizer = torch.optim.AdamW(self.layer.parameters(), lr=1e-5, **fused)
        self.rows: list[dict[str, Any]] = []
        self.checks: list[dict[str, Any]] = []
        self.repeat_kv = False

    def inputs(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator(device=self.device).manual_seed(n)
        x = torch.randn(1, n, self.shape.hidden, device=self.device, dtype=self.dtype, generator=gen)
        g = torch.randn(1, n, self.shape.hidden, device=self.device, dtype=self.dtype, generator=gen)
        return x.requires_grad_(True), g

    def layer_fn(self, compiled: bool) -> Callable:
        if not compiled:
            return self.layer
        return torch.compile(self.layer.forward, fullgraph=True, dynamic=False)

    def step(self, mode: str, fn: Callable, x: torch.Tensor, g: torch.Tensor) -> tuple[Callable, Callable]:
        """(before, step) of a mode: `before()` runs outside the timed region."""
        params = list(self.layer.parameters())

        def reset():
            x.grad = None
            for p in params:
                p.grad = None

        if mode == "fwd":

            def forward():
                with torch.no_grad():
                    return fn(x)

            return (lambda: None), forward
        if mode == "fwdbwd":
            return reset, lambda: fn(x).backward(g)

        def train_step():
            fn(x).backward(g)
            self.optimizer.step()

        return reset, train_step

    def check(self, impl: str, compiled: bool, attention: Attention, fn: Callable, n: int) -> dict[str, Any]:
        """Errors against the float32 layer, from the initial weights (the optimizer's steps
        have moved them); the weights stay restored for the timing that follows."""
        self.layer.load_state_dict(self.initial)
        ref_layer = LlamaLayer(self.shape, device=self.device, dtype=torch.float32)
        ref_layer.load_state_dict({key: value.float() for key, value in self.initial.items()})
        ref_layer.attention = reference_attention(self.shape, n, self.device)
        x, g = self.inputs(n)
        errors: dict[str, float] = {}
        with torch.no_grad():
            # The layer's update to the residual stream (out - x): x itself would hide errors.
            errors["layer_update"] = relative_error(fn(x) - x, ref_layer(x.float()) - x.float())
        note = attention.note
        if not compiled:
            # The sublayer alone: the residual stream would hide an attention error.
            xn = self.layer.attn_norm(x.detach()).detach().requires_grad_(True)
            xn_ref = xn.detach().float().requires_grad_(True)
            out = self.layer.attention_block(xn)
            ref = ref_layer.attention_block(xn_ref)
            errors["attn_out"] = relative_error(out, ref)
            try:
                out.backward(g)
                ref.backward(g.float())
                errors["attn_dx"] = relative_error(xn.grad, xn_ref.grad)
            except Exception as err:  # noqa: BLE001 - flex has no CPU backward, say
                note = "; ".join(filter(None, [note, f"gradient not checked: {benchlib.first_line(err)}"]))
        del ref_layer
        worst = max(errors.values())
        result = {"impl": impl, "compiled": compiled, "n": n, "errors": errors, "max": worst,
                  "ok": worst <= self.args.tol, "note": note}
        self.checks.append(result)
        return result


def probe_cudnn_gqa(bench: Bench) -> str | None:
    """Whether cuDNN SDPA takes enable_gqa at this head layout (None: yes; else the error)."""
    if bench.device != "cuda":
        return None
    s = bench.shape
    q = torch.randn(1, s.heads, 256, s.head_dim, device="cuda", dtype=bench.dtype, requires_grad=True)
    k, v = (torch.randn(1, s.kv_heads, 256, s.head_dim, device="cuda", dtype=bench.dtype, requires_grad=True)
            for _ in range(2))
    from torch.nn.attention import SDPBackend, sdpa_kernel

    try:
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).sum().backward()
        torch.cuda.synchronize()
    except Exception as err:  # noqa: BLE001
        return benchlib.first_line(err)
    return None


def run_case(bench: Bench, impl: str, compiled: bool, n: int, modes: list[str], checked: set) -> None:
    """All modes of one (attention, layer kind, N); every failure becomes a row."""
    base = {"impl": impl, "layer": "compiled" if compiled else "eager", "n": n}
    try:
        attention = build_attention(impl, bench.shape, n, bench.device, compiled, bench.repeat_kv)
        bench.layer.attention = attention.fn
        fn = bench.layer_fn(compiled)
    except Exception as err:  # noqa: BLE001
        bench.rows += [{**base, "mode": mode, "error": benchlib.first_line(err)} for mode in modes]
        return
    with attention.context():
        measure_case(bench, impl, compiled, n, modes, checked, base, attention, fn)
    bench.layer.attention = None
    del fn, attention
    gc.collect()
    if bench.device == "cuda":
        torch.cuda.empty_cache()


def measure_case(bench: Bench, impl: str, compiled: bool, n: int, modes: list[str], checked: set,
                 base: dict, attention: Attention, fn: Callable) -> None:
    """The check (first time only) and the timed modes of one case."""
    args = bench.args
    key = (impl, compiled)
    if key not in checked and n in args.check_seq_lens:
        checked.add(key)
        try:
            result = bench.check(impl, compiled, attention, fn, n)
            benchlib.log(f"  check {impl} {base['layer']} N={n}: "
                         + ", ".join(f"{k}={v:.1e}" for k, v in result["errors"].items())
                         + ("" if result["ok"] else "  FAIL"))
        except Exception as err:  # noqa: BLE001
            bench.checks.append({"impl": impl, "compiled": compiled, "n": n, "error": benchlib.first_line(err)})
            benchlib.log(f"  check {impl} {base['layer']} N={n} fails: {benchlib.first_line(err)}")
    x, g = bench.inputs(n)
    for mode in modes:
        row = {**base, "mode": mode, "error": None, "note": attention.note}
        try:
            before, step = bench.step(mode, fn, x, g)
            ms, spread = benchlib.median_ms(step, bench.device, args.warmup, args.reps, before)
            row.update(ms=ms, iqr_ms=spread)
            benchlib.log(f"  {impl} {base['layer']} {mode} N={n}: {ms:.3f} ms")
        except Exception as err:  # noqa: BLE001
            row["error"] = benchlib.first_line(err)
            benchlib.log(f"  {impl} {base['layer']} {mode} N={n} fails: {row['error']}")
            if bench.device == "cuda":
                torch.cuda.synchronize()
        bench.rows.append(row)


# --------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------


def tables(bench: Bench) -> list[str]:
    """Per layer kind: one line per (mode, N), the three attentions side by side."""
    lines = []
    impls = bench.args.impls
    by_key = {(r["layer"], r["mode"], r["n"], r["impl"]): r for r in bench.rows}
    for layer in ("eager", "compiled"):
        keys = sorted({(r["mode"], r["n"]) for r in bench.rows if r["layer"] == layer},
                      key=lambda key: (list(MODES).index(key[0]), key[1]))
        if not keys:
            continue
        header = ["mode", "N"] + [f"{impl} ms" for impl in impls]
        peers = [impl for impl in impls if impl != "attnfuse"]
        if "attnfuse" in impls:
            header += [f"{peer} / attnfuse" for peer in peers]
        cells = []
        for mode, n in keys:
            line = [mode, n]
            for impl in impls:
                row = by_key.get((layer, mode, n, impl))
                if row is None:
                    line.append("")
                elif row.get("error"):
                    line.append(f"fails: {row['error']}")
                else:
                    line.append(benchlib.fmt(row["ms"], ".3f"))
            mine = by_key.get((layer, mode, n, "attnfuse"), {}).get("ms")
            if "attnfuse" in impls:
                for peer in peers:
                    theirs = by_key.get((layer, mode, n, peer), {}).get("ms")
                    line.append(benchlib.fmt(theirs / mine if mine and theirs else None, ".2f", "x"))
            cells.append(line)
        title = "whole layer under torch.compile(fullgraph=True)" if layer == "compiled" else \
            "eager layer (rotation and flex compiled on their own)"
        lines += [f"## {title}: ms per step", ""] + benchlib.markdown_table(header, cells) + [""]
    if bench.checks:
        cells = []
        for c in bench.checks:
            if c.get("error"):
                cells.append([c["impl"], "compiled" if c["compiled"] else "eager", c["n"], f"fails: {c['error']}", ""])
            else:
                cells.append([c["impl"], "compiled" if c["compiled"] else "eager", c["n"],
                              ", ".join(f"{k} {v:.1e}" for k, v in c["errors"].items()),
                              ("ok" if c["ok"] else "FAIL") + (f" ({c['note']})" if c.get("note") else "")])
        lines += [f"## Correctness against the float32 layer (tolerance {bench.args.tol:g})", ""]
        lines += benchlib.markdown_table(["attention", "layer", "N", "relative errors", "status"], cells) + [""]
    notes = sorted({f"{r['impl']}: {r['note']}" for r in bench.rows if r.get("note")})
    if notes:
        lines += ["Notes:", ""] + [f"- {note}" for note in notes] + [""]
    return lines


def layer_name(shape: LayerShape) -> str:
    return "Llama-3-8B decoder layer" if shape == LLAMA3_8B else f"Small test layer (hidden {shape.hidden})"


def write(bench: Bench, meta: dict, stem: str, final: bool) -> None:
    args, s = bench.args, bench.shape
    shape = (f"hidden {s.hidden}, {s.heads}/{s.kv_heads} heads of {s.head_dim}, MLP {s.ffn}, "
             f"RMSNorm eps {s.eps:g}, RoPE theta {s.theta:g}, B=1, {args.dtype}")
    markdown = [f"# {layer_name(s)} with three attentions ({meta['gpu'] or 'CPU'})", ""]
    markdown += benchlib.metadata_lines(meta)
    markdown += [f"- layer: {shape}",
                 f"- timing: {'CUDA events per step' if bench.device == 'cuda' else 'CPU wall clock'}, "
                 f"{args.warmup} warmup steps, median of {args.reps}",
                 "- modes: " + "; ".join(f"{k} = {v}" for k, v in MODES.items())]
    if not final:
        markdown.append("- **partial: the run was still going (or was cut short) when this was written**")
    markdown.append("")
    markdown += tables(bench)
    config = {key: (str(value) if isinstance(value, Path) else value) for key, value in vars(args).items()}
    document = {"metadata": meta, "config": {**config, "shape": dataclasses.asdict(s)}, "rows": bench.rows,
                "checks": bench.checks, "final": final}
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / f"{stem}.json"
    json_path.write_text(json.dumps(benchlib.json_safe(document), indent=1) + "\n")
    (out / f"{stem}.md").write_text("\n".join(markdown) + "\n")
    if final:
        print("\n".join(tables(bench)))
        print(f"wrote {json_path}\nwrote {out / f'{stem}.md'}")
        plot(bench, out / stem, meta)


def plot(bench: Bench, stem: Path, meta: dict) -> None:
    """One PNG per (layer kind, mode): ms per step against N, and each peer over AttnFuse."""
    for layer in ("eager", "compiled"):
        for mode, label in MODES.items():
            times: dict[str, dict[float, float]] = {}
            for r in bench.rows:
                if r["layer"] == layer and r["mode"] == mode and r.get("ms"):
                    times.setdefault(r["impl"], {})[r["n"]] = r["ms"]
            if not times:
                continue
            title = f"{layer_name(bench.shape)}, {layer}, {label}, {bench.args.dtype}, on {meta['gpu'] or 'CPU'}"
            path = benchlib.plot_panels(stem.with_name(f"{stem.name}-{layer}-{mode}.png"), title,
                                        benchlib.time_and_ratio_panels(times, "attnfuse", "sequence length N",
                                                                       time_label="time per step (ms)"))
            if path is None:
                return  # no matplotlib: the note was printed once
            print(f"wrote {path}")


def _csv_ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-lens", type=_csv_ints, default=[2048, 4096, 8192])
    parser.add_argument("--compiled-seq-lens", type=_csv_ints,
                        help="lengths of the compiled-layer cases (default: --seq-lens)")
    parser.add_argument("--check-seq-lens", type=_csv_ints, default=[2048],
                        help="lengths at which each attention is checked, the first one met (default 2048)")
    parser.add_argument("--impls", type=lambda t: t.split(","), default=list(IMPLS))
    parser.add_argument("--modes", type=lambda t: t.split(","), default=list(MODES))
    parser.add_argument("--compile", choices=["off", "on", "both"], default="both",
                        help="eager layer only, compiled layer only, or both (default)")
    parser.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps before timing")
    parser.add_argument("--reps", type=int, default=30, help="timed steps; the median is reported")
    parser.add_argument("--tol", type=float, default=3e-2, help="relative error allowed in the checks")
    parser.add_argument("--time-budget", type=float, default=None,
                        help="seconds after which no new case starts (the results say what ran)")
    parser.add_argument("--out", type=Path, default=benchlib.ROOT / "bench" / "results")
    parser.add_argument("--nondeterministic", action="store_true",
                        help="compile the attnfuse column with deterministic=False (the fused backward)")
    parser.add_argument("--quick", action="store_true",
                        help="CPU, a tiny layer (hidden 64, 4/2 heads of 16, MLP 128), N=32, fp32, "
                        "eager only unless --compile is given, 1 warmup and 2 timed steps")
    args = parser.parse_args(argv)
    for name in args.impls:
        if name not in IMPLS:
            parser.error(f"unknown --impls entry {name!r}; choose from {', '.join(IMPLS)}")
    for name in args.modes:
        if name not in MODES:
            parser.error(f"unknown --modes entry {name!r}; choose from {', '.join(MODES)}")

    DETERMINISTIC[0] = not args.nondeterministic
    device = "cuda" if torch.cuda.is_available() and not args.quick else "cpu"
    shape = LLAMA3_8B
    if args.quick:
        shape = QUICK
        explicit = set(argv if argv is not None else sys.argv[1:])
        args.seq_lens = args.seq_lens if "--seq-lens" in explicit else [32]
        args.check_seq_lens = args.seq_lens[:1]
        args.compile = args.compile if "--compile" in explicit else "off"
        args.dtype = "fp32"
        args.warmup = args.warmup if "--warmup" in explicit else 1
        args.reps = args.reps if "--reps" in explicit else 2
    elif device == "cpu":
        print("llama_layer.py: no CUDA device; pass --quick to check the script on the CPU", file=sys.stderr)
        return 2
    if "attnfuse" in args.impls:
        import attnfuse  # noqa: F401 - picks Triton's interpreter (CPU) before torch.compile imports Triton
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    if args.compile != "off" or set(args.impls) - {"attnfuse"}:
        benchlib.bench_tool.configure_dynamo()  # one graph per (N, attention, grad mode): no eager fallback
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False

    bench = Bench(args, shape, device, dtype)
    if "sdpa-cudnn" in args.impls:
        refused = probe_cudnn_gqa(bench)
        if refused:
            benchlib.log(f"cuDNN SDPA refuses enable_gqa ({refused}); repeating k, v in its steps")
            bench.repeat_kv = True
    meta = benchlib.metadata(device)
    stem = f"{benchlib.stamp()}-llama-layer"
    cases = []
    if args.compile in ("off", "both"):
        cases += [(False, n, impl) for n in args.seq_lens for impl in args.impls]
    if args.compile in ("on", "both"):
        cases += [(True, n, impl) for n in (args.compiled_seq_lens or args.seq_lens) for impl in args.impls]
    # A check at a length nobody runs would never happen: check at the first length run.
    if not set(args.check_seq_lens) & {n for _, n, _ in cases}:
        args.check_seq_lens = [cases[0][1]] if cases else []
    started = time.perf_counter()
    checked: set = set()
    with benchlib.CaseProgress(len(cases)) as progress:
        for compiled, n, impl in cases:
            progress.step(f"{'compiled' if compiled else 'eager'} layer, {impl}, N={n}")
            if args.time_budget is not None and time.perf_counter() - started > args.time_budget:
                bench.rows += [{"impl": impl, "layer": "compiled" if compiled else "eager", "n": n, "mode": mode,
                                "error": f"skipped: time budget of {args.time_budget:g} s spent"}
                               for mode in args.modes]
                continue
            run_case(bench, impl, compiled, n, args.modes, checked)
            write(bench, meta, stem, final=False)
    write(bench, meta, stem, final=True)
    failed = [c for c in bench.checks if c.get("ok") is False]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

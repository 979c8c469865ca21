"""Would one backward kernel with dQ accumulated by atomics beat the deterministic two?

An experiment on the compiler's output: the emitted dK/dV kernel, edited so that each loop
step also forms its block's dQ part (dS^T K, a fifth product) and adds it into an fp32 dQ
buffer with `tl.atomic_add`. That is FlashAttention-2's and cuDNN's backward: 5 products per
block pair instead of the deterministic path's 7 (dQ kernel 3, dK/dV kernel 4), at the price
of a float sum whose order changes from run to run.

It times, for plain causal attention at the Llama-3-8B geometry (B=1, Hq=32, Hkv=8, D=128,
bf16, N=4096 unless --seq-lens):

- `deterministic`: the emitted dQ kernel that forms delta, then dK/dV (a training step's
  backward today);
- `atomic`: zeroing the fp32 dQ buffer, the preprocess (delta), the edited dK/dV kernel, and
  dQ's scale and cast (a torch elementwise op, standing in for a conversion kernel),
  per dK/dV tile configuration in --configs;
- `tma-reduce`: the same, with each step's whole dQ tile added by one TMA reduce-add
  through a tensor descriptor (`desc.atomic_add`, FlashAttention-3's mechanism) instead of
  one atomic per element;

and checks the edited kernel's dQ, dK and dV against the emitted kernels'. It also times the
RoPE + causal dK/dV kernel against the plain causal one (the in-kernel rotation of dK's
epilogue), emitted and with dV stored before dK is rotated (`--rope-only` times only that).

    python bench/dkdv_atomic_dq.py [--seq-lens 4096] [--configs 64,32,4,3;128,32,8,2]

`--cpu` runs a small ragged problem in Triton's interpreter: checks the edit, times nothing.
"""

from __future__ import annotations

import argparse
import re

import torch
import triton
from dkdv_emitted_variants import (  # bench/ is the script's directory
    in_dkdv,
    load_kernel,
)

import attnfuse as af

DKDV_DOT = re.compile(r"^(?P<indent> *)dk = tl\.dot\((?P<scores>grad_scores\w*)\b.*$")
DELTA_BASE = re.compile(r"^(?P<indent> *)delta_base = .*$", re.MULTILINE)


def with_atomic_dq(source: str, tma: bool = False) -> str:
    """The dK/dV kernel of `source` edited to also add each step's dS^T K into `dq_acc_ptr`
    (fp32, dO's strides) with atomics; dQ then still needs the score scale. `tma`: one bulk
    reduction of the whole tile per step through a tensor descriptor (on Hopper a TMA
    reduce-add, FlashAttention-3's way) instead of one atomic per element."""
    return in_dkdv(source, lambda body: _atomic_dq_body(body, tma))


def _atomic_dq_body(body: str, tma: bool) -> str:
    body = body.replace("    sm_scale, ", "    dq_acc_ptr, sm_scale, ", 1)
    descriptor = ("\n{indent}dq_desc = tl.make_tensor_descriptor(dq_acc_base, shape=[n_q, HEAD_DIM], "
                  "strides=[stride_do_n, 1], block_shape=[BLOCK_N, BLOCK_D])")
    body = DELTA_BASE.sub(lambda m: m[0] + f"\n{m['indent']}dq_acc_base = dq_acc_ptr + batch * stride_do_b"
                          " + head * stride_do_h" + (descriptor.format(indent=m["indent"]) if tma else ""), body)
    lines, out, masked = body.splitlines(), [], False
    for line in lines:
        out.append(line)
        if "queries = start_m" in line:
            masked = False
        if "query_in_bounds = " in line:
            masked = True
        match = DKDV_DOT.match(line)
        if match:
            ind, scores = match["indent"], match["scores"]
            mask = ", mask=query_in_bounds[:, None]" if masked else ""
            out.append(f"{ind}dq_part = tl.dot(tl.trans({scores}).to(k.dtype), k)")
            if tma:  # rows past n_q fall outside the descriptor's shape: TMA drops them
                out.append(f"{ind}dq_desc.atomic_add([start_m, 0], dq_part)")
            else:
                out.append(f"{ind}tl.atomic_add(dq_acc_base + queries[:, None] * stride_do_n + cols_d[None, :]"
                           f" * stride_do_d, dq_part{mask}, sem=\"relaxed\")")
    assert sum("atomic_add(" in x for x in out) == 3, "expected three query loops"
    return "\n".join(out)


def dv_stored_first(source: str) -> str:
    """The dK/dV kernel's dV store moved above dK's epilogue (scale, split and rotation)."""
    return in_dkdv(source, _dv_stored_first_body)


def _dv_stored_first_body(body: str) -> str:
    lines = body.splitlines()
    store = next(i for i, x in enumerate(lines) if x.lstrip().startswith("tl.store(dv_base"))
    comment = store - 1
    first = next(i for i, x in enumerate(lines) if "# tile.apply_scale" in x or "# tile.split" in x)
    moved = lines[comment:store + 1]
    return "\n".join(lines[:first] + moved + lines[first:comment] + lines[store + 1:])


def without_dk_rotation(source: str) -> str:
    """The dK/dV kernel's dK epilogue without the rotation's transpose: dK stored as the
    plain causal kernel stores it (a wrong gradient for RoPE; only timed, to see what the
    in-kernel rotation costs)."""
    return in_dkdv(source, _without_dk_rotation_body)


def _without_dk_rotation_body(body: str) -> str:
    lines = body.splitlines()
    first = next(i for i, x in enumerate(lines) if "# tile.split" in x)
    store_dv = next(i for i, x in enumerate(lines) if x.lstrip().startswith("tl.store(dv_base")) - 1
    indent = lines[first][: len(lines[first]) - len(lines[first].lstrip())]
    plain = (f"{indent}tl.store(dk_base + rows[:, None] * stride_dk_n + cols_d[None, :] * stride_dk_d, "
             "dk_1.to(dk_ptr.dtype.element_ty), mask=row_in_bounds[:, None])")
    return "\n".join(lines[:first] + [plain] + lines[store_dv:])


def setup(spec, config, n, hq, hkv, d, dtype, device):
    """(plan, tensors) of a training call, after its forward, with a random output gradient."""
    fn = af.compile(spec, config=config)
    torch.manual_seed(0)
    q = torch.randn(1, hq, n, d, device=device, dtype=dtype)
    k = torch.randn(1, hkv, n, d, device=device, dtype=dtype)
    v = torch.randn(1, hkv, n, d, device=device, dtype=dtype)
    plan = fn.plan(q, k, v, training=True)
    rotated: dict[str, torch.Tensor] = {}
    out, lse = fn.forward(plan, {}, q, k, v, rotated=rotated)
    grad_out = torch.randn_like(out)
    tensors = {"q": q, "k": k, "v": v, "o": out, "lse": lse, "do": grad_out, **rotated, **plan.constants,
               "dq": torch.empty_like(q), "dk": torch.empty_like(k), "dv": torch.empty_like(v),
               "delta": torch.empty(1, hq, n, device=device, dtype=torch.float32)}
    return fn, plan, tensors


def launch_of(plan, name):
    return next(x for x in plan.launches if x.info.name == name)


def run_edited(launch, kernel, tensors, extra=()):
    """Launches `kernel` (an edit of `launch`'s) with `launch`'s arguments, `extra` inserted
    before the scalars."""
    args, _spec = launch.arguments(tensors)
    flags = {"SHARED_OFFSETS": launch.shares_offsets(tensors)} if launch.info.shared_offsets else {}
    return kernel[launch.grid](*args, *extra, *launch.scalars, **flags,
                               num_warps=launch.info.num_warps, num_stages=launch.info.num_stages)


def bench(fn_, device):
    if device == "cpu":
        fn_()
        return float("nan")
    return triton.testing.do_bench(fn_, warmup=25, rep=200, return_mode="median")


def relative(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def time_deterministic(causal, n, shape, device) -> tuple[dict[str, torch.Tensor], float]:
    """The emitted backward (dQ forming delta, then dK/dV) at the default configuration:
    its gradients, as the reference of the edits, and the dK/dV kernel's time."""
    hq, hkv, d, dtype = shape
    _fn, plan, t = setup(causal, None, n, hq, hkv, d, dtype, device)
    dq_delta, dkdv = launch_of(plan, "attention_bwd_dq_delta"), launch_of(plan, "attention_bwd_dkdv")
    dq_delta(t)
    dkdv(t)
    reference = {r: t[r].clone() for r in ("dq", "dk", "dv", "delta")}
    ms_dq = bench(lambda: dq_delta(t), device)
    ms_kv = bench(lambda: dkdv(t), device)
    products = 2 * hq * n * n * d / 2  # one causal product's FLOPs
    print(f"N={n} deterministic: dq_delta {ms_dq:.4f} ms + dkdv {ms_kv:.4f} ms = {ms_dq + ms_kv:.4f} ms "
          f"({7 * products / (ms_dq + ms_kv) / 1e9:.0f} TF/s)", flush=True)
    return reference, ms_kv


def time_atomic(causal, n, shape, cfg, reference, device, tma: bool) -> None:
    """The dK/dV kernel with an atomic dQ at dK/dV configuration `cfg` (per element, or with
    `tma` per tile through a descriptor): the backward it makes (zeroing, preprocess,
    kernel, dQ's scale and cast) and the kernel alone."""
    hq, hkv, d, dtype = shape
    config = None if device == "cpu" else af.TileConfig(64, 64, 4, 3, 64, 64, 4, 2, *cfg)
    _fn, plan, t = setup(causal, config, n, hq, hkv, d, dtype, device)
    pre, kv = launch_of(plan, "attention_bwd_preprocess"), launch_of(plan, "attention_bwd_dkdv")
    kernel = load_kernel(with_atomic_dq(plan.compiled.source, tma), "attention_bwd_dkdv")
    dq_acc = torch.zeros(t["do"].shape, device=device, dtype=torch.float32)
    scale = d ** -0.5

    def step():
        dq_acc.zero_()
        pre(t)
        run_edited(kv, kernel, t, (dq_acc,))
        t["dq"].copy_(dq_acc * scale)

    step()
    errors = " ".join(f"{r} {relative(t[r], reference[r]):.1e}" for r in ("dq", "dk", "dv"))
    ms_step = bench(step, device)
    ms_kernel = bench(lambda: run_edited(kv, kernel, t, (dq_acc,)), device)
    compiled = run_edited(kv, kernel, t, (dq_acc,))
    regs = f"{compiled.n_regs}r/{compiled.n_spills}s" if hasattr(compiled, "n_regs") else ""
    products = 2 * hq * n * n * d / 2
    print(f"N={n} {'tma-reduce' if tma else 'atomic'} dkdv cfg={cfg}: step {ms_step:.4f} ms, fused kernel {ms_kernel:.4f} ms "
          f"({5 * products / ms_kernel / 1e9:.0f} TF/s) {regs}; vs emitted: {errors}", flush=True)


def time_rope_epilogue(n, shape, ms_causal, device) -> None:
    """The RoPE + causal dK/dV kernel: emitted, with dV stored before dK's rotation, and
    without the rotation (timing only), beside the plain causal kernel's `ms_causal`."""
    hq, hkv, d, dtype = shape
    rope_causal = af.attention(af.rope(theta=10000.0), af.causal())
    _fn, plan, t = setup(rope_causal, None, n, hq, hkv, d, dtype, device)
    launch_of(plan, "attention_bwd_dq_delta")(t)
    kv = launch_of(plan, "attention_bwd_dkdv")
    kv(t)
    emitted = (t["dk"].clone(), t["dv"].clone())
    kernel = load_kernel(dv_stored_first(plan.compiled.source), "attention_bwd_dkdv")
    run_edited(kv, kernel, t)
    err = max(relative(t["dk"], emitted[0]), relative(t["dv"], emitted[1]))
    unrotated = load_kernel(without_dk_rotation(plan.compiled.source), "attention_bwd_dkdv")
    run_edited(kv, unrotated, t)
    ms_emitted = bench(lambda: kv(t), device)
    ms_first = bench(lambda: run_edited(kv, kernel, t), device)
    ms_unrotated = bench(lambda: run_edited(kv, unrotated, t), device)
    same = load_kernel(plan.compiled.source, "attention_bwd_dkdv")
    regs = " ".join(f"{name} {c.n_regs}r/{c.n_spills}s" for name, c in
                    (("emitted", run_edited(kv, same, t)), ("dv-first", run_edited(kv, kernel, t)),
                     ("unrotated", run_edited(kv, unrotated, t))) if hasattr(c, "n_regs"))
    print(f"N={n} rope_causal dkdv: emitted {ms_emitted:.4f} ms, dv stored first {ms_first:.4f} ms "
          f"(diff {err:.0e}), dK not rotated back {ms_unrotated:.4f} ms; causal dkdv {ms_causal:.4f} ms; "
          f"{regs}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seq-lens", default="4096")
    parser.add_argument("--configs", default="64,32,4,3;64,64,4,2;128,32,8,2;128,64,8,2;64,32,4,2")
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--rope-only", action="store_true", help="time only the RoPE dK epilogue")
    args = parser.parse_args()
    device = "cpu" if args.cpu else "cuda"
    # On-device tensor descriptors (the tma-reduce variant) need scratch memory.
    triton.set_allocator(lambda size, _align, _stream: torch.empty(size, dtype=torch.int8, device=device))
    shape = (4, 2, 32, torch.float16) if args.cpu else (32, 8, 128, torch.bfloat16)
    seq_lens = [90] if args.cpu else [int(x) for x in args.seq_lens.split(",")]
    causal = af.attention(af.causal())
    for n in seq_lens:
        reference, ms_causal = time_deterministic(causal, n, shape, device)
        for text in [] if args.rope_only else args.configs.split(";"):
            cfg = tuple(int(x) for x in text.split(","))
            for tma in (False, True):
                try:
                    time_atomic(causal, n, shape, cfg, reference, device, tma)
                except Exception as err:  # noqa: BLE001 (a configuration that does not compile or fit)
                    print(f"N={n} {'tma-reduce' if tma else 'atomic'} dkdv cfg={cfg}: failed "
                          f"({type(err).__name__}: {str(err)[:120]})", flush=True)
        time_rope_epilogue(n, shape, ms_causal, device)


if __name__ == "__main__":
    main()

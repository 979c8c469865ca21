"""Where one step's GPU time goes: every kernel a forward (or forward + backward) step launches,
per implementation, from the PyTorch profiler.

Takes `attnfuse-bench`'s shape and case flags (`--preset`, `--seq-lens`, `--variants`,
`--impls`, `--mode`, ...). For each case and implementation it runs a few warm-up steps,
then profiles `--steps` steps and prints each kernel's device time per step (summed over its
launches in a step), its launches per step, and the total. The kernels' sum against the
step's wall time shows how much of a step is host time; the per-kernel lines show which
kernel a gap to another implementation sits in (the rotation kernels, say, against the
baselines' compiled pre-rotation).

    python bench/step_profile.py --preset llama3-8b --dtype bf16 --mode fwdbwd \\
        --variants rope_causal,causal --seq-lens 4096 --impls attnfuse,sdpa-cudnn

Without a GPU (`--allow-cpu`, Triton's interpreter) it lists CPU operators instead, which
only checks that the script runs.
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from attnfuse.tools import bench


def kernel_times(step, steps: int, device: str) -> tuple[dict[str, tuple[float, float]], float]:
    """({kernel: (ms per step, launches per step)}, wall ms per step) over `steps` profiled
    steps. On the CPU the "kernels" are the CPU operators (self time)."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    bench._synchronize(device)
    with profile(activities=activities) as prof:
        started = time.perf_counter()
        for _ in range(steps):
            step()
        bench._synchronize(device)
        wall_ms = (time.perf_counter() - started) * 1e3 / steps
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for event in prof.events():
        if device == "cuda":
            if event.device_type != torch.autograd.DeviceType.CUDA:
                continue
            duration_us = event.device_time_total  # a kernel event: its own duration
        else:
            duration_us = event.self_cpu_time_total
        totals[event.name][0] += duration_us / 1e3
        totals[event.name][1] += 1
    return {name: (ms / steps, count / steps) for name, (ms, count) in totals.items()}, wall_ms


def short(name: str, width: int = 90) -> str:
    """A kernel name cut to `width` characters (cuDNN's and Inductor's names are long)."""
    return name if len(name) <= width else name[: width - 3] + "..."


def main(argv: list[str] | None = None) -> int:
    parser = bench.build_parser()
    parser.description = __doc__
    parser.add_argument("--steps", type=int, default=20, help="profiled steps per case (default 20)")
    parser.add_argument("--top", type=int, default=15, help="kernels listed per case (default 15)")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not args.allow_cpu:
        print("no GPU: pass --allow-cpu to profile CPU operators in the interpreter", file=sys.stderr)
        return 2
    config = bench.resolve_config(args, device)
    print(f"# {torch.cuda.get_device_name() if device == 'cuda' else 'CPU'}, torch {torch.__version__}; "
          f"B={config.batch} Hq={config.heads} Hkv={config.kv_heads} D={config.head_dim} "
          f"{config.dtype} {config.mode}, {args.steps} profiled steps")
    for variant in config.variants:
        for n in config.seq_lens:
            case = bench.make_case(config, variant, n)
            for impl in config.impls:
                try:
                    prepared = bench.IMPLS[impl](case)[0]
                except bench.NotApplicable as err:
                    print(f"\n{variant} N={n} {impl}: not applicable ({err})")
                    continue
                with prepared.context():
                    timed = bench._step(prepared, case)

                    def step(timed=timed, leaves=prepared.inputs):
                        # As attnfuse-bench's timing does (do_bench's grad_to_none), and as an
                        # optimizer's zero_grad(set_to_none=True): no accumulation into .grad.
                        for leaf in leaves:
                            leaf.grad = None
                        timed()

                    for _ in range(3):  # compile, autotune, fill the caches
                        step()
                    times, wall_ms = kernel_times(step, args.steps, device)
                total = sum(ms for ms, _count in times.values())
                print(f"\n{variant} N={n} {impl}: kernels {total:.4f} ms per step, wall {wall_ms:.4f} ms per step")
                ranked = sorted(times.items(), key=lambda item: -item[1][0])
                for name, (ms, count) in ranked[: args.top]:
                    print(f"  {ms:8.4f} ms  {count:4.1f}x  {short(name)}")
                for tensor in prepared.inputs:
                    tensor.grad = None
            bench._release_memory(device)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Host time of the Gluon launches with and without the descriptor replay
(`gluon_launch.GluonRunner.replay`), at the Llama-3-8B heads (bf16, B=1, 32/8 heads of 128),
causal, `deterministic=False` (the Gluon fused backward), on the H200:

    python3 bench/gluon_launch_host.py [--n 8192] [--rounds 6]

Per round, interleaved: the backward's Gluon launch alone with the same tensors (as a training
loop hands them back), and a whole training step (`fn(q, k, v).backward(g)`), each with replay
on and off (off: `replay` always misses, so every call builds, checks and encodes its
descriptors, as before replay existed). Host µs per call: the median of 50 calls, each timed
from the call to its return with the GPU idle before it. Also how many calls replayed.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import attnfuse as af
from attnfuse.runtime.gluon_backward import GluonBackwardLaunch


def host_us(call, calls: int = 50) -> float:
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    n = args.n
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, g = (torch.randn(1, h, n, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
                  for h in (32, 8, 8, 32))
    for t in (q, k, v):
        t.requires_grad_()
    fn = af.compile(af.attention(af.causal()), deterministic=False)
    fn(q, k, v).backward(g)
    plan = fn.plan(q, k, v, training=True)
    launch = next((x for x in plan.launches if isinstance(x, GluonBackwardLaunch)), None)
    if launch is None:
        print("no Gluon backward launch in this plan (not an sm_90 GPU, or auto declined)")
        return
    with torch.no_grad():
        o, lse = fn(q, k, v, return_lse=True)
    tensors = {"q": q.detach(), "k": k.detach(), "v": v.detach(), "do": g, "lse": lse.contiguous(),
               "delta": (o.float() * g.float()).sum(-1).contiguous(), "dk": torch.empty_like(k),
               "dv": torch.empty_like(v), "dq_acc": torch.zeros(q.shape, device="cuda", dtype=torch.float32)}
    runner = launch.runner
    replay = runner.replay
    outcomes: list[bool] = []

    def counted(key, rest):
        outcomes.append(replay(key, rest))
        return outcomes[-1]

    def never(key, rest):
        return False

    def step():
        for t in (q, k, v):
            t.grad = None
        fn(q, k, v).backward(g)

    results: dict[str, list[float]] = {}
    for r in range(args.rounds):
        for mode, replayer in (("on", counted), ("off", never)) if r % 2 == 0 else (("off", never), ("on", counted)):
            runner.replay = replayer
            results.setdefault(f"launch, replay {mode}", []).append(host_us(lambda: launch(tensors)))
            results.setdefault(f"training step, replay {mode}", []).append(host_us(step))
    runner.replay = replay
    print(f"causal N={n}, B=1 H=32/8 D=128 bf16; {args.rounds} rounds interleaved, host us per call (median of 50)")
    for label, values in results.items():
        print(f"  {label}: median {statistics.median(values):.1f} us, rounds {', '.join(f'{x:.0f}' for x in values)}")
    print(f"  replayed {sum(outcomes)} of {len(outcomes)} calls with replay on; kept sets {len(runner.described)}")


if __name__ == "__main__":
    main()

"""Which training calls' backward ran the Gluon kernel and which fell back to the portable one
(and for which tensor): the RoPE + causal and causal calls at the Llama-3-8B heads, bf16, with
deterministic=False. H200 only.

    python3 bench/gluon_backward_fallbacks.py
"""

from __future__ import annotations

import torch

import attnfuse as af
from attnfuse.runtime.gluon_backward import GluonBackwardLaunch


def main() -> None:
    for name, spec in (("causal", af.attention(af.causal())), ("rope+causal", af.attention(af.rope(), af.causal()))):
        for n in (2048, 4096, 8192):
            fn = af.compile(spec, deterministic=False)
            q = torch.randn(1, 32, n, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            k = torch.randn(1, 8, n, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            v = torch.randn(1, 8, n, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            fn(q, k, v).sum().backward()
            plan = fn.plan(q, k, v, training=True)
            seen = [dict(launch.fallbacks) for launch in plan.launches if isinstance(launch, GluonBackwardLaunch)]
            shapes = {role: (tuple(t.shape), t.stride(), t.data_ptr() % 16)
                      for role, t in plan.constants.items()} if hasattr(plan, "constants") else {}
            print(f"{name} N={n}: Gluon backward launches {len(seen)}, fallbacks {seen}; constants {shapes}", flush=True)


if __name__ == "__main__":
    main()

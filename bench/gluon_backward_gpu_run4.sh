#!/usr/bin/env bash
# Repeat of the backward targets at causal and RoPE + causal (the run-to-run spread of the
# Gluon fused backward at N=4096), twice in one call.
set -u
mkdir -p /tmp/x
for i in 1 2; do
  timeout 140 python3 bench/backward_targets.py --cases causal,rope+causal --out /tmp/x --reps 30 > /tmp/x/backward_targets-$i.log 2>&1
  echo "round $i rc=$?"
done
tar czf "$OUT/x.tgz" -C /tmp x

#!/usr/bin/env bash
# The closing H200 call for the Gluon fused backward: the fallback probe, the backward targets
# beside cuDNN, the Llama-3-8B layer (deterministic=False), and a few GPU tests of the copy path.
set -u
mkdir -p /tmp/x
timeout 100 python3 bench/gluon_backward_fallbacks.py > /tmp/x/fallbacks.log 2>&1; grep -v Warn /tmp/x/fallbacks.log | tail -6
timeout 230 python3 bench/backward_targets.py --out /tmp/x --reps 20 > /tmp/x/backward_targets.log 2>&1
echo "backward_targets rc=$?"
timeout 130 python3 bench/llama_layer.py --seq-lens 4096,8192 --compile off --modes fwd,fwdbwd --nondeterministic \
  --out /tmp/x > /tmp/x/llama_layer.log 2>&1
echo "llama rc=$?"
timeout 100 python3 -m pytest -q -p no:cacheprovider test/python/test_gpu_gluon_backward.py -k "equals_split or model_layout or expanded or lse" \
  > /tmp/x/gpu_tests-gluon-backward-subset.log 2>&1; echo "tests rc=$?"; tail -2 /tmp/x/gpu_tests-gluon-backward-subset.log
tar czf "$OUT/x.tgz" -C /tmp x

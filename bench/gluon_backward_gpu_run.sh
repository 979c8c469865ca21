#!/usr/bin/env bash
# The H200 call for the Gluon fused backward (issue 17): its GPU tests, then the backward
# targets beside cuDNN, then the Llama-3-8B layer with deterministic=False. Logs and results
# under /tmp/x, packed into $OUT/x.tgz (the run tool brings back few files).
set -u
mkdir -p /tmp/x
timeout 260 python3 -m pytest -q -p no:cacheprovider --maxfail=8 test/python/test_gpu_gluon_backward.py \
  > /tmp/x/gpu_tests-gluon-backward.log 2>&1
echo "tests rc=$?" >> /tmp/x/gpu_tests-gluon-backward.log
tail -5 /tmp/x/gpu_tests-gluon-backward.log
timeout 200 python3 bench/backward_targets.py --out /tmp/x --reps 20 > /tmp/x/backward_targets.log 2>&1
echo "backward_targets rc=$?"; tail -3 /tmp/x/backward_targets.log
timeout 120 python3 bench/llama_layer.py --seq-lens 4096,8192 --compile off --modes fwdbwd --nondeterministic \
  --out /tmp/x > /tmp/x/llama_layer.log 2>&1
echo "llama rc=$?"; tail -3 /tmp/x/llama_layer.log
tar czf "$OUT/x.tgz" -C /tmp x

#!/usr/bin/env bash
# After the direct Gluon launches: the Gluon GPU tests (backward all, forward a subset), then
# the A/B timings with host times, then the backward targets once more.
set -u
mkdir -p /tmp/y
timeout 250 python3 -m pytest -q -p no:cacheprovider --maxfail=5 test/python/test_gpu_gluon_backward.py \
  > /tmp/y/gpu_tests-gluon-backward.log 2>&1; echo "bwd tests rc=$?"; tail -2 /tmp/y/gpu_tests-gluon-backward.log
timeout 120 python3 -m pytest -q -p no:cacheprovider --maxfail=5 test/python/test_gpu_gluon.py \
  -k "equals_portable or training_call or model_layout or unaligned or refused or rope or persistent_matches and causal" \
  > /tmp/y/gpu_tests-gluon-forward-subset.log 2>&1; echo "fwd tests rc=$?"; tail -2 /tmp/y/gpu_tests-gluon-forward-subset.log
timeout 100 python3 bench/gluon_backward_ab.py --cases causal --rounds 2 > /tmp/y/ab.log 2>&1; grep -v Warn /tmp/y/ab.log | tail -14
timeout 150 python3 bench/backward_targets.py --cases causal,rope+causal --out /tmp/y --reps 30 > /tmp/y/backward_targets.log 2>&1; echo "bt rc=$?"
tar czf "$OUT/y.tgz" -C /tmp y

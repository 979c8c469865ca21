#!/usr/bin/env bash
# One H200 call for the Gluon forward's schedules (three consumers at head dim 64, the
# persistent grid), in priority order, each step under `timeout` (results and logs under $OUT):
#   1. the new Gluon GPU tests: 2 and 3 consumers at both head dims, the persistent grid, the
#      head-dim table (test/python/test_gpu_gluon.py -k ...)
#   2. bench/gluon_forward.py: Gluon (table), Gluon 2c / 3c, Gluon persistent, tl, auto, cuDNN
#   3. the rest of test/python/test_gpu_gluon.py (the default schedule's cases)
set -u
OUT="${OUT:-bench/results/run}"
mkdir -p "$OUT"
export ATTNFUSE_CACHE_DIR="${ATTNFUSE_CACHE_DIR:-/tmp/afc}" PYTHONUNBUFFERED=1
NEW="consumer_counts or persistent or three_consumers"
timeout 420 python3 -m pytest test/python/test_gpu_gluon.py -q -x -p no:cacheprovider -k "$NEW" > "$OUT/gluon_schedule_tests.log" 2>&1
tail -3 "$OUT/gluon_schedule_tests.log"
(cd bench && timeout 240 python3 gluon_forward.py --out "$OUT" --reps 50 > "$OUT/gluon_forward.log" 2>&1)
tail -13 "$OUT"/*-gluon-forward.md
timeout 200 python3 -m pytest test/python/test_gpu_gluon.py -q -p no:cacheprovider -k "not ($NEW)" > "$OUT/gluon_tests.log" 2>&1
tail -3 "$OUT/gluon_tests.log"

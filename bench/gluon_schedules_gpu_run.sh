#!/usr/bin/env bash
# Two H200 calls (each under the 10-minute limit of one command) for the Gluon forward's
# schedules (three consumers at head dim 64, the persistent grid); each step under `timeout`,
# results and logs under $OUT:
#   bash bench/gluon_schedules_gpu_run.sh tests   the new Gluon GPU tests: 2 and 3 consumers at
#                                                 both head dims, the persistent grid, the
#                                                 head-dim table (32 Gluon kernels to compile)
#   bash bench/gluon_schedules_gpu_run.sh bench   bench/gluon_forward.py (Gluon by the table,
#                                                 2c, 3c, persistent, tl, auto, cuDNN), then the
#                                                 other Gluon GPU tests
set -u
OUT="${OUT:-bench/results/run}"
mkdir -p "$OUT"
export ATTNFUSE_CACHE_DIR="${ATTNFUSE_CACHE_DIR:-/tmp/afc}" PYTHONUNBUFFERED=1
NEW="consumer_counts or persistent or three_consumers"
case "${1:-}" in
  tests)
    timeout 540 python3 -m pytest test/python/test_gpu_gluon.py -q -p no:cacheprovider -k "$NEW" \
      > "$OUT/gluon_schedule_tests.log" 2>&1
    tail -15 "$OUT/gluon_schedule_tests.log" ;;
  bench)
    (cd bench && timeout 300 python3 gluon_forward.py --out "$OUT" --reps 50 > "$OUT/gluon_forward.log" 2>&1)
    tail -13 "$OUT"/*-gluon-forward.md
    timeout 240 python3 -m pytest test/python/test_gpu_gluon.py -q -p no:cacheprovider -k "not ($NEW)" \
      > "$OUT/gluon_tests.log" 2>&1
    tail -5 "$OUT/gluon_tests.log" ;;
  *) echo "usage: OUT=DIR bash bench/gluon_schedules_gpu_run.sh tests|bench" >&2; exit 2 ;;
esac

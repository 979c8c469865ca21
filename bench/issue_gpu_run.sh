#!/usr/bin/env bash
# One H200 call for this session's changes, in priority order, each step under `timeout`
# (results and logs under $OUT):
#   1. test/python/test_gpu_gluon.py            the Gluon forward against the reference
#   2. bench/gluon_forward.py                   Gluon / tl / auto / cuDNN at issue 17's sizes
#   3. bench/decode.py --rows 1,2,3,4,5,6       decode beside SDPA and flex (issue 16's table)
#   4. test/python/test_gpu_decode.py           the decode kernels (page lookahead, merge loop)
#   5. bench/decode_tune.py --paged 16,64       the paged / merge sweep, as far as time allows
set -u
OUT="${OUT:-bench/results/run}"
mkdir -p "$OUT"
export ATTNFUSE_CACHE_DIR="${ATTNFUSE_CACHE_DIR:-/tmp/afc}" PYTHONUNBUFFERED=1
timeout 150 python3 -m pytest test/python/test_gpu_gluon.py -q -p no:cacheprovider > "$OUT/gluon_tests.log" 2>&1
tail -3 "$OUT/gluon_tests.log"
(cd bench && timeout 100 python3 gluon_forward.py --out "$OUT" --reps 50 > "$OUT/gluon_forward.log" 2>&1)
tail -11 "$OUT"/*-gluon-forward.md
(cd bench && timeout 130 python3 decode.py --rows 1,2,3,4,5,6 --time-budget 100 --out "$OUT" > "$OUT/decode.log" 2>&1)
grep "|" "$OUT"/*-decode.md | head -40
timeout 80 python3 -m pytest test/python/test_gpu_decode.py -q -x -p no:cacheprovider > "$OUT/decode_tests.log" 2>&1
tail -3 "$OUT/decode_tests.log"
(cd bench && timeout 85 python3 decode_tune.py --paged 16,64 --time-budget 60 --out "$OUT/decode_tune-paged.md" > "$OUT/decode_tune.log" 2>&1)
tail -30 "$OUT/decode_tune-paged.md"

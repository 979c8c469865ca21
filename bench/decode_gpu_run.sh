#!/usr/bin/env bash
# One H200 call for the split merge (issue 16), each step under `timeout` (results under $OUT):
#   1. bench/decode_profile.py                  the decode's kernels, merge forms side by side
#   2. bench/decode.py --rows 1,...,8           issue 16's table, paged, ragged, RoPE, Nq 4/16
#   3. test/python/test_gpu_decode.py           the decode kernels against the reference
set -u
OUT="${OUT:-bench/results/run}"
mkdir -p "$OUT"
export ATTNFUSE_CACHE_DIR="${ATTNFUSE_CACHE_DIR:-/tmp/afc}" PYTHONUNBUFFERED=1
(cd bench && timeout 150 python3 decode_profile.py --variants kernel,kernel-stages1,last-split --no-stream --out "$OUT" > "$OUT/profile.log" 2>&1)
grep "|" "$OUT"/*-decode_profile.md | cut -c1-200
(cd bench && timeout 260 python3 decode.py --rows 1,2,3,4,5,6,7,8 --time-budget 200 --out "$OUT" > "$OUT/decode.log" 2>&1)
grep "|" "$OUT"/*-decode.md | cut -d'|' -f2-9 | head -80
timeout 120 python3 -m pytest test/python/test_gpu_decode.py -q -x -p no:cacheprovider > "$OUT/decode_tests.log" 2>&1
tail -3 "$OUT/decode_tests.log"

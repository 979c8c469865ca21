#!/usr/bin/env bash
# One H200 call (10 minutes) for issue 16's small pages: paged decode with the keys' page rows
# hoisted out of the key loop (TileConfig.hoist_page_rows 1, the default) against the earlier
# per-step form (ATTNFUSE_HOIST_PAGE_ROWS=0), each step under `timeout`, results under $OUT:
#   1. test/python/test_gpu_decode.py                     the decode kernels against the reference
#   2. bench/decode.py --rows 5,6 --paged-forms hoisted,unhoisted
#        rows 1-4 paged (pages of 16 and 64) and the ragged batch (pages of 64): attnfuse-paged<P>
#        (hoisted) beside attnfuse-paged<P>-unhoisted and the contiguous cache, one process
#   3. bench/decode_tune.py --paged 16,64 --small-steps   hoisted or not at 64/3 and 128/3, then
#        16- and 32-key steps (what is left of the budget)
set -u
OUT="${OUT:-bench/results/run}"
mkdir -p "$OUT"
export ATTNFUSE_CACHE_DIR="${ATTNFUSE_CACHE_DIR:-/tmp/afc}" PYTHONUNBUFFERED=1
unset ATTNFUSE_HOIST_PAGE_ROWS
timeout 130 python3 -m pytest test/python/test_gpu_decode.py -q -x -p no:cacheprovider > "$OUT/decode_tests.log" 2>&1
tail -3 "$OUT/decode_tests.log"
(cd bench && timeout 300 python3 decode.py --rows 5,6 --paged-forms hoisted,unhoisted --time-budget 230 \
    --out "$OUT" > "$OUT/decode.log" 2>&1)
grep "|" "$OUT"/*-decode.md | grep -v "flex\|sdpa" | cut -d'|' -f2-10 | head -60
(cd bench && timeout 130 python3 decode_tune.py --paged 16,64 --small-steps --time-budget 90 \
    --out "$OUT/decode_tune-small-steps.md" > "$OUT/decode_tune.log" 2>&1)
grep "|" "$OUT/decode_tune-small-steps.md" | cut -c1-400

set -u
mkdir -p /tmp/x
timeout 150 python3 bench/gluon_backward_fallbacks.py > /tmp/x/fallbacks.log 2>&1; echo "fallbacks rc=$?"; cat /tmp/x/fallbacks.log | grep -v Warning | tail -8
timeout 120 python3 -m pytest -q -p no:cacheprovider test/python/test_gpu_decode.py -k programmatic_dependent > /tmp/x/gpu_tests-decode-pdl.log 2>&1; echo "pdl tests rc=$?"; tail -3 /tmp/x/gpu_tests-decode-pdl.log
timeout 280 python3 bench/decode.py --rows 1,2,3,4,5 --pdl-forms on,off --time-budget 200 --out /tmp/x > /tmp/x/decode.log 2>&1; echo "decode rc=$?"; tail -4 /tmp/x/decode.log
tar czf "$OUT/x.tgz" -C /tmp x

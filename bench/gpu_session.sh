#!/usr/bin/env bash
# One H200 call that runs the named stages in order and packs their logs and results into
# $OUT/session.tgz (the device returns few files), rewritten after every stage. Usage, from the repository root on the device:
#   bash bench/gpu_session.sh gluon-tests backward-targets layer host
# Stages:
#   all-tests         the four test_gpu*.py files with pytest-xdist (TESTS_WORKERS, TESTS_LIMIT): about
#                     700 s on 16 workers, so one call runs a part: tests-portable (test_gpu.py and
#                     test_gpu_decode.py), tests-gluon-forward, tests-gluon-backward
#   gluon-tests       test_gpu_gluon_backward.py (all) and a test_gpu_gluon.py forward subset
#   gpu-tests         test_gpu.py and test_gpu_decode.py (all)
#   backward-targets  bench/backward_targets.py, causal and RoPE + causal, 30 reps: the default
#                     (deterministic), separate and nondet_auto columns
#   backward-ab       bench/backward_targets.py's nondet_auto column on this tree and, if the
#                     untracked folder ab_before/ holds an older attnfuse package, on that one too
#   ordered-ab        bench/backward_targets.py's default (deterministic) column, causal and RoPE +
#                     causal, on this tree and, if the untracked folder ab_before/ holds an older
#                     attnfuse package, on that one too
#   layer-det         bench/llama_layer.py fwdbwd at 4096 and 8192, eager, deterministic (the default)
#   backward-targets-d64  the same at the paper shape (B=4, 12 heads of 64, fp16)
#   ab                bench/gluon_backward_ab.py, causal, 2 rounds (kernel times and host times)
#   launch-host       bench/gluon_launch_host.py: Gluon launch host time, descriptor replay on and off
#   ordered-tests     test_gpu_gluon_backward.py's tests of the ordered (deterministic) backward
#   gluon-tests-short the backward's launch and layout tests and the forward subset
#   gluon-forward-tests  test_gpu_gluon.py without the consumer-count and persistent permutations
#   forward-ab        bench/gluon_forward.py's Gluon column on this tree and, if the untracked
#                     folder ab_before/ holds an older attnfuse package, on that one too
#   layer-default     bench/llama_layer.py fwd and fwdbwd at 4096 and 8192, eager, the default (deterministic)
#   decode-splits     bench/decode_splits.py: the split decode with its split count forced, beside split_plan's and SDPA
#                     flash, at 16k, 32k and B=8 x 8k (one-call graphs, clean flush, interleaved)
#   decode-long       bench/decode.py rows 2-3 (the long single-sequence caches)
#   layer             bench/llama_layer.py fwd and fwdbwd at 4096 and 8192, eager, deterministic=False
#   host              bench/host_overhead.py at N=128 and 512
#   forward           bench/gluon_forward.py at head dim 128
#   forward-table     bench/gluon_forward.py's issue cases (auto and tl columns) and its RoPE sweep (auto)
#   forward-256       bench/gluon_forward.py at head dim 256 (Gluon, tl and auto columns)
#   gluon-256-tests   test_gpu_gluon.py's head-dim-256 tests and the persistent-by-tile-class test
#   backward-d64-ordered  backward_targets.py at the paper shape: default, separate, nondet_auto, ordered_gluon
#   decode            bench/decode.py rows 1-5
#   decode-ab         bench/decode.py rows 1-5 on this tree and, if the untracked folder ab_before/ holds an
#                     older attnfuse package, rows 1-3 on that one too
#   persistent-ab     bench/gluon_persistent_ab.py: the Gluon forward's persistent grid against a program per
#                     tile, interleaved rounds, dense and causal at both head dims
#   decode-profile    bench/decode_profile.py rows 1-4: the default decode beside 128-key blocks from 16k keys
#   decode-profile-ab the decode-profile stage on this tree and, if the untracked folder ab_before/ holds an
#                     older attnfuse package, on that one too
#   decode-lens-probe bench/decode_tma_probe.py --sweep lens at the 16k and 32k caches: the kv_lens read's cost
#   decode-tma-probe  bench/decode_tma_probe.py at the 16k and 32k caches: pointer against TMA loads
#   variants-tests    test_gpu_gluon.py's bias, pointwise-with-bias and auto-by-class tests
#   issue17-backward  bench/backward_targets.py's default column (deterministic), causal and RoPE + causal,
#                     Llama heads, 4096 and 8192: issue 17's fwd+bwd rows
#   pointwise-tests   test_gpu_gluon_backward.py's pointwise-normalizer (ReLU, sigmoid) and soft-capping tests
#   pointwise-backward  bench/backward_targets.py's relu, relu+causal and sigmoid+causal rows (no cuDNN peer), default,
#                     separate, nondet_auto and ordered_gluon columns, Llama heads then the paper shape
#   sparse-tests      test_gpu_gluon.py's block-sparse tests (the Gluon forward on block lists)
#   sparse-targets    bench/block_sparse.py on the Gluon and the portable target, densities 0.1-1.0, the paper
#                     shape (D=64) and the Llama heads at N=8192 (D=128)
#   sparse-issue15    bench/block_sparse.py as a user calls it (auto), densities 0.05-1.0, beside flex: issue 15's row
#   sparse-gluon-tiles bench/block_sparse_tiles.py with the Gluon listed forward's tiles swept (64/128/192 rows,
#                     64/128 keys) at densities 0.05-0.25, beside auto, flex and two tl configurations
#   issue17           issue 17's whole table in one call: bench/gluon_forward.py's issue cases (auto, tl, the plain grid of 2 and 3 consumers) and
#                     RoPE sweep (auto), backward_targets.py's default column, llama_layer.py fwd+bwd, then
#                     bench/issue17_table.py over their JSON files
#   step-profile      bench/step_profile.py, fwd+bwd causal at the Llama heads, N=4096 and 8192: every kernel's
#                     time per step, AttnFuse (default) beside cuDNN
#   sparse-order      bench/block_sparse_tiles.py at densities 0.05 and 0.1 on each layout as drawn and with its rows
#                     sorted heaviest / lightest first (the same work, another program order), tl tiles of 64 rows
#   verify46          verify45's tests and the Gluon backward over block lists (documents, block sparsity)
#   verify48          stop 47's changes: the Gluon backward with an additive bias and index tiles (tests), then bias rows
#                     (a padding mask; a learned bias per head and key) beside the split
#   verify48-tl       stop 47's base-2 row max in the portable target: test_gpu.py and test_gpu_decode.py, then
#                     gluon_forward.py's tl column and decode.py rows 1-3, each beside ab_before/ if present
#   verify47          stop 46's changes: the Gluon backward under interleaved RoPE (its tests), the launch-graph
#                     tests (a RoPE call's pre-rotation kernels now replay in the graph), and the host cost of
#                     RoPE + causal calls (bench/host_overhead.py --rope) beside plain causal ones
#   listed-backward   the Gluon backward's block-list tests, then bench/document.py fwd+bwd with the split
#                     backward and with the Gluon one, deterministic and not
#   verify43          what stop 43 left unrun on a GPU: launch-graph, head-major, block-sparse, document and graph
#                     tests; bench/block_sparse.py as a user calls it (auto); bench/host_overhead.py
#   sparse-head-major the GPU tests of block-sparse and document calls (both targets), then bench/block_sparse.py
#                     as a user calls it (auto) and with its sparse calls on the portable target (--sparse-target
#                     triton: the head-major tl kernel; the dense call stays auto)
#   sparse-grid-probe bench/block_sparse_grid_probe.py: the portable block-sparse forward on the runtime's grid and on
#                     the transposed one (query blocks fastest), densities 0.05-0.5
#   host-profile      bench/host_overhead.py at N=128 and 512 with --profile and --launches
#   document-tests    test_gpu_gluon.py's document tests (the Gluon forward on document lists) and test_gpu.py's
#                     (the portable kernels, forward and backward)
#   document          bench/document.py: packed sequences, causal and bidirectional, fwd and fwd+bwd, AttnFuse
#                     (auto, Gluon, tl) beside compiled flex_attention; GEOMETRY=llama|paper (default both)
#   index-tiles       test_gpu_gluon.py's index-tile tests (position-aware blocks and element-wise filters on the
#                     Gluon forward), test_gpu_decode.py's chunked decode past 2^21, and test_gpu_gluon_backward.py's
#                     descriptor-replay test (failed on the H100 in
#                     session 40; its message names what moved between steps)
#   softcap-backward  bench/backward_targets.py's softcap+causal rows (no cuDNN peer), default, separate and
#                     nondet_auto: the Gluon backward auto gives soft-capping at D=128 spills 204-324 bytes in its
#                     step loops on Triton 3.6 (bench/results/20261205T1230Z-gluon-sm90-spill-sweep.md), untimed
#   verify44          the launch-graph GPU tests (test_gpu.py, test_gpu_decode.py)
#   gluon-sizes       the sweep behind auto's Gluon sizes at head dim 128 (forward with each target forced,
#                     backward split against the ordered Gluon kernel), below 4096 and at the paper shape
#   verify45          stop 44's review fixes on a GPU: odd-Nq and call-time-position Gluon backward
#                     tests, launch-graph tests, the training step at N = 3072 / 4093 / 4096
#   tune              attnfuse-tune on the GPU: RoPE + causal at the Llama heads (bf16, N=4096), forward and
#                     backward over a small grid, its tuning file, and a call that reads the file
set -u
dir=/tmp/session
mkdir -p "$dir"
pytest_run() {  # name timeout pytest-args...
  local name=$1 limit=$2; shift 2
  timeout "$limit" python3 -m pytest -q -p no:cacheprovider --maxfail=5 "$@" > "$dir/gpu_tests-$name.log" 2>&1
  echo "$name tests rc=$?"; tail -2 "$dir/gpu_tests-$name.log"
}
on_before() {  # name timeout script args...: the script on ab_before/'s package, if there is one
  # ab_before/ goes first on the path, so its attnfuse is the one imported; --out "$dir/before".
  local name=$1 limit=$2 script=$3; shift 3
  [ -d ab_before/attnfuse ] || return 0
  mkdir -p "$dir/before"
  PYTHONPATH="$PWD/ab_before${PYTHONPATH:+:$PYTHONPATH}" timeout "$limit" python3 "$script" "$@" --out "$dir/before" \
    > "$dir/$name-before.log" 2>&1
  echo "$name (ab_before) rc=$?"
}
for stage in "$@"; do
  start=$(date +%s)
  case $stage in
    all-tests|tests-portable|tests-gluon-forward|tests-gluon-backward)
      # The GPU test files spread over worker processes (the tests are compile-bound: Triton's
      # JIT runs on the host's cores while the GPU idles); TESTS_WORKERS (default 16), TESTS_LIMIT.
      # The whole suite took about 700 s on 16 workers (session 38): more than one call's 600,
      # so a session runs the three parts in turn. A kernel fault is reported at the test that
      # launched it: conftest.py synchronizes after each test and, on a fault (sticky: it would
      # fail every later CUDA call of the process), ends the worker, which xdist reports as a
      # crash in that test and replaces. -vv (the helper's -q makes it -v) names each result as
      # it comes, so a run cut short by the limit still names its failures.
      case $stage in
        all-tests) files="test/python/test_gpu.py test/python/test_gpu_decode.py test/python/test_gpu_gluon.py test/python/test_gpu_gluon_backward.py" ;;
        tests-portable) files="test/python/test_gpu.py test/python/test_gpu_decode.py" ;;
        tests-gluon-forward) files="test/python/test_gpu_gluon.py" ;;
        tests-gluon-backward) files="test/python/test_gpu_gluon_backward.py" ;;
      esac
      # shellcheck disable=SC2086
      pytest_run "$stage" "${TESTS_LIMIT:-480}" -n "${TESTS_WORKERS:-16}" -vv -rfE --tb=short --maxfail=30 \
        -W ignore::pytest_benchmark.logger.PytestBenchmarkWarning $files
      grep -E "(FAILED|ERROR) " "$dir/gpu_tests-$stage.log" | head -40  # as they came, then the summary's
      grep -c -E "^\[gw[0-9]+\].* PASSED " "$dir/gpu_tests-$stage.log" | sed 's/^/passed so far: /' ;;
    gluon-tests)
      pytest_run gluon-backward 420 test/python/test_gpu_gluon_backward.py
      pytest_run gluon-forward-subset 150 test/python/test_gpu_gluon.py \
        -k "equals_portable or training_call or model_layout or unaligned or refused or rope or persistent_matches and causal" ;;
    ordered-tests)
      pytest_run gluon-backward-ordered 200 test/python/test_gpu_gluon_backward.py -k ordered ;;
    gluon-tests-short)
      pytest_run gluon-backward-short 120 test/python/test_gpu_gluon_backward.py \
        -k "direct_launcher or replay or equals_split or model_layout or expanded or lse_gradient"
      pytest_run gluon-forward-subset 150 test/python/test_gpu_gluon.py \
        -k "equals_portable or training_call or model_layout or unaligned or refused or rope or persistent_matches and causal" ;;
    gluon-forward-tests)
      pytest_run gluon-forward 230 test/python/test_gpu_gluon.py -k "forward_matches_reference or \
        rows_without_keys or equals_portable or training_call or model_layout or unaligned or refused or rope \
        or persistent_matches and causal or takes_the_persistent or takes_three or head_dim_256" ;;
    forward-ab)
      timeout 150 python3 bench/gluon_forward.py --out "$dir" --reps 30 --columns gluon,auto \
        > "$dir/gluon_forward-after.log" 2>&1; echo "forward (this tree) rc=$?"
      on_before gluon_forward 150 bench/gluon_forward.py --reps 30 --columns gluon ;;
    gpu-tests)
      pytest_run gpu 400 test/python/test_gpu.py
      pytest_run decode 200 test/python/test_gpu_decode.py ;;
    backward-targets)
      timeout 250 python3 bench/backward_targets.py --cases causal,rope+causal --out "$dir" --reps 30 \
        --columns default,separate,nondet_auto > "$dir/backward_targets.log" 2>&1; echo "backward-targets rc=$?" ;;
    backward-ab)
      timeout 150 python3 bench/backward_targets.py --cases causal --out "$dir" --reps 30 --columns nondet_auto \
        > "$dir/backward_ab-after.log" 2>&1; echo "backward-ab (this tree) rc=$?"
      on_before backward_ab 150 bench/backward_targets.py --cases causal --reps 30 --columns nondet_auto ;;
    ordered-ab)
      timeout 200 python3 bench/backward_targets.py --cases causal,rope+causal --out "$dir" --reps 30 --columns default \
        > "$dir/ordered_ab-after.log" 2>&1; echo "ordered-ab (this tree) rc=$?"
      on_before ordered_ab 200 bench/backward_targets.py --cases causal,rope+causal --reps 30 --columns default ;;
    layer-det)
      timeout 300 python3 bench/llama_layer.py --seq-lens 4096,8192 --compile off --modes fwdbwd \
        --out "$dir" > "$dir/llama_layer_det.log" 2>&1; echo "layer-det rc=$?" ;;
    backward-targets-d64)
      timeout 200 python3 bench/backward_targets.py --geometry paper --cases causal,dense --seq-lens 4096,8192 \
        --out "$dir" --reps 30 > "$dir/backward_targets_d64.log" 2>&1; echo "backward-targets-d64 rc=$?" ;;
    ab)
      timeout 150 python3 bench/gluon_backward_ab.py --cases causal --rounds 2 > "$dir/gluon_backward_ab.log" 2>&1
      echo "ab rc=$?"; grep -v Warn "$dir/gluon_backward_ab.log" | tail -14 ;;
    launch-host)
      timeout 120 python3 bench/gluon_launch_host.py > "$dir/gluon_launch_host.log" 2>&1; echo "launch-host rc=$?"
      grep -v Warn "$dir/gluon_launch_host.log" | tail -8 ;;
    layer)
      timeout 300 python3 bench/llama_layer.py --seq-lens 4096,8192 --compile off --modes fwd,fwdbwd \
        --nondeterministic --out "$dir" > "$dir/llama_layer.log" 2>&1; echo "layer rc=$?" ;;
    host)
      timeout 200 python3 bench/host_overhead.py --seq-lens 128,512 --out "$dir" \
        > "$dir/host_overhead.log" 2>&1; echo "host rc=$?" ;;
    forward)
      timeout 250 python3 bench/gluon_forward.py --out "$dir" --reps 30 > "$dir/gluon_forward.log" 2>&1
      echo "forward rc=$?" ;;
    forward-table)
      timeout 200 python3 bench/gluon_forward.py --out "$dir" --reps 50 --columns auto,triton > "$dir/gluon_forward_table.log" 2>&1
      echo "forward-table (issue cases) rc=$?"
      timeout 150 python3 bench/gluon_forward.py --out "$dir" --reps 50 --cases rope-sweep --columns auto \
        > "$dir/gluon_forward_rope_sweep.log" 2>&1; echo "forward-table (RoPE sweep) rc=$?" ;;
    gluon-256-tests)
      pytest_run gluon-256 300 test/python/test_gpu_gluon.py -k "head_dim_256 or takes_the_persistent or takes_three" ;;
    forward-256)
      timeout 200 python3 bench/gluon_forward.py --out "$dir" --reps 30 --head-dims 256 --columns gluon,gluon_ps,triton,auto \
        > "$dir/gluon_forward_256.log" 2>&1; echo "forward-256 rc=$?" ;;
    backward-d64-ordered)
      timeout 200 python3 bench/backward_targets.py --geometry paper --cases causal,dense --seq-lens 4096,8192 \
        --out "$dir" --reps 30 --columns default,separate,nondet_auto,ordered_gluon > "$dir/backward_d64_ordered.log" 2>&1
      echo "backward-d64-ordered rc=$?" ;;
    persistent-ab)
      timeout 200 python3 bench/gluon_persistent_ab.py --out "$dir" > "$dir/gluon_persistent_ab.log" 2>&1
      echo "persistent-ab rc=$?"; tail -12 "$dir/gluon_persistent_ab.log" ;;
    decode-profile)
      timeout 200 python3 bench/decode_profile.py --variants kernel,kernel-long16384 --no-stream --out "$dir" \
        > "$dir/decode_profile.log" 2>&1; echo "decode-profile rc=$?" ;;
    decode-profile-ab)
      timeout 200 python3 bench/decode_profile.py --variants kernel,kernel-long16384 --no-stream --out "$dir" \
        > "$dir/decode_profile-after.log" 2>&1; echo "decode-profile-ab (this tree) rc=$?"
      on_before decode_profile 200 bench/decode_profile.py --variants kernel,kernel-long16384 --no-stream ;;
    decode-lens-probe)
      timeout 150 python3 bench/decode_tma_probe.py --rows 2,3 --reps 50 --sweep lens --out "$dir" \
        > "$dir/decode_lens_probe.log" 2>&1; echo "decode-lens-probe rc=$?" ;;
    decode-tma-probe)
      timeout 300 python3 bench/decode_tma_probe.py --rows 2,3 --reps 30 --out "$dir" > "$dir/decode_tma_probe.log" 2>&1
      echo "decode-tma-probe rc=$?" ;;
    decode)
      timeout 250 python3 bench/decode.py --rows 1,2,3,4,5 --time-budget 200 --out "$dir" \
        > "$dir/decode.log" 2>&1; echo "decode rc=$?" ;;
    decode-ab)
      timeout 240 python3 bench/decode.py --rows 1,2,3,4,5 --time-budget 200 --out "$dir" \
        > "$dir/decode-after.log" 2>&1; echo "decode-ab (this tree) rc=$?"
      on_before decode 150 bench/decode.py --rows 1,2,3 --time-budget 110 ;;
    layer-default)
      timeout 240 python3 bench/llama_layer.py --seq-lens 4096,8192 --compile off --modes fwd,fwdbwd --out "$dir" \
        > "$dir/llama_layer_default.log" 2>&1; echo "layer-default rc=$?" ;;
    decode-splits)
      timeout 200 python3 bench/decode_splits.py --rows 16k,32k,8x8k --out "$dir" > "$dir/decode_splits.log" 2>&1
      echo "decode-splits rc=$?"; tail -6 "$dir/decode_splits.log" ;;
    decode-long)
      timeout 200 python3 bench/decode.py --rows 2,3 --time-budget 150 --out "$dir" > "$dir/decode_long.log" 2>&1
      echo "decode-long rc=$?" ;;
    variants-tests)
      pytest_run gluon-variants 200 test/python/test_gpu_gluon.py -k "bias or pointwise_and_bias or auto_takes" ;;
    issue17-backward)
      timeout 200 python3 bench/backward_targets.py --cases causal,rope+causal --out "$dir" --reps 30 \
        --columns default > "$dir/issue17_backward.log" 2>&1; echo "issue17-backward rc=$?" ;;
    pointwise-tests)
      pytest_run gluon-pointwise 240 test/python/test_gpu_gluon_backward.py -k "relu or sigmoid or softcap" ;;
    pointwise-backward)
      for geometry in llama paper; do
        timeout 170 python3 bench/backward_targets.py --cases relu,relu+causal,sigmoid+causal --geometry $geometry \
          --out "$dir" --reps 20 --columns default,separate,nondet_auto,ordered_gluon > "$dir/pointwise_backward_$geometry.log" 2>&1
        echo "pointwise-backward ($geometry) rc=$?"
      done ;;
    issue17)
      mkdir -p "$dir/issue17"/{forward,sweep,backward,layer}
      # gluon2 / gluon3: the plain grid with two / three consumers, beside auto's schedule (persistent
      # at D=128 dense): which schedule wins where auto does not beat cuDNN, in the same rounds.
      timeout 230 python3 bench/gluon_forward.py --out "$dir/issue17/forward" --reps 30 --columns auto,triton,gluon2,gluon3 \
        > "$dir/issue17_forward.log" 2>&1; echo "issue17 forward rc=$?"
      timeout 110 python3 bench/gluon_forward.py --out "$dir/issue17/sweep" --reps 30 --cases rope-sweep --columns auto \
        > "$dir/issue17_sweep.log" 2>&1; echo "issue17 sweep rc=$?"
      timeout 100 python3 bench/backward_targets.py --cases causal,rope+causal --out "$dir/issue17/backward" --reps 30 \
        --columns default > "$dir/issue17_backward.log" 2>&1; echo "issue17 backward rc=$?"
      timeout 150 python3 bench/llama_layer.py --seq-lens 4096,8192 --compile off --modes fwdbwd \
        --out "$dir/issue17/layer" > "$dir/issue17_layer.log" 2>&1; echo "issue17 layer rc=$?"
      args=()
      for part in forward sweep backward layer; do
        file=$(ls "$dir/issue17/$part"/*.json 2>/dev/null | head -1)
        [ -n "$file" ] && args+=("--$part" "$file")
      done
      python3 bench/issue17_table.py "${args[@]}" --out "$dir" ;;
    sparse-tests)
      pytest_run gluon-sparse 200 test/python/test_gpu_gluon.py -k "block_sparse or refused" ;;
    sparse-targets)
      for target in gluon triton; do
        ATTNFUSE_FORWARD_TARGET=$target timeout 100 python3 bench/block_sparse.py --densities 0.1,0.25,0.5,1.0 \
          --out "$dir/sparse-$target" > "$dir/block_sparse_$target.log" 2>&1; echo "sparse-targets ($target, D=64) rc=$?"
        ATTNFUSE_FORWARD_TARGET=$target timeout 100 python3 bench/block_sparse.py --densities 0.1,0.25,0.5,1.0 \
          --batch 1 --heads 32 --head-dim 128 --seq 8192 --out "$dir/sparse-$target-d128" \
          > "$dir/block_sparse_${target}_d128.log" 2>&1; echo "sparse-targets ($target, D=128) rc=$?"
      done ;;
    sparse-issue15)
      timeout 150 python3 bench/block_sparse.py --densities 0.05,0.1,0.25,0.5,1.0 --out "$dir" \
        > "$dir/block_sparse_issue15.log" 2>&1; echo "sparse-issue15 rc=$?"; tail -12 "$dir/block_sparse_issue15.log" ;;
    sparse-gluon-tiles)
      timeout 200 python3 bench/block_sparse_tiles.py --densities 0.05,0.1,0.25 --configs "64,64,4,2;128,64,8,2" \
        --gluon-tiles "64,128;128,128;128,64;192,128" --out "$dir" > "$dir/block_sparse_gluon_tiles.log" 2>&1
      echo "sparse-gluon-tiles rc=$?"; tail -8 "$dir/block_sparse_gluon_tiles.log" ;;
    sparse-order)
      timeout 300 python3 bench/block_sparse_tiles.py --densities 0.05,0.1 --row-orders drawn,heavy,light \
        --configs "64,64,4,2;64,64,4,3;64,64,2,2;64,32,4,2;32,64,2,2" --out "$dir" > "$dir/block_sparse_order.log" 2>&1
      echo "sparse-order rc=$?"; tail -8 "$dir/block_sparse_order.log" ;;
    verify43)
      # What stop 43 could not run on a GPU: the launch-graph and head-major tests on the final
      # code, the block-sparse call as auto now makes it (the portable head-major kernel with
      # 64 x 64 tiles at head dim 64), and the host cost with launch graphs.
      pytest_run verify43 240 -n 8 test/python/test_gpu.py test/python/test_gpu_decode.py test/python/test_gpu_gluon.py \
        -k "launch_graphs or head_major or block_sparse or documents or refused or capture or graph"
      timeout 150 python3 bench/block_sparse.py --densities 0.05,0.1,0.25,0.5,1.0 --out "$dir" \
        > "$dir/block_sparse_auto.log" 2>&1; echo "block-sparse (auto) rc=$?"; tail -9 "$dir/block_sparse_auto.log"
      timeout 200 python3 bench/host_overhead.py --seq-lens 128,512 --out "$dir" > "$dir/host_overhead.log" 2>&1
      echo "host rc=$?"; grep "train" "$dir"/*host-overhead.md | tail -10 ;;
    verify44)
      # The launch-graph tests after stop 44's fix (captures were all dropped: the allocation
      # count spanned capture_begin, which allocates for the graph itself).
      pytest_run verify44 200 -n 8 test/python/test_gpu.py test/python/test_gpu_decode.py -k "launch_graphs or graph" ;;
    verify45)
      # What stop 44 could not run on a GPU: its review fixes (each call's own padded lse /
      # delta copies at an Nq off a multiple of 4; launch graphs only under the caching
      # allocator), with the tests of the Gluon backward at odd Nq and call-time RoPE positions,
      # the launch-graph tests, and the step at N = 4093 beside 4096.
      pytest_run verify45 240 -n 12 test/python/test_gpu_gluon_backward.py test/python/test_gpu.py \
        test/python/test_gpu_decode.py -k "padded_rows or call_time_positions or launch_graphs or graph"
      timeout 90 python3 bench/backward_targets.py --cases causal,rope+causal --seq-lens 3072,4093,4096 \
        --columns default --reps 20 --out "$dir/verify45" > "$dir/backward_odd.log" 2>&1; echo "backward (odd Nq) rc=$?"
      grep -h "^| \(causal\|rope\)" "$dir"/verify45/*backward-targets.md ;;
    verify46)
      # verify45's tests (stop 44's review fixes, never run on a GPU) and stop 45's Gluon
      # backward over block lists (documents, block sparsity; ordered adds by the lists' ranks).
      pytest_run verify45 200 -n 12 test/python/test_gpu_gluon_backward.py test/python/test_gpu.py \
        test/python/test_gpu_decode.py -k "padded_rows or call_time_positions or launch_graphs or graph"
      pytest_run listed-backward 200 -n 12 test/python/test_gpu_gluon_backward.py test/python/test_gpu.py \
        -k "walks_block_lists or document or block_sparse" ;;
    verify47)
      # Stop 46: dK's interleaved pairs split in registers in the Gluon backward's epilogue
      # (never run on a GPU), and the forward's pre-rotation kernels replayed in the launch graph.
      pytest_run verify47 200 -n 12 test/python/test_gpu_gluon_backward.py test/python/test_gpu.py \
        -k "interleaved or launch_graphs or graph"
      for rope in "" "--rope"; do
        timeout 150 python3 bench/host_overhead.py --seq-lens 128,512 $rope --out "$dir" \
          > "$dir/host_overhead${rope:+-rope}.log" 2>&1; echo "host ${rope:-causal} rc=$?"
        grep "| train | attnfuse |\|| fwd | attnfuse |" "$dir/host_overhead${rope:+-rope}.log"
      done ;;
    verify48)
      # Stop 47: the Gluon backward with an additive bias and with index tiles (never run on a
      # GPU): their tests (the fused portable backward's bias tests run on the CPU), then the
      # bias rows beside the split, deterministic and not, at the Llama heads: what a rule for
      # `auto` needs.
      pytest_run verify48 200 -n 12 test/python/test_gpu_gluon_backward.py -k "additive_bias or index_tiles"
      timeout 200 python3 bench/backward_targets.py --cases bias+causal,biasgrad+causal --seq-lens 4096,8192 \
        --columns separate,ordered_gluon,fused_gluon --out "$dir" > "$dir/backward_bias.log" 2>&1
      echo "bias backward rc=$?"; tail -4 "$dir/backward_bias.log" ;;
    verify48-tl)
      # Stop 47: the portable target's online softmax keeps its row max in base-2 units (the
      # Gluon forward's form): its GPU tests, then its forward (the tl column) and the decode
      # rows beside the code before the change (ab_before/, if present).
      pytest_run verify48-tl 300 -n 12 test/python/test_gpu.py test/python/test_gpu_decode.py
      timeout 120 python3 bench/gluon_forward.py --out "$dir" --reps 30 --columns triton \
        > "$dir/tl_forward-after.log" 2>&1; echo "tl forward (this tree) rc=$?"
      on_before tl_forward 120 bench/gluon_forward.py --reps 30 --columns triton
      timeout 150 python3 bench/decode.py --rows 1,2,3 --time-budget 110 --out "$dir" \
        > "$dir/decode-after.log" 2>&1; echo "decode (this tree) rc=$?"
      on_before decode 150 bench/decode.py --rows 1,2,3 --time-budget 110 ;;
    listed-backward)
      # The Gluon backward over block lists as it now is (each list walked from its last entry
      # down, entries read a step ahead: not yet run on a GPU): its tests, then the document
      # step with the split backward (ATTNFUSE_BACKWARD_TARGET=triton) and with the Gluon one
      # (gluon: auto takes none for listed calls, GLUON_LISTED_MIN_WORK), deterministic and not,
      # at the Llama heads. A Gluon column faster than the split is what a GLUON_LISTED_MIN_WORK
      # entry needs.
      pytest_run listed-backward 200 -n 12 test/python/test_gpu_gluon_backward.py -k "walks_block_lists"
      for det in "" "--nondeterministic"; do
        for target in triton gluon; do
          name="document-bwd-$target${det:+-nondet}"
          ATTNFUSE_BACKWARD_TARGET=$target timeout 100 python3 bench/document.py --geometry llama --modes fwdbwd \
            --columns attnfuse --seq-lens 8192,16384 --rep 60 $det --out "$dir/$name" > "$dir/$name.log" 2>&1
          echo "document fwd+bwd ($name) rc=$?"; grep "^| B" "$dir/$name.log"
        done
      done ;;
    gluon-sizes)
      # Where auto's Gluon sizes at head dim 128 come from (stop 44; gluon_forward.SOFTMAX_MIN_WORK,
      # gluon_backward.GLUON_ORDERED_MIN_WORK): each target forced below 4096, and at the paper shape.
      for target in gluon triton; do
        ATTNFUSE_FORWARD_TARGET=$target timeout 70 python3 -m attnfuse.tools.bench --preset llama3-8b --dtype bf16 \
          --mode fwd --variants causal,rope_causal --seq-lens 1024,2048,3072,4093 --impls attnfuse --rep 100 \
          --no-plots --no-progress --out "$dir/sizes-fwd-llama-$target" > "$dir/sizes-fwd-llama-$target.log" 2>&1
        echo "gluon-sizes forward llama ($target) rc=$?"
        ATTNFUSE_FORWARD_TARGET=$target timeout 50 python3 -m attnfuse.tools.bench --preset paper --mode fwd \
          --variants causal --seq-lens 4096,6144,8191 --impls attnfuse --rep 100 --no-plots --no-progress \
          --out "$dir/sizes-fwd-paper-$target" > "$dir/sizes-fwd-paper-$target.log" 2>&1
        echo "gluon-sizes forward paper ($target) rc=$?"
      done
      ATTNFUSE_FORWARD_TARGET=gluon timeout 80 python3 bench/backward_targets.py --cases causal,rope+causal \
        --seq-lens 1024,2048,3072 --columns separate,ordered_gluon --reps 20 --out "$dir/sizes-bwd-llama" \
        > "$dir/sizes-bwd-llama.log" 2>&1; echo "gluon-sizes backward (llama) rc=$?"
      ATTNFUSE_FORWARD_TARGET=gluon timeout 60 python3 bench/backward_targets.py --geometry paper --cases causal \
        --seq-lens 4096,6144 --columns separate,ordered_gluon --reps 20 --out "$dir/sizes-bwd-paper" \
        > "$dir/sizes-bwd-paper.log" 2>&1; echo "gluon-sizes backward (paper) rc=$?" ;;
    sparse-head-major)
      pytest_run sparse-head-major 200 -n 8 test/python/test_gpu.py test/python/test_gpu_gluon.py \
        -k "head_major or block_sparse or documents or refused"
      timeout 150 python3 bench/block_sparse.py --densities 0.05,0.1,0.25,0.5,1.0 --out "$dir" \
        > "$dir/block_sparse_auto.log" 2>&1; echo "block-sparse (auto) rc=$?"; tail -9 "$dir/block_sparse_auto.log"
      timeout 150 python3 bench/block_sparse.py --densities 0.05,0.1,0.25,0.5,1.0 --sparse-target triton \
        --out "$dir/triton" > "$dir/block_sparse_triton.log" 2>&1; echo "block-sparse (triton) rc=$?"
      tail -9 "$dir/block_sparse_triton.log" ;;
    sparse-grid-probe)
      timeout 150 python3 bench/block_sparse_grid_probe.py --densities 0.05,0.1,0.25,0.5 --out "$dir" \
        > "$dir/block_sparse_grid_probe.log" 2>&1; echo "sparse-grid-probe rc=$?"; tail -8 "$dir/block_sparse_grid_probe.log" ;;
    host-profile)
      timeout 200 python3 bench/host_overhead.py --seq-lens 128,512 --profile --launches --out "$dir" \
        > "$dir/host_profile.log" 2>&1; echo "host-profile rc=$?"; grep -v Warn "$dir/host_profile.log" | tail -60 ;;
    document-tests)
      pytest_run gluon-documents 240 test/python/test_gpu_gluon.py -k "document or refused"
      pytest_run documents 120 test/python/test_gpu.py -k "documents" ;;
    document)
      timeout 420 python3 bench/document.py --geometry "${GEOMETRY:-llama,paper}" --out "$dir" \
        > "$dir/document.log" 2>&1; echo "document rc=$?"
      grep -v Warn "$dir/document.log" | tail -20 ;;
    step-profile)
      timeout 200 python3 bench/step_profile.py --preset llama3-8b --dtype bf16 --mode fwdbwd --variants causal \
        --seq-lens 4096,8192 --impls attnfuse,sdpa-cudnn > "$dir/step_profile.log" 2>&1; echo "step-profile rc=$?"
      grep -v Warn "$dir/step_profile.log" | tail -30 ;;
    index-tiles)
      pytest_run index-tiles 150 -n 12 test/python/test_gpu_gluon.py -k index_tiles
      pytest_run chunked-decode 60 test/python/test_gpu_decode.py -k chunked_decode
      pytest_run replay 60 test/python/test_gpu_gluon_backward.py -k replay_their_encoded ;;
    softcap-backward)
      timeout 150 python3 bench/backward_targets.py --cases softcap+causal --columns default,separate,nondet_auto \
        --reps 30 --out "$dir" > "$dir/softcap_backward.log" 2>&1; echo "softcap-backward rc=$?"
      tail -4 "$dir/softcap_backward.log" ;;
    tune)
      timeout 400 python3 -m attnfuse.tools.tune "af.attention(af.rope(theta=500000.0), af.causal())" \
        --shape 1,32,8,128 --seq-lens 4096 --dtype bf16 --mode forward,backward --block-m 64,128 \
        --block-n 32,64 --num-warps 4,8 --num-stages 2,3 --out "$dir/tune-h200.json" > "$dir/tune.log" 2>&1
      echo "tune rc=$?"; tail -4 "$dir/tune.log"
      ATTNFUSE_TUNING="$dir/tune-h200.json" python3 -c "
import torch, attnfuse as af
q = torch.randn(1, 32, 4096, 128, device='cuda', dtype=torch.bfloat16)
k, v = (torch.randn(1, 8, 4096, 128, device='cuda', dtype=torch.bfloat16) for _ in range(2))
print('tuned config:', af.compile(af.attention(af.rope(theta=500000.0), af.causal())).plan(q, k, v).config)" \
        >> "$dir/tune.log" 2>&1; tail -1 "$dir/tune.log" ;;
    *) echo "unknown stage $stage" ;;
  esac
  echo "stage $stage took $(( $(date +%s) - start )) s"
  tar czf "$OUT/session.tgz" -C /tmp session  # after every stage: a call cut short keeps what ran
done

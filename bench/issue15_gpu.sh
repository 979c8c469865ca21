#!/usr/bin/env bash
# The GPU run for the issue "A PyTorch citizen", in one call on the H200 (about 8 minutes):
#
#   bash bench/issue15_gpu.sh            # from the repository root; results under $OUT
#   bash bench/issue15_gpu.sh --smoke    # the same steps on the CPU at tiny sizes (checks the script)
#
# 1. bench/host_overhead.py  host cost per call beside SDPA (B=1 H=8 D=64 fp16, N=128, 512)
# 2. bench/block_sparse.py   block-sparse forward against density beside flex (B=4 H=12 N=4096)
# 3. bench/llama_layer.py    a Llama-3-8B decoder layer with SDPA-cuDNN, flex and AttnFuse,
#                            eager and under torch.compile, N=2048/4096/8192, three modes
#
# Each step runs under `timeout`, so one that hangs cannot cost the others their turn, and its
# log is kept. What comes back from $OUT (at most 8 files): summary.md (every table), the three
# logs, env.log, and issue15-results.tar.gz (all .json/.md/.png files). Wheels in .whl/ (xDSL,
# say) are installed first when the package cannot be imported; carry .whl to the machine.
# Times: LAYER_BUDGET (default 300 s) is when the layer benchmark stops starting new cases;
# DEADLINE (default 540 s after the start) is when any step still running is stopped.
set -u
OUT="${OUT:-bench/results/issue15}"
WORK="$(mktemp -d)/issue15"
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
LAYER_BUDGET="${LAYER_BUDGET:-300}"
DEADLINE="${DEADLINE:-540}"  # seconds after the start by which every step has ended (the call's limit is 600)
START=$(date +%s)

{
  echo "start $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv 2>&1
  if ! "$PY" -c "import xdsl" 2>/dev/null && [ -d .whl ]; then
    echo "installing .whl/*.whl into /tmp/site"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1
    export PYTHONPATH="$PYTHONPATH:/tmp/site"
  fi
  "$PY" - <<'EOF'
import importlib
for name in ("torch", "triton", "xdsl", "attnfuse", "matplotlib", "rich"):
    try:
        module = importlib.import_module(name)
        print(f"{name} {getattr(module, '__version__', '?')} {getattr(module, '__file__', '')}")
    except Exception as err:  # noqa: BLE001
        print(f"{name}: not importable ({type(err).__name__}: {err})")
import torch
print("cuda", torch.version.cuda, "device", torch.cuda.get_device_name() if torch.cuda.is_available() else None)
EOF
} 2>&1 | tee "$OUT/env.log"
# The install above ran in a subshell of the pipe: export its path here too.
[ -d /tmp/site ] && export PYTHONPATH="$PYTHONPATH:/tmp/site"

left() { echo $((DEADLINE - ($(date +%s) - START))); }

step() {  # step NAME TIMEOUT_S COMMAND...: run, log to $OUT/NAME.log, record the exit status
  local name=$1 limit=$2
  shift 2
  # No step may run past the deadline, so the summary and the archive are always written.
  [ "$limit" -gt "$(left)" ] && limit=$(left)
  if [ "$limit" -lt 20 ]; then
    echo "=== $name skipped: $(left) s left before the deadline" | tee -a "$OUT/env.log"
    return
  fi
  echo "=== $name ($(($(date +%s) - START)) s in): $*" | tee -a "$OUT/env.log"
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "=== $name exit $rc ($(($(date +%s) - START)) s in)" | tee -a "$OUT/env.log"
}

HOST=() SPARSE=() LAYER=()
if [ "${1:-}" = "--smoke" ]; then
  HOST=(--smoke) SPARSE=(--quick) LAYER=(--quick)
fi
step host 120 "$PY" bench/host_overhead.py --out "$WORK/host" "${HOST[@]}"
step sparse 180 "$PY" bench/block_sparse.py --out "$WORK/sparse" "${SPARSE[@]}"
# The layer's budget is when it stops starting cases; a case already started (a compile, say)
# gets the rest, up to the deadline.
BUDGET=$(( $(left) - 100 ))
[ "$BUDGET" -gt "$LAYER_BUDGET" ] && BUDGET=$LAYER_BUDGET
step layer $((BUDGET + 150)) "$PY" bench/llama_layer.py --out "$WORK/layer" --time-budget "$BUDGET" "${LAYER[@]}"

{
  echo "# Issue 15 GPU run ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(($(date +%s) - START)) s)"
  echo
  for part in host sparse layer; do
    for md in "$WORK/$part"/*.md; do
      [ -f "$md" ] && { cat "$md"; echo; }
    done
  done
} >"$OUT/summary.md"
tar -czf "$OUT/issue15-results.tar.gz" -C "$(dirname "$WORK")" issue15
ls -la "$OUT"
echo "total $(($(date +%s) - START)) s"

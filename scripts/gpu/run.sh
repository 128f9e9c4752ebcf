#!/usr/bin/env bash
# One prepared GPU session of heptstudy (issue 13). How to run it: scripts/gpu/README.md.
#
# In priority order, each measurement in its own process under `timeout`; one that does not fit
# in the time left (BUDGET seconds from the start) is skipped and listed in summary.txt:
#   1. fused_check.py: the fused kernel's compiles over 12 new lengths (both shape policies),
#      fused-vs-plain parity, the backbone at 10,000 hits plain / fused-dynamic / fused-ladder;
#   2. the recipe's batch 48: the study's checkpointed_b48 and baseline_b48 (plain attention,
#      the profile's default), checkpointed_b48 with PYTORCH_CUDA_ALLOC_CONF=
#      expandable_segments:True, and checkpointed_b48 with fused attention; then the op-group
#      cost table of the recipe's model on the GPU (bfloat16, plain attention: op_costs_cuda.json,
#      what keepNN plans and auto's front need for the recipe; the CPU table is float32);
#   3. the rest of the GPU study matrix (configs/study/gpu.yaml, in its order);
#   4. fused attention at batch 4 and 16 (no checkpointing), baseline_b48 with expandable
#      segments and with fused attention, fused with the selective policy at batch 4.
# Results under $OUT: study/ (the matrix's reports, named as `heptstudy study run` names them),
# fused/ (model.heptv2.attention_backend=fused), expandable/ (expandable segments),
# fused_check.json, op_costs_cuda.json, table.txt, summary.txt, env.txt, logs/, predictions_vs_measured.md/.json
# (scripts/gpu/compare_predictions.py: the reports against experiments/gpu_blind_predictions/).
#
# It refuses to measure when the committed blind predictions are not of this checkout
# (scripts/gpu/check_predictions.py; CHECK_PREDICTIONS=no skips that for another MATRIX).
# Settings (environment): OUT (required), GPU_DATA (default data/gpu: tfds/ and wheels/),
# BUDGET (seconds, default 460), SKIP ("study/NAME fused/NAME ..." already measured),
# PLATFORM (default h100), MATRIX (default configs/study/gpu.yaml), BENCH_EXTRA (more bench
# options for every fused/expandable run and the cost table), CHECK_ARGS (options of
# fused_check.py), COST_DEVICE (the cost table's --device, default cuda), PYTHON.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
: "${OUT:?set OUT to the folder for the results}"
GPU_DATA=${GPU_DATA:-data/gpu}
BUDGET=${BUDGET:-460}
SKIP=" ${SKIP:-} "
PLATFORM=${PLATFORM:-h100}
MATRIX=${MATRIX:-configs/study/gpu.yaml}
BENCH_EXTRA=${BENCH_EXTRA:-}
CHECK_ARGS=${CHECK_ARGS:-}
COST_DEVICE=${COST_DEVICE:-cuda}
PY=${PYTHON:-python3}
START=$(date +%s)
mkdir -p "$OUT/study" "$OUT/fused" "$OUT/expandable" "$OUT/logs"

case $GPU_DATA in /*) ;; *) GPU_DATA=$ROOT/$GPU_DATA ;; esac
if compgen -G "$GPU_DATA/wheels/*.whl" >/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$GPU_DATA"/wheels/*.whl >"$OUT/logs/pip.log" 2>&1 \
    || { echo "wheel install failed:"; tail -5 "$OUT/logs/pip.log"; exit 1; }
  export PYTHONPATH=/tmp/site:$ROOT
else
  export PYTHONPATH=$ROOT
fi
export PYTHONUNBUFFERED=1 MPLBACKEND=agg TORCHINDUCTOR_CACHE_DIR=/tmp/heptstudy-inductor
unset PYTORCH_CUDA_ALLOC_CONF # the allocator as it comes, except in expandable/
DATA=$GPU_DATA/tfds
if [ ! -d "$DATA/cld_edm_ttbar_hits" ]; then
  echo "no cld_edm_ttbar_hits in $DATA: see scripts/gpu/README.md (data)"
  exit 1
fi
# blind: a GPU measures only code whose predictions were committed first (scripts/gpu/README.md);
# CHECK_PREDICTIONS=no for a session that is not compared with them (another MATRIX)
if [ "${CHECK_PREDICTIONS:-yes}" = no ]; then
  echo "predictions not checked (CHECK_PREDICTIONS=no): not a blind comparison" \
    | tee -a "$OUT/summary.txt"
elif ! $PY scripts/gpu/check_predictions.py --matrix "$MATRIX" >"$OUT/logs/check.log" 2>&1; then
  cat "$OUT/logs/check.log"
  echo "refused: nothing measured (stale blind predictions)"
  exit 1
fi

{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || true
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  echo "commit ${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
  echo "budget ${BUDGET}s, platform $PLATFORM, matrix $MATRIX"
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

left() { echo $((BUDGET - ($(date +%s) - START))); }

# measure NAME LIMIT_S COMMAND...: one process under timeout, its log, one line in summary.txt.
measure() {
  local name=$1 lim=$2 l t0 rc log
  shift 2
  if [[ "$SKIP" == *" $name "* ]]; then
    echo "$name skipped (SKIP)" | tee -a "$OUT/summary.txt"
    return
  fi
  l=$(left)
  if [ "$l" -lt 30 ]; then
    echo "$name skipped (${l}s of the budget left)" | tee -a "$OUT/summary.txt"
    return
  fi
  [ "$lim" -gt "$l" ] && lim=$l
  log="$OUT/logs/${name//\//_}.log"
  t0=$(date +%s)
  timeout "$lim" "$@" >"$log" 2>&1
  rc=$?
  echo "$name rc=$rc $(($(date +%s) - t0))s$([ $rc -eq 124 ] && echo " (timed out at ${lim}s)")" \
    | tee -a "$OUT/summary.txt"
  tail -2 "$log" | cut -c1-300
}

# study NAME LIMIT: a run of the matrix, as its notebook would measure it.
study() {
  measure "study/$1" "$2" $PY scripts/gpu/matrix_run.py "$MATRIX" --name "$1" \
    --out "$OUT/study" --data-dir "$DATA"
}

# variant FOLDER NAME LIMIT ENV_ASSIGNMENT -- BENCH_OPTIONS: the same bench with one change.
variant() {
  local folder=$1 name=$2 lim=$3 envs=$4
  shift 5
  # shellcheck disable=SC2086 # envs and BENCH_EXTRA are word lists on purpose
  measure "$folder/$name" "$lim" env $envs $PY -m heptstudy.cli bench --platform "$PLATFORM" \
    --data-dir "$DATA" --no-progress --set data.nvalid=4 --output "$OUT/$folder/$name.json" \
    "$@" $BENCH_EXTRA
}
FUSED=(--set model.heptv2.attention_backend=fused)
EXPANDABLE="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
B48=(--batch-size 48 --steps 2 --warmup 1)

mapfile -t RUNS < <($PY scripts/gpu/matrix_run.py "$MATRIX" --list 2>"$OUT/logs/matrix.log")
if [ "${#RUNS[@]}" -eq 0 ]; then
  echo "the matrix $MATRIX could not be read:"
  cat "$OUT/logs/matrix.log"
  exit 1
fi

# 1. the fused kernel
# shellcheck disable=SC2086
measure fused_check 180 $PY scripts/gpu/fused_check.py "$OUT/fused_check.json" $CHECK_ARGS
# 2. the recipe's batch
study "${RUNS[0]}" 150
study "${RUNS[1]}" 150
variant expandable checkpointed_b48 150 "$EXPANDABLE" -- "${B48[@]}" --checkpointing
variant fused checkpointed_b48 150 "" -- "${B48[@]}" --checkpointing "${FUSED[@]}"
# shellcheck disable=SC2086
measure op_costs 120 $PY -m heptstudy.cli costs --device "$COST_DEVICE" --data-dir "$DATA" \
  --set train.dtype=bfloat16 --set model.heptv2.attention_backend=plain \
  --out "$OUT/op_costs_cuda.json" $BENCH_EXTRA
# 3. the rest of the study
for name in "${RUNS[@]:2}"; do
  study "$name" 110
done
# 4. if time is left
variant fused baseline_b4 110 "" -- --batch-size 4 --steps 5 --warmup 2 "${FUSED[@]}"
variant fused baseline_b16 120 "" -- --batch-size 16 --steps 5 --warmup 2 "${FUSED[@]}"
variant expandable baseline_b48 150 "$EXPANDABLE" -- "${B48[@]}"
variant fused baseline_b48 150 "" -- "${B48[@]}" "${FUSED[@]}"
variant fused checkpointed_selective_b4 110 "" -- --batch-size 4 --steps 5 --warmup 2 \
  --checkpointing selective "${FUSED[@]}"

$PY scripts/gpu/summarize.py "$OUT" >"$OUT/table.txt" 2>&1
cat "$OUT/table.txt"
# measured against the blind predictions committed before this session (no GPU time)
$PY scripts/gpu/compare_predictions.py "$OUT" >"$OUT/logs/predictions.log" 2>&1
cat "$OUT/logs/predictions.log"
echo "total $(($(date +%s) - START))s" | tee -a "$OUT/summary.txt"

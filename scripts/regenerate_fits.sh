#!/usr/bin/env bash
# Regenerate the estimator's stored outputs for the code as it is now (no GPU needed): the three
# estimated memory models of configs/fit/ (`heptstudy fit` refuses a stored model whose code
# fingerprint differs from the running code's) and the blind predictions of the GPU study,
# experiments/gpu_blind_predictions/predictions.json (`make check-predictions` fails, and
# scripts/gpu/run.sh refuses to measure, until they are of this code).
#
#   bash scripts/regenerate_fits.sh [DATA_DIR]
#       the models: fake steps of the current model on a generated 2,000-event set (DATA_DIR,
#       default data/tfds_fit2000), each step's allocation trace replayed through the
#       caching-allocator simulator; the predictions: every memory run of configs/study/gpu.yaml
#       on the GPU session's data (its events and seed: experiments/h200_2026-11-30/session.yaml;
#       GPU_DATA, default data/tfds_gpu). Data sets are generated when they are not there. The
#       three fits and the prediction runs all run at once in processes of their own (JOBS
#       prediction runs at a time, default: the cores), so that the cores stay busy until the
#       last one ends.
#       ONLY=fits or ONLY=predictions regenerates one of the two. Logs: a temporary folder,
#       named at the end.
#   bash scripts/regenerate_fits.sh --measured REPORTS_DIR [COMMIT]
#       the measured models, from GPU bench reports of the current code (heptstudy bench or
#       scripts/gpu/), fingerprinted with COMMIT's code (default: the commit the reports name).
#
# Commit what it wrote before any GPU measures this code: the blind comparison after a GPU
# session (scripts/gpu/compare_predictions.py) shows from git that the predictions were
# committed before the commit the GPU measured.
set -euo pipefail
bin=${BIN:-.venv/bin}
export PYTHONPATH=${PYTHONPATH:-$PWD}
start=$SECONDS

if [ "${1:-}" = "--measured" ]; then
  reports=${2:?give the folder of the GPU bench reports}
  commit=${3:-}
  "$bin/python" - "$reports" "$commit" <<'EOF'
import sys

from heptstudy.errors import HeptstudyError
from heptstudy.fitting.reports import save_measured_models

try:
    written, rejected = save_measured_models([sys.argv[1]], "configs/fit", sys.argv[2] or None)
except HeptstudyError as err:
    sys.exit(f"heptstudy: error: {err}")
for path in written:
    print(f"wrote {path}")
for r in rejected:
    print(f"not stored: {r}")
EOF
  exit 0
fi

fit_data=${1:-data/tfds_fit2000}
gpu_data=${GPU_DATA:-data/tfds_gpu}
only=${ONLY:-both}
jobs=${JOBS:-$(nproc)}
case $only in both | fits | predictions) ;; *)
  echo "ONLY=$only: give fits, predictions or nothing (both)" >&2
  exit 2
  ;;
esac
logs=$(mktemp -d /tmp/regenerate_fits.XXXXXX)
trap 'echo "elapsed $((SECONDS - start)) s (logs: $logs)"' EXIT

# generate DIR TRAIN TEST [SEED]: the data set, unless it is there
generate() {
  [ -f "$1/cld_edm_ttbar_hits/1/3.2.1/dataset_info.json" ] && return
  "$bin/heptstudy" data generate --data-dir "$1" --events-train "$2" --events-test "$3" \
    --seed "${4:-20261014}" >"$logs/data_$2.log" 2>&1 \
    || { echo "FAILED: data for $1 ($logs/data_$2.log):" && tail -3 "$logs/data_$2.log" && return 1; }
}

# fit PLATFORM OUT: one estimated model; its answer's first line, or where its error is
fit() {
  local log="$logs/$(basename "$2" .json).log"
  if "$bin/heptstudy" fit --platform "$1" --per-device-batch 48 --data-dir "$fit_data" \
    --estimate --save-model "$2" >"$log" 2>&1; then
    echo "$(head -1 "$log")"$'\n'"wrote $2"
  else
    echo "FAILED: $2 ($log):"
    tail -3 "$log"
    return 1
  fi
}

fits() {
  generate "$fit_data" 2000 64
  # the H100 recipe with fused attention: a copy of the profile with attention_backend fused
  # (the recipe never overrides the platform's backend)
  local fused="$logs/h100_fused.yaml" pids=() rc=0
  sed 's/^name: .*/name: h100_fused/; s/^attention_backend: .*/attention_backend: fused/' \
    configs/training/platforms/h100.yaml >"$fused"
  fit h100 configs/fit/h100_hit_heptv2_b48_estimated.json & pids+=($!)
  fit lumi_mi250x configs/fit/lumi_mi250x_hit_heptv2_b48_estimated.json & pids+=($!)
  fit "$fused" configs/fit/h100_hit_heptv2_fused_b48_estimated.json & pids+=($!)
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  return $rc
}

predictions() {
  local session
  session=$("$bin/python" -c 'from heptstudy.estimate.predictions import session_facts
d = session_facts()["data"]
print(d["events_train"], d["events_test"], d["seed"])') || return 1
  # shellcheck disable=SC2086 # three words: events_train events_test seed
  generate "$gpu_data" $session
  if "$bin/heptstudy" study predict --matrix configs/study/gpu.yaml --data-dir "$gpu_data" \
    --jobs "$jobs" --out experiments/gpu_blind_predictions/predictions.json \
    >"$logs/predictions.log" 2>&1; then
    cat "$logs/predictions.log"
  else
    echo "FAILED: the blind predictions ($logs/predictions.log):"
    tail -3 "$logs/predictions.log"
    return 1
  fi
}

pids=() rc=0
[ "$only" = predictions ] || { fits & pids+=($!); }
[ "$only" = fits ] || { predictions & pids+=($!); }
for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
exit $rc

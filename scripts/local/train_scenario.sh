#!/usr/bin/env bash
# Local smoke run of a training scenario: one CPU process (configs/training/platforms/local_cpu.yaml).
#
#   scripts/local/train_scenario.sh SCENARIO --variant NAME [--resume PATH] [--set KEY=VALUE ...]
#
# SCENARIO is a file or a name in configs/training/scenarios. The production budget is deliberately
# replaced from the environment (defaults in brackets):
#   GLOBAL_BATCH_SIZE [8] NUM_STEPS [4] VAL_FREQ [2] CHECKPOINT_FREQ [2] NVALID [8] NTEST [8]
#   NUM_WORKERS [0]    -> train.global_batch_size, train.num_steps, train.val_freq,
#                         train.checkpoint_freq, data.nvalid, data.ntest, data.num_workers
#   VALIDATION_DIAGNOSTICS_BATCHES -> train.validation_diagnostics_batches when the schema has that
#                         key; otherwise accepted and reserved (reported, nothing set)
#   RESUME=PATH        same as --resume PATH (passed to `heptstudy train`)
#   DATA_DIR           -> data.data_dir;  OUT_DIR -> train.out_dir (root: ROOT/SCENARIO/VARIANT)
#   RENDER_DIR         where the resolved configuration is written
#                      [experiments/local/train/_rendered/SCENARIO/local_cpu]
# Every resolution still checks the scenario's invariants (heptstudy.scenario.RULES).
set -euo pipefail
echo "NOTE: local smoke run with NOT production settings: the scenario's budget is overridden" \
  "(global batch ${GLOBAL_BATCH_SIZE:=8}, ${NUM_STEPS:=4} steps, one CPU process, float32)."

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY=python3; fi
. "$ROOT/scripts/lib/real_path.sh"
if [ -x "$ROOT/.venv/bin/heptstudy" ]; then HEPTSTUDY="$ROOT/.venv/bin/heptstudy"; else HEPTSTUDY=heptstudy; fi

usage() { echo "usage: $0 SCENARIO --variant NAME [--resume PATH] [--set KEY=VALUE ...]" >&2; exit 2; }
[ $# -ge 1 ] || usage
SCENARIO="$1"; shift
VARIANT=""; RESUME="${RESUME:-}"; SETS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --variant) VARIANT="${2:?--variant needs a NAME}"; shift 2 ;;
    --variant=*) VARIANT="${1#*=}"; shift ;;
    --resume) RESUME="${2:?--resume needs a PATH}"; shift 2 ;;
    --resume=*) RESUME="${1#*=}"; shift ;;
    --set) SETS+=(--set "${2:?--set needs KEY=VALUE}"); shift 2 ;;
    --set=*) SETS+=(--set "${1#*=}"); shift ;;
    *) echo "unknown argument: $1" >&2; usage ;;
  esac
done
[ -n "$VARIANT" ] || { echo "--variant NAME is required" >&2; usage; }

SETS=(
  --set "train.global_batch_size=$GLOBAL_BATCH_SIZE"
  --set "train.num_steps=$NUM_STEPS"
  --set "train.val_freq=${VAL_FREQ:-2}"
  --set "train.checkpoint_freq=${CHECKPOINT_FREQ:-2}"
  --set "data.nvalid=${NVALID:-8}"
  --set "data.ntest=${NTEST:-8}"
  --set "data.num_workers=${NUM_WORKERS:-0}"
  ${DATA_DIR:+--set "data.data_dir=$DATA_DIR"}
  ${OUT_DIR:+--set "train.out_dir=$OUT_DIR"}
  "${SETS[@]+"${SETS[@]}"}"
)
if [ -n "${VALIDATION_DIAGNOSTICS_BATCHES:-}" ]; then
  if "$PY" -c "import sys; from heptstudy.config import TrainConfig; sys.exit('validation_diagnostics_batches' not in TrainConfig.model_fields)"; then
    SETS+=(--set "train.validation_diagnostics_batches=$VALIDATION_DIAGNOSTICS_BATCHES")
  else
    echo "VALIDATION_DIAGNOSTICS_BATCHES=$VALIDATION_DIAGNOSTICS_BATCHES accepted but reserved:" \
      "the configuration schema has no train.validation_diagnostics_batches yet; nothing set."
  fi
fi

NAME="$(basename "$SCENARIO" .yaml)"
RENDER_DIR="$(real_path "${RENDER_DIR:-$ROOT/experiments/local/train/_rendered/$NAME/local_cpu}" RENDER_DIR)"
"$PY" -m heptstudy.cli scenario render --scenario "$SCENARIO" \
  --platform "$ROOT/configs/training/platforms/local_cpu.yaml" --variant "$VARIANT" \
  --out "$RENDER_DIR" "${SETS[@]}"

CMD=("$HEPTSTUDY" train --config "$RENDER_DIR/$VARIANT.yaml")
[ -z "$RESUME" ] || CMD+=(--resume "$RESUME")
echo "running: ${CMD[*]}"
exec "${CMD[@]}"

#!/usr/bin/env bash
# Render and submit both variants of a training scenario on LUMI-G.
#
#   scripts/lumi/train_scenario.sh SCENARIO [mi250x] [--variant NAME] [--set KEY=VALUE ...]
#                                  [--resume PATH] [--out DIR]
#
# The profile is configs/training/platforms/lumi_PROFILE.yaml (PROFILE defaults to mi250x).
# `heptstudy scenario render` resolves the scenario, checks every invariant and writes one Slurm
# batch script per variant (plus the resolved configurations) into DIR
# [experiments/train/_rendered/SCENARIO/lumi_PROFILE]. With sbatch on PATH both are submitted;
# without it they are printed and nothing is submitted. Set SBATCH_ACCOUNT (project_...) unless
# the profile names an account.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY=python3; fi
[ $# -ge 1 ] || { echo "usage: $0 SCENARIO [mi250x] [--variant NAME] [--set KEY=VALUE ...] [--resume PATH] [--out DIR]" >&2; exit 2; }
SCENARIO="$1"; shift
PROFILE=mi250x
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then PROFILE="$1"; shift; fi
PLATFORM="$ROOT/configs/training/platforms/lumi_$PROFILE.yaml"
OUT="$ROOT/experiments/train/_rendered/$(basename "$SCENARIO" .yaml)/lumi_$PROFILE"
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="${2:?--out needs a DIR}"; shift 2 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done

"$PY" -m heptstudy.scenario render --scenario "$SCENARIO" --platform "$PLATFORM" --out "$OUT" \
  "${ARGS[@]+"${ARGS[@]}"}"

mapfile -t SCRIPTS < "$OUT/launch_scripts.txt"
if command -v sbatch >/dev/null 2>&1; then
  for s in "${SCRIPTS[@]}"; do echo "submitting $s"; sbatch "$s"; done
else
  for s in "${SCRIPTS[@]}"; do echo "===== $s"; cat "$s"; done
  echo "sbatch not found: nothing was submitted. The batch scripts are written to:"
  printf '  %s\n' "${SCRIPTS[@]}"
fi

#!/usr/bin/env bash
# Shared by the cluster wrappers: render one Slurm batch script per variant of a scenario on a
# platform profile, then submit them with sbatch, or, where sbatch does not exist, print them,
# leave them on disk and say that nothing was submitted.
#
#   submit_scenario.sh PLATFORM_FILE RENDER_DIR SCENARIO [--variant NAME] [--set KEY=VALUE ...]
#                      [--resume PATH] [--out DIR]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY=python3; fi
PLATFORM="$1"; OUT="$2"; SCENARIO="$3"; shift 3
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="${2:?--out needs a DIR}"; shift 2 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done

"$PY" -m heptstudy.cli scenario render --scenario "$SCENARIO" --platform "$PLATFORM" --out "$OUT" \
  "${ARGS[@]+"${ARGS[@]}"}"

mapfile -t SCRIPTS < "$OUT/launch_scripts.txt"
if command -v sbatch >/dev/null 2>&1; then
  for s in "${SCRIPTS[@]}"; do echo "submitting $s"; sbatch "$s"; done
else
  for s in "${SCRIPTS[@]}"; do echo "===== $s"; cat "$s"; done
  echo "sbatch not found: nothing was submitted. The batch scripts are written to:"
  printf '  %s\n' "${SCRIPTS[@]}"
fi

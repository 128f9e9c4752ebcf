#!/usr/bin/env bash
# Shared by the cluster wrappers: render one Slurm batch script per variant of a scenario on a
# platform profile, then submit them with sbatch, or, where sbatch does not exist, print them,
# leave them on disk and say that nothing was submitted.
#
#   submit_scenario.sh PREFIX SCENARIO PROFILE [--variant NAME] [--set KEY=VALUE ...]
#                      [--resume PATH] [--out DIR]
#
# PROFILE is a name (configs/training/platforms/PREFIX+NAME.yaml) or the path of a profile file
# (holding a '/' or ending in .yaml); DIR defaults to experiments/local/train/_rendered/SCENARIO/P, P the
# profile's file name without .yaml. Paths given relative (SCENARIO, PROFILE, --out, --resume)
# are taken from the working directory, as by any command.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY=python3; fi
. "$ROOT/scripts/lib/real_path.sh"
PREFIX="$1"; SCENARIO="$2"; PROFILE="$3"; shift 3

if [[ "$PROFILE" == */* || "$PROFILE" == *.yaml ]]; then
  PLATFORM="$PROFILE"
  [ -f "$PLATFORM" ] || [ ! -f "$PLATFORM.yaml" ] || PLATFORM="$PLATFORM.yaml"
  if [ ! -f "$PLATFORM" ]; then
    [[ "$PROFILE" == /* ]] || WHERE=" ($PWD/$PROFILE, taken from the working directory)"
    KNOWN="$(cd "$ROOT/configs/training/platforms" && ls -- "$PREFIX"*.yaml | sed "s/^$PREFIX//; s/\.yaml$//")"
    echo "heptstudy: error: platform profile '$PROFILE'${WHERE:-} is not a file: give the" \
      "path of a profile YAML file, or a profile name:" $KNOWN >&2
    exit 2
  fi
  NAME="$(basename "$PLATFORM" .yaml)"
else
  PLATFORM="$ROOT/configs/training/platforms/$PREFIX$PROFILE.yaml"; NAME="$PREFIX$PROFILE"
fi
OUT="$ROOT/experiments/local/train/_rendered/$(basename "$SCENARIO" .yaml)/$NAME"
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="${2:?--out needs a DIR}"; shift 2 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
OUT="$(real_path "$OUT" "render folder (--out)")"

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

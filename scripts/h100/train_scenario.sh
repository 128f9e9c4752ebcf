#!/usr/bin/env bash
# Render and submit both variants of a training scenario on H100 nodes.
#
#   scripts/h100/train_scenario.sh SCENARIO [h100] [--variant NAME] [--set KEY=VALUE ...]
#                                  [--resume PATH] [--out DIR]
#
# The profile is configs/training/platforms/PROFILE.yaml (PROFILE defaults to h100), or PROFILE is
# the path of a profile file (holding a '/' or ending in .yaml; a relative one is taken from the
# working directory, as is --out).
# `heptstudy scenario render` resolves the scenario, checks every invariant and writes one Slurm
# batch script per variant (plus the resolved configurations) into DIR
# [experiments/local/train/_rendered/SCENARIO/PROFILE]. With sbatch on PATH both are submitted;
# without it they are printed and nothing is submitted. Set SBATCH_ACCOUNT and SBATCH_PARTITION unless
# the profile names them.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
[ $# -ge 1 ] || { echo "usage: $0 SCENARIO [h100] [--variant NAME] [--set KEY=VALUE ...] [--resume PATH] [--out DIR]" >&2; exit 2; }
SCENARIO="$1"; shift
PROFILE=h100
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then PROFILE="$1"; shift; fi
exec "$ROOT/scripts/lib/submit_scenario.sh" "" "$SCENARIO" "$PROFILE" "$@"

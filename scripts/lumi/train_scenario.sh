#!/usr/bin/env bash
# Render and submit both variants of a training scenario on LUMI-G.
#
#   scripts/lumi/train_scenario.sh SCENARIO [mi250x] [--variant NAME] [--set KEY=VALUE ...]
#                                  [--resume PATH] [--out DIR]
#
# The profile is configs/training/platforms/lumi_PROFILE.yaml (PROFILE defaults to mi250x), or
# PROFILE is the path of a profile file (holding a '/' or ending in .yaml; a relative one is taken
# from the working directory, as is --out).
# `heptstudy scenario render` resolves the scenario, checks every invariant and writes one Slurm
# batch script per variant (plus the resolved configurations) into DIR
# [experiments/local/train/_rendered/SCENARIO/lumi_PROFILE]. With sbatch on PATH both are submitted;
# without it they are printed and nothing is submitted. Set SBATCH_ACCOUNT (project_...) unless
# the profile names an account.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
[ $# -ge 1 ] || { echo "usage: $0 SCENARIO [mi250x] [--variant NAME] [--set KEY=VALUE ...] [--resume PATH] [--out DIR]" >&2; exit 2; }
SCENARIO="$1"; shift
PROFILE=mi250x
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then PROFILE="$1"; shift; fi
exec "$ROOT/scripts/lib/submit_scenario.sh" "lumi_" "$SCENARIO" "$PROFILE" "$@"

#!/usr/bin/env bash
# auto over 12 counted steps at a budget between the off and full peaks, and off and full timed
# over the same 13 batches (see README.md); on an otherwise idle machine, one process after the
# other. The off/full rounds, the parity and the by-module breakdown at batch 4 are the
# reference study's runs (`make reference`: experiments/cpu_reference/). Writes into OUT (the
# committed folder refuses bench outputs; copy them here afterwards).
# usage: experiments/checkpointing_limit_cpu_b4/run.sh DATA_DIR [OUT] [BUDGET_GIB]
set -euo pipefail
DATA=${1:?data dir}
OUT=${2:-experiments/local/checkpointing_limit_cpu_b4}
BUDGET=${3:-3.25}
B="heptstudy bench --batch-size 4 --platform local_cpu --data-dir $DATA --no-progress --steps 12 --warmup 1"
$B --checkpointing auto --set model.heptv2.memory_budget_gib=$BUDGET --output $OUT/auto12/auto_b4.json
$B --checkpointing off --passes timing --output $OUT/auto12/baseline_b4.json
$B --checkpointing full --passes timing --output $OUT/auto12/checkpointed_b4.json

#!/usr/bin/env bash
# The measurements of this folder, one process after the other (see README.md): the timed runs
# first (they need an otherwise idle machine), then the memory-only ones. Writes into OUT (the
# committed folder refuses bench outputs; copy them here afterwards).
# usage: experiments/checkpointing_limit_cpu_b4/run.sh DATA_DIR [OUT] [BUDGET_GIB]
set -euo pipefail
DATA=${1:?data dir}
OUT=${2:-experiments/local/checkpointing_limit_cpu_b4}
BUDGET=${3:-3.25}
B="heptstudy bench --batch-size 4 --platform local_cpu --data-dir $DATA --no-progress"
# parity of the full-size model at batch 1 (deterministic algorithms)
heptstudy bench --batch-size 1 --parity-only --deterministic --platform local_cpu \
  --data-dir "$DATA" --no-progress --output $OUT/parity_deterministic_b1.json
# off / full step times: 3 rounds of fresh processes, the pair one after the other
for r in 1 2 3; do
  $B --checkpointing off --passes timing --output $OUT/rounds/round$r/baseline_b4.json
  $B --checkpointing full --passes timing --output $OUT/rounds/round$r/checkpointed_b4.json
done
# auto (its default plan order) over 12 counted steps, and off and full over the same 13 batches
$B --checkpointing auto --set model.heptv2.memory_budget_gib=$BUDGET --steps 12 --warmup 1 \
  --output $OUT/auto12/auto_b4.json
$B --checkpointing off --passes timing --steps 12 --warmup 1 --output $OUT/auto12/baseline_b4.json
$B --checkpointing full --passes timing --steps 12 --warmup 1 --output $OUT/auto12/checkpointed_b4.json
# what the steps keep at their peaks, by module (memory pass only)
$B --checkpointing full --passes memory --output $OUT/breakdown/checkpointed_b4.json
$B --checkpointing off --passes memory --output $OUT/breakdown/baseline_b4.json

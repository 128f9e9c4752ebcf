#!/usr/bin/env bash
# The measurements of this folder, one process after the other (see README.md).
# usage: experiments/checkpointing_limit_cpu_b4/run.sh DATA_DIR [BUDGET_GIB]
set -euo pipefail
DATA=${1:?data dir}
BUDGET=${2:-3}
OUT=experiments/checkpointing_limit_cpu_b4
B="heptstudy bench --batch-size 4 --platform local_cpu --data-dir $DATA --no-progress"
# parity of the full-size model at batch 1 (deterministic algorithms)
heptstudy bench --batch-size 1 --parity-only --deterministic --platform local_cpu \
  --data-dir "$DATA" --no-progress --output $OUT/parity_deterministic_b1.json
# what the checkpointed step keeps at its peak, by module (memory pass only)
$B --checkpointing --passes memory --output $OUT/breakdown/checkpointed_b4.json
# off / full step times: 3 rounds of fresh processes, the pair one after the other
for r in 1 2 3; do
  $B --no-checkpointing --passes timing --output $OUT/rounds/round$r/baseline_b4.json
  $B --checkpointing --passes timing --output $OUT/rounds/round$r/checkpointed_b4.json
done
# auto over 12 counted steps, and off and full over the same 13 batches
$B --auto-checkpointing --set model.heptv2.memory_budget_gib=$BUDGET \
  --set "model.heptv2.auto_plan_order=[layers1,layers3,full]" --steps 12 --warmup 1 \
  --output $OUT/auto12/auto_b4.json
$B --no-checkpointing --passes timing --steps 12 --warmup 1 --output $OUT/auto12/baseline_b4.json
$B --checkpointing --passes timing --steps 12 --warmup 1 --output $OUT/auto12/checkpointed_b4.json
# the uncheckpointed step's breakdown, last
$B --no-checkpointing --passes memory --output $OUT/breakdown/baseline_b4.json

#!/bin/bash
# Paired timing rounds at batch 4, padded: in each round every plan in a fresh process, one after
# the other, the timing pass only. Run from anywhere; writes <plan>_r<round>.json here.
set -u
cd "$(dirname "$0")/../.."
out=experiments/front_timing_b4
for round in 1 2 3 4; do
  for plan in off full keep10 keep25 keep70; do
    .venv/bin/heptstudy bench --batch-size 4 --checkpointing "$plan" --platform local_cpu \
      --data-dir data/tfds --passes timing --no-progress --output "$out/${plan}_r$round.json" |
      grep -o 'mean step [0-9,]* ms' | sed "s/^/round $round $plan: /"
  done
done

#!/usr/bin/env bash
# The front at batch 4 timed in paired rounds (heptstudy bench paired): padded, then packed, on
# the generated data set of `make study-data`, with the reference's platform and batches. The
# reports are written to experiments/local/front_paired_b4/ (results folders are written only
# by the study) and copied here.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=experiments/local/front_paired_b4
mkdir -p "$out"
common=(--batch-size 4 --platform local_cpu --data-dir data/tfds --steps 2 --warmup 1)
.venv/bin/heptstudy bench paired full keep10 keep20 keep25 keep70 every2 every3 selective \
  --rounds 6 "${common[@]}" --output "$out/paired_b4.json"
.venv/bin/heptstudy bench paired full keep10 keep20 keep25 keep70 \
  --rounds 4 --batching packed "${common[@]}" --output "$out/packed_paired_b4.json"
cp "$out"/paired_b4.json "$out"/packed_paired_b4.json experiments/front_paired_b4/
# goal 2 (at every2's memory or less, at most +3%): keep70 alone in more rounds
.venv/bin/heptstudy bench paired keep70 --rounds 12 "${common[@]}" --output "$out/keep70_paired_b4.json"
cp "$out"/keep70_paired_b4.json experiments/front_paired_b4/
# the floor of every solver plan: every layer checkpointed keeping every group (keep100), its time
# paired and its peak (one memory pass)
.venv/bin/heptstudy bench paired keep100 --rounds 8 "${common[@]}" --output "$out/keep100_paired_b4.json"
.venv/bin/heptstudy bench --checkpointing keep100 --passes memory "${common[@]}" \
  --output "$out/keep100_memory_b4.json"
cp "$out"/keep100_paired_b4.json "$out"/keep100_memory_b4.json experiments/front_paired_b4/

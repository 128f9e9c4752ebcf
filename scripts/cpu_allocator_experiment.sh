#!/usr/bin/env bash
# Why checkpointed steps can be faster on a CPU: the same bench runs (batch 1 and 4, off and full
# checkpointing) with glibc's default allocator and with one told to keep freed memory
# (large mmap and trim thresholds), so that a step reuses pages instead of having the kernel map
# and zero fresh ones. Minor page faults and times of each whole process come from GNU time.
#
#   bash scripts/cpu_allocator_experiment.sh [DATA_DIR] [OUT_DIR]
#
# Writes OUT_DIR/{default,retain}_{baseline,checkpointed}_b{1,4}.json (bench reports; they record
# the allocator settings and each step's page faults and system time) and OUT_DIR/processes.tsv. Synthetic data unless DATA_DIR holds real events. About 12 minutes on
# two cores.
set -euo pipefail
data_dir=${1:-data/tfds}
out=${2:-experiments/cpu_allocator}
bin=${BIN:-.venv/bin}
mkdir -p "$out"
printf "allocator\trun\twall_s\tuser_s\tsys_s\tminor_faults\tmax_rss_kib\n" > "$out/processes.tsv"
for allocator in default retain; do
  for batch in 1 4; do
    for mode in baseline checkpointed; do
      flag="--checkpointing off"
      [ "$mode" = checkpointed ] && flag="--checkpointing full"
      name="${allocator}_${mode}_b${batch}"
      # "default": started without any allocator variable; "retain": started with the
      # settings of configs/training/platforms/local_cpu.yaml (each report records which). The
      # measurement applies them itself too (mallopt), and GNU time measures that one process.
      env_vars=(-u MALLOC_MMAP_THRESHOLD_ -u MALLOC_TRIM_THRESHOLD_ -u MALLOC_TOP_PAD_)
      line=default
      if [ "$allocator" = retain ]; then
        env_vars+=(MALLOC_MMAP_THRESHOLD_=17179869184 MALLOC_TRIM_THRESHOLD_=17179869184
                   MALLOC_TOP_PAD_=1073741824)
        line=platform
      fi
      /usr/bin/time -o "$out/.time" -f "%e\t%U\t%S\t%R\t%M" \
        env "${env_vars[@]}" "$bin/heptstudy" bench --allocator "$line" --batch-size "$batch" $flag \
          --steps 2 --warmup 1 --data-dir "$data_dir" --no-progress \
          --output "$out/$name.json" > "$out/.log" 2>&1 || { cat "$out/.log"; exit 1; }
      printf "%s\t%s\t%s\n" "$allocator" "$name" "$(cat "$out/.time")" >> "$out/processes.tsv"
      echo "$name: $(cat "$out/.time")"
    done
  done
done
rm -f "$out/.time" "$out/.log"

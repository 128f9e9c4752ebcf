#!/usr/bin/env bash
# Which host allocator serves CPU step times best: glibc as it comes, glibc keeping freed memory
# (the local_cpu profile), jemalloc and tcmalloc (preloaded), at batch 4 with and without full
# checkpointing, timed steps only. Each allocator gets a platform profile (local_cpu with its
# own env) written into OUT_DIR, so every report records what its process ran with.
#
#   bash scripts/cpu_allocator_libraries.sh [DATA_DIR] [OUT_DIR]
#
# jemalloc and tcmalloc are looked up in the usual library folders (Debian: libjemalloc2,
# libtcmalloc-minimal4); an allocator not installed is skipped and said so. Writes
# OUT_DIR/<allocator>_<mode>_b4.json and OUT_DIR/processes.tsv (GNU time). About 10 minutes on
# two cores; synthetic data unless DATA_DIR holds real events.
set -euo pipefail
data_dir=${1:-data/tfds}
out=${2:-experiments/cpu_allocator_libraries}
bin=${BIN:-.venv/bin}
mkdir -p "$out"
find_lib() {
  for dir in /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib /usr/local/lib; do
    for f in "$dir"/$1; do [ -e "$f" ] && { echo "$f"; return; }; done
  done
}
profile() {  # profile NAME ENV_YAML: local_cpu with another env block
  sed '/^env:/,$d' configs/training/platforms/local_cpu.yaml > "$out/platform_$1.yaml"
  printf "env:\n%s\n" "$2" >> "$out/platform_$1.yaml"
  sed -i "s/^name: local_cpu/name: local_cpu_$1/" "$out/platform_$1.yaml"
}
allocators=(default retain)
jemalloc=$(find_lib "libjemalloc.so*"); tcmalloc=$(find_lib "libtcmalloc_minimal.so*")
[ -n "$jemalloc" ] && { profile jemalloc "  LD_PRELOAD: \"$jemalloc\""; allocators+=(jemalloc); } \
  || echo "jemalloc not installed: skipped"
[ -n "$tcmalloc" ] && { profile tcmalloc "  LD_PRELOAD: \"$tcmalloc\""; allocators+=(tcmalloc); } \
  || echo "tcmalloc not installed: skipped"
printf "allocator\trun\twall_s\tuser_s\tsys_s\tminor_faults\tmax_rss_kib\n" > "$out/processes.tsv"
for mode in baseline checkpointed; do
  flag="--checkpointing off"
  [ "$mode" = checkpointed ] && flag="--checkpointing full"
  for allocator in "${allocators[@]}"; do
    case $allocator in
      default) how=(--platform local_cpu --allocator default); pre=() ;;
      retain) how=(--platform local_cpu); pre=() ;;
      # a preloaded allocator takes effect only in a process started with it
      jemalloc) how=(--platform "$out/platform_$allocator.yaml"); pre=(env "LD_PRELOAD=$jemalloc") ;;
      tcmalloc) how=(--platform "$out/platform_$allocator.yaml"); pre=(env "LD_PRELOAD=$tcmalloc") ;;
    esac
    name="${allocator}_${mode}_b4"
    /usr/bin/time -o "$out/.time" -f "%e\t%U\t%S\t%R\t%M" \
      "${pre[@]}" "$bin/heptstudy" bench "${how[@]}" --batch-size 4 $flag --passes timing \
        --steps 4 --warmup 1 --data-dir "$data_dir" --no-progress \
        --output "$out/$name.json" > "$out/.log" 2>&1 || { cat "$out/.log"; exit 1; }
    printf "%s\t%s\t%s\n" "$allocator" "$name" "$(cat "$out/.time")" >> "$out/processes.tsv"
    echo "$name: $(cat "$out/.time")"
  done
done
rm -f "$out/.time" "$out/.log"

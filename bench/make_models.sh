#!/usr/bin/env bash
# bench/make_models.sh - `rebound make-model` at the named shapes: time,
# file size, and tensor bytes against the sizes llama.cpp reports for the
# same shapes (shared/models/README.md, llama-bench "size" column).
# Verifies each file with `rebound info` before reporting it.
#
# usage: bench/make_models.sh [BUILD_DIR] [TYPES...]   (default: build q4_0 q4_k_m q8_0)
# Prints one machine-readable line per result ("result ...") and a table.
# Needs ~2.5 GB free in $TMPDIR; files are deleted as it goes.
set -euo pipefail
build=${1:-build}
shift || true
types=("$@")
[ ${#types[@]} -gt 0 ] || types=(q4_0 q4_k_m q8_0)
rebound="$build/rebound"
[ -x "$rebound" ] || { echo "no $rebound: build first (cmake -B build && cmake --build build -j2)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
threads=$(nproc)
# llama.cpp's sizes (MiB) for these shapes, from shared/models/README.md
declare -A llama_mib=([tinyllama-1.1b/q4_0]=606.5 [tinyllama-1.1b/q4_k_m]=636.2 [tinyllama-1.1b/q8_0]=1114.9
                      [llama3.2-1b/q4_0]=727.8 [llama3.2-1b/q8_0]=1252.4
                      [smollm2-360m/q4_0]=200.1 [smollm2-360m/q8_0]=350.1)
rows=()
for shape in smollm2-360m qwen3-0.6b tinyllama-1.1b llama3.2-1b; do
  for type in "${types[@]}"; do
    f="$tmp/$shape-$type.gguf"
    start=$(date +%s.%N)
    "$rebound" make-model --shape "$shape" --type "$type" -o "$f" >/dev/null 2>"$tmp/notes"
    secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
    info=$("$rebound" info "$f")
    bytes=$(stat -c %s "$f")
    data=$(echo "$info" | sed -n 's/^weights *\([0-9,]*\) bytes.*/\1/p' | tr -d ,)
    data_mib=$(awk -v d="$data" 'BEGIN { printf "%.1f", d / 1048576 }')
    ref=${llama_mib[$shape/$type]:-}
    echo "result bench=make-model commit=$commit cc=$(cc --version | head -1 | awk '{print $NF}') cpu=\"$cpu\" threads=$threads shape=$shape type=$type seconds=$secs file_bytes=$bytes tensor_mib=$data_mib llama_cpp_mib=${ref:-na}"
    rows+=("$(printf '| %-15s | %-7s | %8.2f | %10s | %10s | %s |' "$shape" "$type" "$secs" "$data_mib" "${ref:-n/a}" "$(wc -l <"$tmp/notes") fallbacks")")
    rm -f "$f"
  done
done
echo
echo "rebound make-model, $threads threads, $cpu, commit $commit"
echo "| shape           | type    | seconds  | tensor MiB | llama.cpp MiB | notes |"
echo "|-----------------|---------|----------|------------|---------------|-------|"
printf '%s\n' "${rows[@]}"

#!/usr/bin/env bash
# bench/vs_llamacpp.sh - llama-bench against `rebound bench` in the same run:
# for every round, for every model file, one llama-bench run and one rebound
# run of the same tests (alternating, so that a change in the machine's load
# falls on both), then a markdown table of the medians over the rounds with
# the ratio rebound / llama.cpp, the CPU, the load average before and after,
# and both commits.
#
# usage: bench/vs_llamacpp.sh LLAMA_BENCH REBOUND MODEL.gguf [MODEL.gguf..] [-- BENCH_ARGS..]
#   LLAMA_BENCH  path of llama.cpp's llama-bench (its build's commit is read
#                from the git checkout it sits in, when there is one)
#   REBOUND      path of the rebound binary (build/rebound)
#   BENCH_ARGS   the tests, passed to both tools as they are (default:
#                -p 512 -n 128 -t 2 -r 1); both accept -p -n -pg -d -t -r
#   ROUNDS=3     rounds (environment); REBOUND_COMMIT names the commit of a
#                rebound binary that is not in its git checkout, LLAMA_COMMIT
#                that of a llama.cpp built from an exported tree
# Each run's results are read from -o jsonl (llama-bench's field names,
# which rebound bench writes too): n_prompt, n_gen, n_depth, avg_ts.
# Needs python3 for the table.
set -euo pipefail
[ $# -ge 3 ] || { sed -n '2,/^set -e/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//' >&2; exit 2; }
llama_bench=$1
rebound=$2
shift 2
models=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do models+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(-p 512 -n 128 -t 2 -r 1)
rounds=${ROUNDS:-3}
[ -x "$llama_bench" ] || { echo "vs_llamacpp: no llama-bench at $llama_bench" >&2; exit 1; }
[ -x "$rebound" ] || { echo "vs_llamacpp: no rebound at $rebound" >&2; exit 1; }
for m in "${models[@]}"; do
  [ -f "$m" ] || { echo "vs_llamacpp: no model file $m" >&2; exit 1; }
done
command -v python3 >/dev/null || { echo "vs_llamacpp: python3 is needed for the table" >&2; exit 1; }

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
load0=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq 1 "$rounds"); do
  for m in "${models[@]}"; do
    name=$(basename "$m")
    "$llama_bench" -m "$m" "${args[@]}" -o jsonl 2>"$out/err" |
      sed "s|^|{\"tool\": \"llama.cpp\", \"file\": \"$name\", \"round\": $r, \"r\": |; s|\$|}|" >>"$out/all.jsonl" ||
      { cat "$out/err" >&2; exit 1; }
    "$rebound" bench -m "$m" "${args[@]}" -o jsonl 2>"$out/err" |
      sed "s|^|{\"tool\": \"rebound\", \"file\": \"$name\", \"round\": $r, \"r\": |; s|\$|}|" >>"$out/all.jsonl" ||
      { cat "$out/err" >&2; exit 1; }
    echo "round $r $name done (load $(cut -d' ' -f1 /proc/loadavg))" >&2
  done
done
load1=$(cut -d' ' -f1-3 /proc/loadavg)

cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//') (family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' '), model $(grep -m1 '^model[[:space:]]' /proc/cpuinfo | cut -d: -f2 | tr -d ' '); $(grep -qw avx512f /proc/cpuinfo && echo AVX-512 || echo no AVX-512))"
# REBOUND_COMMIT names a binary copied out of its checkout
rb_commit=${REBOUND_COMMIT:-$(git -C "$(dirname "$(readlink -f "$rebound")")" rev-parse --short HEAD 2>/dev/null || echo unknown)}
lc_commit=${LLAMA_COMMIT:-$(git -C "$(dirname "$(readlink -f "$llama_bench")")" rev-parse --short HEAD 2>/dev/null || echo unknown)}
echo "Command: \`bench/vs_llamacpp.sh $llama_bench $rebound ${models[*]} -- ${args[*]}\` (ROUNDS=$rounds)"
echo
echo "CPU: $cpu, $(nproc) cores. rebound $rb_commit, llama.cpp $lc_commit. Load average (1, 5, 15 min) before: $load0, after: $load1."
echo
python3 - "$out/all.jsonl" "$rounds" <<'EOF'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    line = line.strip()
    if not line:
        continue
    o = json.loads(line)
    r = o["r"]
    test = ("pp%d" % r["n_prompt"] if r["n_prompt"] else "") + ("+" if r["n_prompt"] and r["n_gen"] else "") + \
           ("tg%d" % r["n_gen"] if r["n_gen"] else "")
    if r.get("n_depth", 0):
        test += " @ d%d" % r["n_depth"]
    key = (o["file"], r["n_threads"], test)
    rows.setdefault(key, {}).setdefault(o["tool"], []).append(r["avg_ts"])
print("| file | threads | test | llama.cpp tok/s | rebound tok/s | rebound / llama.cpp | per round |")
print("|---|---|---|---|---|---|---|")
for key in rows:
    lc, rb = rows[key].get("llama.cpp", []), rows[key].get("rebound", [])
    if not lc or not rb:
        continue
    a, b = statistics.median(lc), statistics.median(rb)
    per = " ".join("%.2f" % (y / x) for x, y in zip(lc, rb))
    print("| %s | %d | %s | %.2f | %.2f | **%.2fx** | %s |" % (key[0], key[1], key[2], a, b, b / a, per))
EOF

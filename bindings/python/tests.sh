#!/usr/bin/env bash
# tests.sh - the Python binding's tests (CTest's python_bindings): makes two
# small random-weight models with `rebound make-model` and runs pytest on
# tests/ with the librebound of this build (REBOUND_LIBRARY).
#
# usage: tests.sh SKIP_REASON PRELOAD PYTHON REBOUND_BIN LIBREBOUND SCRATCH SRC_DIR
#   SKIP_REASON non-empty: print it and exit 77. PYTHON must import cffi and
#   pytest (else 77 too).
#   PRELOAD: "" or the sanitizer runtimes of a sanitizer build (gcc's
#   libasan and libubsan): preloaded into the interpreter and everything
#   this script starts, with ASan's leak check off (the interpreter's own
#   allocations are not the library's; the C tests check its leaks) and
#   its SEGV handler off (the JVM takes SEGV for its own checks).
# Writes only into SCRATCH. Exit 0 pass, 77 skipped, else failure.
set -euo pipefail
[ $# -eq 7 ] || { echo "usage: $0 SKIP_REASON PRELOAD PYTHON REBOUND_BIN LIBREBOUND SCRATCH SRC_DIR" >&2; exit 2; }
WHY=$1 PRELOAD=$2 PY=$3 REBOUND=$4 LIB=$5 SCRATCH=$6 SRC=$7
if [ -n "$WHY" ]; then
    echo "SKIP [python_bindings]: $WHY"
    exit 77
fi
fail() { echo "FAIL [python_bindings]: $*" >&2; exit 1; }
for m in cffi pytest; do
    "$PY" -c "import $m" 2>/dev/null || {
        echo "SKIP [python_bindings]: $PY cannot import $m (scripts/deps.sh installs it: Debian python3-$m)"
        exit 77
    }
done
[ -f "$LIB" ] || fail "$LIB does not exist (build first)"
case "$SCRATCH" in ""|/) fail "refusing scratch dir '$SCRATCH'" ;; esac
rm -rf "$SCRATCH"
mkdir -p "$SCRATCH"
cd "$SCRATCH"
if [ -n "$PRELOAD" ]; then
    export LD_PRELOAD="$PRELOAD${LD_PRELOAD:+ $LD_PRELOAD}"
    export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0:handle_segv=0:allow_user_segv_handler=1"
    echo "-- sanitizer build: LD_PRELOAD=$LD_PRELOAD ASAN_OPTIONS=$ASAN_OPTIONS"
fi
"$REBOUND" make-model --shape tiny --type q8_0 -o tiny.gguf > mk.log 2>&1 || { cat mk.log >&2; fail "make-model"; }
"$REBOUND" make-model --arch qwen3 --vocab-style bpe --dim 64 --layers 2 --heads 4 \
    --kv-heads 2 --ffn 256 --vocab 1024 --ctx 256 --type q8_0 -o qwen.gguf > mkq.log 2>&1 \
    || { cat mkq.log >&2; fail "make-model qwen3"; }
export REBOUND_LIBRARY=$LIB REBOUND_BIN=$REBOUND REBOUND_INCLUDE_DIR=$(dirname "$SRC")/../include
export REBOUND_TEST_MODEL=$SCRATCH/tiny.gguf REBOUND_TEST_MODEL_BPE=$SCRATCH/qwen.gguf
export PYTHONPATH=$SRC${PYTHONPATH:+:$PYTHONPATH} PYTHONDONTWRITEBYTECODE=1
"$PY" -m pytest -q -p no:cacheprovider --basetemp="$SCRATCH/tmp" "$SRC/tests" \
    || fail "pytest (above)"
echo "PASS [python_bindings]"

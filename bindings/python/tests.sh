#!/usr/bin/env bash
# tests.sh - the Python binding's tests (CTest's python_bindings): makes two
# small random-weight models with `rebound make-model` and runs pytest on
# tests/ with the librebound of this build (REBOUND_LIBRARY).
#
# usage: tests.sh SKIP_REASON PYTHON REBOUND_BIN LIBREBOUND SCRATCH SRC_DIR
#   SKIP_REASON non-empty: print it and exit 77. PYTHON must import cffi and
#   pytest (else 77 too).
# Writes only into SCRATCH. Exit 0 pass, 77 skipped, else failure.
set -euo pipefail
[ $# -eq 6 ] || { echo "usage: $0 SKIP_REASON PYTHON REBOUND_BIN LIBREBOUND SCRATCH SRC_DIR" >&2; exit 2; }
WHY=$1 PY=$2 REBOUND=$3 LIB=$4 SCRATCH=$5 SRC=$6
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

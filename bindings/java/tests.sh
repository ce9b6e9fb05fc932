#!/usr/bin/env bash
# tests.sh - the Java binding's tests (CTest's java_bindings): the JUnit 5
# tests (src/test/java) on a small random-weight model, then
# examples/Generate.java against `rebound run --temp 0` on the same files
# and prompts: the same bytes.
#
# usage: tests.sh SKIP_REASON PRELOAD REBOUND_BIN SCRATCH JAVA JAR TESTS_JAR JNI_LIB JUNIT_JAR SRC_DIR
#   SKIP_REASON non-empty: print it and exit 77 (the binding was not built).
#   PRELOAD: "" or the sanitizer runtimes of a sanitizer build (gcc's
#   libasan and libubsan): preloaded into the interpreter and everything
#   this script starts, with ASan's leak check off (the interpreter's own
#   allocations are not the library's; the C tests check its leaks) and
#   its SEGV handler off (the JVM takes SEGV for its own checks).
# Writes only into SCRATCH. Exit 0 pass, 77 skipped, else failure.
set -euo pipefail
[ $# -eq 10 ] || { echo "usage: $0 SKIP_REASON PRELOAD REBOUND_BIN SCRATCH JAVA JAR TESTS_JAR JNI_LIB JUNIT_JAR SRC_DIR" >&2; exit 2; }
WHY=$1 PRELOAD=$2 REBOUND=$3 SCRATCH=$4 JAVA=$5 JAR=$6 TESTS_JAR=$7 JNI=$8 JUNIT=$9 SRC=${10}
if [ -n "$WHY" ]; then
    echo "SKIP [java_bindings]: $WHY"
    exit 77
fi
fail() { echo "FAIL [java_bindings]: $*" >&2; exit 1; }
for f in "$JAR" "$TESTS_JAR" "$JNI" "$JUNIT"; do
    [ -f "$f" ] || fail "$f does not exist (build first: cmake --build build)"
done
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

echo "-- JUnit: $(basename "$TESTS_JAR")"
"$JAVA" -Drebound.jni.library="$JNI" -Drebound.test.model="$SCRATCH/tiny.gguf" \
    -Drebound.test.dir="$SCRATCH" -jar "$JUNIT" --disable-banner --disable-ansi-colors --details=tree \
    --fail-if-no-tests --class-path "$JAR:$TESTS_JAR" --scan-class-path "$TESTS_JAR" \
    || fail "JUnit tests failed (above)"

# the ComponentCallbacks2 glue, compiled against stand-ins of the four
# Android types it uses (src/test/android-stubs; a real android.jar builds
# it in CMake when one is found): it compiles, calls AndroidMemory with
# Android's constants, and the stand-ins' constants are AndroidMemory's
JAVAC=$(dirname "$JAVA")/javac
if [ -x "$JAVAC" ]; then
    echo "-- android/ReboundMemoryCallbacks.java compiles against the Android stand-ins"
    mkdir -p glue
    "$JAVAC" -nowarn -d glue -cp "$JAR" $(find "$SRC/src/test/android-stubs" -name '*.java') \
        "$SRC/android/org/rebound/android/ReboundMemoryCallbacks.java" > glue.log 2>&1 \
        || { cat glue.log >&2; fail "the Android glue does not compile"; }
    cat > glue/GlueCheck.java <<'JAVA'
import android.content.ComponentCallbacks2;
import org.rebound.AndroidMemory;
public class GlueCheck {
    public static void main(String[] a) {
        int[][] pairs = {
            {ComponentCallbacks2.TRIM_MEMORY_RUNNING_MODERATE, AndroidMemory.TRIM_MEMORY_RUNNING_MODERATE},
            {ComponentCallbacks2.TRIM_MEMORY_RUNNING_LOW, AndroidMemory.TRIM_MEMORY_RUNNING_LOW},
            {ComponentCallbacks2.TRIM_MEMORY_RUNNING_CRITICAL, AndroidMemory.TRIM_MEMORY_RUNNING_CRITICAL},
            {ComponentCallbacks2.TRIM_MEMORY_UI_HIDDEN, AndroidMemory.TRIM_MEMORY_UI_HIDDEN},
            {ComponentCallbacks2.TRIM_MEMORY_BACKGROUND, AndroidMemory.TRIM_MEMORY_BACKGROUND},
            {ComponentCallbacks2.TRIM_MEMORY_MODERATE, AndroidMemory.TRIM_MEMORY_MODERATE},
            {ComponentCallbacks2.TRIM_MEMORY_COMPLETE, AndroidMemory.TRIM_MEMORY_COMPLETE}};
        for (int[] p : pairs)
            if (p[0] != p[1])
                throw new AssertionError(p[0] + " != " + p[1]);
    }
}
JAVA
    "$JAVA" -cp "glue:$JAR" glue/GlueCheck.java || fail "Android's trim levels differ from AndroidMemory's"
fi

# the ~20-line program: the same greedy text as `rebound run`
n=0
for model in tiny.gguf qwen.gguf; do
    for prompt in "Once upon a time" "The cat sat on"; do
        n=$((n + 1))
        echo "-- examples/Generate.java vs rebound run --temp 0: $model, '$prompt'"
        "$REBOUND" run -m "$model" -p "$prompt" -n 24 --temp 0 > run$n.out 2> run$n.err \
            || { cat run$n.err >&2; fail "rebound run"; }
        "$JAVA" -Drebound.jni.library="$JNI" -cp "$JAR" "$SRC/examples/Generate.java" \
            "$model" "$prompt" 24 > java$n.out 2> java$n.err || { cat java$n.err >&2; fail "Generate.java"; }
        [ -s run$n.out ] || fail "rebound run printed nothing"
        cmp run$n.out java$n.out || {
            echo "--- rebound run:"; cat run$n.out; echo; echo "--- Generate.java:"; cat java$n.out; echo
            fail "Generate.java and rebound run differ ($model, '$prompt')"
        }
    done
done
echo "PASS [java_bindings]: JUnit, and Generate.java = rebound run on $n model/prompt pairs"

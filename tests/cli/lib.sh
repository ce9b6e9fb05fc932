# lib.sh - helpers shared by the end-to-end tests of the `rebound` command.
# Sourced (not run) by tests/cli/cli_*.sh after `set -euo pipefail`.
#
# Every script is called by CTest as
#   bash tests/cli/<name>.sh REBOUND_BIN SCRATCH_DIR [MODELS_DIR]
# SCRATCH_DIR lies in the build tree; the script empties it first and writes
# nowhere else. Exit 0 = pass, 77 = skipped, anything else = failure.

if [ $# -lt 2 ]; then
    echo "usage: $0 REBOUND_BIN SCRATCH_DIR [MODELS_DIR]" >&2
    exit 2
fi
REBOUND=$1
SCRATCH=$2
[ -x "$REBOUND" ] || { echo "FAIL: rebound binary '$REBOUND' is not executable" >&2; exit 1; }
case "$SCRATCH" in
    ""|/) echo "FAIL: refusing scratch dir '$SCRATCH'" >&2; exit 1 ;;
esac
REBOUND=$(cd "$(dirname "$REBOUND")" && pwd)/$(basename "$REBOUND")
CLI_DIR=$(cd "$(dirname "$0")" && pwd) # this folder: serve_lib.sh
rm -rf "$SCRATCH"
mkdir -p "$SCRATCH"
cd "$SCRATCH" || exit 1
SCRATCH=$(pwd)

# Counting: N_CHECKS counts assertions that ran and held (run_ok, run_fails,
# expect_line, and each `COND && ok || fail MSG` / `COND && fail MSG || ok`
# in the scripts); `check` only opens a section, and a section in which no
# assertion ran fails the test (a heading is not a check). An assertion in
# a subshell or $(...) is not counted: the count is a lower bound.
N_CHECKS=0
N_SECTIONS=0
SECTION=""
SECTION_START=0
TEST_NAME=$(basename "$0" .sh)

fail() {
    echo "FAIL [$TEST_NAME]: $*" >&2
    exit 1
}

ok() {      # ok: one assertion held
    N_CHECKS=$((N_CHECKS + 1))
}

end_section() {
    if [ -n "$SECTION" ] && [ "$N_CHECKS" -eq "$SECTION_START" ]; then
        fail "section '$SECTION' ran no check"
    fi
}

check() {   # check DESCRIPTION: open a section (print what is checked)
    end_section
    N_SECTIONS=$((N_SECTIONS + 1))
    SECTION=$*
    SECTION_START=$N_CHECKS
    echo "-- $*"
}

passed() {
    end_section
    [ "$N_CHECKS" -gt 0 ] || fail "no check ran"
    echo "PASS [$TEST_NAME]: $N_CHECKS checks in $N_SECTIONS sections"
}

# run_ok OUT_PREFIX CMD...: run, keep stdout/stderr in OUT_PREFIX.{out,err};
# fail if the exit status is not 0.
run_ok() {
    local p=$1
    shift
    local rc=0
    "$@" >"$p.out" 2>"$p.err" || rc=$?
    if [ $rc -ne 0 ]; then
        echo "command: $*" >&2
        echo "--- stdout" >&2; cat "$p.out" >&2
        echo "--- stderr" >&2; cat "$p.err" >&2
        fail "exit status $rc, expected 0"
    fi
    ok
}

# run_fails OUT_PREFIX EXPECTED_RC|any STDERR_REGEX CMD...: the command must
# exit non-zero (or exactly EXPECTED_RC) and its stderr must match the
# extended regex. It must not crash (status >= 128 means a signal).
run_fails() {
    local p=$1 want=$2 re=$3
    shift 3
    local rc=0
    "$@" >"$p.out" 2>"$p.err" </dev/null || rc=$?
    if [ $rc -eq 0 ]; then
        echo "command: $*" >&2
        fail "exit status 0, expected a failure"
    fi
    if [ $rc -eq 126 ] || [ $rc -eq 127 ]; then
        cat "$p.err" >&2
        fail "could not run: $*"
    fi
    if [ $rc -ge 128 ]; then
        echo "command: $*" >&2; cat "$p.err" >&2
        fail "killed by a signal (status $rc)"
    fi
    if [ "$want" != any ] && [ $rc -ne "$want" ]; then
        echo "command: $*" >&2; cat "$p.err" >&2
        fail "exit status $rc, expected $want"
    fi
    if ! grep -Eq -- "$re" "$p.err"; then
        echo "command: $*" >&2
        echo "--- stderr" >&2; cat "$p.err" >&2
        fail "stderr does not match /$re/"
    fi
    ok
}

# expect_line FILE REGEX: some line of FILE matches the extended regex.
expect_line() {
    if ! grep -Eq -- "$2" "$1"; then
        echo "--- $1" >&2; cat "$1" >&2
        fail "no line of $1 matches /$2/"
    fi
    ok
}

# tensor_table INFO_OUT: the `rebound info --tensors` table as
# "name type dims..." lines (header and summary dropped, offsets dropped).
tensor_table() {
    awk '/^tensor +type +dims/ { on = 1; next }
         on && NF >= 4 { line = $1 " " $2; for (i = 3; i < NF; i++) line = line " " $i; print line }' "$1"
}

# first_data_offset INFO_OUT: the smallest tensor file offset (decimal).
first_data_offset() {
    local min="" off
    for off in $(awk '/^tensor +type +dims/ { on = 1; next } on && NF >= 4 { print $NF }' "$1"); do
        off=$((off))
        if [ -z "$min" ] || [ "$off" -lt "$min" ]; then min=$off; fi
    done
    [ -n "$min" ] || fail "no tensor table in $1"
    echo "$min"
}

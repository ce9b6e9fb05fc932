#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test_readme.sh - the README says only what is true:
#   1. every ```c block compiles (C11, -Wall -Wextra -Werror) against the
#      built library and runs on a model made by `rebound make-model` (argv:
#      MODEL.gguf "Once upon a time"); a block whose usage line says
#      "greedy" prints exactly what `rebound run --temp 0 -n 32` generates;
#   2. every ```python block is valid Python (py_compile: it may need a
#      server or a package that is not here);
#   3. every `rebound ...` command line in a code block of the README and
#      of docs/reference.md, docs/serve.md and docs/benchmarks.md names a
#      subcommand that `rebound --help` lists, and each of its options is
#      one that `rebound SUBCOMMAND --help` lists (llama.cpp spellings too);
#   4. every repository path those files name (in backticks or as a link)
#      exists; bindings/ paths only once that folder exists (another branch
#      adds it: until then they are listed as a note);
#   5. the test command in the README is the one .ci/run's test step runs.
#
# usage: test_readme.sh SOURCE_DIR BUILD_DIR REBOUND_BIN SCRATCH_DIR CC ["EXTRA_CFLAGS"]
# Exits 77 (skip) without python3 (it parses the Markdown).
set -euo pipefail
if [ $# -lt 5 ]; then
    echo "usage: $0 SOURCE_DIR BUILD_DIR REBOUND_BIN SCRATCH_DIR CC [EXTRA_CFLAGS]" >&2
    exit 2
fi
SRC=$(cd "$1" && pwd) BUILD=$(cd "$2" && pwd) SCRATCH=$4 CC=$5 EXTRA=${6:-}
REBOUND=$(cd "$(dirname "$3")" && pwd)/$(basename "$3")
fail() { echo "FAIL [test_readme]: $*" >&2; exit 1; }
step() { echo "-- $*"; }
command -v python3 >/dev/null 2>&1 || { echo "SKIP [test_readme]: python3 is not installed"; exit 77; }
"$REBOUND" --version >/dev/null 2>&1 ||
    { echo "SKIP [test_readme]: $REBOUND does not run here (a cross build?)"; exit 77; }
case "$SCRATCH" in ""|/) fail "refusing scratch dir '$SCRATCH'" ;; esac
rm -rf "$SCRATCH"
mkdir -p "$SCRATCH"
cd "$SCRATCH"
README=$SRC/README.md
[ -f "$README" ] || fail "no README.md in $SRC"

# The blocks and command lines, extracted once: block-N.c, block-N.py,
# commands.txt (one command per line, continuations joined), paths.txt
python3 - "$SRC" <<'EOF'
import os, re, sys, textwrap
src = sys.argv[1]
# the README, and the docs it sends readers to (their code is indented
# blocks: only their command lines and paths are checked)
files = ["README.md"] + ["docs/" + f for f in ("reference.md", "serve.md", "benchmarks.md")
                         if os.path.exists(os.path.join(src, "docs", f))]
nc = npy = 0
cmds, paths = [], set()

def commands(body, where):
    body = re.sub(r"\\\n\s*", " ", body)
    for line in body.splitlines():
        line = re.sub(r"^\s*(\$\s+)?", "", line)
        line = re.sub(r"\s+#.*$", "", line)    # a shell comment
        for part in re.split(r"\s*(?:&&|\|\||;|\|)\s*", line):
            m = re.match(r"(?:\S*/)?rebound\s+(.*)", part)
            if m:
                cmds.append(where + "\t" + m.group(1))

for name in files:
    text = open(os.path.join(src, name), encoding="utf-8").read()
    # fences may be indented (a block inside a list item): the body is dedented
    for lang, body in re.findall(r"^[ \t]*```([A-Za-z0-9_+-]*)[^\n]*\n(.*?)^[ \t]*```",
                                 text, re.S | re.M):
        body = textwrap.dedent(body)
        if name == "README.md" and lang == "c":
            nc += 1
            open("block-%d.c" % nc, "w").write(body)
        elif lang in ("python", "py"):
            npy += 1
            open("block-%d.py" % npy, "w").write(body)
        elif lang in ("", "sh", "bash", "shell", "console"):
            commands(body, name)
    # indented code blocks (4 spaces)
    if name != "README.md":
        indented = "\n".join(l[4:] if l.startswith("    ") else "" for l in text.splitlines())
        commands(indented, name)
    # repository paths: `a/b...` in backticks or (a/b...) as a link target
    for p in re.findall(r"`([^`\s]+)`", text) + re.findall(r"\]\(([^)\s]+)\)", text):
        p = p.split("#")[0].rstrip(".,:;")
        if re.match(r"^(src|include|app|tests|docs|examples|scripts|cmake|bindings|tools|bench|fuzz|serve|\.ci)(/|$)", p) \
                or p in ("LICENSE", "CMakeLists.txt", "pyproject.toml"):
            paths.add(p.rstrip("/"))
        elif name.startswith("docs/") and re.match(r"^[\w.-]+\.(svg|json|md)$", p):
            paths.add("docs/" + p)      # a link relative to docs/
open("commands.txt", "w").write("\n".join(cmds) + "\n")
open("paths.txt", "w").write("\n".join(sorted(paths)) + "\n")
print("extracted %d C blocks, %d Python blocks, %d rebound commands, %d paths from %s"
      % (nc, npy, len(cmds), len(paths), ", ".join(files)))
EOF

step "the README's test command is .ci/run's test step"
CI_CMD=$(sed -n '/^step_test()/,/^}/p' "$SRC/.ci/run" | grep -E '^\s+scripts/deps.sh' | sed -E 's/^\s+//')
[ -n "$CI_CMD" ] || fail ".ci/run's step_test has no scripts/deps.sh ... command line"
grep -qF "$CI_CMD" "$README" || fail "the README does not show .ci/run's test command: $CI_CMD"

step "every repository path named exists"
n_paths=0 missing=""
while IFS= read -r p; do
    [ -n "$p" ] || continue
    case $p in
        bindings/*|bindings)
            if [ ! -d "$SRC/bindings" ]; then
                echo "NOTE: bindings/ does not exist in this tree: '$p' not checked"
                continue
            fi ;;
    esac
    # a glob (docs/*.md) must match something
    # shellcheck disable=SC2086
    if ! compgen -G "$SRC/$p" >/dev/null; then
        missing="$missing $p"
    fi
    n_paths=$((n_paths + 1))
done < paths.txt
[ -z "$missing" ] || fail "the README names paths that do not exist:$missing"
echo "   $n_paths paths"

step "every rebound command names a subcommand and options it takes"
"$REBOUND" --help > help.txt
SUBS=$(awk '/^commands:/ { on = 1; next } on && NF { print $1 } on && !NF { exit }' help.txt)
[ -n "$SUBS" ] || fail "no commands in rebound --help"
n_cmds=0
while IFS=$'\t' read -r where line; do
    [ -n "$line" ] || continue
    # shellcheck disable=SC2086
    set -f; set -- $line; set +f
    sub=$1
    shift
    case $sub in
        --help|-h|--version|help) continue ;;
    esac
    grep -qx -- "$sub" <<< "$SUBS" || fail "$where: 'rebound $line': '$sub' is not a rebound command"
    [ -f "help-$sub.txt" ] || "$REBOUND" "$sub" --help > "help-$sub.txt" 2>&1 ||
        fail "rebound $sub --help failed"
    for w in "$@"; do
        w=${w#[}
        w=${w%]}
        case $w in
            -[0-9]*|-) continue ;;        # a negative number or stdin, a value
            --*=*) w=${w%%=*} ;;
            -*) ;;
            *) continue ;;
        esac
        [ "$w" = -h ] || [ "$w" = --help ] && continue
        grep -qE -- "(^|[ ,])$w([ ,]|$)" "help-$sub.txt" ||
            fail "$where: 'rebound $line': option $w is not in \`rebound $sub --help\`"
    done
    n_cmds=$((n_cmds + 1))
done < commands.txt
[ "$n_cmds" -ge 20 ] || fail "only $n_cmds rebound commands found in the code blocks"
echo "   $n_cmds commands"

step "every Python block is valid Python"
for f in block-*.py; do
    [ -e "$f" ] || break
    python3 -m py_compile "$f" || fail "$f (a Python block of the README) does not compile"
done

step "every C block builds against the library and runs"
"$REBOUND" make-model --shape stories260k --type q8_0 -o model.gguf > make.log 2>&1 ||
    { cat make.log >&2; fail "rebound make-model failed"; }
n_c=0
for f in block-*.c; do
    [ -e "$f" ] || break
    exe=${f%.c}
    # shellcheck disable=SC2086
    "$CC" -std=c11 -Wall -Wextra -Werror $EXTRA -I"$SRC/include" "$f" -o "$exe" \
        -L"$BUILD" -Wl,-rpath,"$BUILD" -lrebound > "$exe.cc.log" 2>&1 ||
        { cat -n "$f" >&2; cat "$exe.cc.log" >&2; fail "$f (a C block of the README) does not compile"; }
    "./$exe" model.gguf "Once upon a time" > "$exe.out" 2> "$exe.err" ||
        { cat "$exe.err" >&2; fail "$f: exit status $? on model.gguf"; }
    [ -s "$exe.out" ] || fail "$f printed nothing"
    if grep -q 'greedy' "$f"; then
        "$REBOUND" run -m model.gguf -p "Once upon a time" -n 32 --temp 0 --no-display-prompt \
            > run.out 2> run.err || { cat run.err >&2; fail "rebound run failed"; }
        cmp -s "$exe.out" run.out ||
            fail "$f prints '$(cat "$exe.out")', rebound run --temp 0 -n 32 '$(cat run.out)'"
    fi
    n_c=$((n_c + 1))
done
[ "$n_c" -ge 1 ] || fail "the README has no C block"
echo "   $n_c C blocks"
echo "PASS [test_readme]"

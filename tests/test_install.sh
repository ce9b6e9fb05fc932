#!/usr/bin/env bash
# test_install.sh - the installed rebound works for a user: `cmake --install`
# into a temporary prefix puts the shared and static library, header,
# pkg-config file, CMake package and CLI in place; examples/minimal.c builds
# against them with pkg-config (plain cc, shared and --static) and through
# examples/CMakeLists.txt (find_package(rebound CONFIG): rebound::rebound and
# rebound::rebound_static), and each binary runs on a model made by the
# installed `rebound make-model`.
#
# usage: test_install.sh CMAKE BUILD_DIR SOURCE_DIR SCRATCH_DIR CC ["EXTRA_CFLAGS"]
#   EXTRA_CFLAGS: flags the build used that a program linking the library
#   needs too (the sanitizer flags of a REBOUND_SANITIZE build).
# Writes only into SCRATCH_DIR (and BUILD_DIR/install_manifest.txt, which
# cmake --install writes). Exits 77 (skip) when pkg-config is missing.
set -euo pipefail

if [ $# -lt 5 ]; then
    echo "usage: $0 CMAKE BUILD_DIR SOURCE_DIR SCRATCH_DIR CC [EXTRA_CFLAGS]" >&2
    exit 2
fi
CMAKE=$1 BUILD=$2 SRC=$3 SCRATCH=$4 CC=$5 EXTRA=${6:-}

fail() { echo "FAIL [test_install]: $*" >&2; exit 1; }
step() { echo "-- $*"; }

if ! command -v pkg-config >/dev/null 2>&1; then
    echo "SKIP [test_install]: pkg-config is not installed (apt-get install pkg-config)"
    exit 77
fi
case "$SCRATCH" in ""|/) fail "refusing scratch dir '$SCRATCH'" ;; esac
BUILD=$(cd "$BUILD" && pwd)
SRC=$(cd "$SRC" && pwd)
rm -rf "$SCRATCH"
mkdir -p "$SCRATCH"
SCRATCH=$(cd "$SCRATCH" && pwd)
PREFIX=$SCRATCH/prefix
cd "$SCRATCH"

step "cmake --install $BUILD --prefix $PREFIX"
"$CMAKE" --install "$BUILD" --prefix "$PREFIX" > install.log 2>&1 || { cat install.log >&2; fail "cmake --install failed"; }

step "installed files: lib*/librebound.so* and librebound.a, include/rebound.h and rebound_experimental.h, lib*/pkgconfig/rebound.pc, lib*/cmake/rebound, bin/rebound, share/doc/rebound/LICENSE"
PC=$(find "$PREFIX" -path '*/pkgconfig/rebound.pc' | head -n 1)
[ -n "$PC" ] || { find "$PREFIX" >&2; fail "no pkgconfig/rebound.pc under the prefix"; }
LIBDIR=$(dirname "$(dirname "$PC")")
case "$LIBDIR" in "$PREFIX"/lib|"$PREFIX"/lib64|"$PREFIX"/lib/*) ;; *) fail "unexpected libdir $LIBDIR" ;; esac
for f in "$LIBDIR/librebound.so" "$LIBDIR/librebound.a" "$PREFIX/include/rebound.h" \
         "$PREFIX/include/rebound_experimental.h" "$LIBDIR/cmake/rebound/reboundConfig.cmake" \
         "$LIBDIR/cmake/rebound/reboundConfigVersion.cmake" "$PREFIX/share/doc/rebound/LICENSE"; do
    [ -e "$f" ] || fail "$f is not installed"
done
[ -x "$PREFIX/bin/rebound" ] || fail "$PREFIX/bin/rebound is not installed"
# librebound.so -> librebound.so.N (the SONAME, N = SOVERSION) -> librebound.so.VERSION
SONAME=$(readelf -d "$LIBDIR/librebound.so" | sed -n 's/.*Library soname: \[\(.*\)\].*/\1/p')
case "$SONAME" in librebound.so.[0-9]*) ;; *) fail "librebound.so has SONAME '$SONAME', expected librebound.so.N" ;; esac
# the ABI of this tree: SOVERSION 1 (API 0.3: the versioned params)
[ "$SONAME" = librebound.so.1 ] || fail "SONAME $SONAME, expected librebound.so.1"
[ -e "$LIBDIR/$SONAME" ] || fail "$LIBDIR/$SONAME (the SONAME) is not installed"
# the file is named by the project's version (librebound.so.0.5.0), the
# SONAME by the ABI's number: the two need not share a prefix
ls "$LIBDIR"/librebound.so.[0-9]*.[0-9]*.[0-9]* >/dev/null 2>&1 ||
    fail "no versioned librebound.so.X.Y.Z in $LIBDIR"
# Captured first, never piped into grep -q: under pipefail, grep -q leaving
# early kills the writer with SIGPIPE and fails a pipeline that matched.
INTERNAL_HEADERS=$(find "$PREFIX" -name '*.h' ! -name rebound.h ! -name rebound_experimental.h)
if [ -n "$INTERNAL_HEADERS" ]; then
    find "$PREFIX" -name '*.h' >&2
    fail "internal headers are installed; only include/rebound.h and rebound_experimental.h are public"
fi

step "rebound.pc points into the prefix"
export PKG_CONFIG_PATH=$LIBDIR/pkgconfig
unset PKG_CONFIG_LIBDIR PKG_CONFIG_SYSROOT_DIR || true
pkg-config --exists rebound || fail "pkg-config does not find rebound in $PKG_CONFIG_PATH"
[ "$(pkg-config --variable=prefix rebound)" = "$PREFIX" ] ||
    { cat "$PC" >&2; fail "rebound.pc has prefix '$(pkg-config --variable=prefix rebound)', expected '$PREFIX'"; }
[ "$(pkg-config --variable=libdir rebound)" = "$LIBDIR" ] || fail "rebound.pc libdir is not $LIBDIR"
[ "$(pkg-config --variable=includedir rebound)" = "$PREFIX/include" ] || fail "rebound.pc includedir is not $PREFIX/include"
VERSION=$(pkg-config --modversion rebound)
[ -e "$LIBDIR/librebound.so.$VERSION" ] || fail "librebound.so.$VERSION (the .pc's version) is not installed"
grep -q '^Description: .*MIT license' "$PC" || { cat "$PC" >&2; fail "rebound.pc does not name the license"; }
# the static link's extras: threads and libm, and lz4/zstd when the library has them
STATIC_LIBS=$(pkg-config --static --libs rebound)
for l in -lpthread -lm; do
    grep -qe "$l" <<< "$STATIC_LIBS" || fail "pkg-config --static --libs rebound lacks $l: $STATIC_LIBS"
done
if nm "$LIBDIR/librebound.a" 2>/dev/null | grep -q ' U LZ4_'; then
    grep -qe -llz4 <<< "$STATIC_LIBS" || fail "librebound.a calls lz4 but the .pc's static libs lack -llz4: $STATIC_LIBS"
fi
grep -Eq "^rebound $VERSION\$" <("$PREFIX/bin/rebound" --version) ||
    fail "rebound.pc version $VERSION differs from \`rebound --version\`: $("$PREFIX/bin/rebound" --version)"

step "the installed rebound makes a model"
"$PREFIX/bin/rebound" make-model --shape stories260k --type q4_0 -o model.gguf > make.log 2>&1 ||
    { cat make.log >&2; fail "installed rebound make-model failed"; }

# the expected numbers, from `rebound info` of the same model
"$PREFIX/bin/rebound" info model.gguf > info.txt
num() { grep -E "$1" info.txt | head -n 1 | awk -v f="$2" '{ gsub(",", "", $f); print $f }'; }
EXP_LAYERS=5
EXP_WEIGHTS=$(num '^weights ' 2)
EXP_KV=$(num '^KV cache f16 ' 4)
[ "$EXP_KV" = 640 ] || fail "rebound info says $EXP_KV KV bytes per token for stories260k, expected 640"

# check_minimal BINARY: run it on model.gguf and on a missing file.
check_minimal() {
    local bin=$1
    "$bin" model.gguf > minimal.out 2> minimal.err ||
        { cat minimal.out minimal.err >&2; fail "$bin model.gguf failed"; }
    cat minimal.out
    grep -Eq '^architecture +llama$' minimal.out || fail "$bin: wrong architecture"
    grep -Eq "^layers +$EXP_LAYERS\$" minimal.out || fail "$bin: wrong layer count"
    grep -Eq "^weight bytes +$EXP_WEIGHTS\$" minimal.out || fail "$bin: weight bytes differ from rebound info ($EXP_WEIGHTS)"
    grep -Eq "^KV bytes per token +$EXP_KV\$" minimal.out || fail "$bin: KV bytes per token differ from rebound info ($EXP_KV)"
    local rc=0
    "$bin" missing.gguf > /dev/null 2> missing.err || rc=$?
    [ $rc -eq 1 ] || { cat missing.err >&2; fail "$bin missing.gguf: exit $rc, expected 1"; }
    grep -q "cannot open 'missing.gguf'" missing.err || { cat missing.err >&2; fail "$bin: no clear message for a missing file"; }
    rc=0
    "$bin" > /dev/null 2>&1 || rc=$?
    [ $rc -eq 2 ] || fail "$bin without arguments: exit $rc, expected 2"
}

step "cc examples/minimal.c \$(pkg-config --cflags --libs rebound), strict C11"
# shellcheck disable=SC2046,SC2086
"$CC" -std=c11 -Wall -Wextra -Wpedantic -Werror $EXTRA "$SRC/examples/minimal.c" -o minimal-cc \
    $(pkg-config --cflags --libs rebound) || fail "examples/minimal.c does not build against the installed rebound"
step "run it (LD_LIBRARY_PATH=$LIBDIR)"
LD_LIBRARY_PATH=$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} check_minimal ./minimal-cc
LDD_OUT=$(LD_LIBRARY_PATH=$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} ldd ./minimal-cc)
grep -q "$LIBDIR/$SONAME" <<< "$LDD_OUT" ||
    { echo "$LDD_OUT" >&2; fail "minimal-cc does not load $SONAME from the prefix"; }

# is_static BINARY: it does not load librebound.so at all
is_static() {
    local out
    out=$(ldd "$1" 2>&1 || true)
    if grep -q librebound <<< "$out"; then
        echo "$out" >&2
        fail "$1 loads librebound.so; it should have librebound.a linked in"
    fi
}

step "cc examples/minimal.c against librebound.a (pkg-config --static)"
# -l:librebound.a: the archive even where librebound.so sits beside it
# shellcheck disable=SC2046,SC2086
"$CC" -std=c11 -Wall -Wextra -Wpedantic -Werror $EXTRA "$SRC/examples/minimal.c" -o minimal-static-cc \
    $(pkg-config --cflags rebound) $(sed 's/-lrebound\b/-l:librebound.a/' <<< "$STATIC_LIBS") ||
    fail "examples/minimal.c does not link statically with pkg-config --static --libs rebound"
is_static ./minimal-static-cc
check_minimal ./minimal-static-cc

step "examples/CMakeLists.txt (find_package(rebound CONFIG)) against the prefix"
"$CMAKE" -S "$SRC/examples" -B examples-build -DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_C_COMPILER="$CC" \
    -DCMAKE_C_FLAGS="$EXTRA" -DCMAKE_EXE_LINKER_FLAGS="$EXTRA" > examples-configure.log 2>&1 ||
    { cat examples-configure.log >&2; fail "configuring examples/ failed"; }
"$CMAKE" --build examples-build > examples-build.log 2>&1 ||
    { cat examples-build.log >&2; fail "building examples/ failed"; }
step "run rebound::rebound (CMake's build RPATH finds the library)"
check_minimal examples-build/minimal
LDD_OUT=$(ldd examples-build/minimal)
grep -q "$LIBDIR/$SONAME" <<< "$LDD_OUT" ||
    { echo "$LDD_OUT" >&2; fail "examples-build/minimal does not load $SONAME from the prefix"; }
step "run rebound::rebound_static"
is_static examples-build/minimal_static
check_minimal examples-build/minimal_static

step "find_package(rebound 99.0) is refused (reboundConfigVersion.cmake)"
mkdir -p version-probe
printf 'cmake_minimum_required(VERSION 3.16)\nproject(p LANGUAGES C)\nfind_package(rebound 99.0 CONFIG REQUIRED)\n' \
    > version-probe/CMakeLists.txt
if "$CMAKE" -S version-probe -B version-probe/build -DCMAKE_PREFIX_PATH="$PREFIX" > version-probe.log 2>&1; then
    fail "find_package(rebound 99.0) succeeded against rebound $VERSION"
fi
grep -q "rebound" version-probe.log || { cat version-probe.log >&2; fail "no message naming rebound"; }

echo "PASS [test_install]"

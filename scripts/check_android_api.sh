#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# scripts/check_android_api.sh - does librebound build for the Android API
# level the README states (24), without the NDK? The library is compiled
# here against glibc with __ANDROID__ and __ANDROID_API__=24 defined, so
# that the code's Android branches are the ones compiled, and the C library
# functions it calls are checked against those bionic introduced after
# API 24 (bionic's libc/libc.map.txt: LIBC_O = 26, LIBC_P = 28, LIBC_Q =
# 29, and the later levels' functions a runtime might call). A call to one
# of them would not link (or not load) on an API-24 device.
#
# usage: scripts/check_android_api.sh [BUILD_DIR]   (default build-android-api)
# Needs cmake, a C compiler and nm. Exit 0: none found; 1: some found.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${1:-build-android-api}
API=24

# name:level, bionic's first API level with it (only those above 24)
NEWER="
sync_file_range:26 pthread_getname_np:26 getsubopt:26 nl_langinfo:26 mallopt:26 futimes:26
lutimes:26 strtod_l:26 strtof_l:26 strtol_l:26 strtoul_l:26 mblen:26 getdomainname:26
aligned_alloc:28 getentropy:28 getrandom:28 glob:28 globfree:28 iconv:28 iconv_open:28
posix_spawn:28 posix_spawnp:28 posix_spawnattr_init:28 posix_spawn_file_actions_init:28
pthread_setschedprio:28 pthread_attr_setinheritsched:28 syncfs:28 swab:28 fexecve:28
fflush_unlocked:28 fgets_unlocked:28 fputs_unlocked:28 fread_unlocked:28 fwrite_unlocked:28
getlogin_r:28 hcreate:28 hsearch:28 strptime_l:28 __freading:28 __fwriting:28
getloadavg:29 reallocarray:29 timespec_get:29 pthread_sigqueue:29
statx:30 memfd_create:30 mlock2:30 renameat2:30 pthread_cond_clockwait:30
pthread_mutex_clocklock:30 pthread_rwlock_clockrdlock:30 pthread_rwlock_clockwrlock:30
sem_clockwait:30
pidfd_open:31 process_madvise:31
preadv2:33 pwritev2:33 backtrace:33 backtrace_symbols:33
close_range:34 copy_file_range:34
epoll_pwait2:35
qsort_r:36 sig2str:36 lchmod:36
"

echo "configure: the library with -D__ANDROID__=1 -D__ANDROID_API__=$API (glibc headers)"
cmake -S . -B "$OUT" -DREBOUND_TESTS=OFF -DREBOUND_SERVE=OFF -DREBOUND_BENCH_SERVE=OFF \
    -DCMAKE_BUILD_TYPE=Release "-DCMAKE_C_FLAGS=-D__ANDROID__=1 -D__ANDROID_API__=$API" \
    > "$OUT.log" 2>&1 || { cat "$OUT.log"; exit 1; }
cmake --build "$OUT" -j2 --target rebound >> "$OUT.log" 2>&1 || { tail -n 40 "$OUT.log"; exit 1; }
LIB="$OUT/librebound.so"
UNDEF=$(nm -D --undefined-only "$LIB" | awk '{ print $NF }' | sed 's/@.*//' | sort -u)
bad=""
for e in $NEWER; do
    name=${e%%:*} level=${e##*:}
    if grep -qx -- "$name" <<< "$UNDEF"; then
        bad="$bad $name (API $level)"
    fi
done
if [ -n "$bad" ]; then
    echo "librebound calls C library functions that bionic has only above API $API:$bad"
    exit 1
fi
echo "NOTE: librebound's $(wc -l <<< "$UNDEF") C library calls are all in bionic at API $API"

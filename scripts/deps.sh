#!/bin/sh
# SPDX-License-Identifier: MIT
# scripts/deps.sh - installs what rebound's build and tests use, when it is
# missing, on Debian or Ubuntu (apt-get; as root, or with password-less
# sudo). Nothing is installed when everything is present, so the README's
# commands may run it every time.
#
#   required   a C compiler, cmake, make
#   serve      pkg-config, libmicrohttpd-dev (HTTP), libjansson-dev (JSON):
#              `rebound serve` is built only with them (librebound never
#              links them)
#   bench-serve  libcurl4-openssl-dev (HTTP client), libjansson-dev:
#              `rebound bench-serve` is built only with them
#   demo       liblz4-dev, libzstd-dev: the zram baseline's codecs, the
#              `rebound demo` table's zram rows (the library links them when
#              found; without them those rows say "not part of this build")
#   chat       libedit-dev: line editing and history in `rebound chat`
#              (without it chat reads plain lines)
#   tests      curl and python3: the serve test's HTTP client and its JSON
#              reader; nodejs and npm: the SDK test (cli_serve_sdk) installs
#              the openai and Vercel AI npm packages under build/ with them
#   bindings   default-jdk-headless (the Java binding, JNI) and junit5 (its
#              tests); python3-cffi (the Python binding), python3-pytest,
#              python3-setuptools and python3-pip (its tests, pip install .)
#
# Without apt-get (or rights to use it) it lists what is missing and exits
# 0: the build then goes on without serve and says so.
set -eu
want=""
have() { command -v "$1" >/dev/null 2>&1; }
have cc || have gcc || want="$want gcc libc6-dev"
have cmake || want="$want cmake"
have make || want="$want make"
have pkg-config || want="$want pkg-config"
if ! have pkg-config || ! pkg-config --exists libmicrohttpd 2>/dev/null; then
    want="$want libmicrohttpd-dev"
fi
if ! have pkg-config || ! pkg-config --exists jansson 2>/dev/null; then
    want="$want libjansson-dev"
fi
if ! have pkg-config || ! pkg-config --exists libcurl 2>/dev/null; then
    want="$want libcurl4-openssl-dev"
fi
if ! have pkg-config || ! pkg-config --exists liblz4 2>/dev/null; then
    want="$want liblz4-dev"
fi
if ! have pkg-config || ! pkg-config --exists libzstd 2>/dev/null; then
    want="$want libzstd-dev"
fi
if ! have pkg-config || ! pkg-config --exists libedit 2>/dev/null; then
    want="$want libedit-dev"
fi
have curl || want="$want curl"
have python3 || want="$want python3"
# the bindings (bindings/java, bindings/python): Debian's packages are for
# Debian's interpreter, which a python3 earlier on PATH may hide
have javac || want="$want default-jdk-headless"
[ -f /usr/share/java/junit-platform-console-standalone.jar ] || want="$want junit5"
py=python3
[ -x /usr/bin/python3 ] && py=/usr/bin/python3
for m in cffi:python3-cffi pytest:python3-pytest setuptools:python3-setuptools pip:python3-pip; do
    "$py" -c "import ${m%%:*}" >/dev/null 2>&1 || want="$want ${m#*:}"
done
have node || want="$want nodejs"
have npm || want="$want npm"
[ -n "$want" ] || exit 0
sudo=""
if [ "$(id -u)" -ne 0 ]; then
    if have sudo && sudo -n true 2>/dev/null; then
        sudo="sudo -n"
    else
        echo "scripts/deps.sh: missing:$want (not root and no password-less sudo: install them, then run cmake again)" >&2
        exit 0
    fi
fi
if ! have apt-get; then
    echo "scripts/deps.sh: missing:$want (no apt-get: install them with your package manager)" >&2
    exit 0
fi
echo "scripts/deps.sh: installing$want" >&2
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq >/dev/null 2>&1 || echo "scripts/deps.sh: apt-get update failed; trying the lists at hand" >&2
# shellcheck disable=SC2086
if ! $sudo apt-get install -y -qq --no-install-recommends $want >/dev/null; then
    echo "scripts/deps.sh: apt-get install$want failed" >&2
    exit 1
fi

"""Loads librebound with cffi (ABI mode: no compiler at install time).

Where the library comes from, first found:
  1. REBOUND_LIBRARY: a path to librebound.so (or the folder holding it);
     when set, nothing else is tried;
  2. a source checkout's build folder (<repo>/build/librebound.so) when
     this package is imported from bindings/python;
  3. the system's search path (librebound.so.0: an installed rebound;
     LD_LIBRARY_PATH; run ldconfig after installing into /usr/local/lib).
"""
import ctypes.util
import os

from cffi import FFI

from ._cdef import CDEF

ffi = FFI()
ffi.cdef(CDEF)


def _candidates():
    env = os.environ.get("REBOUND_LIBRARY")
    if env:
        if os.path.isdir(env):
            return [os.path.join(env, n) for n in ("librebound.so", "librebound.so.0",
                                                   "librebound.dylib")], True
        return [env], True
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(os.path.dirname(here)))
    out = []
    build = os.path.join(repo, "build", "librebound.so")
    if os.path.exists(os.path.join(repo, "include", "rebound.h")) and os.path.exists(build):
        out.append(build)
    out += ["librebound.so.0", "librebound.so"]
    found = ctypes.util.find_library("rebound")
    if found:
        out.append(found)
    return out, False


def _load():
    names, from_env = _candidates()
    errors = []
    for n in names:
        if from_env and not os.path.exists(n):
            errors.append("%s: no such file" % n)
            continue
        try:
            return ffi.dlopen(n), n
        except OSError as e:
            errors.append("%s: %s" % (n, e))
    raise ImportError("rebound: cannot load librebound (%s). Build it (cmake -B build && "
                      "cmake --build build), install it (cmake --install build), or set "
                      "REBOUND_LIBRARY to the path of librebound.so. Tried: %s"
                      % ("REBOUND_LIBRARY=" + os.environ["REBOUND_LIBRARY"] if from_env
                         else "no REBOUND_LIBRARY", "; ".join(errors)))


lib, library_path = _load()

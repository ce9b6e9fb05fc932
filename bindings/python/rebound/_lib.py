"""Loads librebound with cffi (ABI mode: no compiler at install time).

Where the library comes from, first found:
  1. REBOUND_LIBRARY: a path to librebound.so (or the folder holding it);
     when set, nothing else is tried;
  2. a source checkout's build folder (<repo>/build/librebound.so) when
     this package is imported from bindings/python;
  3. the system's search path (librebound.so, .so.1, .so.0: an installed rebound;
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
    out += ["librebound.so", "librebound.so.1", "librebound.so.0"]
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

# the params structs' form (_cdef.py): "v3" when the library exports
# rb_session_params_init (0.3 on), else "v2"
try:
    lib.rb_session_params_init
    PARAMS = "v3"
except AttributeError:
    PARAMS = "v2"


def model_params():
    """A new rb_model_params of the library's form, with its defaults."""
    if PARAMS == "v3":
        p = ffi.new("rb_model_params_v3 *")
        lib.rb_model_params_init(p, ffi.sizeof("rb_model_params_v3"))
        return p
    return ffi.new("rb_model_params_v2 *", lib.rb_model_default_params())


def session_params():
    """A new rb_session_params of the library's form, with its defaults."""
    if PARAMS == "v3":
        p = ffi.new("rb_session_params_v3 *")
        lib.rb_session_params_init(p, ffi.sizeof("rb_session_params_v3"))
        return p
    return ffi.new("rb_session_params_v2 *", lib.rb_session_default_params())

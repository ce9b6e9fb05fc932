"""The cffi declarations (rebound/_cdef.py) against the header: a C program
compiled with include/rebound.h prints sizeof and offsetof of every field
the binding declares; each must be cffi's. A field the header adds, moves
or retypes fails here, naming it."""
import os
import shutil
import subprocess

import pytest

import rebound
from rebound._cdef import STRUCTS
from rebound._lib import PARAMS, ffi


def test_struct_layouts_match_the_header(tmp_path):
    inc = os.environ.get("REBOUND_INCLUDE_DIR")
    if not inc:
        pytest.skip("REBOUND_INCLUDE_DIR is not set")
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    lines, want = [], []
    for ours, s in STRUCTS:
        ours = ours.format(params=PARAMS)
        lines.append('printf("%%s %%zu\\n", "%s", sizeof(%s));' % (s, s))
        want.append("%s %d" % (s, ffi.sizeof(ours)))
        for name, _ in ffi.typeof(ours).fields:
            lines.append('printf("%%s.%%s %%zu\\n", "%s", "%s", offsetof(%s, %s));'
                         % (s, name, s, name))
            want.append("%s.%s %d" % (s, name, ffi.offsetof(ours, name)))
    src = tmp_path / "layout.c"
    src.write_text("#include <stddef.h>\n#include <stdio.h>\n#include <rebound_experimental.h>\n"
                   "int main(void)\n{\n    %s\n    return 0;\n}\n" % "\n    ".join(lines))
    exe = tmp_path / "layout"
    subprocess.run([cc, "-std=c11", "-I", inc, str(src), "-o", str(exe)], check=True)
    got = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split("\n")
    diff = [(w, g) for w, g in zip(want, got) if w != g]
    assert not diff, "cffi (rebound/_cdef.py) vs the header: " + "; ".join(
        "binding %s, header %s" % d for d in diff[:10])
    assert len(got) - 1 == len(want)

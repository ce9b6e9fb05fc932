"""`pip install .` (offline: --no-build-isolation, setuptools from the
system) from bindings/python and from the repository root puts a working
package where Python finds it, outside the source tree."""
import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # bindings/python
ROOT = os.path.dirname(os.path.dirname(HERE))


def _pip_ok():
    return subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode == 0


@pytest.mark.parametrize("where", ["bindings/python", "root"])
def test_pip_install(where, tmp_path, model_path):
    if not _pip_ok():
        pytest.skip("pip is not installed (Debian: python3-pip)")
    src = tmp_path / "src"   # a copy: setuptools writes build/ and egg-info beside the sources
    if where == "root":
        (src / "bindings").mkdir(parents=True)
        shutil.copytree(HERE, src / "bindings" / "python",
                        ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
        shutil.copy(os.path.join(ROOT, "pyproject.toml"), src / "pyproject.toml")
    else:
        shutil.copytree(HERE, src, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    target = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
                        "--no-index", "--target", str(target), str(src)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (target / "rebound" / "__init__.py").exists()
    env = dict(os.environ, PYTHONPATH=str(target))
    code = ("import rebound, sys; m = rebound.Model(sys.argv[1]); "
            "s = m.create_session(n_ctx=64); print(rebound.__file__); "
            "print(len(s.generate('Hi', max_tokens=4, temperature=0)) >= 0)")
    r = subprocess.run([sys.executable, "-c", code, model_path], capture_output=True, text=True,
                       env=env, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith(str(target)), r.stdout

"""examples/generate.py prints the same bytes as `rebound run --temp 0` on
the same file and prompt."""
import os
import subprocess
import sys

import pytest

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       "examples", "generate.py")


@pytest.mark.parametrize("which", ["model_path", "bpe_model_path"])
@pytest.mark.parametrize("prompt", ["Once upon a time", "The cat sat on"])
def test_example_matches_rebound_run(which, prompt, rebound_bin, request):
    model = request.getfixturevalue(which)
    run = subprocess.run([rebound_bin, "run", "-m", model, "-p", prompt, "-n", "24", "--temp", "0"],
                         capture_output=True, check=True)
    assert run.stdout.startswith(prompt.encode())
    py = subprocess.run([sys.executable, EXAMPLE, model, prompt, "24"], capture_output=True,
                        check=True)
    assert py.stdout == run.stdout, "generate.py %r != rebound run %r" % (py.stdout, run.stdout)

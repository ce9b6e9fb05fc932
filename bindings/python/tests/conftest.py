"""Shared fixtures. The runner (bindings/python/tests.sh, CTest's
python_bindings) makes the models with `rebound make-model` and sets:
  REBOUND_TEST_MODEL      llama, SentencePiece-style vocabulary (tiny)
  REBOUND_TEST_MODEL_BPE  qwen3, GPT-2 byte-level BPE
  REBOUND_BIN             the rebound command (for `rebound run`)
  REBOUND_INCLUDE_DIR     include/ (the layout test compiles against it)
  REBOUND_LIBRARY         the librebound.so under test
A missing variable skips the tests that need it."""
import os

import pytest


def _env(name):
    v = os.environ.get(name)
    if not v:
        pytest.skip("%s is not set (run through bindings/python/tests.sh)" % name)
    return v


@pytest.fixture(scope="session")
def model_path():
    return _env("REBOUND_TEST_MODEL")


@pytest.fixture(scope="session")
def bpe_model_path():
    return _env("REBOUND_TEST_MODEL_BPE")


@pytest.fixture(scope="session")
def rebound_bin():
    return _env("REBOUND_BIN")


@pytest.fixture
def model(model_path):
    import rebound
    m = rebound.Model(model_path)
    yield m
    m.close()

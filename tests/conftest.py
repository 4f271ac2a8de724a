"""Shared test set-up: every test starts with the thread pools of the numpy backend on every CPU (and BLAS
uncapped); a test builds its models on the backend it names (helpers.spec(): the numpy specification,
dtype-generic and float64-capable), and tests of the fast backends load them explicitly."""
import numpy as np
import pytest

from minigpt import backends


@pytest.fixture(autouse=True)
def numpy_threads():
    backends.load("numpy", threads=0, verbose=False)
    yield
    backends.load("numpy", threads=0, verbose=False)


@pytest.fixture
def use():
    """use(name) loads the backend (with every CPU, so the threaded paths run) and returns its Ops."""
    def load(name):
        return backends.load(name, verbose=False)
    return load


@pytest.fixture
def rng():
    return np.random.default_rng(1234)

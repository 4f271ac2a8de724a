"""Shared test set-up: every test starts on the numpy backend (dtype-generic, float64-capable) with every CPU;
tests of the fast backends select them explicitly."""
import numpy as np
import pytest

from minigpt import backends


@pytest.fixture(autouse=True)
def numpy_backend():
    backends.select("numpy", threads=0, verbose=False)
    yield
    backends.select("numpy", threads=0, verbose=False)


@pytest.fixture
def use():
    """use(name) selects the backend (with every CPU, so the threaded paths run) and returns its Ops."""
    def select(name):
        backends.select(name, verbose=False)
        return backends.current()
    return select


@pytest.fixture
def rng():
    return np.random.default_rng(1234)

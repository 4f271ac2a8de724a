"""Shared test set-up: every test starts on the numpy backend (dtype-generic, float64-capable);
tests of the fast backends select them explicitly."""
import numpy as np
import pytest

from minigpt import kernels as K


@pytest.fixture(autouse=True)
def numpy_backend():
    K.set_backend("numpy")
    yield
    K.set_backend("numpy")


@pytest.fixture
def rng():
    return np.random.default_rng(1234)

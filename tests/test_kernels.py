"""Tests of minigpt/kernels.py and its backends (numpy, numba, native).

Each backend that loads here is compared with a float64 np.matmul over M, N, K in {1, 7, 16, 17, 64, 129},
every (ta, tb) and acc on/off, and over batched shapes; then the argument checks (dtype, layout, shapes) and
the selection rules (auto skips what cannot run; an explicit unavailable backend is an error). Tests of a
backend that cannot run on this machine are skipped with its reason. Whole-model equivalence is in test_model.py.
"""
import itertools
import sys

import numpy as np
import pytest

from minigpt import kernels as K

SIZES = (1, 7, 16, 17, 64, 129)
FLAGS = list(itertools.product((False, True), repeat=2))          # (ta, tb)


def _why_not(name):
    try:
        K._load(name)
        return None
    except K.BackendUnavailable as e:
        return str(e)


REASONS = {name: _why_not(name) for name in K.BACKENDS}
FAST = [pytest.param(n, marks=pytest.mark.skipif(REASONS[n] is not None, reason=str(REASONS[n])))
        for n in ("numba", "native")]
ALL = [pytest.param("numpy")] + FAST


def _operands(rng, M, N, Kd, ta, tb, lead=()):
    """float32 a, b stored as the flags say, and op(a) @ op(b) in float64."""
    a = rng.standard_normal((*lead, Kd, M) if ta else (*lead, M, Kd)).astype(np.float32)
    b = rng.standard_normal((*lead, N, Kd) if tb else (*lead, Kd, N)).astype(np.float32)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ref = np.matmul(a64.swapaxes(-1, -2) if ta else a64, b64.swapaxes(-1, -2) if tb else b64)
    return a, b, ref


def _close(got, ref, Kd):
    # float32 sums of Kd unit-variance products: the rounding error grows like sqrt(Kd)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=2e-5 * np.sqrt(max(Kd, 1)))


# ----------------------------------------------------------------------------
# numerics: every backend against float64

@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("ta,tb", FLAGS)
@pytest.mark.parametrize("acc", [False, True])
def test_matmul_matches_float64(name, ta, tb, acc):
    K.set_backend(name)
    rng = np.random.default_rng(0)
    for M, N, Kd in itertools.product(SIZES, repeat=3):
        a, b, ref = _operands(rng, M, N, Kd, ta, tb)
        if acc:
            c0 = rng.standard_normal((M, N)).astype(np.float32)
            out = c0.copy()
            got = K.matmul(a, b, ta=ta, tb=tb, out=out, acc=True)
            assert got is out, "acc=True must add into out in place"
            ref = ref + c0
        else:
            got = K.matmul(a, b, ta=ta, tb=tb)
        assert got.shape == (M, N) and got.dtype == np.float32
        _close(got, ref, Kd)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("ta,tb", FLAGS)
def test_few_rows_match_float64(name, ta, tb):
    # decoding multiplies 1..num_samples rows by a weight matrix: native has an unpacked path for these;
    # widths cross its 64-column tiles, and the large ones are split over threads
    K.set_backend(name)
    rng = np.random.default_rng(2)
    for M, N, Kd in itertools.product((1, 2, 3, 4, 5), (1, 63, 65, 130, 1536), (1, 17, 384)):
        a, b, ref = _operands(rng, M, N, Kd, ta, tb)
        out = rng.standard_normal((M, N)).astype(np.float32)
        _close(K.matmul(a, b, ta=ta, tb=tb, out=out.copy(), acc=True), ref + out, Kd)
        _close(K.matmul(a, b, ta=ta, tb=tb), ref, Kd)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("ta,tb", FLAGS)
def test_bmm_matches_float64(name, ta, tb):
    K.set_backend(name)
    rng = np.random.default_rng(1)
    shapes = [((1,), 7, 16, 17), ((3,), 1, 7, 129), ((5,), 64, 64, 32), ((48,), 64, 32, 64), ((2, 3), 17, 16, 7)]
    for lead, M, N, Kd in shapes:
        a, b, ref = _operands(rng, M, N, Kd, ta, tb, lead)
        _close(K.bmm(a, b, ta=ta, tb=tb), ref, Kd)
        out = np.full((*lead, M, N), np.nan, np.float32)          # beta = 0 must never read out
        assert K.bmm(a, b, ta=ta, tb=tb, out=out) is out
        _close(out, ref, Kd)
        K.bmm(a, b, ta=ta, tb=tb, out=out, acc=True)
        _close(out, 2 * ref, Kd)


def _head_view(x):
    """x (B, nh, r, c) copied into a strided view laid out like one head's q inside qkv (B, r, 3, nh, hs):
    heads interleaved, rows nh*(c+3) floats apart, NaN between them."""
    B, nh, r, c = x.shape
    v = np.full((B, r, nh, c + 3), np.nan, np.float32)[..., :c].transpose(0, 2, 1, 3)
    v[...] = x
    return v


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("ta,tb", FLAGS)
def test_bmm_on_views_matches_float64(name, ta, tb):
    """Attention's products on heads read and written in place (two batch levels, long rows), and a one-level
    stack whose rows are longer than its matrices."""
    K.set_backend(name)
    if not K.bmm_takes_views():
        pytest.skip(f"{name} bmm takes C-contiguous arrays only (the model copies heads for it)")
    rng = np.random.default_rng(7)
    for M, N, Kd in [(17, 17, 7), (17, 7, 17), (1, 9, 5), (33, 20, 64)]:
        a, b, ref = _operands(rng, M, N, Kd, ta, tb, (3, 5))
        av, bv = _head_view(a), _head_view(b)
        assert not (av.flags.c_contiguous or bv.flags.c_contiguous)
        _close(K.bmm(av, bv, ta=ta, tb=tb), ref, Kd)
        out = _head_view(np.full((3, 5, M, N), np.nan, np.float32))   # beta = 0 must never read out
        assert K.bmm(av, bv, ta=ta, tb=tb, out=out) is out
        _close(out, ref, Kd)
        K.bmm(av, bv, ta=ta, tb=tb, out=out, acc=True)
        _close(out, 2 * ref, Kd)
        assert np.isnan(out.base).sum() == 3 * 5 * M * 3               # the gaps between heads were not written
    a, b, ref = _operands(rng, 9, 11, 13, ta, tb, (4,))
    av = np.pad(a, ((0, 0), (0, 0), (0, 5)))[:, :, :a.shape[-1]]        # (4, r, c) with rows c+5 apart
    _close(K.bmm(av, b, ta=ta, tb=tb), ref, 13)


@pytest.mark.parametrize("name", ALL)
def test_matmul_empty_and_k0(name):
    K.set_backend(name)
    a, b = np.zeros((3, 0), np.float32), np.zeros((0, 4), np.float32)
    np.testing.assert_array_equal(K.matmul(a, b), np.zeros((3, 4)))
    out = np.ones((3, 4), np.float32)
    np.testing.assert_array_equal(K.matmul(a, b, out=out, acc=True), np.ones((3, 4)))
    assert K.matmul(np.zeros((0, 5), np.float32), np.zeros((5, 2), np.float32)).shape == (0, 2)


@pytest.mark.parametrize("name", FAST)
def test_matmul_same_bits_for_any_thread_count(name):
    # each C element is summed by one thread in k order, so threads change speed, not bits (products of <= 4 rows
    # on native split K over threads instead: test_few_rows_match_float64 checks those)
    rng = np.random.default_rng(2)
    a, b, _ = _operands(rng, 129, 65, 300, False, True)
    K.set_backend(name, threads=1)
    one = K.matmul(a, b, tb=True)
    K.set_threads(2)
    np.testing.assert_array_equal(K.matmul(a, b, tb=True), one)


def test_native_spin_wait_keeps_results():
    # generation lets the workers wait on the CPU between products (kernels.set_spin); a worker that started a
    # job late, or a caller that returned before its workers, would show here as a wrong product
    if REASONS["native"]:
        pytest.skip(REASONS["native"])
    K.set_backend("native", threads=2)
    rng = np.random.default_rng(4)
    shapes = ((1, 1536, 384), (3, 130, 1536), (129, 65, 300), (257, 512, 2048))    # the last outlasts the spin
    cases = [_operands(rng, M, N, Kd, False, False) for M, N, Kd in shapes]
    try:
        K.set_spin(300)
        for _ in range(20):
            for a, b, ref in cases:
                _close(K.matmul(a, b), ref, a.shape[1])
    finally:
        K.set_spin(0)


def test_native_matches_its_scalar_reference():
    if REASONS["native"]:
        pytest.skip(REASONS["native"])
    from minigpt import _native
    lib = _native.backend().lib
    rng = np.random.default_rng(3)
    for (M, N, Kd), (ta, tb) in itertools.product([(1, 1, 1), (9, 33, 17), (17, 16, 257), (64, 129, 7)], FLAGS):
        a, b, ref = _operands(rng, M, N, Kd, ta, tb)
        fast, slow = np.empty((M, N), np.float32), np.empty((M, N), np.float32)
        args = (ta, tb, M, N, Kd, a, a.shape[1], b, b.shape[1], 0.0)
        assert lib.mgk_sgemm(*args, fast, N) == 0 and lib.mgk_sgemm_ref(*args, slow, N) == 0
        _close(fast, slow, Kd)
        _close(slow, ref, Kd)
    bad = np.zeros((2, 2), np.float32)
    assert lib.mgk_sgemm(0, 0, 2, 2, 2, bad, 1, bad, 2, 0.0, bad, 2) == -1     # lda < K is refused


def test_native_leaves_caller_fp_mode_alone():
    # the kernel sets flush-to-zero while it runs; numpy in the calling thread must still see subnormals
    if REASONS["native"]:
        pytest.skip(REASONS["native"])
    K.set_backend("native")
    K.matmul(np.ones((8, 8), np.float32), np.ones((8, 8), np.float32))
    tiny = np.float32(1e-40)                                       # subnormal in float32
    assert tiny * np.float32(1.0) != 0 and np.float32(1e-38) / np.float32(1e3) != 0


# ----------------------------------------------------------------------------
# argument checks

@pytest.mark.parametrize("name", FAST)
def test_fast_backends_reject_float64_and_strided(name):
    K.set_backend(name)
    a = np.ones((4, 3), np.float32)
    with pytest.raises(TypeError, match="float32"):
        K.matmul(a.astype(np.float64), np.ones((3, 2), np.float32))
    with pytest.raises(TypeError, match="float32"):
        K.matmul(a, np.ones((3, 2), np.float32), out=np.zeros((4, 2)), acc=True)
    with pytest.raises(ValueError, match="contiguous"):
        K.matmul(a.T, np.ones((4, 2), np.float32))                 # a transpose view: use ta=True instead
    with pytest.raises(ValueError, match="contiguous"):
        K.bmm(np.ones((2, 4, 6), np.float32)[:, :, ::2], np.ones((2, 3, 2), np.float32))


@pytest.mark.parametrize("name", ALL)
def test_mismatched_shapes_raise(name):
    K.set_backend(name)
    a, b = np.ones((4, 3), np.float32), np.ones((5, 2), np.float32)
    with pytest.raises(ValueError, match="inner dimensions"):
        K.matmul(a, b)
    with pytest.raises(ValueError, match="inner dimensions"):
        K.matmul(a, b, ta=True, tb=True)                           # op(a) 3x4, op(b) 2x5
    with pytest.raises(ValueError, match="out has shape"):
        K.matmul(a, np.ones((3, 2), np.float32), out=np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError, match="acc=True"):
        K.matmul(a, np.ones((3, 2), np.float32), acc=True)
    with pytest.raises(ValueError, match="2-D"):
        K.matmul(np.ones((2, 4, 3), np.float32), np.ones((3, 2), np.float32))
    with pytest.raises(ValueError, match="batch"):
        K.bmm(np.ones((2, 4, 3), np.float32), np.ones((3, 3, 2), np.float32))


# ----------------------------------------------------------------------------
# selection

def test_auto_skips_an_unavailable_backend(monkeypatch, capsys):
    real = K._load

    def no_native(name):
        if name == "native":
            raise K.BackendUnavailable("native: pretend the library is missing")
        return real(name)

    monkeypatch.setattr(K, "_load", no_native)
    picked = K.set_backend("auto")
    assert picked != "native" and picked in K.BACKENDS
    assert f"auto -> {picked}" in capsys.readouterr().err        # auto says what it chose, and why
    assert "native" not in K.available()


def test_explicit_unavailable_backend_raises(monkeypatch, tmp_path):
    from minigpt import _native
    missing = str(tmp_path / "no_such_libmgk.so")
    monkeypatch.setenv("MINIGPT_NATIVE_LIB", missing)
    _native._lib.cache_clear(), _native.backend.cache_clear()
    try:
        with pytest.raises(K.BackendUnavailable, match="MINIGPT_NATIVE_LIB"):
            K.set_backend("native")
        assert K.backend() == "numpy"                              # no silent switch happened
        assert K.set_backend("auto", verbose=False) != "native"
    finally:
        _native._lib.cache_clear(), _native.backend.cache_clear()
    with pytest.raises(K.BackendUnavailable, match="unknown backend"):
        K.set_backend("cuda")


@pytest.mark.skipif(REASONS["native"] is not None, reason=str(REASONS["native"]))
def test_native_refuses_a_stale_build(monkeypatch):
    """A library built from another version of mgk.c (other signatures) is refused before any call."""
    from minigpt import _native
    K.set_backend("numpy")
    monkeypatch.setattr(_native, "_ABI", _native._ABI + 1)
    _native._lib.cache_clear(), _native.backend.cache_clear()
    try:
        with pytest.raises(K.BackendUnavailable, match="pip install -e"):
            K.set_backend("native")
    finally:
        _native._lib.cache_clear(), _native.backend.cache_clear()


@pytest.mark.skipif(REASONS["native"] is not None, reason=str(REASONS["native"]))
def test_native_bmm_rejects_unwalkable_views():
    K.set_backend("native")
    a, b = np.ones((2, 4, 3), np.float32), np.ones((2, 3, 5), np.float32)
    with pytest.raises(ValueError, match="read-only"):
        K.bmm(a, b, out=np.broadcast_to(np.zeros((4, 5), np.float32), (2, 4, 5)))
    with pytest.raises(ValueError, match="contiguous floats"):
        K.bmm(np.broadcast_to(np.ones((4, 1), np.float32), (2, 4, 3)), b)   # rows of stride-0 columns
    with pytest.raises(ValueError, match="two batch dims"):
        K.bmm(np.ones((2, 2, 2, 4, 3), np.float32)[:, :, :, :, :], np.ones((2, 2, 2, 6, 5), np.float32)[..., ::2, :])


def test_numba_unavailable_without_numba(monkeypatch):
    from minigpt import _numba
    monkeypatch.setattr(_numba, "numba", None)
    monkeypatch.setattr(_numba, "_backend", None)
    monkeypatch.setattr(_numba, "_IMPORT_ERROR", ImportError("No module named 'numba'"), raising=False)
    with pytest.raises(K.BackendUnavailable, match="pip install numba"):
        K.set_backend("numba")
    assert K.backend() == "numpy"


@pytest.mark.parametrize("name", FAST)
def test_fast_backend_caps_blas_threads(name):
    from threadpoolctl import threadpool_info
    blas = lambda: [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]   # noqa: E731
    before = blas()
    K.set_backend(name)
    assert all(n == 1 for n in blas())
    K.set_backend("numpy")
    assert blas() == before


def test_numpy_threads_set_blas_threads():
    from threadpoolctl import threadpool_info
    blas = lambda: [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]   # noqa: E731
    if not blas():
        pytest.skip("numpy here has no BLAS that threadpoolctl can see")
    try:
        K.set_backend("numpy", threads=1)
        assert blas() and all(n == 1 for n in blas())
    finally:
        K.set_backend("numpy", threads=K._cpus())

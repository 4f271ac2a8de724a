"""The backends around the ops (test_ops.py checks each op's numbers): thread counts that change speed, not
bits; the native library's own checks (spin wait, scalar reference, the caller's FP mode); argument checks
shared by every backend; and selection (auto skips what cannot run, an explicit unavailable backend is an
error, a stale native build is refused, BLAS threads are capped while native threads run; by dtype:
test_backends.py). A backend that cannot run here is skipped with its reason.
"""
import itertools

import numpy as np
import pytest

from minigpt import backends
from test_ops import F32, F64, FAST, FLAGS, REASONS, close_gemm, operands, randn


# ----------------------------------------------------------------------------
# threads and the native library

@pytest.mark.parametrize("name", FAST)
def test_same_bits_for_any_thread_count(name):
    # each C element is summed by one thread in k order, and each row of a row op by one thread, so threads
    # change speed, not bits (products of <= 8 rows on native split K over threads instead: the few-rows test).
    # numba's products are OpenBLAS's, whose sums may depend on its thread count (numpy 1.24.4's OpenBLAS gave
    # other bits at 2 threads): there only numba's own kernels are held to the same bits
    rng = np.random.default_rng(2)
    a, b, _ = operands(rng, 129, 65, 300, False, True)
    q, k, _ = operands(rng, 64, 64, 16, False, True, (4, 4))
    x, w = randn(rng, (300, 129), F32, 2, 1), randn(rng, 129, F32)
    s = randn(rng, (8, 64, 64), F32, 3)
    runs = []
    for threads in (1, 2):
        ops = backends.load(name, threads=threads, verbose=False)
        y, mean, rstd = np.empty_like(x), np.empty(300, F32), np.empty(300, F32)
        ops.layernorm(x, w, w, y, mean, rstd)
        runs.append([ops.matmul(a, b, tb=True), ops.bmm(q, k, tb=True), y, ops.causal_softmax(s.copy(), 0.25, 0)])
    for i, (one, two) in enumerate(zip(*runs)):
        if name == "numba" and i < 2:                                 # the products: OpenBLAS's sums, K deep
            close_gemm(two, one.astype(F64), (300, 16)[i])
        else:
            np.testing.assert_array_equal(two, one)


def _native():
    if REASONS["native"]:
        pytest.skip(REASONS["native"])
    return backends._load("native")


def test_native_spin_wait_keeps_results():
    # generation lets the workers wait on the CPU between products (Ops.spin); a worker that started a job
    # late, or a caller that returned before its workers, would show here as a wrong product
    _native()
    ops = backends.load("native", threads=2, verbose=False)
    rng = np.random.default_rng(4)
    shapes = ((1, 1536, 384), (3, 130, 1536), (129, 65, 300), (257, 512, 2048))    # the last outlasts the spin
    cases = [operands(rng, M, N, Kd, False, False) for M, N, Kd in shapes]
    try:
        ops.spin(300)
        for _ in range(20):
            for a, b, ref in cases:
                close_gemm(ops.matmul(a, b), ref, a.shape[1])
    finally:
        ops.spin(0)


def test_native_matches_its_scalar_reference():
    lib = _native().lib
    rng = np.random.default_rng(3)
    for (M, N, Kd), (ta, tb) in itertools.product([(1, 1, 1), (9, 33, 17), (17, 16, 257), (64, 129, 7)], FLAGS):
        a, b, ref = operands(rng, M, N, Kd, ta, tb)
        fast, slow = np.empty((M, N), F32), np.empty((M, N), F32)
        args = (ta, tb, M, N, Kd, a, a.shape[1], b, b.shape[1], 0.0)
        assert lib.mgk_sgemm(*args, fast, N) == 0 and lib.mgk_sgemm_ref(*args, slow, N) == 0
        close_gemm(fast, slow, Kd)
        close_gemm(slow, ref, Kd)
    bad = np.zeros((2, 2), F32)
    assert lib.mgk_sgemm(0, 0, 2, 2, 2, bad, 1, bad, 2, 0.0, bad, 2) == -1     # lda < K is refused


def test_native_leaves_caller_fp_mode_alone():
    # the kernel sets flush-to-zero while it runs; numpy in the calling thread must still see subnormals
    ops = _native()
    ops.matmul(np.ones((8, 8), F32), np.ones((8, 8), F32))
    tiny = F32(1e-40)                                                  # subnormal in float32
    assert tiny * F32(1.0) != 0 and F32(1e-38) / F32(1e3) != 0


# ----------------------------------------------------------------------------
# argument checks

@pytest.mark.parametrize("name", FAST)
def test_fast_backends_reject_float64_products(use, name):
    ops = use(name)
    a, b = np.ones((4, 3), F32), np.ones((3, 2), F32)
    with pytest.raises(TypeError, match="float32"):
        ops.matmul(a.astype(F64), b)
    with pytest.raises(TypeError, match="float32"):
        ops.matmul(a, b, out=np.zeros((4, 2)), acc=True)
    with pytest.raises(TypeError, match="float32"):
        ops.bmm(a[None], b[None].astype(F64))
    with pytest.raises(TypeError, match="float32"):
        ops.matmul(np.ones((4, 6))[:, ::2], b)                          # views too


@pytest.mark.parametrize("name", [pytest.param("numpy")] + FAST)
def test_mismatched_shapes_raise(use, name):
    ops = use(name)
    a, b = np.ones((4, 3), F32), np.ones((5, 2), F32)
    with pytest.raises(ValueError, match="inner dimensions"):
        ops.matmul(a, b)
    with pytest.raises(ValueError, match="inner dimensions"):
        ops.matmul(a, b, ta=True, tb=True)                             # op(a) 3x4, op(b) 2x5
    with pytest.raises(ValueError, match="out has shape"):
        ops.matmul(a, np.ones((3, 2), F32), out=np.zeros((2, 4), F32))
    with pytest.raises(ValueError, match="acc=True"):
        ops.matmul(a, np.ones((3, 2), F32), acc=True)
    with pytest.raises(ValueError, match="2-D"):
        ops.matmul(np.ones((2, 4, 3), F32), np.ones((3, 2), F32))
    with pytest.raises(ValueError, match="batch"):
        ops.bmm(np.ones((2, 4, 3), F32), np.ones((3, 3, 2), F32))
    with pytest.raises(ValueError, match="overlap"):
        ops.matmul(a, np.ones((3, 3), F32), out=a[:, :3])
    with pytest.raises(TypeError, match="numpy arrays"):
        ops.matmul([[1.0]], np.ones((1, 1), F32))


@pytest.mark.parametrize("name", [pytest.param("numpy")] + FAST)
def test_attention_rejects_bad_arguments_as_its_products_do(use, name):
    """Native's fused attention checks what its C code trusts; what it does not take runs Ops' composition,
    whose products raise: the same errors on every backend. Native also refuses outputs over inputs (the
    composition's products check only their own operands: dq written over q would change dk = ds^T q)."""
    ops = use(name)
    r = np.random.default_rng(0)
    q, k, v = (r.standard_normal((2, 2, 6, 4)).astype(F32) for _ in range(3))
    att, y = np.empty((2, 2, 6, 6), F32), np.empty((2, 2, 6, 4), F32)
    ops.attention(q, k, v, att, y, 0.5)
    if name == "native":
        with pytest.raises(ValueError, match="overlap"):
            ops.attention(q, k, v, att, q, 0.5)                        # y written over q
        with pytest.raises(ValueError, match="overlap"):
            ops.attention_backward(q, k, v, att, y, q, np.empty_like(q), np.empty_like(q), 0.5)   # dq over q
    with pytest.raises(ValueError, match="read-only"):
        ops.attention(q, k, v, att, np.broadcast_to(y[:1], y.shape), 0.5)
    with pytest.raises(ValueError, match="start >= 0"):
        ops.attention(q, k, v, att, y, 0.5, start=-1)
    with pytest.raises(ValueError, match="inner dimensions|shape"):
        ops.attention(q, k[..., :3], v, att, y, 0.5)
    with pytest.raises(ValueError, match="seed"):
        ops.attention(q, k, v, att, y, 0.5, 0, (0.5, -1))


# ----------------------------------------------------------------------------
# selection

def test_auto_skips_an_unavailable_backend(monkeypatch, capsys):
    real = backends._load

    def no_native(name):
        if name == "native":
            raise backends.BackendUnavailable("native: pretend the library is missing")
        return real(name)

    monkeypatch.setattr(backends, "_load", no_native)
    picked = backends.load("auto").name
    assert picked != "native" and picked in backends.BACKENDS
    err = capsys.readouterr().err
    assert f"auto -> {picked}" in err and "pretend the library is missing" in err   # what it chose, and why
    assert "native" not in backends.available()


def test_explicit_unavailable_backend_raises(monkeypatch, tmp_path):
    from minigpt.backends import native
    monkeypatch.setenv("MINIGPT_NATIVE_LIB", str(tmp_path / "no_such_libmgk.so"))
    native._lib.cache_clear(), native.backend.cache_clear()
    try:
        with pytest.raises(backends.BackendUnavailable, match="MINIGPT_NATIVE_LIB"):
            backends.load("native")                                    # no silent switch to another
        assert backends.load("auto", verbose=False).name != "native"
    finally:
        native._lib.cache_clear(), native.backend.cache_clear()
    with pytest.raises(backends.BackendUnavailable, match="unknown backend"):
        backends.load("cuda")


@pytest.mark.skipif(REASONS["native"] is not None, reason=str(REASONS["native"]))
def test_native_refuses_a_stale_build(monkeypatch):
    """A library built from another version of mgk.c (other signatures) is refused before any call."""
    from minigpt.backends import native
    monkeypatch.setattr(native, "_ABI", native._ABI + 1)
    native._lib.cache_clear(), native.backend.cache_clear()
    try:
        with pytest.raises(backends.BackendUnavailable, match="pip install -e"):
            backends.load("native")
    finally:
        native._lib.cache_clear(), native.backend.cache_clear()


def test_numba_unavailable_without_numba(monkeypatch):
    from minigpt.backends import numba_ops
    monkeypatch.setattr(numba_ops, "numba", None)
    monkeypatch.setattr(numba_ops, "_backend", None)
    monkeypatch.setattr(numba_ops, "_IMPORT_ERROR", ImportError("No module named 'numba'"), raising=False)
    with pytest.raises(backends.BackendUnavailable, match="pip install numba"):
        backends.load("numba")


@pytest.mark.parametrize("kernel", ["layernorm_fwd", "causal_softmax_fwd"])
@pytest.mark.parametrize("fault,why", [("raise", "failed to compile or run"), ("wrong", "wrong results")])
def test_numba_unavailable_when_its_smoke_test_fails(monkeypatch, kernel, fault, why):
    """backend() runs two numba kernels (LayerNorm, and the softmax with its own LLVM exp) before it serves: a
    kernel that cannot run here, or that computes the wrong thing, makes the backend unavailable with the reason
    (auto then skips it)."""
    from minigpt.backends import numba_ops
    if numba_ops.numba is None:
        pytest.skip("numba is not installed")

    def broken(*args):
        if fault == "raise":
            raise RuntimeError("LLVM ERROR: no such target")
        args[-3 if kernel == "layernorm_fwd" else 0][...] = 0.5          # out (LayerNorm) or att (softmax)

    monkeypatch.setattr(numba_ops.NK, kernel, broken)
    monkeypatch.setattr(numba_ops, "_backend", None)
    with pytest.raises(backends.BackendUnavailable, match=why):
        numba_ops.backend()


def _blas_threads():
    from threadpoolctl import threadpool_info
    return [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]


@pytest.mark.parametrize("name", FAST)
def test_one_pool_at_a_time_blas_threads(name):
    """native never calls BLAS: BLAS gets 1 thread while native's pool runs. numba's products are BLAS's
    (numpy_ops.product): BLAS gets the backend's threads, as on numpy."""
    if not _blas_threads():
        pytest.skip("numpy here has no BLAS that threadpoolctl can see")
    backends.load(name, threads=2, verbose=False)
    assert all(n == (1 if name == "native" else 2) for n in _blas_threads())
    backends.load(name, threads=1, verbose=False)
    assert all(n == 1 for n in _blas_threads())
    backends.load("numpy", threads=2, verbose=False)
    assert all(n == 2 for n in _blas_threads())                        # native's cap lifted


def test_numpy_threads_set_blas_threads():
    if not _blas_threads():
        pytest.skip("numpy here has no BLAS that threadpoolctl can see")
    backends.load("numpy", threads=1, verbose=False)
    assert all(n == 1 for n in _blas_threads())
    assert backends.threads() == 1

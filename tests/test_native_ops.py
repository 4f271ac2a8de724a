"""Tests of native/mgk_ops.c, the C versions of the non-matmul ops behind minigpt/backends/native.py.

Each op's fast path (mgk_<op>) is compared with its scalar reference (mgk_ref_<op>), and both with the float64
NumPy specification, on odd shapes, under every ISA path this CPU can run (mgk_set_isa). The paths must agree
bit for bit (mgk_ops.c compiles one source per path with FMA contraction off), and so must 1 and 2 threads.
Then the inline exp over the float32 range, aliasing, and the argument checks. tests/test_ops.py runs the same
ops through the Ops interface with strided views. Skipped, with the reason, where the native library cannot load.
"""
import ctypes

import numpy as np
import pytest

from minigpt import backends
from minigpt.backends import interface, numpy_ops

F32, F64 = np.float32, np.float64
SPEC = numpy_ops.NumpyOps()                                      # the specification, run in float64
ROWS = (1, 7, 17, 65, 129)
COLS = ROWS + (8300,)               # 8300: column sums (GELU's db) over more than one of mgk_ops.c's COL_BLOCKs a thread


REASON = backends.why_unavailable("native")
pytestmark = pytest.mark.skipif(REASON is not None, reason=str(REASON))


@pytest.fixture(scope="module")
def lib():
    return backends._load("native").lib


@pytest.fixture
def isas(lib):
    """The ISA paths this CPU runs (generic, avx2, avx512 as available); the one in use is restored after."""
    saved, saved_nt = lib.mgk_isa(), lib.mgk_get_num_threads()
    yield list(range(lib.mgk_cpu_isa() + 1))
    lib.mgk_set_isa(saved)
    lib.mgk_set_num_threads(saved_nt)


def randn(rng, shape, s=1.0, shift=0.0):
    return (s * rng.standard_normal(shape) + shift).astype(F32)


def f64(*arrays):
    return [None if a is None else np.array(a, F64) for a in arrays]


def close(got, ref, k=1.0, what=""):
    """got within k * 1e-5 of ref, elementwise and relative to ref's largest entry (test_ops.py's tolerance)."""
    tol, ref = k * 1e-5, np.asarray(ref, F64)
    np.testing.assert_allclose(np.asarray(got, F64), ref, rtol=tol, atol=tol * max(np.abs(ref).max(initial=0), 1e-30),
                               err_msg=what)


def each_isa(lib, isas, call):
    """call() under every ISA path; asserts that all give the same bits, returns the results."""
    results = []
    for isa in isas:
        assert lib.mgk_set_isa(isa) == 0
        results.append(call())
    for isa, res in zip(isas[1:], results[1:]):
        for a, b in zip(res, results[0]):
            np.testing.assert_array_equal(a, b, err_msg=f"ISA path {isa} differs from path {isas[0]}")
    return results[0]


def check(lib, isas, run, spec, k=1.0):
    """run(prefix) -> outputs of mgk_<op> ('mgk_') or mgk_ref_<op> ('mgk_ref_'); spec() -> float64 outputs."""
    fast, ref, want = each_isa(lib, isas, lambda: run("mgk_")), run("mgk_ref_"), spec()
    for i, (f, r, w) in enumerate(zip(fast, ref, want)):
        close(f, r, k, what=f"output {i}: fast vs scalar reference")
        close(r, w, k, what=f"output {i}: scalar reference vs float64 spec")
        close(f, w, k, what=f"output {i}: fast vs float64 spec")


# ----------------------------------------------------------------------------
# the ops, one runner each: C arguments from numpy arrays, fresh outputs

def layernorm(lib, prefix, x, w, b, dy, dw0, db0):
    """... and its backward a second time, adding dx into dx0 (acc): the last output, dx0 + dx"""
    N, C = x.shape
    y, mean, rstd, dx = np.empty_like(x), np.empty(N, F32), np.empty(N, F32), np.empty_like(x)
    dw, db = dw0.copy(), None if db0 is None else db0.copy()
    assert getattr(lib, prefix + "layernorm_fwd")(N, C, x, w, b, 1e-5, y, mean, rstd) == 0
    assert getattr(lib, prefix + "layernorm_bwd")(N, C, dy, x, w, mean, rstd, dx, dw, db, 0) == 0
    acc = np.linspace(-1, 1, N * C, dtype=F32).reshape(N, C)
    assert getattr(lib, prefix + "layernorm_bwd")(N, C, dy, x, w, mean, rstd, acc, dw0.copy(), None, 1) == 0
    return [y, mean, rstd, dx, dw] + ([] if db is None else [db]) + [acc]


def layernorm_spec(x, w, b, dy, dw0, db0):
    N, C = x.shape
    y, mean, rstd, dx = np.empty((N, C)), np.empty(N), np.empty(N), np.empty((N, C))
    x, w, b, dy, dw, db = f64(x, w, b, dy, dw0, db0)
    SPEC.layernorm(x, w, b, y, mean, rstd, 1e-5)
    SPEC.layernorm_backward(dy, x, w, mean, rstd, dx, dw, db)
    return [y, mean, rstd, dx, dw] + ([] if db is None else [db]) + [np.linspace(-1, 1, N * C).reshape(N, C) + dx]


@pytest.mark.parametrize("N", ROWS)
@pytest.mark.parametrize("C", COLS)
@pytest.mark.parametrize("bias", [True, False])
def test_layernorm_fast_matches_reference_and_spec(lib, isas, N, C, bias):
    rng = np.random.default_rng(N * 1000 + C)
    args = (randn(rng, (N, C), 3, 1), randn(rng, C, 1, 1), randn(rng, C) if bias else None, randn(rng, (N, C)),
            randn(rng, C), randn(rng, C) if bias else None)
    check(lib, isas, lambda p: layernorm(lib, p, *args), lambda: layernorm_spec(*args), k=10)   # dx cancels


def gelu(lib, prefix, x, b, dout, db0):
    N, H = x.shape
    y, d, dx, db = np.empty_like(x), np.empty_like(x), np.empty_like(x), None if db0 is None else db0.copy()
    assert getattr(lib, prefix + "gelu_fwd")(N, H, x, b, y, d) == 0
    assert getattr(lib, prefix + "gelu_bwd")(N, H, dout, d, dx, db) == 0
    return [y, d, dx] + ([] if db is None else [db])


def gelu_spec(x, b, dout, db0):
    y, d, dx = np.empty(x.shape), np.empty(x.shape), np.empty(x.shape)
    x, b, dout, db = f64(x, b, dout, db0)
    SPEC.gelu(x, b, y, d)
    SPEC.gelu_backward(dout, d, dx, db)
    return [y, d, dx] + ([] if db is None else [db])


@pytest.mark.parametrize("N", ROWS)
@pytest.mark.parametrize("H", COLS)
@pytest.mark.parametrize("bias", [True, False])
def test_gelu_matches_reference_and_spec(lib, isas, N, H, bias):
    rng = np.random.default_rng(N * 1000 + H)
    args = (randn(rng, (N, H), 3), randn(rng, H) if bias else None, randn(rng, (N, H)),
            randn(rng, H) if bias else None)
    check(lib, isas, lambda p: gelu(lib, p, *args), lambda: gelu_spec(*args), k=10)   # db: sums of N rows


def softmax(lib, prefix, s, datt, scale, start):
    L, T, Tk = s.shape
    att, g = s.copy(), datt.copy()
    assert getattr(lib, prefix + "causal_softmax_fwd")(L, T, Tk, start, scale, att) == 0
    assert getattr(lib, prefix + "causal_softmax_bwd")(L, T, Tk, start, scale, att, g) == 0
    return [att, g]


def softmax_spec(s, datt, scale, start):
    att = SPEC.causal_softmax(s.astype(F64), scale, start)
    return [att, SPEC.causal_softmax_backward(att, datt.astype(F64), scale, start)]


@pytest.mark.parametrize("L", (1, 3))
@pytest.mark.parametrize("T,start,Tk", [(1, 0, 1), (7, 0, 7), (17, 0, 17), (65, 0, 65), (5, 3, 8), (7, 2, 129),
                                        (17, 100, 129), (4, 0, 17), (9, 20, 17)])
def test_causal_softmax_fast_matches_reference_and_spec(lib, isas, L, T, start, Tk):
    """Tk > T: keys before the first query (start) and past the last one's; start + i may pass Tk (all seen)."""
    rng = np.random.default_rng(T * 100 + Tk)
    s, datt = randn(rng, (L, T, Tk), 3), randn(rng, (L, T, Tk))
    future = np.triu(np.ones((T, Tk), bool), k=start + 1)
    s[:, future] = np.nan                                         # the masked part is never read
    check(lib, isas, lambda p: softmax(lib, p, s, datt, 0.3, start), lambda: softmax_spec(s, datt, 0.3, start), k=5)
    att = softmax(lib, "mgk_", s, datt, 0.3, start)[0]
    assert (att[:, future] == 0).all(), "masked entries must be exactly 0"


def xent(lib, prefix, logits, t, scale):
    N, V = logits.shape
    lse, dl, total = np.empty(N, F32), np.empty_like(logits), ctypes.c_double()
    assert getattr(lib, prefix + "xent_fwd")(N, V, logits, t, lse, ctypes.byref(total)) == 0
    assert getattr(lib, prefix + "xent_bwd")(N, V, logits, t, lse, scale, dl) == 0
    return [np.array([total.value]), lse, dl]


def xent_spec(logits, t, scale):
    N, V = logits.shape
    lse = np.empty(N)
    loss = SPEC.cross_entropy(logits.astype(F64), t, lse)
    return [np.array([loss * N]), lse, SPEC.cross_entropy_backward(logits.astype(F64), t, lse, scale, np.empty((N, V)))]


@pytest.mark.parametrize("N", ROWS)
@pytest.mark.parametrize("V", ROWS + (300,))
def test_cross_entropy_fast_matches_reference_and_spec(lib, isas, N, V):
    rng = np.random.default_rng(N * 1000 + V)
    logits, t = randn(rng, (N, V), 4), rng.integers(0, V, N).astype(np.int64)
    logits[0, 0] = 1000.0                                         # max-subtracted: no overflow
    check(lib, isas, lambda p: xent(lib, p, logits, t, 0.25), lambda: xent_spec(logits, t, 0.25), k=2)


def adamw(lib, prefix, p0, g, m0, v0, args):
    p, m, v = p0.copy(), m0.copy(), v0.copy()
    assert getattr(lib, prefix + "adamw")(p.size, p, g, m, v, *args) == 0
    return [p, m, v]


def adamw_spec(p, g, m, v, args):
    p, g, m, v = f64(p, g, m, v)
    SPEC.adamw(p, g, m, v, *args)
    return [p, m, v]


@pytest.mark.parametrize("n", ROWS + (1000,))
def test_adamw_fast_matches_reference_and_spec(lib, isas, n):
    rng = np.random.default_rng(n)
    p, g, m, v = randn(rng, n), randn(rng, n), randn(rng, n), randn(rng, n) ** 2
    args = (1e-2, 0.9, 0.99, 1e-8, 0.1, 1 - 0.9 ** 3, 1 - 0.99 ** 3)
    check(lib, isas, lambda pre: adamw(lib, pre, p, g, m, v, args), lambda: adamw_spec(p, g, m, v, args), k=2)
    fast, ref = adamw(lib, "mgk_", p, g, m, v, args), adamw(lib, "mgk_ref_", p, g, m, v, args)
    for a, b in zip(fast, ref):                                   # the same float32 formula, elementwise
        np.testing.assert_array_equal(a, b)


def embedding(lib, prefix, dW0, idx, dout):
    dW = dW0.copy()
    assert getattr(lib, prefix + "embedding_bwd")(idx.size, dW.shape[0], dW.shape[1], dW, idx, dout) == 0
    return [dW]


def embedding_spec(dW0, idx, dout):
    dW = dW0.astype(F64)
    SPEC.embedding_backward(dW, idx, dout.astype(F64))
    return [dW]


@pytest.mark.parametrize("N", ROWS)
@pytest.mark.parametrize("C", ROWS)
def test_embedding_backward_fast_matches_reference_and_spec(lib, isas, N, C):
    rng = np.random.default_rng(N * 1000 + C)
    V = 11
    idx, dW, dout = rng.integers(0, V, N).astype(np.int64), randn(rng, (V, C)), randn(rng, (N, C))
    idx[: min(N, 4)] = 3                                          # repeats add up, in order
    check(lib, isas, lambda p: embedding(lib, p, dW, idx, dout), lambda: embedding_spec(dW, idx, dout), k=2)
    fast, ref = embedding(lib, "mgk_", dW, idx, dout)[0], embedding(lib, "mgk_ref_", dW, idx, dout)[0]
    np.testing.assert_array_equal(fast, ref)                       # the same adds in the same order


def dropout(lib, prefix, x, p, seed, in_place=False):
    y = x.copy() if in_place else np.full(x.shape, np.nan, F32)
    keep_from, scale = interface.dropout_keep_from(p), 1.0 / (1.0 - p)
    assert getattr(lib, prefix + "dropout")(x.size, seed, keep_from, scale, y if in_place else x, y) == 0
    return [y]


def dropout_spec(x, p, seed):                                     # float32, as the layers run it: the same bits
    return [SPEC.dropout(x, p, seed, out=np.empty_like(x))]


@pytest.mark.parametrize("n", ROWS + (70_001,))                  # 70,001: past numpy_ops' hashing chunk
@pytest.mark.parametrize("p,seed", [(0.2, 1), (0.5, 2**64 - 1), (0.0, 2**40 + 3)])
def test_dropout_fast_matches_reference_and_spec(lib, isas, n, p, seed):
    x = randn(np.random.default_rng(n), n)
    want = dropout_spec(x, p, seed)
    for run in (lambda pre: dropout(lib, pre, x, p, seed), lambda pre: dropout(lib, pre, x, p, seed, True)):
        for got in (each_isa(lib, isas, lambda: run("mgk_")), run("mgk_ref_")):
            np.testing.assert_array_equal(got[0], want[0])          # the same integers decide every element


# ----------------------------------------------------------------------------
# threads: every op on shapes large enough to be split, the same bits on 1 and 2 threads

@pytest.mark.parametrize("spin_us", [0, 100])
def test_same_bits_for_1_and_2_threads(lib, isas, spin_us):
    # shapes above each op's threading threshold (mgk_ops.c: ~100 us of work on one thread while the pool's
    # workers sleep between calls, spin 0; ~5 us a thread while they spin, as the native backend sets it): rows
    # split over threads; LayerNorm's dw and db summed in row blocks that N alone fixes, added in block order; GELU's
    # db and the scatter-add's dW split by columns, each summed in row order by one thread (the 8300-wide GELU:
    # more than one COL_BLOCK a thread)
    saved_spin = lib.mgk_pool_spin_us()
    assert lib.mgk_set_spin_us(spin_us) == 0
    try:
        same_bits_for_1_and_2_threads(lib, isas)
    finally:
        lib.mgk_set_spin_us(saved_spin)


def same_bits_for_1_and_2_threads(lib, isas):
    rng = np.random.default_rng(5)
    x, w, b, dy = randn(rng, (2600, 257), 2, 1), randn(rng, 257), randn(rng, 257), randn(rng, (2600, 257))
    s, datt = randn(rng, (25, 128, 128), 3), randn(rng, (25, 128, 128))
    logits, t = randn(rng, (2000, 65), 3), rng.integers(0, 65, 2000).astype(np.int64)
    n = 700_001
    p, g, m, v = randn(rng, n), randn(rng, n), randn(rng, n), randn(rng, n) ** 2
    idx, dout, dW = rng.integers(0, 50, 4000).astype(np.int64), randn(rng, (4000, 257)), randn(rng, (50, 257))
    wx, ww, wb, wdy = randn(rng, (60, 8300), 2, 1), randn(rng, 8300), randn(rng, 8300), randn(rng, (60, 8300))
    args = (1e-3, 0.9, 0.99, 1e-8, 0.1, 0.5, 0.3)
    dx3m = randn(rng, 3_000_001)
    for isa in isas:
        assert lib.mgk_set_isa(isa) == 0
        runs = []
        for nt in (1, 2):
            assert lib.mgk_set_num_threads(nt) == 0
            runs.append(layernorm(lib, "mgk_", x, w, b, dy, w, b) + gelu(lib, "mgk_", x, b, dy, b)
                        + gelu(lib, "mgk_", x, None, dy, None) + softmax(lib, "mgk_", s, datt, 0.25, 0)
                        + xent(lib, "mgk_", logits, t, 0.1) + adamw(lib, "mgk_", p, g, m, v, args)
                        + embedding(lib, "mgk_", dW, idx, dout) + layernorm(lib, "mgk_", wx, ww, wb, wdy, ww, wb)
                        + gelu(lib, "mgk_", wx, wb, wdy, wb) + dropout(lib, "mgk_", dx3m, 0.1, 99))
        for i, (one, two) in enumerate(zip(*runs)):
            np.testing.assert_array_equal(two, one, err_msg=f"output {i}, ISA path {isa}")


# ----------------------------------------------------------------------------
# the inline exp

def _ulps(a, b):
    """Distance in units in the last place between float32 arrays (ordered bit patterns; +0 == -0)."""
    ia, ib = (np.where(x.view(np.int32) < 0, np.int64(-2**31) - x.view(np.int32), x.view(np.int32)).astype(np.int64)
              for x in (a, b))
    return np.abs(ia - ib)


def test_exp_within_one_ulp_over_the_float32_range(lib, isas):
    # every 257th bit pattern from -inf to +inf (with NaNs), against float64 exp rounded to float32. Results
    # below FLT_MIN are 0 by design (no subnormal results: each costs a microcode assist), the rest within 1 ulp
    bits = np.arange(0, 2**32, 257, dtype=np.uint64).astype(np.uint32)
    x = np.concatenate([bits.view(F32), np.array([0.0, -0.0, -87.3365, -87.33655, -103.97, -104.0, 88.72283,
                                                  88.72284, 89.0, -np.inf, np.inf, np.nan], F32)])
    with np.errstate(over="ignore", invalid="ignore"):
        want = np.exp(x.astype(F64)).astype(F32)
    tiny = np.finfo(F32).tiny                                    # FLT_MIN, the smallest normal float32
    for isa in isas:
        assert lib.mgk_set_isa(isa) == 0
        got = np.empty_like(x)
        assert lib.mgk_exp(x.size, x, got) == 0
        nan = np.isnan(want)
        assert (np.isnan(got) == nan).all(), "NaN in, NaN out (and nowhere else)"
        err = _ulps(got[~nan], want[~nan])
        flushed = (want[~nan] < tiny) & (got[~nan] == 0)
        assert (err[~flushed] <= 1).all(), (isa, x[~nan][~flushed][err[~flushed].argmax()], err[~flushed].max())
        assert (got[x < -87.3366] == 0).all()                    # -inf and the subnormal range -> exactly 0
        special = np.empty(4, F32)
        lib.mgk_exp(4, np.array([-np.inf, np.inf, -1000.0, 1000.0], F32), special)
        assert special[0] == 0.0 and special[2] == 0.0           # the causal mask's -inf -> exactly 0
        assert special[1] == np.inf and special[3] == np.inf


# ----------------------------------------------------------------------------
# aliasing and edge values through the Ops interface

@pytest.fixture
def ops():
    return backends.load("native", verbose=False)


def test_in_place_forms_match(ops):
    rng = np.random.default_rng(6)
    x, b = randn(rng, (65, 129), 3), randn(rng, 129)
    y, d = np.empty_like(x), np.empty_like(x)
    ops.gelu(x, b, y, d)
    x2, d2 = x.copy(), np.empty_like(x)
    assert ops.gelu(x2, b, x2, d2) is x2                            # out may be x itself
    np.testing.assert_array_equal(x2, y)
    np.testing.assert_array_equal(d2, d)
    dout, db1, db2 = randn(rng, (65, 129)), np.zeros(129, F32), np.zeros(129, F32)
    dx = ops.gelu_backward(dout, d, np.empty_like(dout), db1)
    dout2 = dout.copy()
    assert ops.gelu_backward(dout2, d, dout2, db2) is dout2         # dx may be dout itself
    np.testing.assert_array_equal(dout2, dx)
    np.testing.assert_array_equal(db2, db1)

    w, mean, rstd = randn(rng, 129, 1, 1), np.empty(65, F32), np.empty(65, F32)
    ops.layernorm(x, w, b, y, mean, rstd)
    dy, dw1, dw2 = randn(rng, (65, 129)), np.zeros(129, F32), np.zeros(129, F32)
    dx = ops.layernorm_backward(dy, x, w, mean, rstd, np.empty_like(dy), dw1, None)
    dy2 = dy.copy()
    ops.layernorm_backward(dy2, x, w, mean, rstd, dy2, dw2, None)   # dx over dy: dw is summed first
    np.testing.assert_array_equal(dy2, dx)
    np.testing.assert_array_equal(dw2, dw1)


def test_softmax_edge_values(ops):
    s = np.zeros((1, 3, 4), F32)
    s[0, 1, 0] = -np.inf                                            # a visible -inf score gets weight 0
    s[0, 2] = [1e30, -1e30, 0.0, 5.0]                               # huge scores: max-subtracted
    att = ops.causal_softmax(s, 1.0, 0)
    np.testing.assert_array_equal(att[0, 1], [0.0, 1.0, 0.0, 0.0])
    np.testing.assert_array_equal(att[0, 2], [1.0, 0.0, 0.0, 0.0])
    assert att[0, 0, 0] == 1.0 and (att[0, 0, 1:] == 0).all()


def test_native_ops_reject_float64_and_bad_arguments(ops):
    x = np.zeros((3, 4))
    with pytest.raises(TypeError, match="float32"):
        ops.layernorm(x, np.ones(4), None, np.empty_like(x), np.empty(3), np.empty(3))
    with pytest.raises(TypeError, match="float32"):
        ops.gelu(x, None, np.empty_like(x), np.empty_like(x))
    with pytest.raises(TypeError, match="float32"):
        ops.causal_softmax(np.zeros((2, 2)), 1.0)
    logits = np.zeros((3, 5), F32)
    with pytest.raises(ValueError, match="out of range"):
        ops.cross_entropy(logits, np.array([0, 5, 1]), np.empty(3, F32))
    with pytest.raises(ValueError, match="out of range"):
        ops.cross_entropy_backward(logits, np.array([0, -1, 1]), np.zeros(3, F32), 1.0, np.empty_like(logits))
    ids, dW = np.array([0, 4], np.int64), np.zeros((4, 2), F32)          # the C scatter-add, called directly
    assert ops.lib.mgk_embedding_bwd(2, 4, 2, dW, ids, np.zeros((2, 2), F32)) == -1
    buf, w, dw = np.zeros((5, 4), F32), np.ones(4, F32), np.zeros(4, F32)   # LayerNorm backward's dx: in place over
    stats = np.ones(4, F32)                                                # dy, or apart from it, not half over it
    assert ops.lib.mgk_layernorm_bwd(4, 4, buf[1:], buf[1:], w, stats, stats, buf[:4], dw, None, 0) == -1
    assert ops.lib.mgk_layernorm_bwd(4, 4, buf[1:], buf[1:], w, stats, stats, buf[1:], dw, None, 0) == 0
    assert ops.lib.mgk_layernorm_bwd(4, 4, buf[1:], buf[1:], w, stats, stats, buf[1:], dw, None, 1) == -1  # acc
    with pytest.raises(ValueError, match="shape"):
        ops.layernorm(logits, np.ones(4, F32), None, np.empty_like(logits), np.empty(3, F32), np.empty(3, F32))
    with pytest.raises(ValueError, match="read-only"):
        ops.gelu(logits, None, np.broadcast_to(np.zeros(5, F32), (3, 5)), np.empty_like(logits))


def test_the_c_librarys_out_of_memory_is_a_memoryerror(ops, monkeypatch):
    """-2 from the C library (a pack buffer or scratch it could not allocate) raises MemoryError, which training
    turns into its one-line out-of-memory error; -1 (a bad argument) stays a ValueError."""
    class Failing:
        def __init__(self, rc):
            self.rc = rc

        def __getattr__(self, name):
            return lambda *args: self.rc
    x, w, stats = np.ones((4, 8), F32), np.ones(8, F32), np.ones(4, F32)
    for rc, kind in ((-2, MemoryError), (-1, ValueError)):
        monkeypatch.setattr(ops, "lib", Failing(rc))
        with pytest.raises(kind, match=f"rc={rc}"):
            ops.matmul(x, x, tb=True)
        with pytest.raises(kind, match=f"rc={rc}"):
            ops.layernorm_backward(x, x, w, stats, stats, np.empty_like(x), np.zeros(8, F32), None)

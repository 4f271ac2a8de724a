"""Every op of the backend interface (minigpt/backends, class Ops), on every backend that runs here, against
the float64 NumPy specification (NumpyOps on float64 copies of the same values).

Runs: numpy, numba and native in float32 (tolerance of float32 sums, scaled by the result's magnitude), and
numba's kernels (every op but the products, which are the specification's) also in float64 (to 1e-12). Each op
runs on odd shapes, on contiguous arrays and on strided views: the heads layers.heads makes of a (B, T, 3C) array,
padded rows, a third of each row, stepped columns, transposes, reversed rows, broadcasts. Output views sit in
NaN-filled arrays, and the NaN gaps around them must stay unwritten. Then the in-place forms, one walk over every op
Ops declares (an op declared without a row in WALK fails it), and the float32 approximations over their whole
range. A backend that cannot run here is skipped with its reason. Threads, the native library's own checks,
argument checks and selection: test_kernels.py and test_backends.py. Whole-model equivalence: test_model.py.
"""
import inspect
import itertools

import numpy as np
import pytest

from minigpt import backends
from minigpt.backends import numpy_ops
from minigpt.layers import heads
from helpers import causal_products

F32, F64 = np.float32, np.float64
SPEC = numpy_ops.NumpyOps()                                     # the specification, run in float64
SIZES = (1, 7, 16, 17, 64, 129)
FLAGS = list(itertools.product((False, True), repeat=2))          # (ta, tb)


REASONS = {name: backends.why_unavailable(name) for name in backends.BACKENDS}


def _run(name, dt):
    marks = pytest.mark.skipif(REASONS[name] is not None, reason=str(REASONS[name]))
    return pytest.param(name, dt, marks=marks, id=f"{name}-{np.dtype(dt).name}")


def _fast(name):
    return pytest.param(name, marks=pytest.mark.skipif(REASONS[name] is not None, reason=str(REASONS[name])))


FAST = [_fast("numba"), _fast("native")]
PRODUCTS = [_run("numpy", F32), _run("numba", F32), _run("native", F32)]     # the products: float32 (numpy: any)
KERNELS = PRODUCTS + [_run("numba", F64)]                                   # every other op


# ----------------------------------------------------------------------------
# arrays: random values, strided views inside NaN-filled arrays, comparison with the specification

def randn(rng, shape, dt, s=1.0, shift=0.0):
    return (s * rng.standard_normal(shape) + shift).astype(dt)


def _layout(shape, kind):
    """(shape of a base array, function base -> a view of `shape` laid out as kind)."""
    c = shape[-1]
    if kind == "contig":
        return shape, lambda a: a
    if kind == "pad":                                             # rows 5 elements farther apart
        return (*shape[:-1], c + 5), lambda a: a[..., :c]
    if kind == "mid":                                             # the middle third of each row (k of qkv)
        return (*shape[:-1], 3 * c), lambda a: a[..., c:2 * c]
    if kind == "step":                                            # columns 2 apart: rows not contiguous
        return (*shape[:-1], 2 * c), lambda a: a[..., ::2]
    if kind == "T":                                               # a transpose
        return (*shape[:-2], c, shape[-2]), lambda a: a.swapaxes(-1, -2)
    if kind == "rev":                                             # a negative stride
        return shape, lambda a: a[::-1]
    if kind == "heads":                                           # (B, nh, T, hs): k of heads(qkv (B, T, 3C))
        B, nh, T, hs = shape
        return (B, T, 3 * nh * hs), lambda a: heads(a, nh, 3)[1]
    raise ValueError(kind)


def gapped(shape, kind, dt, values=None):
    """A view of `shape` laid out as kind inside a NaN-filled array (holding values, if given), and a function
    that tells whether every element outside the view is still NaN."""
    bshape, view = _layout(tuple(shape), kind)
    base, inside = np.full(bshape, np.nan, dt), np.zeros(bshape, bool)
    view(inside)[...] = True
    v = view(base)
    assert v.shape == tuple(shape)
    if values is not None:
        v[...] = values
    return v, lambda: bool(np.isnan(base[~inside]).all())


def f64(*arrays):
    return [None if a is None else np.array(a, F64) for a in arrays]


def close(got, ref, dt, k=1.0, what=""):
    """got within k * (1e-5 float32 | 1e-12 float64) of ref, elementwise and relative to ref's largest entry."""
    tol = k * (1e-5 if dt == F32 else 1e-12)
    ref = np.asarray(ref, F64)
    np.testing.assert_allclose(np.asarray(got, F64), ref, rtol=tol, atol=tol * max(np.abs(ref).max(initial=0), 1e-30),
                               err_msg=what)


def close_gemm(got, ref, Kd):
    # float32 sums of Kd unit-variance products: the rounding error grows like sqrt(Kd)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=2e-5 * np.sqrt(max(Kd, 1)))


def operands(rng, M, N, Kd, ta, tb, lead=()):
    """float32 a, b stored as the flags say, and op(a) @ op(b) in float64."""
    a = randn(rng, (*lead, Kd, M) if ta else (*lead, M, Kd), F32)
    b = randn(rng, (*lead, N, Kd) if tb else (*lead, Kd, N), F32)
    return a, b, SPEC.bmm(*f64(a, b), ta=ta, tb=tb) if lead else SPEC.matmul(*f64(a, b), ta=ta, tb=tb)


# ----------------------------------------------------------------------------
# products

@pytest.mark.parametrize("name,dt", PRODUCTS)
@pytest.mark.parametrize("ta,tb", FLAGS)
@pytest.mark.parametrize("acc", [False, True])
def test_matmul_matches_float64(use, name, dt, ta, tb, acc):
    ops = use(name)
    rng = np.random.default_rng(0)
    for M, N, Kd in itertools.product(SIZES, repeat=3):
        a, b, ref = operands(rng, M, N, Kd, ta, tb)
        if acc:
            c0 = randn(rng, (M, N), F32)
            out = c0.copy()
            got = ops.matmul(a, b, ta=ta, tb=tb, out=out, acc=True)
            assert got is out, "acc=True must add into out in place"
            ref = ref + c0
        else:
            got = ops.matmul(a, b, ta=ta, tb=tb)
        assert got.shape == (M, N) and got.dtype == F32
        close_gemm(got, ref, Kd)


@pytest.mark.parametrize("name,dt", PRODUCTS)
@pytest.mark.parametrize("ta,tb", FLAGS)
def test_few_rows_match_float64(use, name, dt, ta, tb):
    # decoding multiplies 1..num_samples rows by a weight matrix: native has an unpacked path for these (M <= 8);
    # widths cross its vectors and its tiles of 2-8 columns (op(B) = B^T), and the large ones are split over threads
    ops = use(name)
    rng = np.random.default_rng(2)
    for M, N, Kd in itertools.product((1, 2, 3, 5, 8, 9), (1, 63, 65, 130, 1536), (1, 17, 384)):
        a, b, ref = operands(rng, M, N, Kd, ta, tb)
        out = randn(rng, (M, N), F32)
        close_gemm(ops.matmul(a, b, ta=ta, tb=tb, out=out.copy(), acc=True), ref + out, Kd)
        close_gemm(ops.matmul(a, b, ta=ta, tb=tb), ref, Kd)


# (a, b, out) layouts: walkable views (rows of contiguous floats) and views that must be copied
MATMUL_VIEWS = [("pad", "mid", "pad"), ("mid", "pad", "mid"), ("step", "T", "step"), ("T", "rev", "T"),
                ("rev", "step", "pad"), ("contig", "contig", "step")]


@pytest.mark.parametrize("name,dt", PRODUCTS)
@pytest.mark.parametrize("ta,tb", FLAGS)
def test_matmul_on_views_matches_float64(use, name, dt, ta, tb):
    ops = use(name)
    rng = np.random.default_rng(5)
    for (M, N, Kd), (ka, kb, ko) in itertools.product([(7, 17, 16), (1, 9, 5), (33, 20, 64), (17, 1, 129)],
                                                      MATMUL_VIEWS):
        a, b, ref = operands(rng, M, N, Kd, ta, tb)
        av, a_gaps = gapped(a.shape, ka, F32, a)
        bv, b_gaps = gapped(b.shape, kb, F32, b)
        out, out_gaps = gapped((M, N), ko, F32)                      # NaN: beta = 0 must never read out
        assert ops.matmul(av, bv, ta=ta, tb=tb, out=out) is out
        close_gemm(out, ref, Kd)
        ops.matmul(av, bv, ta=ta, tb=tb, out=out, acc=True)
        close_gemm(out, 2 * ref, Kd)
        assert out_gaps() and a_gaps() and b_gaps(), f"{ka, kb, ko}: a write outside a view"
        np.testing.assert_array_equal(av, a)                         # inputs are not written
        close_gemm(ops.matmul(av, bv, ta=ta, tb=tb), ref, Kd)


@pytest.mark.parametrize("name,dt", PRODUCTS)
@pytest.mark.parametrize("ta,tb", FLAGS)
def test_bmm_matches_float64(use, name, dt, ta, tb):
    ops = use(name)
    rng = np.random.default_rng(1)
    shapes = [((1,), 7, 16, 17), ((3,), 1, 7, 129), ((5,), 64, 64, 32), ((48,), 64, 32, 64), ((2, 3), 17, 16, 7),
              ((2, 2, 3), 5, 9, 4)]
    for lead, M, N, Kd in shapes:
        a, b, ref = operands(rng, M, N, Kd, ta, tb, lead)
        close_gemm(ops.bmm(a, b, ta=ta, tb=tb), ref, Kd)
        out = np.full((*lead, M, N), np.nan, F32)                    # beta = 0 must never read out
        assert ops.bmm(a, b, ta=ta, tb=tb, out=out) is out
        close_gemm(out, ref, Kd)
        ops.bmm(a, b, ta=ta, tb=tb, out=out, acc=True)
        close_gemm(out, 2 * ref, Kd)


# (a, b, out) layouts of 4-D (2 batch dims) and 3-D (1 batch dim) stacks
BMM_VIEWS4 = [("heads", "heads", "heads"), ("heads", "pad", "mid"), ("step", "heads", "T"), ("rev", "T", "heads"),
              ("mid", "step", "step")]
BMM_VIEWS3 = [("pad", "mid", "pad"), ("step", "T", "mid"), ("T", "rev", "step"), ("rev", "pad", "T")]


@pytest.mark.parametrize("name,dt", PRODUCTS)
@pytest.mark.parametrize("ta,tb", FLAGS)
def test_bmm_on_views_matches_float64(use, name, dt, ta, tb):
    """Attention's products on heads read and written in place (two batch levels, rows in qkv), and
    stacks whose rows are longer than their matrices, or not contiguous at all (native copies those; numba's
    products are np.matmul's, which reads any view)."""
    ops = use(name)
    rng = np.random.default_rng(7)
    shapes4 = [(17, 17, 7), (17, 7, 17), (1, 9, 5), (33, 20, 64)]
    cases = [((3, 5), mnk, kinds) for mnk in shapes4 for kinds in BMM_VIEWS4]
    cases += [((4,), mnk, kinds) for mnk in [(9, 11, 13), (1, 16, 129)] for kinds in BMM_VIEWS3]
    for lead, (M, N, Kd), (ka, kb, ko) in cases:
        a, b, ref = operands(rng, M, N, Kd, ta, tb, lead)
        av, a_gaps = gapped(a.shape, ka, F32, a)
        bv, b_gaps = gapped(b.shape, kb, F32, b)
        out, out_gaps = gapped(ref.shape, ko, F32)
        assert ops.bmm(av, bv, ta=ta, tb=tb, out=out) is out
        close_gemm(out, ref, Kd)
        ops.bmm(av, bv, ta=ta, tb=tb, out=out, acc=True)
        close_gemm(out, 2 * ref, Kd)
        assert out_gaps() and a_gaps() and b_gaps(), f"{lead, ka, kb, ko}: a write outside a view"
        np.testing.assert_array_equal(av, a)
        close_gemm(ops.bmm(av, bv, ta=ta, tb=tb), ref, Kd)


@pytest.mark.parametrize("name,dt", PRODUCTS)
def test_causal_products_are_the_plain_products(use, name, dt):
    """bmm(causal=...): "out" is the plain product with the future exactly 0 (whatever out held), "a" the plain
    product of a causal a, stored as is or transposed, with acc too (helpers.causal_products)."""
    for got, a, b, ta, tb, base, future in causal_products(use(name), np.random.default_rng(12)):
        ref = SPEC.bmm(*f64(a, b), ta=ta, tb=tb) + (0 if base is None else base)
        if future is not None:
            ref[..., future] = 0
            assert (got[..., future] == 0).all()
        close_gemm(got, ref, a.shape[-2] if ta else a.shape[-1])


def test_causal_products_refuse_what_they_cannot_mean():
    a, b = np.ones((2, 4, 3), F32), np.ones((2, 3, 4), F32)
    for kw in (dict(causal="b"), dict(causal="out", acc=True, out=np.zeros((2, 4, 4), F32)),
               dict(causal="a", start=-1)):
        with pytest.raises(ValueError, match="causal"):
            SPEC.bmm(a, b, **kw)


@pytest.mark.parametrize("name,dt", PRODUCTS)
def test_bmm_takes_unwalkable_views(use, name, dt):
    """Views the C code cannot walk in place (broadcasts, stride-0 rows, three strided batch dims) are copied
    into scratch and give the float64 result: no backend refuses a view."""
    ops = use(name)
    rng = np.random.default_rng(8)
    x, b = randn(rng, (4, 3), F32), randn(rng, (2, 3, 5), F32)
    cases = [(np.broadcast_to(x, (2, 4, 3)), b),                                     # batch stride 0
             (np.broadcast_to(x[:1], (2, 4, 3)), b),                                 # row and batch strides 0
             (np.broadcast_to(x[:, :1], (2, 4, 3)), b),                              # column stride 0
             (randn(rng, (2, 2, 2, 4, 6), F32)[..., ::2], randn(rng, (2, 2, 2, 3, 5), F32)[:, ::-1])]
    for a, bb in cases:
        ref = SPEC.bmm(*f64(a, bb))
        close_gemm(ops.bmm(a, bb), ref, 3)
        out = np.full(ref.shape, np.nan, F32)
        close_gemm(ops.bmm(a, bb, out=out), ref, 3)
    with pytest.raises(ValueError, match="read-only"):
        ops.bmm(x[None], b[:1], out=np.broadcast_to(np.zeros((4, 5), F32), (1, 4, 5)))


@pytest.mark.parametrize("name,dt", PRODUCTS)
def test_matmul_empty_and_k0(use, name, dt):
    ops = use(name)
    a, b = np.zeros((3, 0), F32), np.zeros((0, 4), F32)
    np.testing.assert_array_equal(ops.matmul(a, b), np.zeros((3, 4)))
    out = np.ones((3, 4), F32)
    np.testing.assert_array_equal(ops.matmul(a, b, out=out, acc=True), np.ones((3, 4)))
    assert ops.matmul(np.zeros((0, 5), F32), np.zeros((5, 2), F32)).shape == (0, 2)
    assert ops.bmm(np.zeros((0, 3, 5), F32), np.zeros((0, 5, 2), F32)).shape == (0, 3, 2)
    np.testing.assert_array_equal(ops.bmm(np.zeros((2, 3, 0), F32), np.zeros((2, 0, 4), F32)), np.zeros((2, 3, 4)))
    for M, N in ((0, 4), (4, 0), (0, 0)):                              # empty causal results
        assert ops.bmm(np.zeros((2, M, 5), F32), np.zeros((2, 5, N), F32), causal="out").shape == (2, M, N)


# ----------------------------------------------------------------------------
# the other ops; layout "views" puts every array but the (N,) statistics and parameters in a strided view

LAYOUTS = ["contig", "views"]


def _kinds(layout, *kinds):
    return kinds if layout == "views" else ("contig",) * len(kinds)


@pytest.mark.parametrize("name,dt", KERNELS)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("N,C", [(21, 33), (1, 7), (5, 129)])
def test_layernorm_matches_spec(use, rng, name, dt, bias, layout, N, C):
    ops = use(name)
    kx, ky, kdy, kdx = _kinds(layout, "pad", "mid", "step", "rev")
    x = gapped((N, C), kx, dt, randn(rng, (N, C), dt, 3, 1))[0]
    y, y_gaps = gapped((N, C), ky, dt)
    w, b = randn(rng, C, dt, 1, 1), randn(rng, C, dt) if bias else None
    mean, rstd = np.empty(N, dt), np.empty(N, dt)
    ref_y, ref_m, ref_r = np.empty((N, C)), np.empty(N), np.empty(N)
    SPEC.layernorm(*f64(x, w, b), ref_y, ref_m, ref_r, 1e-5)
    assert ops.layernorm(x, w, b, y, mean, rstd, 1e-5) is y
    close(y, ref_y, dt, what="y")
    close(mean, ref_m, dt, what="mean")
    close(rstd, ref_r, dt, what="rstd")
    assert y_gaps()

    dy = gapped((N, C), kdy, dt, randn(rng, (N, C), dt))[0]
    dx, dx_gaps = gapped((N, C), kdx, dt)
    dw, db = randn(rng, C, dt), randn(rng, C, dt) if bias else None     # the op adds into dw, db
    ref_dx, ref_dw, ref_db = np.empty((N, C)), *f64(dw, db)
    SPEC.layernorm_backward(*f64(dy, x, w), ref_m, ref_r, ref_dx, ref_dw, ref_db)
    ops.layernorm_backward(dy, x, w, mean, rstd, dx, dw, db)
    close(dx, ref_dx, dt, 10, what="dx")                                # dx: sums of cancelling terms
    close(dw, ref_dw, dt, 10, what="dw")
    if bias:
        close(db, ref_db, dt, what="db")
    assert dx_gaps()
    first = dx.copy()
    ops.layernorm_backward(dy, x, w, mean, rstd, dx, dw, db, acc=True)  # dx += the same again, through the view
    np.testing.assert_array_equal(dx, first + first)
    assert dx_gaps()


@pytest.mark.parametrize("name,dt", KERNELS)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gelu_matches_spec(use, rng, name, dt, bias, layout):
    ops = use(name)
    shape = (3, 7, 33)
    kx, ky, kd, kdo, kdx = _kinds(layout, "T", "pad", "mid", "step", "rev")
    x = gapped(shape, kx, dt, randn(rng, shape, dt, 3))[0]
    b = randn(rng, 33, dt) if bias else None
    (y, y_gaps), (d, d_gaps) = gapped(shape, ky, dt), gapped(shape, kd, dt)
    ref_y, ref_d = np.empty(shape), np.empty(shape)
    SPEC.gelu(*f64(x, b), ref_y, ref_d)
    assert ops.gelu(x, b, y, d) is y
    close(y, ref_y, dt, 2, what="y")
    close(d, ref_d, dt, 2, what="gelu'")
    assert y_gaps() and d_gaps()

    dout = gapped(shape, kdo, dt, randn(rng, shape, dt))[0]
    dx, dx_gaps = gapped(shape, kdx, dt)
    db0 = randn(rng, 33, dt) if bias else None                           # the op adds into db
    ref_dx, ref_db = np.empty(shape), *f64(db0)
    SPEC.gelu_backward(*f64(dout, d), ref_dx, ref_db)
    for inplace in (False, True):                                       # dx may be dout itself
        db = None if db0 is None else db0.copy()
        out = dout if inplace else dx
        assert ops.gelu_backward(dout, d, out, db) is out
        close(out, ref_dx, dt, what=f"dx (in place: {inplace})")
        if bias:
            close(db, ref_db, dt, 10, what="db")
    assert dx_gaps()


@pytest.mark.parametrize("name,dt", KERNELS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("T,start,Tk", [(7, 0, 7), (1, 0, 1), (5, 3, 8), (4, 2, 9), (17, 0, 17), (6, 5, 8)])
def test_causal_softmax_matches_spec(use, rng, name, dt, layout, T, start, Tk):
    """Query i sees keys 0..start+i of Tk (Tk > T: a prefix before the queries, and keys past the last query's;
    start + T > Tk: the last queries see every key, and nothing past a row is written)."""
    ops = use(name)
    shape, scale = (2, 3, T, Tk), 0.3
    future = np.triu(np.ones((T, Tk), bool), k=start + 1)
    s = randn(rng, shape, dt, 3)
    ka, kd = _kinds(layout, "heads", "step")
    att, att_gaps = gapped(shape, ka, dt, s)
    att[:, :, future] = np.nan                                          # the masked half is never read
    ref = SPEC.causal_softmax(s.astype(F64), scale, start)
    assert ops.causal_softmax(att, scale, start) is att
    close(att, ref, dt, 2, what="att")
    assert (att[:, :, future] == 0).all(), "masked entries must be exactly 0"
    assert att_gaps()

    datt, datt_gaps = gapped(shape, kd, dt, randn(rng, shape, dt))
    ref_ds = SPEC.causal_softmax_backward(ref, datt.astype(F64), scale, start)
    assert ops.causal_softmax_backward(att, datt, scale, start) is datt
    close(datt, ref_ds, dt, 5, what="d(scores)")
    assert (datt[:, :, future] == 0).all()
    assert datt_gaps()


@pytest.mark.parametrize("name,dt", KERNELS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("tdt", [np.int64, np.int32])
def test_cross_entropy_matches_spec(use, rng, name, dt, layout, tdt):
    ops = use(name)
    N, V = 37, 11
    kl, kd = _kinds(layout, "pad", "step")
    values = randn(rng, (N, V), dt, 4)
    values[0, :3] = [1000, 0, -1000]                                    # max-subtracted: no overflow
    logits = gapped((N, V), kl, dt, values)[0]
    t = rng.integers(0, V, N).astype(tdt)
    t[0] = 2                                                           # loss 2000 in row 0
    lse, ref_lse = np.empty(N, dt), np.empty(N)
    ref_loss = SPEC.cross_entropy(values.astype(F64), t, ref_lse)
    loss = ops.cross_entropy(logits, t, lse)
    assert isinstance(loss, float) and abs(loss - ref_loss) <= (1e-5 if dt == F32 else 1e-12) * ref_loss
    close(lse, ref_lse, dt, what="lse")

    dl, dl_gaps = gapped((N, V), kd, dt)
    ref_dl = SPEC.cross_entropy_backward(values.astype(F64), t, ref_lse, 0.25, np.empty((N, V)))
    assert ops.cross_entropy_backward(logits, t, lse, 0.25, dl) is dl
    close(dl, ref_dl, dt, 2, what="dlogits")
    assert dl_gaps()


@pytest.mark.parametrize("name,dt", KERNELS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("idt", [np.int64, np.int32])
def test_embedding_backward_matches_loop(use, rng, name, dt, layout, idt):
    ops = use(name)
    V, N, C = 11, 50, 33
    idx = rng.integers(0, V, N).astype(idt)
    idx[:4] = 3                                                        # repeats must add up
    dout = gapped((N, C), _kinds(layout, "mid")[0], dt, randn(rng, (N, C), dt))[0]
    dW = randn(rng, (V, C), dt)
    want = dW.astype(F64)
    for n in range(N):                                                 # dW[idx[n]] += dout[n], one row at a time
        want[idx[n]] += dout[n]
    ref = dW.astype(F64)
    SPEC.embedding_backward(ref, idx, dout.astype(F64))
    np.testing.assert_allclose(ref, want, rtol=1e-13, atol=1e-13)      # the spec is np.add.at: the loop
    ops.embedding_backward(dW, idx, dout)
    close(dW, want, dt, 2)


@pytest.mark.parametrize("name,dt", KERNELS)
@pytest.mark.parametrize("shape", [(7, 33), (129,)])
def test_adamw_matches_spec(use, rng, name, dt, shape):
    ops = use(name)
    p, m, v = randn(rng, shape, dt), randn(rng, shape, dt), randn(rng, shape, dt) ** 2
    ref = f64(p, m, v)
    for t in (1, 2, 3):                                                # the moments carry from step to step
        g = gapped(shape, "step", dt, randn(rng, shape, dt))[0]        # g may be a view (p, m, v are params)
        args = (1e-2, 0.9, 0.99, 1e-8, 0.1, 1 - 0.9 ** t, 1 - 0.99 ** t)
        before, ref_before = p.astype(F64), ref[0].copy()
        SPEC.adamw(ref[0], g.astype(F64), ref[1], ref[2], *args)
        ops.adamw(p, g, m, v, *args)
        for name_, got, want in zip("pmv", (p, m, v), ref):
            close(got, want, dt, 2, what=f"{name_} after step {t}")
        # the update itself (about lr = 1e-2, small next to p): 1% wrong would pass the check of p above; k 20:
        # p's own rounding in float32 (half an ulp of |p| < 5) is up to 2e-5 of the update
        close(p.astype(F64) - before, ref[0] - ref_before, dt, 20, what=f"p's update at step {t}")


def dropout_mask(ops, shape, p, seed, dt=F64):
    """The mask Ops.dropout multiplies by: its dropout of ones."""
    return ops.dropout(np.ones(shape, dt), p, seed, out=np.empty(shape, dt))


@pytest.mark.parametrize("name,dt", KERNELS)
@pytest.mark.parametrize("layout", ["contig", "step", "rev"])
def test_dropout_matches_spec(use, rng, name, dt, layout):
    """The spec's bits, x times its mask, from any view into any view, and in place; past numpy_ops' hashing
    chunk; p so close to 1 that every element is dropped (keep_from = 2**24)."""
    ops = use(name)
    for shape, p, seed in (((3, 7, 5), 0.5, 12), ((2, 35001), 0.1, 2**63 + 7), ((9, 4), 1 - 2**-25, 5)):
        values = randn(rng, shape, dt)
        want = SPEC.dropout(values, p, seed, out=np.empty(shape, dt))
        x, x_untouched = gapped(shape, layout, dt, values)
        out, untouched = gapped(shape, layout, dt)
        assert ops.dropout(x, p, seed, out=out) is out
        np.testing.assert_array_equal(out, want)
        assert ((want == 0) | (want == values * dt(1.0 / (1.0 - p)))).all() and (want == 0).all() == (p > 1 - 2**-24)
        assert untouched() and x_untouched(), f"{name}: a write outside the views"
        np.testing.assert_array_equal(x, values)
        assert ops.dropout(x, p, seed, out=x) is x                    # in place
        np.testing.assert_array_equal(x, want)
        assert x_untouched()


def test_dropout_is_a_fair_fresh_draw():
    """Keep rates of 1 - p, overall and at every position; masks of two seeds (and of one seed's neighbouring
    elements) uncorrelated; the same seed gives the same mask."""
    n, draws = 4096, 64
    for p in (0.1, 0.5, 0.9):
        masks = np.stack([dropout_mask(SPEC, n, p, seed) > 0 for seed in range(draws)])
        assert abs(masks.mean() - (1 - p)) < 4 * np.sqrt(p * (1 - p) / masks.size)
        per_position = masks.mean(0)                              # each element kept at rate 1 - p across seeds
        assert np.abs(per_position - (1 - p)).max() < 6 * np.sqrt(p * (1 - p) / draws)   # max of 4096: ~4-5
        centred = masks - masks.mean()
        for a, b in ((centred[:-1], centred[1:]), (centred[:, :-1], centred[:, 1:])):   # seeds s, s+1; i, i+1
            r = (a * b).mean() / centred.var()
            assert abs(r) < 4 / np.sqrt(a.size), (p, r)
    a = dropout_mask(SPEC, 100, 0.5, 42)
    assert set(np.unique(a)) == {0.0, 2.0}
    np.testing.assert_array_equal(a, dropout_mask(SPEC, 100, 0.5, 42))
    assert not np.array_equal(a, dropout_mask(SPEC, 100, 0.5, 43))


@pytest.mark.parametrize("name", [p.values[0] for p in PRODUCTS], ids=lambda n: n)
def test_every_backend_refuses_bad_arguments_alike(use, name):
    """Ops checks each op's arguments once for every backend, before a kernel that trusts them runs: ids and
    targets outside [0, V) (numba's scatter-add wrote outside dW, its loss read outside the row), arrays of
    the wrong shape (a short w or g), a 1-D x, a negative start, a loss over no rows (nan on numpy, 0 in C). The
    same error, whichever backend."""
    if REASONS[name] is not None:
        pytest.skip(str(REASONS[name]))
    ops = use(name)
    x, logits, dW = np.zeros((3, 4), F32), np.zeros((3, 5), F32), np.zeros((5, 4), F32)
    cases = [
        (lambda: ops.embedding_backward(dW, np.array([0, 5, 1]), x), r"token ids out of range: .*\[0, 5\), got 0 to 5"),
        (lambda: ops.embedding_backward(dW, np.array([0, -1, 1]), x), r"token ids out of range"),
        (lambda: ops.embedding_backward(dW, np.array([0.0, 1, 1]), x), r"token ids must be integers"),
        (lambda: ops.cross_entropy(logits, np.array([0, 5, 1]), np.empty(3, F32)), r"targets out of range"),
        (lambda: ops.cross_entropy(logits[:0], np.array([], np.int64), np.empty(0, F32)), r"no rows"),
        (lambda: ops.cross_entropy_backward(logits, np.array([0, -1, 1]), np.zeros(3, F32), 1.0,
                                            np.empty_like(logits)), r"targets out of range"),
        (lambda: ops.layernorm(x, np.ones(3, F32), None, np.empty_like(x), np.empty(3, F32), np.empty(3, F32)),
         r"layernorm: an array has shape \(3,\), expected \(4,\)"),
        (lambda: ops.layernorm(x[0], np.ones(4, F32), None, np.empty(4, F32), np.empty(1, F32), np.empty(1, F32)),
         r"layernorm: expected a 2-D array"),
        (lambda: ops.adamw(np.zeros(6, F32), np.zeros(5, F32), np.zeros(6, F32), np.zeros(6, F32), 0.1, 0.9, 0.99,
                           1e-8, 0.0, 1.0, 1.0), r"adamw: an array has shape \(5,\)"),
        (lambda: ops.gelu(x, np.zeros(3, F32), np.empty_like(x), np.empty_like(x)), r"gelu: an array has shape"),
        (lambda: ops.causal_softmax(np.zeros((2, 3, 3), F32), 1.0, start=-1), r"start must be >= 0"),
    ]
    for call, words in cases:
        with pytest.raises((ValueError, TypeError), match=words):
            call()
    assert not dW.any()                                                  # nothing written before the error


def test_dropout_refuses_bad_arguments():
    """A bad p or seed, an out of another shape or dtype, or one that overlaps x without being x."""
    a4 = np.arange(4.0)
    for x, out, p, seed, words in ((np.empty(3), np.empty(3), 1.0, 0, "p must lie in [0, 1)"),
                                   (np.empty(3), np.empty(3), 0.1, -1, "seed"),
                                   (np.empty(3), np.empty(3), 0.1, 2**64, "seed"),
                                   (np.empty(3), np.empty(4), 0.1, 1, "out is"),
                                   (np.empty(3), np.empty(3, F32), 0.1, 1, "out is"),
                                   (a4[1:], a4[:3], 0.1, 1, "overlaps")):
        with pytest.raises(ValueError, match=words.replace("[", r"\[").replace(")", r"\)")):
            SPEC.dropout(x, p, seed, out=out)


@pytest.mark.parametrize("name,dt", KERNELS)
def test_in_place_forms_match(use, rng, name, dt):
    """The aliasing the interface allows: gelu's out may be x, gelu_backward's dx may be dout, and
    layernorm_backward's dx may be dy; each gives what the separate arrays give. A dx that overlaps x, or dy without
    being it, is refused, alike on every backend."""
    ops = use(name)
    x, b, dout = randn(rng, (5, 7, 33), dt, 3), randn(rng, 33, dt), randn(rng, (5, 7, 33), dt)
    y, d = np.empty_like(x), np.empty_like(x)
    ops.gelu(x, b, y, d)
    x2, d2 = x.copy(), np.empty_like(x)
    assert ops.gelu(x2, b, x2, d2) is x2
    np.testing.assert_array_equal(x2, y)
    np.testing.assert_array_equal(d2, d)
    db1, db2 = np.zeros(33, dt), np.zeros(33, dt)
    dx = ops.gelu_backward(dout, d, np.empty_like(dout), db1)
    dout2 = dout.copy()
    assert ops.gelu_backward(dout2, d, dout2, db2) is dout2
    np.testing.assert_array_equal(dout2, dx)
    np.testing.assert_array_equal(db2, db1)

    x, w = randn(rng, (21, 33), dt, 3, 1), randn(rng, 33, dt, 1, 1)
    mean, rstd, dy = np.empty(21, dt), np.empty(21, dt), randn(rng, (21, 33), dt)
    ops.layernorm(x, w, b, np.empty_like(x), mean, rstd)
    dw1, dw2, db1, db2 = np.zeros(33, dt), np.zeros(33, dt), np.zeros(33, dt), np.zeros(33, dt)
    dx = ops.layernorm_backward(dy, x, w, mean, rstd, np.empty_like(dy), dw1, db1)
    dy2 = dy.copy()
    assert ops.layernorm_backward(dy2, x, w, mean, rstd, dy2, dw2, db2) is dy2
    for got, want in ((dy2, dx), (dw2, dw1), (db2, db1)):
        np.testing.assert_array_equal(got, want)
    dx0 = randn(rng, (21, 33), dt)                                              # acc: dx += what it would write
    dx3, dw3, db3 = dx0.copy(), np.zeros(33, dt), np.zeros(33, dt)
    assert ops.layernorm_backward(dy, x, w, mean, rstd, dx3, dw3, db3, acc=True) is dx3
    for got, want in ((dx3, dx0 + dx), (dw3, dw1), (db3, db1)):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="overlaps"):                            # not in place over dy
        ops.layernorm_backward(dy2, x, w, mean, rstd, dy2, dw3, None, acc=True)
    buf = np.concatenate([dy, dy[:1]])
    for dy4, x4, dx4 in ((buf[1:], x, buf[:21]), (dy, buf[1:], buf[:21]), (dy, buf[:21], buf[:21])):
        with pytest.raises(ValueError, match="overlaps"):                        # half over dy or x, or dx is x
            ops.layernorm_backward(dy4, x4, w, mean, rstd, dx4, np.zeros(33, dt), None)


# ----------------------------------------------------------------------------
# the interface walked: every op Ops declares, on every backend, against the float64 spec. One row per op;
# the tests above go deeper (odd shapes, every kind of view, edge values)

KNOBS = {"set_threads", "spin", "with_bf16"}                     # public methods of Ops that are not ops
DECLARED = sorted(n for n, f in vars(backends.Ops).items()
                  if inspect.isfunction(f) and not n.startswith("_") and n not in KNOBS)


def _walk_rows(rng):
    """op -> (its arguments, float64 arrays where the layers pass float arrays; tolerance factor). A backward
    op gets what its forward kept (mean and rstd, gelu', probabilities, lse), made by the spec."""
    N, C, V = 21, 33, 11
    nan = lambda *shape: np.full(shape, np.nan)                   # noqa: E731  (outputs: all must be written)
    r = lambda *shape, s=1.0, shift=0.0: randn(rng, shape, F64, s, shift)    # noqa: E731
    x, w, b = r(N, C, s=3, shift=1), r(C, shift=1), r(C)
    mean, rstd = np.empty(N), np.empty(N)
    SPEC.layernorm(x, w, b, np.empty((N, C)), mean, rstd)
    z, bh, dgelu = r(3, 7, C, s=3), r(C), np.empty((3, 7, C))
    SPEC.gelu(z, bh, np.empty(z.shape), dgelu)
    s = r(2, 3, 5, 8, s=3)
    att = SPEC.causal_softmax(s.copy(), 0.3, 3)
    logits, t, lse = r(N, V, s=4), rng.integers(0, V, N), np.empty(N)
    SPEC.cross_entropy(logits, t, lse)
    p, g, m, v = r(50), r(50), r(50), r(50) ** 2                     # 1-D: p, m, v must not become views
    qh, kh, vh = r(2, 3, 5, 4), r(2, 3, 8, 4), r(2, 3, 8, 4)        # attention: 5 queries after 3 cached keys
    q0, k0, v0, s0 = r(2, 3, 6, 4), r(2, 3, 6, 4), r(2, 3, 6, 4), r(2, 3, 6, 6, s=3)   # ... and at start 0
    att0 = SPEC.causal_softmax(s0, 0.4)
    return {
        "matmul": ([r(C, 17), r(20, C), True, True, r(17, 20), True], 10),
        "bmm": ([r(2, 3, 17, 9), r(2, 3, 9, 20), False, False, nan(2, 3, 17, 20), False], 10),
        "matmul_gelu": ([r(N, 17), r(17, C, s=0.3), bh, nan(N, C), nan(N, C)], 10),
        "matmul_mul": ([r(N, 17), r(C, 17, s=0.3), r(N, C), nan(N, C), True], 10),
        "matmul_add": ([r(N, 17), r(17, C, s=0.3), bh, r(N, C), nan(N, C), (0.25, 12345)], 10),
        "layernorm": ([x, w, b, nan(N, C), nan(N), nan(N), 1e-5], 2),
        "layernorm_backward": ([r(N, C), x, w, mean, rstd, nan(N, C), r(C), r(C)], 10),
        "gelu": ([z, bh, nan(3, 7, C), nan(3, 7, C)], 2),
        "gelu_backward": ([r(3, 7, C), dgelu, nan(3, 7, C), r(C)], 10),
        "causal_softmax": ([s, 0.3, 3], 2),
        "causal_softmax_backward": ([att, r(*s.shape), 0.3, 3], 5),
        "cross_entropy": ([logits, t, nan(N)], 2),
        "cross_entropy_backward": ([logits, t, lse, 0.25, nan(N, V)], 2),
        "embedding_backward": ([r(V, C), rng.integers(0, V, N), r(N, C)], 2),
        "adamw": ([p, g, m, v, 1e-2, 0.9, 0.99, 1e-8, 0.1, 0.5, 0.3], 2),
        "dropout": ([r(4, 9, 13), 0.3, 2**64 - 5, nan(4, 9, 13)], 2),
        "attention": ([qh, kh, vh, nan(2, 3, 5, 8), nan(2, 3, 5, 4), 0.4, 3], 5),
        "attention_backward": ([q0, k0, v0, att0, r(2, 3, 6, 4), nan(2, 3, 6, 4), nan(2, 3, 6, 4),
                                nan(2, 3, 6, 4), 0.4], 10),
    }


def test_walk_rows_are_declared_ops():
    assert sorted(_walk_rows(np.random.default_rng(0))) == DECLARED, "a row for an op Ops does not declare"


@pytest.mark.parametrize("name,dt", PRODUCTS)
@pytest.mark.parametrize("layout", ["contig", "pad"])
@pytest.mark.parametrize("op", DECLARED)
def test_every_declared_op_matches_spec(use, name, dt, layout, op):
    """Each op with one row of arguments; "pad": every float array of 2 or more dims is a view whose rows are
    farther apart than they are long (as att[..., :Tk]), inside NaN. After the call every array argument,
    written or not, and the result must match the spec's."""
    ops = use(name)
    rows = _walk_rows(np.random.default_rng(11))
    assert op in rows, f"Ops.{op} has no row in _walk_rows: add one (its arguments and a tolerance)"
    args, k = rows[op]
    floats = [i for i, a in enumerate(args) if isinstance(a, np.ndarray) and a.dtype.kind == "f"]
    mine, gaps = list(args), []
    for i in floats:
        if layout == "pad" and args[i].ndim >= 2:
            mine[i], gap = gapped(args[i].shape, "pad", dt, args[i])
            gaps.append(gap)
        else:
            mine[i] = args[i].astype(dt)
    ref = [np.array(mine[i], F64) if i in floats else a for i, a in enumerate(args)]   # the same values
    got, want = getattr(ops, op)(*mine), getattr(SPEC, op)(*ref)
    for i in floats:
        close(mine[i], ref[i], dt, k, what=f"{name} {op}: argument {i}")
    if want is not None:
        close(got, want, dt, k, what=f"{name} {op}: the result")
    assert all(gap() for gap in gaps), f"{name} {op}: a write outside a view"


# ----------------------------------------------------------------------------
# the float32 approximations of the numba kernels

@pytest.mark.skipif(REASONS["numba"] is not None, reason=str(REASONS["numba"]))
def test_exp32_matches_numpy_over_the_whole_range():
    from minigpt.backends import numba_kernels as NK
    x = np.concatenate([np.linspace(-110, 100, 400_001), [-87.33, -87.34, 88.72, 88.73, 0.0, -0.0, 1e-30]])
    x = x.astype(F32)
    got = NK._exp32_array(x)
    want = np.exp(x.astype(F64))
    normal = (want > 1.18e-38) & (want < 3.4e38)
    rel = np.abs(got[normal] - want[normal]) / want[normal]
    assert rel.max() < 2.5e-7, rel.max()                               # ~2 ulp
    assert (got[want < 1.1e-38] <= 1.2e-38).all()                      # below FLT_MIN: 0 or the smallest normals
    special = NK._exp32_array(np.array([-np.inf, np.inf, np.nan, -1000.0, 1000.0], F32))
    assert special[0] == 0.0 and special[3] == 0.0                     # the causal mask's -inf -> exactly 0
    assert special[1] == np.inf and special[4] == np.inf and np.isnan(special[2])


@pytest.mark.parametrize("name,dt", PRODUCTS)
def test_gelu_float32_matches_float64_formula(use, name, dt):
    """The float32 GELU of each backend (one exp, no cancellation) over the whole float32 range; numpy's
    gelu' squares x, so there x^2 must be finite (|x| < 1.8e19)."""
    ops = use(name)
    extremes = [-1e4, 1e4, 0.0] + ([-1e30, 1e30] if name != "numpy" else [])
    x = np.concatenate([np.linspace(-30, 30, 200_001), extremes]).astype(F32)
    ref_y, ref_d = np.empty(x.size), np.empty(x.size)
    SPEC.gelu(x.astype(F64), None, ref_y, ref_d)
    y, d = np.empty_like(x), np.empty_like(x)
    ops.gelu(x, None, y, d)
    np.testing.assert_allclose(y, ref_y, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(d, ref_d, rtol=1e-6, atol=1e-6)
    nan = np.array([np.nan], F32)
    assert np.isnan(ops.gelu(nan, None, np.empty(1, F32), np.empty(1, F32))).all()

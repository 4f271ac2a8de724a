"""bf16 products: the rounding (numpy_ops.round_bf16, the C library's mgk_round_bf16) against a scalar reference
written from the definition; every bf16 product (native on every ISA path this CPU runs; numba's, which are the
specification's np.matmul on rounded operands) against a float64 emulation; a whole training step in bf16
against float32; --dtype on the commands."""
import itertools
import math
import os
import struct
import sys
from fractions import Fraction

import numpy as np
import pytest

from minigpt import backends
from minigpt.backends import native
from minigpt.backends.numpy_ops import round_bf16
from minigpt.layers import heads
from minigpt.model import GPT, GPTConfig
from helpers import (causal_products, check_fused_attention, check_matmul_epilogues, check_matmul_gelu,
                     native_threads)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NATIVE = backends.why_unavailable("native")
NUMBA = backends.why_unavailable("numba")
PATHS = list(native.ISAS[:native._lib().mgk_cpu_isa() + 1]) if NATIVE is None else []
# (backend, ISA path or None): every bf16 product this machine has (numba's: the specification's products, reached
# through numba's own wiring), and the amx path's code on emulated
# tiles (mgk_emulate_amx: any CPU runs its packs, tiling, k blocks and causal skipping; the tiles themselves only
# run on a CPU with AMX, as native:amx)
KERNELS = ([("numba", None)] if NUMBA is None else []) + [("native", p) for p in PATHS] + \
    ([("native", "amx-emulated")] if NATIVE is None else [])


@pytest.fixture(params=KERNELS, ids=lambda k: k[0] + (f":{k[1]}" if k[1] else ""))
def kernel(request):
    """Load the backend (and force the native ISA path, or the emulated amx one) for the test; restored after."""
    name, path = request.param
    saved = native._lib().mgk_isa() if name == "native" else None
    ops = backends.load(name, verbose=False)
    if path == "amx-emulated":
        native._lib().mgk_emulate_amx(1)
    elif path:
        assert native._lib().mgk_set_isa(native.ISAS.index(path)) == 0
    yield ops
    if saved is not None:
        native._lib().mgk_emulate_amx(0)
        native._lib().mgk_set_isa(saved)


# ----------------------------------------------------------------------------
# rounding

def bf16_reference(bits):
    """float32 bits -> bf16-rounded float32 bits, from the definition: the bf16 value nearest to x (exact
    rational arithmetic), ties to the one with an even last mantissa bit; past the largest bf16 by half an ulp
    or more -> inf; NaN -> NaN with the quiet bit set."""
    x = struct.unpack("<f", struct.pack("<I", bits))[0]
    if math.isnan(x):
        return (bits | 0x00400000) & 0xFFFF0000
    if math.isinf(x):
        return bits
    lo = bits & 0xFFFF0000                                # truncation: the bf16 at or below |x|
    hi = lo + 0x10000                                     # the next bf16 away from zero (may be inf)
    v = lambda b: Fraction(struct.unpack("<f", struct.pack("<I", b))[0]) if (b & 0x7FFFFFFF) < 0x7F800000 \
        else Fraction(2) ** 128 * (1 if b < 0x80000000 else -1)        # inf as 2^128: where overflow rounds
    d_lo, d_hi = abs(Fraction(x) - v(lo)), abs(v(hi) - Fraction(x))
    if d_lo != d_hi:
        return lo if d_lo < d_hi else hi
    return lo if (lo >> 16) % 2 == 0 else hi


SPECIAL = np.array([
    0x00000000, 0x80000000,                               # +-0
    0x3F800000, 0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF,   # 1, ties to even (down, up), just past/below
    0xBF808000, 0xBF818000,                               # negative ties
    0x00000001, 0x00008000, 0x00018000, 0x00007FFF, 0x807F8000,   # subnormals, their ties, the largest ones
    0x007FFFFF, 0x00800000,                               # the largest subnormal, the smallest normal
    0x7F7F7FFF, 0x7F7F8000, 0x7F7FFFFF, 0xFF7F8000,       # near the largest bf16: stays, ties to inf, overflows
    0x7F800000, 0xFF800000,                               # +-inf
    0x7FC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF, 0xFFC0FFFF,   # NaNs: quiet, signalling, payloads
], dtype=np.uint32)


def test_rounding_matches_the_definition():
    rng = np.random.default_rng(0)
    bits = np.concatenate([SPECIAL, rng.integers(0, 2 ** 32, 4000, dtype=np.uint32),
                           (rng.integers(0, 2 ** 16, 1000, dtype=np.uint32) << 16) | 0x8000])   # 1000 more ties
    got = round_bf16(bits.view(np.float32), np.empty(bits.size, np.float32)).view(np.uint32)
    want = np.array([bf16_reference(int(b)) for b in bits], np.uint32)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, [f"{bits[i]:08x} -> {got[i]:08x}, want {want[i]:08x}" for i in bad[:5]]
    assert np.isnan(got[np.isnan(bits.view(np.float32))].view(np.float32)).all()


def test_rounding_of_strided_views_writes_only_out():
    x = np.random.default_rng(1).standard_normal((6, 10)).astype(np.float32)[:, ::3]
    keep = x.copy()
    out = round_bf16(x, np.empty(x.shape, np.float32))
    assert np.array_equal(x, keep)
    assert np.array_equal(out, round_bf16(np.ascontiguousarray(x), np.empty(x.shape, np.float32)))
    assert not (out.view(np.uint32) & 0xFFFF).any()


@pytest.mark.skipif(NATIVE is not None, reason=str(NATIVE))
def test_c_rounding_equals_numpy_bit_for_bit():
    rng = np.random.default_rng(2)
    bits = np.concatenate([SPECIAL, rng.integers(0, 2 ** 32, 200_000, dtype=np.uint32)])
    x = bits.view(np.float32)
    out = np.empty_like(x)
    assert native._lib().mgk_round_bf16(x.size, x, out) == 0
    assert np.array_equal(out.view(np.uint32), round_bf16(x, np.empty_like(x)).view(np.uint32))


# ----------------------------------------------------------------------------
# the products

def near_ints(rng, shape):
    """Whole numbers in [-8, 8] plus 2^-10 (on nonzero ones): each rounds to its whole number in bf16, so a bf16
    product of such matrices is an exact integer product, while a float32 one is not."""
    n = rng.integers(-8, 9, shape)
    return (n + np.where(n != 0, 2.0 ** -10, 0.0)).astype(np.float32), n


@pytest.mark.parametrize("ta,tb", list(itertools.product((False, True), repeat=2)))
def test_bf16_products_round_both_operands_exactly(kernel, ta, tb):
    """Every kernel (and the numpy emulation) gives the exact integer product of the rounded operands."""
    rng = np.random.default_rng(3)
    for M, N, K in ((1, 7, 5), (5, 33, 17), (37, 45, 70), (70, 130, 301)):
        a, ai = near_ints(rng, (K, M) if ta else (M, K))
        b, bi = near_ints(rng, (N, K) if tb else (K, N))
        want = (ai.T if ta else ai) @ (bi.T if tb else bi)
        for ops in (kernel, backends._load("numpy")):
            got = ops.matmul(a, b, ta, tb, bf16=True)
            assert np.array_equal(got, want), (ops.name, M, N, K)
            assert not np.array_equal(ops.matmul(a, b, ta, tb, bf16=False), want)   # float32 keeps the 2^-10s


def tie_bits(rng, R=37, K=70):
    """R x K float32 bits between 2^-31 and 2^32 whose low halves are bf16 ties, just below or above one, or 0."""
    return (rng.integers(0x3000, 0x5000, (R, K), dtype=np.uint32) << 16) | rng.choice(
        np.array([0x8000, 0x7FFF, 0x8001, 0x0000], np.uint32), (R, K))               # ties, just below, above


def times_identity(kernel, x, M, ta, tb):
    """x[:M] @ I and I[:M] @ x (x as the right operand, K = 37 deep) in bf16, each operand stored transposed
    for ta / tb: every output is one product by 1 (the other terms are 0), so both show how the kernel rounds x."""
    t = np.ascontiguousarray
    R, K = x.shape
    eye = np.eye(R, dtype=np.float32)[:M]
    return (kernel.matmul(t(x[:M].T) if ta else x[:M], np.eye(K, dtype=np.float32), ta, tb, bf16=True),
            kernel.matmul(t(eye.T) if ta else eye, t(x.T) if tb else x, ta, tb, bf16=True))


@pytest.mark.parametrize("M", [37, 3])
@pytest.mark.parametrize("ta,tb", list(itertools.product((False, True), repeat=2)))
def test_bf16_products_round_ties_to_even_in_both_operands(kernel, ta, tb, M):
    """x[:M] @ I and I[:M] @ x are round_bf16(x[:M]) bit for bit, so every kernel's packs (M = 37; odd: the
    tails of the tiles and of the k-pairs) and the native few-rows path (M = 3, no packs, unless both are
    transposed) must round both operands as the definition does, ties to even included."""
    x = tie_bits(np.random.default_rng(8)).view(np.float32)
    want = round_bf16(x[:M], np.empty(x[:M].shape, np.float32)).view(np.uint32)
    for got in times_identity(kernel, x, M, ta, tb):
        assert np.array_equal(got.view(np.uint32), want)


@pytest.mark.parametrize("M", [37, 3])
@pytest.mark.parametrize("ta,tb", list(itertools.product((False, True), repeat=2)))
def test_bf16_products_round_subnormal_operands_to_zero_on_native(kernel, ta, tb, M):
    """x[:M] @ I and I[:M] @ x, as in the test above, with subnormal operands among x: native rounds them to 0 on
    every path, as vcvtneps2bf16 does (its products would treat them as 0 anyway: denormals-are-zero), the largest
    ones too, which the definition rounds up to the smallest normal bf16 (half of them here, in every row, panel,
    tail and k block of x); the specification (numba's products) rounds them by the definition and keeps them.
    Compared as values: the sign of a zero sum is the summation's."""
    rng = np.random.default_rng(9)
    bits = tie_bits(rng)
    sub = rng.random(bits.shape) < 0.25
    n = int(sub.sum())
    magnitude = np.where(rng.random(n) < 0.5, rng.integers(0x007F8000, 0x00800000, n, dtype=np.uint32),   # round up
                         rng.integers(1, 0x007F8000, n, dtype=np.uint32))
    bits[sub] = magnitude | rng.choice(np.array([0, 0x80000000], np.uint32), n)     # either sign
    x = bits.view(np.float32)
    kept = np.where(sub, np.float32(0), x) if kernel.name == "native" else x
    want = round_bf16(kept[:M], np.empty(x[:M].shape, np.float32))
    if kernel.name != "native":
        assert (want[sub[:M]] != 0).any()                 # the specification keeps the ones that round up
    for got in times_identity(kernel, x, M, ta, tb):
        assert np.array_equal(got, want)


def emulated(a, b, ta=False, tb=False):
    """The numpy emulation in float64: exact products of the rounded operands, summed exactly enough."""
    ra = round_bf16(a, np.empty(a.shape, np.float32)).astype(np.float64)
    rb = round_bf16(b, np.empty(b.shape, np.float32)).astype(np.float64)
    return np.matmul(ra.swapaxes(-1, -2) if ta else ra, rb.swapaxes(-1, -2) if tb else rb), \
        np.matmul(np.abs(ra.swapaxes(-1, -2) if ta else ra), np.abs(rb.swapaxes(-1, -2) if tb else rb))


def close_to_emulation(got, a, b, ta=False, tb=False, base=None):
    """Equal up to float32 summation order: |error| <= K * 2^-23 * sum |a_ik b_kj| (a bound on any order)."""
    want, scale = emulated(a, b, ta, tb)
    K = a.shape[-2] if ta else a.shape[-1]
    if base is not None:
        want, scale = want + base, scale + np.abs(base)
    err = np.abs(got - want)
    assert (err <= K * 2.0 ** -23 * scale + 1e-30).all(), float((err / (scale + 1e-30)).max())


@pytest.mark.parametrize("ta,tb", list(itertools.product((False, True), repeat=2)))
def test_bf16_matmul_matches_the_emulation_on_odd_shapes(kernel, ta, tb):
    rng = np.random.default_rng(4)
    for M, N, K in itertools.product((1, 3, 7, 17, 129), (1, 16, 33, 130), (1, 17, 600)):   # k blocks: 256, 384, 512
        a = rng.standard_normal((K, M) if ta else (M, K)).astype(np.float32)
        b = rng.standard_normal((N, K) if tb else (K, N)).astype(np.float32)
        close_to_emulation(kernel.matmul(a, b, ta, tb, bf16=True), a, b, ta, tb)
        out = rng.standard_normal((M, N)).astype(np.float32)
        base = out.astype(np.float64)
        close_to_emulation(kernel.matmul(a, b, ta, tb, out=out, acc=True, bf16=True), a, b, ta, tb, base)


def test_bf16_bmm_on_strided_head_views(kernel):
    """Attention's products read q, k, v as strided views of the fused qkv (B, T, 3C) and write heads in place."""
    rng = np.random.default_rng(5)
    B, T, nh, hs = 3, 19, 4, 12
    qkv = rng.standard_normal((B, T, 3 * nh * hs)).astype(np.float32)
    q, k, v = heads(qkv, nh, 3)                           # (B, nh, T, hs) views
    att = kernel.bmm(q, k, tb=True, bf16=True)            # (B, nh, T, T)
    close_to_emulation(att, q, k, tb=True)
    y = np.zeros((B, T, nh * hs), np.float32)
    (yh,) = heads(y, nh)
    kernel.bmm(att, v, out=yh, bf16=True)
    close_to_emulation(yh, att, v)
    dk = kernel.bmm(att[..., ::2, :], q[..., ::2, :], ta=True, bf16=True)   # every other row: a stepped view
    close_to_emulation(dk, att[..., ::2, :], q[..., ::2, :], ta=True)


def test_bf16_causal_products_match_the_emulation(kernel):
    """Attention's causal products in bf16 (helpers.causal_products): the skipped tiles and k-pairs change
    nothing but the zeroed future."""
    for got, a, b, ta, tb, base, future in causal_products(kernel, np.random.default_rng(7), bf16=True):
        if future is not None:
            assert (got[..., future] == 0).all()
            got = np.where(future, kernel.bmm(a, b, ta=ta, tb=tb, bf16=True), got)   # the plain product there
        close_to_emulation(got, a, b, ta, tb, None if base is None else base.astype(np.float64))


@pytest.mark.skipif(NATIVE is not None, reason=str(NATIVE))
@pytest.mark.parametrize("kernel", [("native", "amx-emulated")], indirect=True, ids=["native:amx-emulated"])
def test_fused_attention_on_the_amx_path(kernel):
    """The fused attention's bf16 products on the amx path's code (emulated tiles) give the bits of the same
    products called one by one (every ISA path: tests/test_native_isa.py)."""
    check_fused_attention(kernel, True, np.random.default_rng(8))


@pytest.mark.skipif(NATIVE is not None, reason=str(NATIVE))
def test_native_scalar_reference_matches_the_emulation():
    lib, rng = native._lib(), np.random.default_rng(6)
    for ta, tb in itertools.product((0, 1), repeat=2):
        M, N, K = 13, 21, 40
        a = rng.standard_normal((K, M) if ta else (M, K)).astype(np.float32)
        b = rng.standard_normal((N, K) if tb else (K, N)).astype(np.float32)
        out = np.empty((M, N), np.float32)
        assert lib.mgk_bgemm_ref(ta, tb, M, N, K, a, a.shape[1], b, b.shape[1], 0.0, out, N) == 0
        close_to_emulation(out, a, b, ta, tb)


AMX_KERNELS = [("native", "amx-emulated")] + ([("native", "amx")] if "amx" in PATHS else [])


@pytest.mark.skipif(NATIVE is not None, reason=str(NATIVE))
@pytest.mark.parametrize("kernel", AMX_KERNELS, indirect=True, ids=lambda k: f"native:{k[1]}")
@pytest.mark.parametrize("ta,tb", list(itertools.product((False, True), repeat=2)))
def test_amx_path_blocking_matches_the_emulation(kernel, ta, tb):
    """The amx path's blocking on emulated tiles (and on the real ones where the CPU has AMX), at the sizes that
    cross its blocks (the kernel tests above run it on odd shapes): two MC row blocks, k blocks (K > 512) packed
    one at a time (N > 1536) or all of op(B) at once, columns past NC, K = 0, and beta."""
    rng = np.random.default_rng(7)
    for M, N, K, beta in ((33, 47, 70, 1.0), (70, 33, 1100, 0.5), (40, 1600, 600, 1.0), (3, 2100, 40, 1.0),
                          (200, 40, 0, 1.0), (200, 70, 300, 0.5)):
        a = rng.standard_normal((K, M) if ta else (M, K)).astype(np.float32)
        b = rng.standard_normal((N, K) if tb else (K, N)).astype(np.float32)
        c = rng.standard_normal((M, N)).astype(np.float32)
        base = beta * c.astype(np.float64)
        if beta == 1.0:
            close_to_emulation(kernel.matmul(a, b, ta, tb, out=c, acc=True, bf16=True), a, b, ta, tb, base)
        else:                                             # another beta: straight through the C call
            assert kernel.lib.mgk_bgemm_batched(1, 1, ta, tb, M, N, K, a.ctypes.data, max(a.shape[1], 1), 0, 0,
                                                b.ctypes.data, max(b.shape[1], 1), 0, 0, beta, c.ctypes.data, N,
                                                0, 0) == 0
            close_to_emulation(c, a, b, ta, tb, base)


def test_bf16_products_refuse_float64():
    a = np.ones((2, 3))
    with pytest.raises(TypeError, match="bf16 products take float32"):
        backends._load("numpy").matmul(a, a.T, bf16=True)
    with pytest.raises(ValueError, match="bf16 products need a float32 model"):
        GPT(GPTConfig(vocab_size=5, block_size=4, n_layer=1, n_head=1, n_embd=4), dtype=np.float64, bf16=True)


# ----------------------------------------------------------------------------
# a whole training step

CFG = GPTConfig(vocab_size=65, block_size=32, n_layer=2, n_head=4, n_embd=64, bias=True)


def step(backend, bf16):
    """loss and flat gradients of one forward + backward from the same weights and batch."""
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 65, (4, 32)), rng.integers(0, 65, (4, 32))
    m = GPT(CFG, np.random.default_rng(1), bf16=bf16, ops=backends.load(backend, verbose=False))
    m.zero_grad()
    _, loss = m.forward(x, y)
    m.backward()
    return loss, m.grad_memory.copy()


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_bf16_step_is_float32_within_bf16_precision():
    """bf16 keeps 8 significant bits: each operand is off by at most 2^-8 relative (0.39%, half an ulp), so the
    gradients move by less than that (measured: 0.33% of their norm at this size); allowing 1% catches a wrong product (tens of
    percent) or a missing rounding (exactly 0), and 1e-4 relative on the loss (measured: 8e-6)."""
    l32, g32 = step("numpy", False)
    l16, g16 = step("numpy", True)
    assert abs(l16 - l32) < 1e-4 * l32
    assert 1e-4 < rel(g16, g32) < 1e-2


@pytest.mark.parametrize("backend", [b for b, r in (("numba", NUMBA), ("native", NATIVE)) if r is None])
def test_bf16_step_of_fast_backends_matches_the_emulation(backend):
    """Summation order differs from numpy's (native's products; numba's and native's LayerNorm, softmax and
    GELU), and a last-bit difference in an activation can flip its bf16
    rounding in the next product (one bf16 ulp, 2^-8 to 2^-7 relative, on that element): measured 1.5e-4 of the
    gradients' norm; the bound, 1e-3, still sits well under the 3e-3 that separates bf16 from float32."""
    l_ref, g_ref = step("numpy", True)
    l, g = step(backend, True)
    assert abs(l - l_ref) < 1e-6 * l_ref
    assert rel(g, g_ref) < 1e-3


def test_products_follow_the_model_that_runs_them():
    """A bf16 model's products are bf16: its backend is bound to its precision; a float32 model on the same
    backend, and the backend itself, run float32 products, whatever ran before."""
    numpy_ops = backends.load("numpy", verbose=False)
    m16 = GPT(CFG, np.random.default_rng(1), bf16=True, ops=numpy_ops)
    m32 = GPT(CFG, np.random.default_rng(1), ops=numpy_ops)
    x = np.random.default_rng(0).integers(0, 65, (2, 8))
    l16 = m16.forward(x)[0].copy()
    l32 = m32.forward(x)[0].copy()
    assert not np.array_equal(l16, l32)
    assert m16.bf16 and m16.ops.bf16 and not m32.bf16 and not m32.ops.bf16
    assert np.array_equal(m16.forward(x)[0], l16) and np.array_equal(m32.forward(x)[0], l32)   # in any order
    a = np.full((2, 2), 1 + 2 ** -10, np.float32)
    assert numpy_ops.matmul(a, a)[0, 0] != 2.0             # the backend itself: float32 products
    assert m16.ops.matmul(a, a)[0, 0] == 2.0               # the bf16 model's: bf16 rounds a to 1


def test_the_bisections_groups_split_every_product_and_each_changes_the_step():
    """scripts/bf16_learning.py --bisect keeps groups of products in float32 inside a bf16 model. Its two splits,
    by layer and by role, each cover every product: with all of a split's groups kept, a bf16 step is float32's
    bit for bit. Each group holds products that the step runs: with it alone kept, the gradients are neither
    bf16's nor float32's."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import bf16_learning as bl
    sys.path.pop(0)
    patched = [(owner, name) for owner, names, _ in bl.LAYERS.values() for name in names] + [
        (GPT, "backward"), (backends.Ops, "matmul"), (backends.Ops, "bmm"),
        (native.NativeOps, "attention"), (native.NativeOps, "attention_backward"), (native.NativeOps, "_matmul_gelu"),
        (native.NativeOps, "_matmul_mul"), (native.NativeOps, "_matmul_add")]
    saved = [(owner, name, getattr(owner, name)) for owner, name in patched]

    def keeping(*groups, run=lambda: step("numpy", True)):
        bl.keep_float32(*groups)
        try:
            return run()
        finally:
            for owner, name, fn in saved:
                setattr(owner, name, fn)
    l32, g32 = step("numpy", False)
    l16, g16 = step("numpy", True)
    for group in bl.GROUPS:
        g = keeping(group)[1]
        assert not np.array_equal(g, g16) and not np.array_equal(g, g32), group
    for split in (bl.LAYERS, bl.ROLES):
        l, g = keeping(*split)
        assert l == l32 and np.array_equal(g, g32), list(split)
    assert step("numpy", True)[0] == l16                     # restored
    if NATIVE is None:                                       # native's fused attention too: its products are kept
        l32, g32 = step("native", False)
        for split in (bl.LAYERS, bl.ROLES):
            l, g = keeping(*split, run=lambda: step("native", True))
            assert l == l32 and np.array_equal(g, g32), list(split)

    def in_backward():                                       # the role of a product: does it accumulate?
        x = np.full((2, 2), 1 + 2 ** -10, np.float32)        # bf16 rounds it to 1: x x = 2 in bf16
        bl._now["backward"] = True
        try:
            ops = backends.load("numpy", verbose=False).with_bf16(True)
            return [ops.matmul(x, x, out=np.zeros_like(x), acc=acc)[0, 0] for acc in (True, False)]
        finally:
            bl._now["backward"] = False
    assert keeping("weight-gradients", run=in_backward) == [2 * (1 + 2 ** -10) ** 2, 2.0]
    assert keeping("input-gradients", run=in_backward) == [2.0, 2 * (1 + 2 ** -10) ** 2]


# ----------------------------------------------------------------------------
# the commands

def test_a_bf16_run_learns_writes_float32_checkpoints_and_samples(tmp_path):
    """Training with --dtype bf16 runs bf16 products (its loss differs from float32's from the first step) and
    learns; the checkpoint is float32, resumes, and samples with and without --dtype bf16."""
    import subprocess
    from helpers import tiny_cfg
    from test_train import read_log
    from minigpt import checkpoint
    from minigpt.train import train
    kw = dict(max_iters=40, eval_interval=20, lr_decay_iters=40, lr=1e-2, min_lr=1e-3)
    runs = {d: read_log(train(tiny_cfg(tmp_path / d, dtype=d, **kw))["log"]) for d in ("float32", "bf16")}
    first = {d: next(r["loss"] for r in rows if r["kind"] == "train") for d, rows in runs.items()}
    assert first["bf16"] != first["float32"] and abs(first["bf16"] - first["float32"]) < 1e-2
    evals = [r["val_loss"] for r in runs["bf16"] if r["kind"] == "eval"]
    assert evals[-1] < evals[0] - 0.5
    ckpt = tmp_path / "bf16" / "out" / "ckpt_last.npz"
    meta, params, _ = checkpoint.load(str(ckpt))
    assert meta["train_config"]["dtype"] == "bf16" and all(p.dtype == np.float32 for p in params.values())
    resumed = train(tiny_cfg(tmp_path / "bf16", dtype="bf16", resume=True, **{**kw, "max_iters": 44}))
    assert read_log(resumed["log"])[-1]["iter"] == 44
    cmd = [sys.executable, "-m", "minigpt.sample", "--ckpt", str(ckpt), "--prompt", "The", "--max_new_tokens", "20",
           "--seed", "3", "--backend", "numpy"]
    out = {d: subprocess.run(cmd + ["--dtype", d], capture_output=True, text=True, timeout=60) for d in ("float32", "bf16")}
    assert all(r.returncode == 0 and r.stdout.startswith("The") for r in out.values()), out["bf16"].stderr
    bad = subprocess.run(cmd + ["--dtype", "fp16"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--dtype must be float32 or bf16" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.skipif(NATIVE is not None, reason=str(NATIVE))
def test_matmul_gelu_on_the_amx_path(kernel):
    """The GELU in the bf16 product's epilogue on the amx path's code (emulated tiles, and the real ones where the
    CPU has them) gives the bits of the product and the GELU called one after the other (every ISA path:
    tests/test_native_isa.py)."""
    check_matmul_gelu(kernel, np.random.default_rng(10))


@pytest.mark.skipif(NATIVE is not None, reason=str(NATIVE))
def test_matmul_mul_and_add_on_the_amx_path(kernel):
    """The multiply and the residual add in the bf16 product's epilogue on the amx path's code, as
    test_matmul_gelu_on_the_amx_path."""
    check_matmul_epilogues(kernel, np.random.default_rng(12))

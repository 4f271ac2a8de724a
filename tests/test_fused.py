"""The numba kernels of minigpt/_fused_numba.py against the NumPy references of minigpt/fused.py (float64 to
1e-12, float32 to float32 accuracy) on odd shapes, the float32 exp/GELU approximations over their whole range,
and the whole GPT's float32 loss and gradients with the fused path on and off."""
import math

import numpy as np
import pytest

from minigpt import fused as F
from minigpt.model import GPT, GPTConfig

nb = pytest.importorskip("minigpt._fused_numba", reason="numba is not installed")
TOL = {np.float64: 1e-12, np.float32: 2e-6}


@pytest.fixture
def both():
    """run(f, *args) -> (numba result, reference result); args are copied for each side."""
    old = F.set_enabled(True)

    def run(f, *args):
        out = []
        for on in (True, False):
            F.set_enabled(on)
            a = [x.copy() if isinstance(x, np.ndarray) else x for x in args]
            r = f(*a)
            out.append((r if isinstance(r, tuple) else (r,)) + tuple(x for x in a if isinstance(x, np.ndarray)))
        F.set_enabled(old)
        return out
    yield run
    F.set_enabled(old)


def close(got, want, dt, scale=1.0):
    for g, w in zip(got, want):
        if g is None:
            continue
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        err = np.abs(g - w).max(initial=0.0) / max(np.abs(w).max(initial=0.0), 1e-30)
        assert err < TOL[dt] * scale, f"rel err {err:.2e}"


def randn(rng, shape, dt, s=1.0):
    return (s * rng.standard_normal(shape)).astype(dt)


# ----------------------------------------------------------------------------
# the float32 approximations

def test_exp32_matches_numpy_over_the_whole_range():
    x = np.concatenate([np.linspace(-110, 100, 400_001), [-87.33, -87.34, 88.72, 88.73, 0.0, -0.0, 1e-30]])
    x = x.astype(np.float32)
    got = nb._exp32_array(x)
    want = np.exp(x.astype(np.float64))
    normal = (want > 1.18e-38) & (want < 3.4e38)
    rel = np.abs(got[normal] - want[normal]) / want[normal]
    assert rel.max() < 2.5e-7, rel.max()                          # ~2 ulp
    assert (got[want < 1.1e-38] <= 1.2e-38).all()                 # below FLT_MIN: 0 or the smallest normals
    special = nb._exp32_array(np.array([-np.inf, np.inf, np.nan, -1000.0, 1000.0], np.float32))
    assert special[0] == 0.0 and special[3] == 0.0                # the causal mask's -inf -> exactly 0
    assert special[1] == np.inf and special[4] == np.inf and np.isnan(special[2])


def test_gelu_float32_matches_float64_formula():
    x64 = np.concatenate([np.linspace(-30, 30, 200_001), [-1e4, 1e4, -1e30, 0.0]])
    x = x64.astype(np.float32)
    ref_y, ref_d = F.gelu_ref(x.astype(np.float64)), F.gelu_grad_ref(x.astype(np.float64))
    y, d = F.gelu(x)
    assert y.dtype == np.float32 and d.dtype == np.float32
    np.testing.assert_allclose(y, ref_y, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(d, ref_d, rtol=1e-6, atol=1e-6)
    assert np.isnan(F.gelu(np.array([np.nan], np.float32))[0]).all()


# ----------------------------------------------------------------------------
# each kernel against its reference

@pytest.mark.parametrize("dt", [np.float64, np.float32])
def test_layernorm_matches_reference(both, rng, dt):
    x, w, b, dy = randn(rng, (21, 33), dt, 3) + 1, randn(rng, 33, dt), randn(rng, 33, dt), randn(rng, (21, 33), dt)
    (y1, m1, r1), (y0, m0, r0) = [r[:3] for r in both(F.layernorm, x, w, b, 1e-5)]
    close((y1, m1, r1), (y0, m0, r0), dt)
    dw, db = np.ones(33, dt), np.zeros(33, dt)                    # the kernel adds into dw, db
    got, want = both(F.layernorm_backward, dy, x, w, m0, r0, dw, db)
    close((got[0], got[-2], got[-1]), (want[0], want[-2], want[-1]), dt, 10)


@pytest.mark.parametrize("dt", [np.float64, np.float32])
def test_gelu_matches_reference(both, rng, dt):
    x, b, dy = randn(rng, (3, 7, 33), dt, 3), randn(rng, 33, dt), randn(rng, (3, 7, 33), dt)
    close(*[r[:2] for r in both(F.gelu, x)], dt, 2)               # y and dy/dx
    (y1, d1), (y0, d0) = [r[:2] for r in both(F.gelu, x, None, None, b)]   # fused bias: gelu(x + b)
    close((y1, d1), (y0, d0), dt, 2)
    got, want = both(F.gelu_backward, dy, d0, None, np.ones(33, dt))      # dx and db += sum dx
    close((got[0], got[-1]), (want[0], want[-1]), dt, 10)


@pytest.mark.parametrize("dt", [np.float64, np.float32])
@pytest.mark.parametrize("start", [0, 4])
def test_causal_softmax_matches_reference(both, rng, dt, start):
    s, datt = randn(rng, (3, 7, 7 + start), dt, 3), randn(rng, (3, 7, 7 + start), dt)
    (a1,), (a0,) = [r[:1] for r in both(F.causal_softmax, s, 0.3, start)]
    close((a1,), (a0,), dt)
    assert (a1[:, np.triu(np.ones((7, 7 + start), bool), k=start + 1)] == 0).all()   # the future: exactly 0
    close(*[r[:1] for r in both(F.causal_softmax_backward, a0, datt, 0.3, start)], dt)
    inplace = s.copy()                                            # out= may be the input
    F.causal_softmax(inplace, 0.3, start, out=inplace)
    close((inplace,), (a0,), dt)


@pytest.mark.parametrize("T", [1, 7, 33])
def test_flash_attention_matches_reference(rng, T):
    """float32 kernel vs float64 reference (the flash path is opt-in, so its float64 compile is skipped)."""
    B, nh, hs = 2, 3, 5
    qkv, dy = randn(rng, (B, T, 3 * nh * hs), np.float64, 2), randn(rng, (B, T, nh * hs), np.float64)
    y0, l0 = F.attention_ref(qkv, nh)
    dqkv0 = F.attention_backward_ref(qkv, y0, dy, l0, nh)
    f32 = [a.astype(np.float32) for a in (qkv, y0, dy, l0)]
    y1, l1 = F.attention(f32[0], nh)
    dqkv1 = F.attention_backward(*f32[:3], f32[3], nh)
    close((y1, l1, dqkv1), (y0, l0, dqkv0), np.float32, 2)


@pytest.mark.parametrize("dt", [np.float64, np.float32])
@pytest.mark.parametrize("n,T,hs", [(0, 1, 5), (6, 1, 11), (9, 3, 16), (0, 4, 3)])
def test_cached_attention_matches_reference(both, rng, dt, n, T, hs):
    """Generation: T new positions at n.. attend to a cache filled up to n+T; what lies beyond is never read."""
    B, nh, S = 2, 3, n + T + 4
    qkv = randn(rng, (B, T, 3 * nh * hs), dt, 2)
    k_all, v_all = randn(rng, (B, nh, S, hs), dt, 2), randn(rng, (B, nh, S, hs), dt)
    k_all[:, :, n + T:] = v_all[:, :, n + T:] = np.nan                 # the unfilled part of the cache
    (y1, *_), (y0, *_) = both(F.attention_cached, qkv, k_all, v_all, n)
    assert y1.shape == (B, T, nh * hs) and np.isfinite(y1).all()
    close((y1,), (y0,), dt, 2)


@pytest.mark.parametrize("dt", [np.float64, np.float32])
def test_cross_entropy_matches_reference(both, rng, dt):
    logits, t = randn(rng, (37, 11), dt, 4), rng.integers(0, 11, 37)
    (l1, s1), (l0, s0) = [r[:2] for r in both(F.cross_entropy, logits, t)]
    assert abs(l1 - l0) <= TOL[dt] * abs(l0)
    close((s1,), (s0,), dt)
    close(*[r[:1] for r in both(F.cross_entropy_backward, logits, t, s0, 0.25)], dt, 2)


@pytest.mark.parametrize("dt", [np.float64, np.float32])
def test_scatter_add_matches_add_at(both, rng, dt):
    idx = rng.integers(0, 11, 50).astype(np.int32)                # repeats must add up
    g, dout = randn(rng, (11, 33), dt), randn(rng, (50, 33), dt)
    got, want = both(F.scatter_add, g, idx, dout)
    close(got[1:2], want[1:2], dt)


@pytest.mark.parametrize("dt", [np.float64, np.float32])
def test_adamw_matches_reference(both, rng, dt):
    p, g, m, v = randn(rng, (7, 33), dt), randn(rng, (7, 33), dt), randn(rng, (7, 33), dt), randn(rng, (7, 33), dt) ** 2
    got, want = both(F.adamw, p, g, m, v, 1e-2, 0.9, 0.99, 1e-8, 0.1, 1 - 0.9 ** 3, 1 - 0.99 ** 3)
    close(got[1:], want[1:], dt)                                  # p, g, m, v after the in-place update


# ----------------------------------------------------------------------------
# the whole model: fused on vs off, float32

@pytest.mark.parametrize("flash", [False, True])
def test_gpt_float32_fused_matches_unfused(flash, monkeypatch):
    monkeypatch.setattr(F, "FLASH", flash)
    cfg = GPTConfig(vocab_size=29, block_size=16, n_layer=2, n_head=2, n_embd=32)
    model = GPT(cfg, np.random.default_rng(0))
    r = np.random.default_rng(1)
    for p in model.params().values():
        p += (0.1 * r.standard_normal(p.shape)).astype(np.float32)
    x, y = r.integers(0, 29, (3, 16)), r.integers(0, 29, (3, 16))
    out = {}
    for on in (True, False):                                       # off: the references, bmm attention
        old = F.set_enabled(on)
        monkeypatch.setattr(F, "FLASH", flash and on)
        model.zero_grad()
        _, loss = model.forward(x, y)
        model.backward()
        out[on] = loss, {k: g.copy() for k, g in model.grads().items()}
        F.set_enabled(old)
    assert abs(out[True][0] - out[False][0]) < 1e-4 * abs(out[False][0])
    for k, g in out[False][1].items():
        np.testing.assert_allclose(out[True][1][k], g, rtol=1e-4, atol=1e-4 * np.abs(g).max(), err_msg=k)


def test_flash_attention_asked_for_runs_or_is_an_error(monkeypatch):
    from minigpt.config import UserError
    qkv = np.zeros((1, 4, 6), np.float32)
    monkeypatch.setattr(F, "FLASH", True)
    monkeypatch.setattr(F, "_ATTENTION", "flash")
    if F.enabled():
        assert F.flash_attention(qkv)
    old = F.set_enabled(False)
    try:
        with pytest.raises(UserError, match="needs the fused numba kernels"):
            F.flash_attention(qkv)                                  # no silent switch to bmm
    finally:
        F.set_enabled(old)
    monkeypatch.setattr(F, "_ATTENTION", "flsh")
    with pytest.raises(UserError, match="choose bmm"):
        F.flash_attention(qkv)
    if F.enabled():                                                # dropout in training has no flash kernel
        monkeypatch.setattr(F, "_ATTENTION", "flash")
        model = GPT(GPTConfig(vocab_size=7, block_size=4, n_layer=1, n_head=2, n_embd=6, dropout=0.1),
                    np.random.default_rng(0))
        with pytest.raises(UserError, match="no attention dropout"):
            model.forward(np.zeros((1, 4), int), np.zeros((1, 4), int))
        model.eval()
        model.forward(np.zeros((1, 4), int))                       # eval: dropout is off, flash runs


def test_switch_selects_references(monkeypatch):
    old = F.set_enabled(False)
    try:
        assert not F.enabled() and not F.flash_attention(np.zeros((1, 1, 3), np.float32))
    finally:
        F.set_enabled(old)
    assert F.enabled() == old
    assert math.isfinite(F.cross_entropy(np.zeros((2, 3), np.float32), np.array([0, 2]))[0])

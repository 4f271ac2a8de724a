"""Finite-difference checks (float64, central) of every layer's input and parameter gradients,
plus the properties of dropout, the causal mask and the positional table."""
import math

import numpy as np
import pytest

from minigpt import layers as L
from gradcheck import check_module, num_grad, rel_err

F64 = np.float64
B, T, C, NH = 2, 5, 8, 2


def replay(rng):
    """A reset() that rewinds rng, so every forward of a check draws the same dropout mask."""
    state = rng.bit_generator.state

    def reset():
        rng.bit_generator.state = state
    return reset


def x_of(rng, *shape):
    return rng.standard_normal(shape)


# ----------------------------------------------------------------------------
# one check per layer: input gradient and every parameter gradient

@pytest.mark.parametrize("gelu", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_grad(rng, bias, gelu):
    """y = x W + b, and with gelu=True y = gelu(x W + b) (the bias add and the GELU fused, as the MLP's c_fc)."""
    m = L.Linear(C, 3 * C, rng, bias=bias, std=0.5, gelu=gelu, dtype=F64)
    if bias:
        m.p["bias"][:] = x_of(rng, 3 * C)                         # non-zero, so it moves the GELU's input
    names = check_module(m, x_of(rng, B, T, C), x_of(rng, B, T, 3 * C))
    assert names == (["bias", "weight"] if bias else ["weight"])


def test_linear_gelu_is_gelu_of_linear(rng):
    m = L.Linear(C, 3 * C, rng, std=0.5, gelu=True, dtype=F64).bind(B, T, F64)
    m.p["bias"][:] = x_of(rng, 3 * C)
    plain = L.Linear(C, 3 * C, rng, dtype=F64).bind(B, T, F64)
    for k in ("weight", "bias"):
        plain.p[k][:] = m.p[k]
    x = x_of(rng, B, T, C)
    np.testing.assert_allclose(m.forward(x), L.GELU().forward(plain.forward(x).copy()), rtol=1e-14, atol=1e-15)


def test_embedding_grad(rng):
    m = L.Embedding(11, C, rng, dtype=F64).bind(B, T, F64)
    idx = np.array([[1, 3, 3, 10, 0], [3, 1, 7, 7, 7]])        # repeats: the scatter-add must sum them
    dy = x_of(rng, B, T, C)
    m.zero_grad()
    m.forward(idx)
    assert m.backward(dy) is None
    probe = lambda: float(np.sum(m.forward(idx) * dy))
    err = rel_err(m.grads()["weight"], num_grad(probe, m.p["weight"]))
    assert err < 1e-6, f"Embedding parameter 'weight': rel err {err:.2e}"


def test_embedding_scatter_add_matches_loop(rng):
    m = L.Embedding(11, C, rng, dtype=F64).bind(B, T, F64)
    idx = rng.integers(0, 11, (B, T))
    dy = x_of(rng, B, T, C)
    m.forward(idx)
    m.backward(dy)
    want = np.zeros((11, C))
    for b in range(B):
        for t in range(T):
            want[idx[b, t]] += dy[b, t]
    np.testing.assert_allclose(m.grads()["weight"], want, rtol=1e-12)


def test_positional_grad(rng):
    m = L.PositionalEmbedding(7, C, rng, dtype=F64)
    check_module(m, x_of(rng, B, T, C), x_of(rng, B, T, C))
    check_module(m, x_of(rng, B, 3, C), x_of(rng, B, 3, C))      # T < block_size: rows 3.. get no gradient
    assert not m.grads()["weight"][3:].any()


def test_positional_too_long_is_clear_error(rng):
    m = L.PositionalEmbedding(4, C, rng).bind(1, 5, np.float32)
    with pytest.raises(ValueError, match="exceed the positional table of length 4"):
        m.forward(np.zeros((1, 5, C), np.float32))


def test_layernorm_grad(rng):
    for bias in (True, False):
        m = L.LayerNorm(C, bias=bias, dtype=F64)
        m.p["weight"][:] = x_of(rng, C)                         # non-trivial gain so its gradient matters
        if bias:
            m.p["bias"][:] = x_of(rng, C)
        check_module(m, 3 * x_of(rng, B, T, C) + 1, x_of(rng, B, T, C))


def test_gelu_grad(rng):
    check_module(L.GELU(), 2 * x_of(rng, B, T, C), x_of(rng, B, T, C))


def test_gelu_matches_tanh_formula(rng):
    x = np.linspace(-8, 8, 101)
    want = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    np.testing.assert_allclose(L.GELU().forward(x), want, rtol=1e-14, atol=1e-15)


def test_dropout_grad_uses_forward_mask(rng):
    drng = np.random.default_rng(5)
    m = L.Dropout(0.3, drng)
    check_module(m, x_of(rng, B, T, C), x_of(rng, B, T, C), reset=replay(drng))


def test_dropout_train_and_eval(rng):
    m = L.Dropout(0.5, np.random.default_rng(0))
    x = np.ones((64, 64))
    y = m.forward(x).copy()
    assert set(np.unique(y)) == {0.0, 2.0}                      # inverted: kept units are scaled by 1/(1-p)
    dx = m.backward(np.full_like(x, 3.0))
    np.testing.assert_array_equal(dx, 3.0 * y)                  # the same mask, not a new one
    m.eval()
    x = x_of(rng, 4, 4)
    assert m.forward(x) is x                                    # identity in eval mode
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        L.Dropout(1.0, np.random.default_rng(0))


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_attention_grad(rng, dropout):
    drng = np.random.default_rng(7)
    m = L.CausalSelfAttention(C, NH, drng, dropout=dropout, dtype=F64)
    for p in m.params().values():
        p[:] = 0.5 * x_of(rng, *p.shape)                        # larger weights: sharper, non-uniform attention
    check_module(m, x_of(rng, B, T, C), x_of(rng, B, T, C), reset=replay(drng))


def test_attention_is_causal(rng):
    m = L.CausalSelfAttention(C, NH, rng, dtype=F64).bind(B, T, F64)
    x = x_of(rng, B, T, C)
    y = m.forward(x).copy()                                     # the next forward overwrites m's output
    for t in range(T - 1):
        x2 = x.copy()
        x2[:, t + 1:] = x_of(rng, B, T - t - 1, C) * 100        # change the future
        np.testing.assert_array_equal(m.forward(x2)[:, :t + 1], y[:, :t + 1])


def test_mlp_grad(rng):
    drng = np.random.default_rng(3)
    m = L.MLP(C, drng, dropout=0.1, dtype=F64)
    for p in m.params().values():
        p[:] = 0.5 * x_of(rng, *p.shape)                        # biases too: the fused bias + GELU is checked
    check_module(m, x_of(rng, B, T, C), x_of(rng, B, T, C), reset=replay(drng))


@pytest.mark.parametrize("bias", [True, False])
def test_block_grad(rng, bias):
    drng = np.random.default_rng(11)
    m = L.Block(C, NH, drng, dropout=0.1, bias=bias, dtype=F64)
    for name, p in m.params().items():
        p[:] = (0.3 * x_of(rng, *p.shape)) + (1.0 if name.endswith("ln_1.weight") else 0.0)
    check_module(m, x_of(rng, B, T, C), x_of(rng, B, T, C), reset=replay(drng))


def test_cross_entropy_grad(rng):
    m = L.CrossEntropy(11).bind(B, T, F64)
    logits = 3 * x_of(rng, B, T, 11)
    targets = rng.integers(0, 11, (B, T))
    m.forward(logits, targets)
    dlogits = m.backward(scale=0.5).copy()
    num = num_grad(lambda: 0.5 * m.forward(logits, targets), logits)
    err = rel_err(dlogits, num)
    assert err < 1e-6, f"CrossEntropy input gradient (logits): rel err {err:.2e}"


def test_cross_entropy_is_stable_and_exact(rng):
    m = L.CrossEntropy(3).bind(1, 2, F64)
    logits = np.array([[[1000.0, 0.0, -1000.0], [0.0, 0.0, 0.0]]])
    loss = m.forward(logits, np.array([[0, 2]]))
    assert np.isfinite(loss)
    np.testing.assert_allclose(loss, (0.0 + math.log(3)) / 2, rtol=1e-12)


def test_backward_frees_cache_and_needs_forward(rng):
    m = L.Linear(C, C, rng, dtype=F64).bind(1, 2, F64)
    m.forward(x_of(rng, 1, 2, C))
    m.backward(x_of(rng, 1, 2, C))
    assert m.cache is None
    with pytest.raises(RuntimeError, match="without a forward"):
        m.backward(x_of(rng, 1, 2, C))


def test_backward_accumulates(rng):
    m = L.Linear(C, C, rng, dtype=F64).bind(1, 3, F64)
    x, dy = x_of(rng, 1, 3, C), x_of(rng, 1, 3, C)
    m.zero_grad()
    m.forward(x); m.backward(dy)
    once = m.grads()["weight"].copy()
    m.forward(x); m.backward(dy)
    np.testing.assert_allclose(m.grads()["weight"], 2 * once)
    m.zero_grad()
    assert not m.grads()["weight"].any()


def test_outputs_live_in_bound_arrays(rng):
    """bind(B, T, dtype) allocates once; forwards at that shape write the same arrays (the next forward
    overwrites the last output), and another shape or dtype allocates anew."""
    m = L.LayerNorm(C, dtype=F64).bind(B, T, F64)
    y = m.forward(x_of(rng, B, T, C))
    assert y is m.a.y and m.bind(B, T, F64).forward(x_of(rng, B, T, C)) is y
    m.bind(B, 3, F64)
    assert m.a.y is not y and m.forward(x_of(rng, B, 3, C)).shape == (B, 3, C)

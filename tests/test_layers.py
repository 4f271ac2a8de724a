"""Finite-difference checks (float64, central) of every layer's input and parameter gradients, and a block's,
plus the properties of dropout, the causal mask, the positional table and the scatter-add."""
import math

import numpy as np
import pytest

from minigpt import layers as L
from minigpt.model import Block, GPTConfig, PER_LAYER, Table, activation_shapes, gradient_shapes, parameter_shapes
from minigpt.model import _carve
from gradcheck import GRAD_TOL, check_layer, num_grad, rel_err
from helpers import spec

F64 = np.float64
B, T, C, NH = 2, 5, 8, 2
ops = spec()                                                    # the numpy specification: it runs float64


def x_of(rng, *shape):
    return rng.standard_normal(shape)


# ----------------------------------------------------------------------------
# one check per layer: the input gradient and every parameter gradient

@pytest.mark.parametrize("bias", [True, False])
def test_linear_grad(rng, bias):
    x, w, b = x_of(rng, B, T, C), x_of(rng, C, 3 * C), x_of(rng, 3 * C) if bias else None
    out, dx, dw, db = np.empty((B, T, 3 * C)), np.empty((B, T, C)), np.zeros((C, 3 * C)), np.zeros(3 * C)

    def backward(dy):
        dw.fill(0), db.fill(0)
        L.linear_backward(ops, dx, dw, db if bias else None, dy, x, w)
        return {"x": dx, "w": dw, **({"b": db} if bias else {})}

    names = check_layer(lambda: L.linear_forward(ops, out, x, w, b), backward,
                        {"x": x, "w": w, **({"b": b} if bias else {})}, x_of(rng, B, T, 3 * C))
    assert names == (["b", "w", "x"] if bias else ["w", "x"])


# the MLP's first Linear with its activation fused: (forward, backward, what the forward keeps for the backward)
ACTIVATIONS = {"gelu": (L.linear_gelu_forward, L.linear_gelu_backward),      # c_fc: gelu(x w + b)
               "relu2": (L.linear_relu2_forward, L.linear_relu2_backward)}   # --activation relu2: relu(x w + b)^2


@pytest.mark.parametrize("act", ACTIVATIONS)
@pytest.mark.parametrize("bias", [True, False])
def test_linear_activation_grad(rng, bias, act):
    """out = act(x w + b), the bias add and the activation fused; about half of relu2's inputs are negative."""
    forward, backward_of = ACTIVATIONS[act]
    x, w, b = x_of(rng, B, T, C), 0.5 * x_of(rng, C, 3 * C), x_of(rng, 3 * C) if bias else None
    out, dact = np.empty((B, T, 3 * C)), np.empty((B, T, 3 * C))
    dx, dw, db = np.empty((B, T, C)), np.zeros((C, 3 * C)), np.zeros(3 * C)

    def backward(dy):
        dw.fill(0), db.fill(0)
        backward_of(ops, dx, dw, db if bias else None, dy, dact, x, w)
        return {"x": dx, "w": dw, **({"b": db} if bias else {})}

    check_layer(lambda: forward(ops, out, dact, x, w, b), backward,
                {"x": x, "w": w, **({"b": b} if bias else {})}, x_of(rng, B, T, 3 * C))


def test_linear_gelu_is_gelu_of_linear(rng):
    x, w, b = x_of(rng, B, T, C), 0.5 * x_of(rng, C, 3 * C), x_of(rng, 3 * C)
    out, dgelu = np.empty((B, T, 3 * C)), np.empty((B, T, 3 * C))
    z = x @ w + b
    want = 0.5 * z * (1 + np.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z ** 3)))
    np.testing.assert_allclose(L.linear_gelu_forward(ops, out, dgelu, x, w, b), want, rtol=1e-13, atol=1e-14)


def test_linear_relu2_is_relu_squared(rng):
    x, w, b = x_of(rng, B, T, C), 0.5 * x_of(rng, C, 3 * C), x_of(rng, 3 * C)
    out, drelu2 = np.empty((B, T, 3 * C)), np.empty((B, T, 3 * C))
    z = x @ w + b
    np.testing.assert_allclose(L.linear_relu2_forward(ops, out, drelu2, x, w, b), np.maximum(z, 0) ** 2, rtol=1e-13)


def test_qk_norm_grad(rng):
    """q and k of each head scaled to RMS 1 in place (--qk_norm); v passes through untouched."""
    x, qkv, rstd = 2 * x_of(rng, B, T, 3 * C) + 0.5, np.empty((B, T, 3 * C)), np.empty((B, T, 2, NH))
    dqkv, tmp = np.empty((B, T, 3 * C)), np.empty((B, T, C))

    def forward():
        np.copyto(qkv, x)                                       # the layer works in place in qkv
        return L.qk_norm_forward(rstd, qkv, NH)

    def backward(dy):
        np.copyto(dqkv, dy)
        return {"x": L.qk_norm_backward(dqkv, tmp, qkv, rstd, NH)}

    check_layer(forward, backward, {"x": x}, x_of(rng, B, T, 3 * C))
    q = forward().reshape(B, T, 3, NH, C // NH)
    ms = (x.reshape(B, T, 3, NH, C // NH)[:, :, :2] ** 2).mean(-1)
    np.testing.assert_allclose((q[:, :, :2] ** 2).mean(-1), ms / (ms + L.LN_EPS), rtol=1e-12)   # RMS 1 but eps
    np.testing.assert_array_equal(q[:, :, 2], x.reshape(B, T, 3, NH, C // NH)[:, :, 2])


def test_softcap_grad(rng):
    """logits = cap tanh(z / cap) (--logit_cap): bounded by cap, the identity near 0."""
    z, out, dcap, dz = 6 * x_of(rng, B, T, 11), np.empty((B, T, 11)), np.empty((B, T, 11)), np.empty((B, T, 11))
    check_layer(lambda: L.softcap_forward(out, dcap, z, 5.0), lambda dy: {"z": L.softcap_backward(dz, dy, dcap)},
                {"z": z}, x_of(rng, B, T, 11))
    np.testing.assert_allclose(L.softcap_forward(out, dcap, z, 5.0), 5.0 * np.tanh(z / 5.0), rtol=1e-14)
    assert np.abs(out).max() < 5.0


def test_gelu_matches_tanh_formula():
    x = np.linspace(-8, 8, 101)
    want = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    got = ops.gelu(x, None, out=np.empty_like(x), dgelu=np.empty_like(x))
    np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-15)


def test_gelu_grad(rng):
    """gelu'(x), which the forward keeps for the backward, against finite differences of sum(gelu(x)): the GELU
    is elementwise, so that gradient is gelu' at each entry."""
    x, dgelu = 2 * x_of(rng, 40), np.empty(40)
    ops.gelu(x, None, out=np.empty_like(x), dgelu=dgelu)
    num = num_grad(lambda: float(ops.gelu(x, None, out=np.empty_like(x), dgelu=np.empty_like(x)).sum()), x)
    assert rel_err(dgelu, num) < 1e-8


def test_embedding_grad(rng):
    """Repeated ids (the scatter-add must sum them) and T below block_size (rows T.. get no gradient)."""
    idx = np.array([[1, 3, 3, 10, 0], [3, 1, 7, 7, 7]])
    wte, wpe = x_of(rng, 11, C), x_of(rng, 7, C)
    out, dwte, dwpe = np.empty((B, T, C)), np.zeros((11, C)), np.zeros((7, C))

    def backward(dy):
        dwte.fill(0), dwpe.fill(0)
        L.embedding_backward(ops, dwte, dwpe, dy, idx)
        return {"wte": dwte, "wpe": dwpe}

    check_layer(lambda: L.embedding_forward(out, idx, wte, wpe), backward, {"wte": wte, "wpe": wpe},
                x_of(rng, B, T, C))
    assert not dwpe[T:].any()


def test_embedding_scatter_add_matches_loop(rng):
    idx, dy = rng.integers(0, 11, (B, T)), x_of(rng, B, T, C)
    dwte, dwpe = np.zeros((11, C)), np.zeros((T, C))
    L.embedding_backward(ops, dwte, dwpe, dy, idx)
    want = np.zeros((11, C))
    for b in range(B):
        for t in range(T):
            want[idx[b, t]] += dy[b, t]
    np.testing.assert_allclose(dwte, want, rtol=1e-12)
    np.testing.assert_allclose(dwpe, dy.sum(0), rtol=1e-12)


def test_embedding_start_reads_later_positions(rng):
    """Generation's offset: positions start.. of the table, for the same token ids."""
    idx, wte, wpe = rng.integers(0, 11, (1, 2)), x_of(rng, 11, C), x_of(rng, 7, C)
    got = L.embedding_forward(np.empty((1, 2, C)), idx, wte, wpe, start=3)
    np.testing.assert_array_equal(got, wte[idx] + wpe[3:5])


@pytest.mark.parametrize("bias", [True, False])
def test_layernorm_grad(rng, bias):
    x, w, b = 3 * x_of(rng, B, T, C) + 1, x_of(rng, C), x_of(rng, C) if bias else None
    out, mean, rstd = np.empty((B, T, C)), np.empty(B * T), np.empty(B * T)
    dx, dw, db = np.empty((B, T, C)), np.zeros(C), np.zeros(C)

    def backward(dy):
        dw.fill(0), db.fill(0)
        L.layernorm_backward(ops, dx, dw, db if bias else None, dy, x, w, mean, rstd)
        return {"x": dx, "w": dw, **({"b": db} if bias else {})}

    check_layer(lambda: L.layernorm_forward(ops, out, mean, rstd, x, w, b), backward,
                {"x": x, "w": w, **({"b": b} if bias else {})}, x_of(rng, B, T, C))


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_attention_grad(rng, dropout):
    qkv = 2 * x_of(rng, B, T, 3 * C)                            # larger scores: sharper, non-uniform attention
    y, att = np.empty((B, T, C)), np.empty((B, NH, T, T))
    drop = (dropout, L.dropout_seed(np.random.default_rng(7))) if dropout else None
    dqkv = np.empty((B, T, 3 * C))

    def backward(dy):
        L.attention_backward(ops, dqkv, dy, qkv, att, NH, drop)
        return {"qkv": dqkv}

    check_layer(lambda: L.attention_forward(ops, y, att, qkv, NH, drop=drop), backward, {"qkv": qkv},
                x_of(rng, B, T, C))


def test_attention_dropout_multiplies_v_by_the_dropped_probabilities(rng):
    """Under dropout y = (att * mask) v, the mask Ops.dropout draws over att's (B, nh, T, T) elements, and att the
    probabilities without dropout."""
    qkv, drop = x_of(rng, B, T, 3 * C), (0.4, 2**63 + 11)
    y0, att0 = np.empty((B, T, C)), np.empty((B, NH, T, T))
    L.attention_forward(ops, y0, att0, qkv, NH)                       # without dropout
    y, att = np.empty((B, T, C)), np.empty((B, NH, T, T))
    L.attention_forward(ops, y, att, qkv, NH, drop=drop)
    np.testing.assert_array_equal(att, att0)                    # att keeps the probabilities
    mask = L.dropout(ops, np.empty(att.shape), np.ones(att.shape), *drop)
    v = L.heads(qkv, NH, 3)[2]                                  # (B, nh, T, hs)
    want = (att0 * mask) @ v                                    # (B, nh, T, hs)
    np.testing.assert_allclose(y.reshape(B, T, NH, C // NH).transpose(0, 2, 1, 3), want, rtol=1e-12, atol=1e-14)
    assert np.abs(y - y0).max() > 0.1                           # and it is not the output without dropout


def test_attention_is_causal(rng):
    qkv = x_of(rng, B, T, 3 * C)
    y, att = np.empty((B, T, C)), np.empty((B, NH, T, T))
    want = L.attention_forward(ops, y, att, qkv, NH).copy()
    for t in range(T - 1):
        q2 = qkv.copy()
        q2[:, t + 1:] = x_of(rng, B, T - t - 1, 3 * C) * 100    # change the future
        np.testing.assert_array_equal(L.attention_forward(ops, y, att, q2, NH)[:, :t + 1], want[:, :t + 1])
    np.testing.assert_allclose(att.sum(-1), 1.0, rtol=1e-12)   # each query's probabilities


def test_attention_with_a_kv_cache_equals_the_full_pass(rng):
    """Positions fed one call at a time (start = positions before, keys and values kept in kv) give the
    rows of one pass over all of them."""
    qkv = x_of(rng, B, T, 3 * C)
    full = L.attention_forward(ops, np.empty((B, T, C)), np.empty((B, NH, T, T)), qkv, NH).copy()
    kv = (np.zeros((B, NH, 7, C // NH)), np.zeros((B, NH, 7, C // NH)))    # room for 7 positions
    got = [L.attention_forward(ops, np.empty((B, 2, C)), np.empty((B, NH, 2, 7)), qkv[:, :2], NH, 0, kv)[:, :2].copy()]
    for t in range(2, T):
        got.append(L.attention_forward(ops, np.empty((B, 1, C)), np.empty((B, NH, 1, 7)), qkv[:, t:t + 1], NH, t,
                                       kv).copy())
    np.testing.assert_allclose(np.concatenate(got, axis=1), full, rtol=1e-12, atol=1e-14)


def test_dropout_is_inverted_and_fresh():
    rng = np.random.default_rng(0)
    seed = L.dropout_seed(rng)
    a = L.dropout(ops, np.empty((64, 64)), np.ones((64, 64)), 0.5, seed)
    assert set(np.unique(a)) == {0.0, 2.0}                      # kept units are scaled by 1/(1-p)
    assert abs(a.mean() - 1.0) < 0.05                           # the expectation is kept
    assert not np.array_equal(a, L.dropout(ops, np.empty((64, 64)), np.ones((64, 64)), 0.5, L.dropout_seed(rng)))
    x = np.arange(1.0, 4097.0).reshape(64, 64)                  # the same seed: the same mask, on any values
    np.testing.assert_array_equal(L.dropout(ops, x.copy(), x, 0.5, seed), x * a)


# ----------------------------------------------------------------------------
# a whole block: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)), through its slice of the tables

@pytest.mark.parametrize("bias,dropout,options", [(True, 0.0, {}), (False, 0.0, {}), (True, 0.1, {}),
                                                  (True, 0.1, dict(activation="relu2", qk_norm=True))])
def test_block_grad(rng, bias, dropout, options):
    cfg = GPTConfig(vocab_size=11, block_size=T, n_layer=1, n_head=NH, n_embd=C, bias=bias, dropout=dropout,
                    **options)
    shapes = {k: s for k, s in parameter_shapes(cfg).items() if k.startswith("h.0.")}
    params = _carve(0.3 * rng.standard_normal(sum(math.prod(s) for s in shapes.values())), shapes)
    params["h.0.ln_1.weight"] += 1.0
    grads = _carve(np.zeros(sum(math.prod(s) for s in shapes.values())), shapes)
    block = Block(cfg, 0, params, grads)
    a = Table(activation_shapes(cfg, B, T, dropout=dropout > 0), F64, B, T, 1, PER_LAYER).h[0]
    d = Table(gradient_shapes(cfg, B, T), F64, B, T)
    x, drng = x_of(rng, B, T, C), np.random.default_rng(11)
    state = drng.bit_generator.state

    def forward():
        drng.bit_generator.state = state                        # replay the same dropout masks
        return block.forward(ops, x, a, drng if dropout else None)

    def backward(dy):
        for g in grads.values():
            g.fill(0)
        dx = block.backward(ops, dy.copy(), x, a, d, dropped=dropout > 0)
        return {"x": dx, **grads}

    names = check_layer(forward, backward, {"x": x, **params}, x_of(rng, B, T, C))
    assert len(names) == len(params) + 1


# ----------------------------------------------------------------------------
# softmax + cross-entropy

def test_cross_entropy_grad(rng):
    logits, targets = 3 * x_of(rng, B, T, 11), rng.integers(0, 11, (B, T))
    lse, dlogits = np.empty(B * T), np.empty((B, T, 11))
    L.crossentropy_forward(ops, lse, logits, targets)
    L.crossentropy_backward(ops, dlogits, logits, targets, lse, scale=0.5)
    num = num_grad(lambda: 0.5 * L.crossentropy_forward(ops, lse, logits, targets), logits)
    err = rel_err(dlogits, num)
    assert err < GRAD_TOL, f"cross-entropy input gradient (logits): rel err {err:.2e}"


def test_cross_entropy_is_stable_and_exact():
    logits = np.array([[[1000.0, 0.0, -1000.0], [0.0, 0.0, 0.0]]])
    loss = L.crossentropy_forward(ops, np.empty(2), logits, np.array([[0, 2]]))
    assert np.isfinite(loss)
    np.testing.assert_allclose(loss, (0.0 + math.log(3)) / 2, rtol=1e-12)


def test_backward_accumulates(rng):
    """Parameter gradients are added (+=), never written: two backwards give twice one."""
    x, w, dy = x_of(rng, 1, 3, C), x_of(rng, C, C), x_of(rng, 1, 3, C)
    dx, dw, db = np.empty((1, 3, C)), np.zeros((C, C)), np.zeros(C)
    L.linear_backward(ops, dx, dw, db, dy, x, w)
    once, once_b = dw.copy(), db.copy()
    L.linear_backward(ops, dx, dw, db, dy, x, w)
    np.testing.assert_allclose(dw, 2 * once)
    np.testing.assert_allclose(db, 2 * once_b)


def test_flat_is_a_view_and_refuses_a_strided_array():
    a = np.zeros((2, 3, 4))
    assert np.shares_memory(L.flat(a), a) and L.flat(a).shape == (6, 4)
    with pytest.raises(AssertionError, match="strided"):         # its reshape would copy: an out= would be lost
        L.flat(a[:, ::2])

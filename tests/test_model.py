"""Whole-GPT checks: every parameter gradient by finite differences, names, causality, init loss, overfitting."""
import math

import numpy as np
import pytest

from minigpt import backends
from minigpt.errors import UserError
from minigpt.model import GPT, PER_LAYER, GPTConfig, Table, activation_shapes
from gradcheck import GRAD_TOL, num_grad, rel_err
from helpers import spec

TINY = dict(vocab_size=11, block_size=6, n_layer=2, n_head=2, n_embd=8, bias=True)


def tiny_model(seed=0, dtype=np.float64, **kw):
    cfg = GPTConfig(**{**TINY, **kw})
    model = GPT(cfg, np.random.default_rng(seed), dtype=dtype, ops=spec())
    if dtype == np.float64:                                    # larger weights than GPT-2 init: every path matters
        r = np.random.default_rng(seed + 100)
        for name, p in model.params().items():
            p += 0.3 * r.standard_normal(p.shape)
    return model


def batch(rng, B=2, T=5, V=11):
    return rng.integers(0, V, (B, T)), rng.integers(0, V, (B, T))


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_gpt_grad_every_parameter(tie, bias, dropout):
    model = tiny_model(tie_weights=tie, bias=bias, dropout=dropout)
    x, y = batch(np.random.default_rng(1))
    state = model.rng.bit_generator.state                      # replay the same dropout masks

    def loss():
        model.rng.bit_generator.state = state
        return model.forward(x, y)[1]

    model.zero_grad()
    loss()
    model.backward()
    grads = {k: v.copy() for k, v in model.grads().items()}
    for name, p in model.params().items():
        err = rel_err(grads[name], num_grad(loss, p))
        assert err < GRAD_TOL, f"GPT(tie={tie}, bias={bias}) parameter {name!r}: rel err {err:.2e}"


SPEEDRUN_OPTIONS = dict(activation="relu2", qk_norm=True, logit_cap=3.0)   # the model options of issue 24


@pytest.mark.parametrize("tie", [True, False])
def test_gpt_grad_every_parameter_with_the_speedrun_options(tie):
    """ReLU^2, QK-norm and the logit soft-cap together, through the whole model (the cap small enough to bend)."""
    model = tiny_model(tie_weights=tie, dropout=0.1, **SPEEDRUN_OPTIONS)
    x, y = batch(np.random.default_rng(4))
    state = model.rng.bit_generator.state

    def loss():
        model.rng.bit_generator.state = state
        return model.forward(x, y)[1]

    model.zero_grad()
    loss()
    assert np.abs(model.acts.logits).max() > 1.5                # the cap is not the identity here
    model.backward()
    grads = {k: v.copy() for k, v in model.grads().items()}
    for name, p in model.params().items():
        err = rel_err(grads[name], num_grad(loss, p))
        assert err < GRAD_TOL, f"GPT({SPEEDRUN_OPTIONS}, tie={tie}) parameter {name!r}: rel err {err:.2e}"


def test_gpt_speedrun_options_with_a_kv_cache_equal_the_full_pass():
    """Generation's forward over the same options: position by position equals one pass."""
    from minigpt.model import KVCache
    model = tiny_model(dtype=np.float64, **SPEEDRUN_OPTIONS).eval()
    x = np.random.default_rng(5).integers(0, 11, (2, 6))
    full = model.forward(x)[0].copy()
    cache = KVCache(model, 2)
    got = [model.forward(x[:, :3], cache=cache)[0].copy()]
    got += [model.forward(x[:, t:t + 1], cache=cache)[0].copy() for t in range(3, 6)]
    np.testing.assert_allclose(np.concatenate(got, axis=1), full, rtol=1e-12, atol=1e-12)


def test_gpt_relu2_mlp_is_relu_squared():
    """--activation relu2: the MLP's hidden layer is relu(ln_2(x) W_fc + b)^2, read from the activation table."""
    model = tiny_model(activation="relu2")
    model.forward(*batch(np.random.default_rng(2)))
    a, p = model.acts.h[1], model.params()
    z = a.ln2 @ p["h.1.mlp.c_fc.weight"] + p["h.1.mlp.c_fc.bias"]
    np.testing.assert_allclose(a.fc, np.maximum(z, 0) ** 2, rtol=1e-12, atol=1e-14)
    assert (a.fc == 0).mean() > 0.3                              # the ReLU cuts about half


def test_gpt_zero_init_proj_zeroes_only_the_output_projections():
    """--zero_init_proj: attn and mlp c_proj start at 0 (every block the identity), the other weights keep the
    draws they have without it, and the projections still get a gradient."""
    cfg = dict(vocab_size=11, block_size=6, n_layer=2, n_head=2, n_embd=8)
    base = GPT(GPTConfig(**cfg), np.random.default_rng(0), dtype=np.float64, ops=spec())
    zero = GPT(GPTConfig(**cfg, zero_init_proj=True), np.random.default_rng(0), dtype=np.float64, ops=spec())
    for k, p in zero.params().items():
        if k.endswith("c_proj.weight"):
            assert not p.any(), k
        else:
            np.testing.assert_array_equal(p, base.params()[k], err_msg=k)
    x, y = batch(np.random.default_rng(1), T=6)
    zero.forward(x, y)
    zero.backward()
    assert zero.grads()["h.0.mlp.c_proj.weight"].any() and zero.grads()["h.1.attn.c_proj.weight"].any()


def test_gpt_backward_scale_scales_every_gradient():
    model = tiny_model()
    x, y = batch(np.random.default_rng(2))
    model.zero_grad()
    model.forward(x, y)
    model.backward()
    g1 = {k: v.copy() for k, v in model.grads().items()}
    model.zero_grad()
    model.forward(x, y)
    model.backward(scale=0.25)
    for k, v in model.grads().items():
        np.testing.assert_allclose(v, 0.25 * g1[k], rtol=1e-12, atol=1e-15, err_msg=k)


@pytest.mark.parametrize("tie", [True, False])
def test_gpt_backward_accumulates(tie):
    """Two forward/backward pairs without zero_grad add up, in every parameter (gradient accumulation; the
    tied wte gets both of its parts each time)."""
    model = tiny_model(tie_weights=tie)
    x, y = batch(np.random.default_rng(6))
    model.zero_grad()
    model.forward(x, y)
    model.backward()
    once = {k: v.copy() for k, v in model.grads().items()}
    model.forward(x, y)
    model.backward()
    for k, v in model.grads().items():
        np.testing.assert_allclose(v, 2 * once[k], rtol=1e-12, atol=1e-15, err_msg=k)


def test_gpt_parameter_names():
    untied = tiny_model(tie_weights=False)
    names = set(untied.params())
    want = {"wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias", "lm_head.weight"}
    for i in range(2):
        for part in ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj"):
            want |= {f"h.{i}.{part}.weight", f"h.{i}.{part}.bias"}
    assert names == want
    assert set(untied.grads()) == names
    tied = tiny_model()
    assert set(tied.params()) == names - {"lm_head.weight"}
    assert untied.params()["h.0.mlp.c_fc.weight"].shape == (8, 32)     # Linear weights are (in, out)
    assert untied.params()["lm_head.weight"].shape == (8, 11)
    assert tied.num_params() == sum(p.size for p in tied.params().values())
    nobias = tiny_model(bias=False)
    assert not any(n.endswith(".bias") for n in nobias.params())


def test_gpt_params_and_grads_are_views_of_one_buffer_each():
    """params()/grads() are live views of param_memory/grad_memory, consecutive and in order, which the blocks
    read and write: clipping and the Allreduce take the buffer itself."""
    model = tiny_model()
    model.params()["h.1.attn.c_proj.weight"][0, 0] = 123.0
    assert model.h[1].p["attn.c_proj.weight"][0, 0] == 123.0
    for mem, named in ((model.param_memory, model.params()), (model.grad_memory, model.grads())):
        offset = 0
        for k, a in named.items():
            assert np.shares_memory(a, mem) and a.ctypes.data == mem.ctypes.data + offset * mem.itemsize, k
            offset += a.size
        assert offset == mem.size == model.num_params()
    model.forward(*batch(np.random.default_rng(0)))
    model.backward()
    assert model.grad_memory.any() and model.h[0].g["mlp.c_fc.weight"].any()
    model.zero_grad()
    assert not any(g.any() for g in model.grads().values())


def test_gpt_activation_table_is_made_once_per_shape():
    """One table per (B, T): forwards at that shape reuse its arrays; another shape makes a new one."""
    model = tiny_model()
    x, y = batch(np.random.default_rng(0))
    model.forward(x, y)
    acts, dacts = model.acts, model.dacts
    model.backward()
    model.forward(x[:, ::-1].copy(), y)
    assert model.acts is acts and model.dacts is dacts and np.shares_memory(model.acts.h[1].qkv, acts.qkv)
    model.forward(x[:, :3], y[:, :3])
    assert model.acts is not acts and model.acts.logits.shape == (2, 3, 11)


def test_per_layer_names_every_array_that_leads_with_n_layer():
    """PER_LAYER (the arrays each layer sees as a.h[l].name) is exactly the activation table's arrays that lead
    with n_layer, with every option on; a table is keyed by its (B, T), whatever its first array."""
    cfg = GPTConfig(vocab_size=11, block_size=8, n_layer=7, n_head=2, n_embd=16, qk_norm=True, logit_cap=30.0,
                    dropout=0.1)
    shapes = activation_shapes(cfg, 2, 3, dropout=True)
    assert {k for k, s in shapes.items() if s[0] == 7} == set(PER_LAYER)
    table = Table(dict(reversed(shapes.items())), np.float64, 2, 3, 7, PER_LAYER)
    assert table.shape == (2, 3) and table.h[6].qkv.shape == (2, 3, 48) and table.h[6].drop_seeds.shape == (3,)


def test_gpt_tables_start_on_cache_lines():
    """Every array of the activation and gradient tables starts on a 64-byte line (np.zeros of a large array does
    not: 16 bytes in), is zero, and has its table shape and the model's dtype."""
    model = tiny_model()
    x, y = batch(np.random.default_rng(0))
    acts, dacts = model.tables(*x.shape)
    arrays = list(vars(acts).items()) + list(vars(dacts).items())
    arrays = [(k, a) for k, a in arrays if isinstance(a, np.ndarray)]
    assert len(arrays) > 20
    for name, a in arrays:
        assert a.ctypes.data % 64 == 0, name
        assert a.dtype == model.param_memory.dtype and a.flags.c_contiguous and not a.any(), name
    assert acts.qkv.shape[:3] == (model.config.n_layer,) + x.shape


def test_gpt_init_scales():
    cfg = GPTConfig(vocab_size=65, block_size=64, n_layer=8, n_head=4, n_embd=256, bias=True)
    p = GPT(cfg, np.random.default_rng(0), ops=spec()).params()
    assert abs(p["h.0.attn.c_attn.weight"].std() - 0.02) < 0.001
    assert abs(p["h.0.mlp.c_proj.weight"].std() - 0.02 / math.sqrt(16)) < 0.0005
    assert abs(p["wte.weight"].std() - 0.02) < 0.001 and p["wte.weight"].dtype == np.float32
    assert not p["h.0.attn.c_attn.bias"].any() and (p["ln_f.weight"] == 1).all()


def test_gpt_is_causal():
    model = tiny_model()
    rng = np.random.default_rng(3)
    x = rng.integers(0, 11, (2, 6))
    logits = model.forward(x)[0].copy()                        # the next forward overwrites the model's logits
    for t in range(5):
        x2 = x.copy()
        x2[:, t + 1:] = rng.integers(0, 11, (2, 5 - t))
        np.testing.assert_array_equal(model.forward(x2)[0][:, :t + 1], logits[:, :t + 1])


def test_gpt_init_loss_is_log_vocab():
    cfg = GPTConfig(vocab_size=65, block_size=32, n_layer=2, n_head=4, n_embd=64)
    model = GPT(cfg, np.random.default_rng(0), ops=spec())
    x, y = batch(np.random.default_rng(0), B=4, T=32, V=65)
    _, loss = model.forward(x, y)
    assert abs(loss - math.log(65)) < 0.1


def test_gpt_overfits_one_batch():
    cfg = GPTConfig(vocab_size=11, block_size=16, n_layer=2, n_head=2, n_embd=32)
    model = GPT(cfg, np.random.default_rng(0), ops=spec())
    x, y = batch(np.random.default_rng(4), B=4, T=16)
    m = {k: np.zeros_like(v) for k, v in model.params().items()}
    v2 = {k: np.zeros_like(v) for k, v in model.params().items()}
    for step in range(1, 101):                                  # minimal Adam, lr 1e-2
        model.zero_grad()
        _, loss = model.forward(x, y)
        model.backward()
        for k, p in model.params().items():
            g = model.grads()[k]
            m[k] = 0.9 * m[k] + 0.1 * g
            v2[k] = 0.999 * v2[k] + 0.001 * g * g
            p -= 1e-2 * (m[k] / (1 - 0.9 ** step)) / (np.sqrt(v2[k] / (1 - 0.999 ** step)) + 1e-8)
    assert loss < 0.1, loss


@pytest.mark.parametrize("field,value,match", [
    ("n_embd", 9, "divisible by --n_head"), ("n_layer", 0, "n_layer"), ("block_size", -1, "block_size"),
    ("vocab_size", 2.5, "vocab_size"), ("dropout", 1.0, "dropout"), ("dropout", -0.1, "dropout"),
    ("bias", "yes", "bias"), ("activation", "swish", "gelu or relu2"), ("qk_norm", 1, "qk_norm"),
    ("logit_cap", -1.0, "logit_cap"), ("logit_cap", math.inf, "logit_cap"), ("zero_init_proj", "no", "zero_init"),
])
def test_config_errors_name_the_field(field, value, match):
    with pytest.raises(UserError, match=match):
        GPTConfig(**{**TINY, field: value})


def test_gpt_rejects_bad_input():
    model = tiny_model(dtype=np.float32)
    with pytest.raises(ValueError, match="positional table"):
        model.forward(np.zeros((1, 7), int))
    with pytest.raises(ValueError, match=r"\[0, 11\)"):
        model.forward(np.full((1, 3), 11))
    with pytest.raises(RuntimeError, match="targets"):
        model.forward(np.zeros((1, 3), int))
        model.backward()
    model.forward(np.zeros((1, 3), int), np.ones((1, 3), int))
    model.forward(np.zeros((1, 4), int))                              # no targets: the old loss must not linger
    with pytest.raises(RuntimeError, match="targets"):
        model.backward()


def test_gpt_logits_live_in_model_arrays():
    """forward returns the model's own logits array: the same object at the same (B, T), overwritten."""
    model = tiny_model()
    x = np.random.default_rng(5).integers(0, 11, (2, 6))
    first = model.forward(x)[0]
    kept = first.copy()
    second = model.forward(x[::-1].copy())[0]
    assert second is first and not np.array_equal(second, kept)


def _backend(name):
    why = backends.why_unavailable(name)
    return pytest.param(name, marks=pytest.mark.skipif(why is not None, reason=str(why)))


@pytest.mark.parametrize("backend", [_backend("numba"), _backend("native")])
def test_gpt_backends_match_numpy_float32(backend):
    """The same float32 batch through a fast backend gives the numpy backend's loss and every gradient."""
    cfg = GPTConfig(vocab_size=29, block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=0.1)
    out = {}
    for name in ("numpy", backend):
        model = GPT(cfg, np.random.default_rng(0), ops=backends.load(name, verbose=False))
        r = np.random.default_rng(2)
        for p in model.params().values():                      # non-zero biases, uneven LayerNorm gains
            p += (0.1 * r.standard_normal(p.shape)).astype(np.float32)
        x, y = batch(np.random.default_rng(1), B=3, T=16, V=29)
        model.zero_grad()
        _, loss = model.forward(x, y)
        model.backward()
        out[name] = loss, {k: g.copy() for k, g in model.grads().items()}
    assert abs(out[backend][0] - out["numpy"][0]) < 1e-4 * out["numpy"][0]
    for k, g in out["numpy"][1].items():
        np.testing.assert_allclose(out[backend][1][k], g, rtol=1e-4, atol=1e-4 * np.abs(g).max(), err_msg=k)


NUMPY_ALLOCATES = "the numpy backend is the plain-NumPy specification: its ops make temporaries by design"


@pytest.mark.parametrize("backend", [
    pytest.param("numpy", marks=pytest.mark.skip(reason=NUMPY_ALLOCATES)),
    _backend("numba"), _backend("native")])
def test_training_step_allocates_nothing_large(backend):
    """After a warm-up step, forward + backward + clip + AdamW reuse the model's arrays: nothing of activation
    size is allocated per step, the logits included (they live in the model's arrays). tracemalloc sees
    numpy's and numba's allocations; numpy's ufuncs buffer broadcast operands in fixed 8192-element chunks
    (32 KB), so the activation here is 128 KB to tell those from arrays that grow with the batch."""
    import tracemalloc
    from minigpt.optim import AdamW, clip_grad_norm
    B, T, C, V = 8, 64, 64, 65
    model = GPT(GPTConfig(vocab_size=V, block_size=T, n_layer=2, n_head=2, n_embd=C), np.random.default_rng(0),
                ops=backends.load(backend, verbose=False))
    opt = AdamW(model.params(), ops=model.ops)
    x, y = batch(np.random.default_rng(1), B=B, T=T, V=V)

    def forward():
        model.zero_grad()
        model.forward(x, y)

    def update():
        clip_grad_norm(model.grad_memory, 1.0)
        opt.step(model.params(), model.grads(), 1e-3)

    phases = {"forward": forward, "backward": model.backward, "update": update}
    for f in phases.values():                                          # warm-up: arrays are made here
        f()
    peak = {}
    for name, f in phases.items():                                     # each phase's own peak, so that an
        tracemalloc.start()                                            # array made and freed inside the
        try:                                                           # backward is seen too
            f()
            peak[name] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    activation = B * T * C * 4                                         # bytes: 128 KB here (logits: 130 KB)
    assert peak["forward"] < activation // 2, f"the forward allocated {peak['forward']} bytes at its peak"
    assert peak["backward"] < activation // 2, f"the backward allocated {peak['backward']} bytes at its peak"
    assert peak["update"] < activation // 2, f"clip + AdamW allocated {peak['update']} bytes at its peak"

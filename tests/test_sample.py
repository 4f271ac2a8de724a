"""Sampling: top-k/top-p/temperature properties, determinism, and KV-cache exactness (tokens and logits)."""
import subprocess
import sys
import warnings
from dataclasses import replace

import numpy as np
import pytest

from minigpt import backends, checkpoint
from minigpt.errors import UserError
from minigpt.data import CharTokenizer
from minigpt.model import GPT, GPTConfig
from minigpt.optim import AdamW
from minigpt.sample import Decoder, generate, sample_next
from helpers import spec

CFG = GPTConfig(vocab_size=13, block_size=8, n_layer=2, n_head=2, n_embd=16)


def model_f32(seed=0, block=CFG.block_size, ops=None):
    m = GPT(replace(CFG, block_size=block), np.random.default_rng(seed), ops=ops or spec())
    r = np.random.default_rng(seed + 1)
    for p in m.params().values():                      # sharper distributions than GPT-2 init
        p += (0.2 * r.standard_normal(p.shape)).astype(p.dtype)
    return m.eval()


def run(model, n, seed, use_cache, B=3, **kw):
    idx = np.tile(np.array([1, 2, 3]), (B, 1))
    return np.stack(list(generate(model, idx, n, np.random.default_rng(seed), use_cache=use_cache, **kw)), 1)


# ----------------------------------------------------------------------------
# one sampling step

def test_top_k_one_is_greedy_and_uses_no_randomness():
    logits = np.random.default_rng(0).standard_normal((4, 13))
    rng = np.random.default_rng(0)
    before = rng.bit_generator.state
    np.testing.assert_array_equal(sample_next(logits, rng, 0.7, top_k=1), logits.argmax(-1))
    assert rng.bit_generator.state == before


def test_top_k_and_top_p_restrict_the_support():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]] * 2000))
    rng = np.random.default_rng(1)
    assert set(sample_next(logits, rng, 1.0, top_k=2)) == {0, 1}
    assert set(sample_next(logits, rng, 1.0, top_p=0.7)) == {0, 1}     # 0.5 < 0.7 <= 0.8
    assert set(sample_next(logits, rng, 1.0, top_p=0.5)) == {0}
    draws = sample_next(logits, rng, 1.0)
    np.testing.assert_allclose(np.bincount(draws, minlength=4) / 2000, [0.5, 0.3, 0.15, 0.05], atol=0.04)
    cold = sample_next(logits, rng, 0.05)                                # low temperature -> nearly greedy
    assert (cold == 0).mean() > 0.99
    with warnings.catch_warnings():
        warnings.simplefilter("error")                                   # no overflow on the way
        assert (sample_next(logits[:, ::-1], rng, 1e-310) == 3).all()    # the limit: greedy, not NaN or token 0
    with pytest.raises(UserError, match="temperature"):
        sample_next(logits, rng, 0.0)

    class Zero:                                                          # the draw u = 0 exactly
        def random(self, shape):
            return np.zeros(shape)
    masked = np.log(np.array([[0.5, 0.3, 0.15, 0.05]]))[:, ::-1].copy()   # the largest last: top_k drops the first
    assert sample_next(masked, Zero(), 1.0, top_k=2)[0] == 2             # never a token of probability 0


def test_fixed_seed_gives_same_text_and_context_is_cropped():
    m = model_f32()
    a = run(m, 20, seed=5, use_cache=False)                              # 3 + 20 tokens > block_size 8
    b = run(m, 20, seed=5, use_cache=False)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, run(m, 20, seed=6, use_cache=False))
    assert a.shape == (3, 20) and a.max() < 13


# ----------------------------------------------------------------------------
# KV cache

@pytest.mark.parametrize("backend", ["numpy", "numba", "native"])
@pytest.mark.parametrize("block,prompt", [(8, 3), (12, 10)])
def test_kv_cache_logits_match_full_recompute_at_every_step(block, prompt, backend):
    # past block_size every step re-prefills the last block_size tokens: covered by the 3 * block steps
    if backend not in backends.available():
        pytest.skip(f"{backend} backend not available here")
    m = model_f32(block=block, ops=backends.load(backend, verbose=False))
    rng = np.random.default_rng(3)
    idx = rng.integers(0, 13, (2, prompt))
    full, cached = Decoder(m, idx, use_cache=False), Decoder(m, idx, use_cache=True)
    for step in range(3 * block):                                        # well past block_size
        a, b = full.logits(), cached.logits()
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-5, err_msg=f"step {step}")
        nxt = rng.integers(0, 13, 2)
        full.append(nxt)
        cached.append(nxt)


@pytest.mark.parametrize("kw", [dict(temperature=1.0), dict(temperature=0.8, top_k=4), dict(top_p=0.9),
                                dict(top_k=1)])
def test_kv_cache_samples_the_same_tokens(kw):
    m = model_f32(seed=2)
    np.testing.assert_array_equal(run(m, 30, 9, True, **kw), run(m, 30, 9, False, **kw))


def test_kv_cache_float64_is_exact_to_rounding():
    m = GPT(CFG, np.random.default_rng(0), dtype=np.float64, ops=spec()).eval()
    idx = np.array([[4, 5, 6, 7]])
    full, cached = Decoder(m, idx, False), Decoder(m, idx, True)
    for t in range(12):
        np.testing.assert_allclose(cached.logits(), full.logits(), rtol=1e-12, atol=1e-12)
        full.append(np.array([t % 13]))
        cached.append(np.array([t % 13]))


# ----------------------------------------------------------------------------
# the command

def test_kv_cache_leaves_the_training_arrays_alone():
    m = model_f32()
    x = np.random.default_rng(0).integers(0, 13, (3, 8))
    logits = m.forward(x)[0].copy()
    acts = m.acts
    list(generate(m, x[:, :3], 4, np.random.default_rng(0)))          # prefill + decoding, batch 3
    np.testing.assert_array_equal(m.forward(x)[0], logits)
    assert m.acts.shape == (3, 8) and m.acts is acts                    # the cache has its own table


def test_sample_command_help_lists_every_setting():
    from dataclasses import fields
    from minigpt.sample import SampleConfig
    r = subprocess.run([sys.executable, "-m", "minigpt.sample", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    for f in fields(SampleConfig):
        assert f"--{f.name}" in r.stdout, f.name
    assert r.stdout.count("(default:") == len(fields(SampleConfig)), r.stdout     # each default once
    assert "(0: all CPUs," in r.stdout                                   # config.COMMON: as training words it


def test_sample_command_streams_batched_samples(tmp_path):
    model = GPT(CFG, np.random.default_rng(0), ops=spec())
    tok = CharTokenizer(list("abcdefghijkl\n"))
    path = str(tmp_path / "c.npz")
    checkpoint.save(path, model, AdamW(model.params(), ops=model.ops),
                    {"tokenizer": tok.to_json(), "model_config": CFG.to_dict()})
    cmd = [sys.executable, "-m", "minigpt.sample", "--ckpt", path, "--prompt", "abc", "--num_samples", "3",
           "--max_new_tokens", "12", "--seed", "4", "--backend", "numpy"]
    r1 = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    r2 = subprocess.run(cmd + ["--kv_cache=false"], capture_output=True, text=True, timeout=60)
    assert r1.returncode == 0, r1.stderr
    assert r1.stdout == r2.stdout                                       # same seed, same text, cache or not
    assert r1.stdout.count("abc") == 3 and "tokens/s" in r1.stderr and "(3 samples," in r1.stderr
    one = subprocess.run(cmd + ["--num_samples=1"], capture_output=True, text=True, timeout=60)
    assert one.returncode == 0 and f"{path}: 12 tokens in " in one.stderr and "(1 sample," in one.stderr, one.stderr
    bad = subprocess.run(cmd + ["--prompt", "abcXYZ"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "'X', 'Y', 'Z'" in bad.stderr and "Traceback" not in bad.stderr

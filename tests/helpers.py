"""Small texts and configs the training tests write themselves; attention's causal products for the product tests."""
import numpy as np

from minigpt import backends
from minigpt.config import TrainConfig
from minigpt.layers import heads

TINY_TRAIN = dict(n_layer=2, n_head=2, n_embd=16, block_size=16, batch_size=4, max_iters=12, eval_interval=4,
                  eval_iters=2, warmup_iters=2, lr_decay_iters=12, lr=3e-3, min_lr=3e-4, log_interval=4,
                  sample_chars=0, plot="", backend="numpy")


def write_text(path, n_chars=6000, seed=0):
    """A deterministic, learnable text: words from a small vocabulary in short lines."""
    rng = np.random.default_rng(seed)
    words = ["to", "be", "or", "not", "the", "king", "shall", "speak", "my", "lord", "and", "good", "night"]
    out, n = [], 0
    while n < n_chars:
        line = " ".join(rng.choice(words, rng.integers(3, 8))).capitalize() + ".\n"
        out.append(line)
        n += len(line)
    text = "".join(out)[:n_chars]
    path.write_text(text, encoding="utf-8")
    return text


def tiny_cfg(tmp_path, **kw):
    data = tmp_path / "text.txt"
    if not data.exists():
        tmp_path.mkdir(parents=True, exist_ok=True)
        write_text(data)
    return TrainConfig(**{**TINY_TRAIN, "data": str(data), "out_dir": str(tmp_path / "out"), **kw})


# (batch dims, T, start, hs): one row, KV-cache offsets (an odd one starts a tile's k range mid-pair on the
# vdpbf16ps path), more rows than a k block (256 deep, 384 on AVX2, 512 on vdpbf16ps), head views, and a tile whose
# first column is its last row's diagonal on the 8 x 32 tiles (rows 24-31, column 32, start 1)
CAUSAL = [((3,), 17, 0, 7), ((2, 3), 64, 0, 32), ((4,), 5, 3, 9), ((1,), 1, 40, 16), ((2,), 130, 0, 33),
          ((1,), 600, 0, 5), ((3,), 7, 2, 1), ((2,), 21, 3, 5), ((2, 3), 19, 4, "heads"), ((2,), 40, 1, 8)]


def causal_products(ops, rng, bf16=None):
    """Run attention's causal products (ops.bmm with causal=, as layers.py calls it) on odd shapes, and yield
    (got, a, b, ta, tb, base, future) per call: got should be op(a) @ op(b) (+ base, when acc), with the
    entries where future is True exactly 0 (future is None for causal="a").
    causal="out": s = q k^T and datt = dy v^T (tb), and b stored as is. causal="a": a causal a (zero past the
    diagonal) times b, a as is (y = att v, dq = ds k) or transposed (dv = att^T dy, dk = ds^T q)."""
    for lead, T, start, hs in CAUSAL:
        Tk = start + T
        fut = backends.future(T, Tk, start)
        if hs == "heads":                                     # q and k heads of one qkv, y's heads written in place
            hs, nh = 6, lead[1]
            qkv = rng.standard_normal((lead[0], Tk, 3 * nh * hs)).astype(np.float32)
            q, k, v = heads(qkv, nh, 3)
            q = q[:, :, start:]
            out = np.full((*lead, T, Tk), np.nan, np.float32)
            yield ops.bmm(q, k, tb=True, out=out, causal="out", start=start, bf16=bf16), q, k, False, True, None, fut
            att = out
            y = np.full((lead[0], T, nh * hs + 3), np.nan, np.float32)
            (yh,) = heads(y[:, :, :nh * hs], nh)
            yield ops.bmm(att, v, out=yh, causal="a", start=start, bf16=bf16), att, v, False, False, None, None
            assert np.isnan(y[:, :, nh * hs:]).all(), "a write outside the heads"
            continue
        for tb in (True, False):
            a = rng.standard_normal((*lead, T, hs)).astype(np.float32)
            b = rng.standard_normal((*lead, Tk, hs) if tb else (*lead, hs, Tk)).astype(np.float32)
            out = np.full((*lead, T, Tk), np.nan, np.float32)     # never read: beta = 0
            yield ops.bmm(a, b, tb=tb, out=out, causal="out", start=start, bf16=bf16), a, b, False, tb, None, fut
        att = rng.standard_normal((*lead, T, Tk)).astype(np.float32)
        att[..., fut] = 0
        for ta in (False, True):
            b = rng.standard_normal((*lead, T if ta else Tk, hs)).astype(np.float32)
            got = ops.bmm(att, b, ta=ta, causal="a", start=start, bf16=bf16)
            yield got, att, b, ta, False, None, None
            base = rng.standard_normal(got.shape).astype(np.float32)
            out = base.copy()
            yield ops.bmm(att, b, ta=ta, out=out, acc=True, causal="a", start=start, bf16=bf16), att, b, ta, False, \
                base, None

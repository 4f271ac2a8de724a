"""Small texts and configs the training tests write themselves; attention's causal products for the product tests."""
import contextlib
import os

import numpy as np

from minigpt import backends
from minigpt.backends import interface, native
from minigpt.config import TrainConfig
from minigpt.layers import heads


def spec():
    """The numpy backend, the executable specification (dtype-generic: float64 for the gradient tests), that the
    tests build their models on unless they name another."""
    return backends.load("numpy", verbose=False)

TINY_TRAIN = dict(n_layer=2, n_head=2, n_embd=16, block_size=16, batch_size=4, max_iters=12, eval_interval=4,
                  eval_iters=2, warmup_iters=2, lr_decay_iters=12, lr=3e-3, min_lr=3e-4, log_interval=4,
                  sample_chars=0, plot="", backend="numpy")


def shakespeare_path():
    """tiny Shakespeare where a checkout may have it: data/ (the training script's download, .ci/run's copy), else
    ../shared/data/ beside the checkout; None if neither. Tests that need the real text skip without it."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for path in (os.path.join(root, "data", "tinyshakespeare.txt"),
                 os.path.join(root, "..", "shared", "data", "tinyshakespeare.txt")):
        if os.path.exists(path):
            return path
    return None


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
        fut = interface.future(T, Tk, start)
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


# (B, nh, T, hs, start): attention's shapes for the fused kernels (Tk = start + T keys; backward only at start 0):
# one query, odd sizes, T past AVX-512's fp32 k block (KC, 256) and row block (MC, 192), 9 heads (uneven over 2
# threads), and a few rows after a KV cache's keys (the few-rows path)
ATTENTION = [(2, 3, 1, 5, 0), (1, 2, 7, 24, 0), (2, 3, 33, 12, 0), (1, 2, 70, 64, 0), (1, 1, 300, 17, 0),
             (3, 3, 20, 8, 0), (2, 3, 4, 8, 5), (1, 3, 9, 16, 40)]


def padded_heads(rng, B, T, nh, hs, pad, fill=None):
    """(B, nh, T, hs) heads of a (B, T, nh * hs + pad) array: a strided view, rows nh * hs + pad floats apart; the
    pad is NaN (where nothing may write), the heads random or `fill`."""
    a = np.full((B, T, nh * hs + pad), np.nan, np.float32)
    a[:, :, :nh * hs] = rng.standard_normal((B, T, nh * hs)) if fill is None else fill
    return a, heads(a[:, :, :nh * hs], nh)[0]


def check_fused_attention(ops, bf16, rng):
    """ops.attention and ops.attention_backward (a backend's own, e.g. native's fused kernels) against Ops'
    composition of the same backend's products and softmax: the same bits, no write outside the views, and the
    caller's floating-point mode kept. Every array is a view with its own strides, as the layers pass them or
    stranger: q inside a qkv, k and v inside their own padded arrays (at start > 0, a KV cache's), att with
    longer rows than Tk, y, dy, dq, dk, dv heads of padded arrays. Each shape runs once more under dropout (p 0.3,
    a 64-bit seed: its mask drawn by the fused kernel, and by Ops.dropout in the composition, numbered over att's
    (B, nh, T, Tk) elements; the backward runs at start 0). Returns how many forwards ran native's fused kernel (counted
    at its ctypes function; each start-0 one's backward must have run fused too); 0 for another backend."""
    lib, calls = getattr(ops, "lib", None), []
    if lib is not None:                                     # count the fused kernels' calls
        real = {f: getattr(lib, f) for f in ("mgk_attention_fwd", "mgk_attention_bwd")}
        for f, fn in real.items():
            setattr(lib, f, lambda *a, f=f, fn=fn: calls.append(f) or fn(*a))
    try:
        return _check_fused_attention(ops, bf16, rng, calls)
    finally:
        for f, fn in (real.items() if lib is not None else ()):
            setattr(lib, f, fn)


def _check_fused_attention(ops, bf16, rng, calls):
    ops, own = ops.with_bf16(bf16), 0                      # every product in bf16, or in float32
    for B, nh, T, hs, start in ATTENTION:
        Tk, C, scale = start + T, nh * hs, 1.0 / np.sqrt(hs)
        q = heads(rng.standard_normal((B, T, 3 * C)).astype(np.float32) * 2, nh, 3)[0]
        if start:                                           # a KV cache of 50 positions, the first Tk filled
            cache = rng.standard_normal((2, B, nh, 50, hs)).astype(np.float32)
            k, v = cache[0, :, :, :Tk], cache[1, :, :, :Tk]
        else:
            k, v = padded_heads(rng, B, Tk, nh, hs, 1)[1], padded_heads(rng, B, Tk, nh, hs, 5)[1]
        for drop in (None, (0.3, int(rng.integers(2**64, dtype=np.uint64)))):
            what = f"{B, nh, T, hs, start}" + (" under dropout" if drop else "")
            res, before = [], len(calls)                    # the op's, then the composition's
            for run in (ops.attention, lambda *a: backends.Ops.attention(ops, *a)):
                att = np.full((B, nh, T, Tk + 3), np.nan, np.float32)
                y, yh = padded_heads(rng, B, T, nh, hs, 2, fill=np.nan)
                run(q, k, v, att[..., :Tk], yh, scale, start, drop)
                assert np.isnan(att[..., Tk:]).all() and np.isnan(y[:, :, C:]).all(), "a write outside the views"
                res.append((att, y))
            for name, got, want in zip(("att", "y"), *res):
                np.testing.assert_array_equal(got, want, err_msg=f"{name} {what}")
            fused = calls[before:] == ["mgk_attention_fwd"]
            own += fused
            if start:
                continue
            att, dy = res[0][0][..., :Tk], padded_heads(rng, B, T, nh, hs, 1)[1]
            grads, before = [], len(calls)
            for run in (ops.attention_backward, lambda *a: backends.Ops.attention_backward(ops, *a)):
                outs = [padded_heads(rng, B, T, nh, hs, pad, fill=np.nan) for pad in (3, 1, 6)]
                run(q, k, v, att, dy, *(h for _, h in outs), scale, drop)
                assert all(np.isnan(a[:, :, C:]).all() for a, _ in outs), "a write outside the views"
                grads.append([a for a, _ in outs])
            for name, got, want in zip("qkv", *grads):
                np.testing.assert_array_equal(got, want, err_msg=f"d{name} {what}")
            assert (calls[before:] == ["mgk_attention_bwd"]) == fused, f"the backward fused iff the forward, {what}"
    assert np.float32(1e-40) * np.float32(1.0) != 0, "the caller's subnormals flushed to zero"
    return own


def matmul_gelu_cases(rng):
    """(a, b, bias) at the shapes that reach every place the epilogue runs: the few-rows path (M <= 8), one and
    several row blocks (MC = 192), one and several k blocks (256, 384 or 512 deep by path), both of the AVX-512
    and amx loop orders (N 130: op(B) fits the B buffer in all its k blocks; N 3000 over 2 threads: it does not,
    with a K that ends in a part k block and one that is a whole number of them), odd edges, and no bias; and a product of zeros whose bias puts GELU's sigmoid among the subnormals, which the
    epilogue must keep as mgk_gelu_fwd does (it computes in the caller's FP mode, not the tiles' flush-to-zero)."""
    yield np.zeros((300, 9), np.float32), np.ones((9, 64), np.float32), np.linspace(-10.2, -9.95, 64, dtype=np.float32)
    for M, N, K in ((3, 17, 5), (8, 130, 40), (37, 33, 17), (400, 130, 1100), (200, 3000, 600), (64, 3000, 1024),
                    (193, 70, 384)):
        a = rng.standard_normal((M, K)).astype(np.float32)
        b = (rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32)
        yield a, b, rng.standard_normal(N).astype(np.float32)
        if M == 37:
            yield a, b, None


def check_matmul_gelu(ops, rng):
    """ops.matmul_gelu (native: mgk_gemm_gelu, the GELU in the product's epilogue) has the bits of the product
    and the GELU called one after the other, float32 and bf16, on 1, 2 and 3 threads."""
    for n in (1, 2, 3):
        with native_threads(n):
            for a, b, bias in matmul_gelu_cases(rng):
                for bf16 in (False, True):
                    o = ops.with_bf16(bf16)
                    out, dgelu = np.full((2, a.shape[0], b.shape[1]), np.nan, np.float32)
                    o.matmul_gelu(a, b, bias, out=out, dgelu=dgelu)
                    z, d = np.empty_like(out), np.empty_like(out)
                    o.gelu(o.matmul(a, b, out=z), bias, out=z, dgelu=d)
                    np.testing.assert_array_equal(out, z, err_msg=f"{a.shape} {b.shape} bf16={bf16} threads={n}")
                    np.testing.assert_array_equal(dgelu, d)


def check_matmul_epilogues(ops, rng):
    """ops.matmul_mul and ops.matmul_add (native: mgk_gemm_mul, mgk_gemm_add, the multiply or the residual add, with
    or without dropout before it, in the product's epilogue) have the bits of the product and the ops called one
    after the other (Ops' composition),
    float32 and bf16, on 1, 2 and 3 threads, at matmul_gelu_cases' shapes (matmul_mul with op(b) = b^T too, as
    the MLP's backward calls it), and where the op's result is subnormal: the epilogue computes in the caller's FP
    mode, not the tiles' flush-to-zero."""
    cases = list(matmul_gelu_cases(rng))
    subnormal = {40: np.full((40, 24), 1e-20, np.float32),          # z 9e-20, times 1e-20: subnormal
                 41: np.full((41, 24), 1e-39, np.float32)}          # z 0, plus a subnormal
    cases += [(np.full((40, 9), 1e-10, np.float32), np.full((9, 24), 1e-10, np.float32), None),
              (np.zeros((41, 9), np.float32), np.ones((9, 24), np.float32), None)]
    for n in (1, 2, 3):
        with native_threads(n):
            for a, b, bias in cases:
                M, N = a.shape[0], b.shape[1]
                other = subnormal.get(M, rng.standard_normal((M, N)).astype(np.float32))
                for bf16 in (False, True):
                    o, what = ops.with_bf16(bf16), f"{a.shape} {b.shape} bf16={bf16} threads={n}"
                    for tb in (False, True):
                        bb = np.ascontiguousarray(b.T) if tb else b
                        out = np.full((M, N), np.nan, np.float32)
                        o.matmul_mul(a, bb, other, out, tb=tb)
                        want = interface.Ops._matmul_mul(o, a, bb, other, np.empty_like(out), tb)
                        np.testing.assert_array_equal(out, want, err_msg=f"matmul_mul tb={tb} {what}")
                    for drop in (None, (0.3, 2**64 - 5)):
                        out = np.full((M, N), np.nan, np.float32)
                        o.matmul_add(a, b, bias, other, out, drop=drop)
                        want = interface.Ops._matmul_add(o, a, b, bias, other, np.empty_like(out), drop)
                        np.testing.assert_array_equal(out, want, err_msg=f"matmul_add drop={drop} {what}")
    assert np.float32(1e-40) * np.float32(1.0) != 0, "the caller's subnormals flushed to zero"


@contextlib.contextmanager
def native_threads(n):
    """The native library on n threads inside the block; its count before restored after."""
    lib = native._lib()
    saved = lib.mgk_get_num_threads()
    lib.mgk_set_num_threads(n)
    try:
        yield
    finally:
        lib.mgk_set_num_threads(saved)

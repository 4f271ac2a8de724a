"""Fused kernels for everything in a training step that is not a matmul, behind one switch.

Each operation has a plain NumPy reference here (the executable specification; tests/test_fused.py compares
the numba kernels of minigpt/_fused_numba.py with it in float64 and float32) and a dispatcher that the layers
call. The numba kernels run for float32 and float64 alike, so the finite-difference tests check the code that
trains. MINIGPT_FUSED=0 (or set_enabled(False)) selects the references; the default is the kernels whenever
numba imports. Attention runs its two matmuls on the kernels.py backend around the fused softmax, unless
MINIGPT_ATTENTION=flash selects the all-numba kernel (no (T, T) tensor kept; slower at configs S and M).
numba uses as many threads as the matmul backend (kernels.set_threads). Not here: matmuls (kernels.py), the
Module bookkeeping and buffers (layers.py).
"""
import functools
import math
import os

import numpy as np

from . import kernels as K
from .config import UserError

_enabled = os.environ.get("MINIGPT_FUSED", "1") != "0"
_nb = None               # the _fused_numba module once loaded, False if numba is missing


def set_enabled(on=True):
    """Use the numba kernels (True) or the NumPy references (False); returns the previous setting."""
    global _enabled
    old, _enabled = _enabled, bool(on)
    return old


def enabled():
    return _enabled and _kernels() is not None


def _kernels():
    global _nb
    if _nb is None:
        try:
            from . import _fused_numba
            _nb = _fused_numba
        except ImportError:                                # numba missing: the references run
            _nb = False
    return _nb or None


SERIAL_BELOW = 16384       # elements of work: below this a kernel runs on one thread (waking numba's other
                           # threads costs ~17 us here, more than one-row LayerNorms and GELUs of decoding take)


def _use(x, work=None):
    """The numba kernel runs for a float32/float64 array when the fused path is on (on one thread when the
    work, x.size unless given, is small)."""
    if not (_enabled and x.dtype in (np.float32, np.float64) and _kernels() is not None):
        return False
    n = 1 if (x.size if work is None else work) < SERIAL_BELOW else K._threads or _cpus()
    n = min(n, _nb.numba.config.NUMBA_NUM_THREADS)
    if n != _nb.numba.get_num_threads():                   # numba's matmul backend sets its own count back
        _nb.numba.set_num_threads(n)
    return True


@functools.cache
def _cpus():
    return K._cpus()


def _c(a):
    return np.ascontiguousarray(a)


def _into(out, a):
    """a written into the caller's buffer out (the reference path computes a new array first)."""
    if out is None:
        return a
    out[...] = a
    return out


def _new(out, like, shape=None):
    return out if out is not None else np.empty(like.shape if shape is None else shape, like.dtype)


_ATTENTION = os.environ.get("MINIGPT_ATTENTION", "bmm")              # see the module docstring
FLASH = _ATTENTION == "flash"


def flash_attention(qkv):
    """Attention layers take the fused numba path for qkv (else: matmuls on the backend + fused softmax).
    Asked for with MINIGPT_ATTENTION=flash, it runs or it is an error: never a silent switch to bmm."""
    if _ATTENTION not in ("bmm", "flash"):
        raise UserError(f"MINIGPT_ATTENTION={_ATTENTION!r}: choose bmm (the default) or flash, or unset it")
    if not FLASH:
        return False
    if not _use(qkv):
        raise UserError("MINIGPT_ATTENTION=flash needs the fused numba kernels (numba installed, MINIGPT_FUSED "
                        "not 0) and a float32/float64 array; unset MINIGPT_ATTENTION to use bmm attention")
    return True


# ----------------------------------------------------------------------------
# LayerNorm over the last axis: forward keeps mean and rstd (N,), backward recomputes xhat

def layernorm_ref(x, w, b, eps):                           # x (N, C) -> y (N, C), mean, rstd (N,)
    mean = x.mean(-1)
    xc = x - mean[:, None]
    rstd = 1.0 / np.sqrt((xc * xc).mean(-1) + eps)
    return xc * rstd[:, None] * w + b, mean, rstd


def layernorm_backward_ref(dy, x, w, mean, rstd, dw, db):  # dy (N, C) -> dx (N, C); dw, db (C,) +=
    xhat = (x - mean[:, None]) * rstd[:, None]             # recomputed, not stored
    dw += (dy * xhat).sum(0)                               # fwd: y = xhat * w + b
    db += dy.sum(0)
    dxhat = dy * w
    # fwd: xhat = (x - mean) * rstd  ->  dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
    return rstd[:, None] * (dxhat - dxhat.mean(-1, keepdims=True) - xhat * (dxhat * xhat).mean(-1, keepdims=True))


def layernorm(x, w, b, eps, out=None):
    if not _use(x):
        y, mean, rstd = layernorm_ref(x, w, b, eps)
        return _into(out, y), mean, rstd
    N = x.shape[0]
    y, mean, rstd = _new(out, x), np.empty(N, x.dtype), np.empty(N, x.dtype)
    _nb.layernorm_fwd(_c(x), w, b, eps, y, mean, rstd)
    return y, mean, rstd


def layernorm_backward(dy, x, w, mean, rstd, dw, db, out=None):
    """dx (N, C), into out when given (out must not be dy: the parameter gradients read dy after dx is written)."""
    if not _use(x):
        return _into(out, layernorm_backward_ref(dy, x, w, mean, rstd, dw, db))
    dy, x, dx = _c(dy), _c(x), _new(out, x)
    _nb.layernorm_bwd(dy, x, w, mean, rstd, dx)
    _nb.layernorm_bwd_params(dy, x, mean, rstd, dw, db)
    return dx


# ----------------------------------------------------------------------------
# GELU, tanh form: y = 0.5 x (1 + tanh(c (x + 0.044715 x^3))), as GPT-2

GELU_C = math.sqrt(2.0 / math.pi)


def gelu_ref(x):
    return 0.5 * x * (1.0 + np.tanh(GELU_C * (x + 0.044715 * x * x * x)))


def gelu_grad_ref(x):
    t = np.tanh(GELU_C * (x + 0.044715 * x * x * x))
    # dy/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 * 0.044715 x^2)
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_C * (1.0 + 3 * 0.044715 * x * x)


def gelu(x, out=None, dydx=None, b=None):
    """x (..., H), b (H,) or None -> (y, dy/dx) of y = gelu(x + b). The forward also makes the derivative (they
    share the exp), so the backward is one multiply."""
    if not _use(x):
        xb = x if b is None else x + b
        return _into(out, gelu_ref(xb)), _into(dydx, gelu_grad_ref(xb))
    x2 = _c(x).reshape(-1, x.shape[-1])                    # (N, H)
    y, dydx = _new(out, x), _new(dydx, x)
    _nb.gelu_fwd(x2, np.zeros(x2.shape[1], x.dtype) if b is None else b, y.reshape(x2.shape), dydx.reshape(x2.shape))
    return y, dydx


def gelu_backward(dy, dydx, out=None, db=None):
    """dx = dy * dydx (out may be dy); db (H,), when given, += dx summed over all but the last axis."""
    if db is None:
        return np.multiply(dy, dydx, out=out)
    if not _use(dy):
        dx = np.multiply(dy, dydx, out=out)
        db += dx.reshape(-1, dx.shape[-1]).sum(0)
        return dx
    dx = _new(out, dy)
    H = dy.shape[-1]
    _nb.gelu_bwd(_c(dy).reshape(-1, H), _c(dydx).reshape(-1, H), dx.reshape(-1, H), db)
    return dx


# ----------------------------------------------------------------------------
# causal softmax of scaled scores (L, T, Tk): query i sits at position start+i and sees keys 0..start+i

def causal_softmax_ref(s, scale, start):
    T, Tk = s.shape[-2:]
    att = s * scale
    att[:, np.triu(np.ones((T, Tk), bool), k=start + 1)] = -np.inf    # -inf, never a finite -1e4
    att -= att.max(-1, keepdims=True)                      # max-subtracted: exp never overflows
    np.exp(att, out=att)
    att /= att.sum(-1, keepdims=True)
    return att


def causal_softmax_backward_ref(att, datt, scale):
    # fwd: att = softmax(scale * s) -> ds = scale * att * (datt - sum_j datt * att); masked entries have att = 0
    return scale * att * (datt - (datt * att).sum(-1, keepdims=True))


def _start_from(out, src):
    """The array an in-place kernel works on: a copy of src, or out holding src (out may be src itself)."""
    if out is None:
        return src.copy()
    if out is not src:
        out[...] = src
    return out


def causal_softmax(s, scale, start=0, out=None):
    """Probabilities of the scores s (L, T, Tk); out= may be s itself (in place)."""
    if not _use(s):
        return _into(out, causal_softmax_ref(s, scale, start))
    out = _start_from(out, s)
    _nb.causal_softmax_fwd(out, scale, start)
    return out


def causal_softmax_backward(att, datt, scale, start=0, out=None):
    """d(scores) from d(probabilities) datt; out= may be datt itself (in place)."""
    if not _use(att):
        return _into(out, causal_softmax_backward_ref(att, datt, scale))
    out = _start_from(out, datt)
    _nb.causal_softmax_bwd(_c(att), out, scale, start)
    return out


# ----------------------------------------------------------------------------
# fused causal attention from the c_attn output: qkv (B, T, 3C) -> y (B, T, C), heads side by side.
# Forward keeps only the row log-sum-exp lse (B, nh, T); backward recomputes the probabilities from it.

def _heads(a, B, T, nh):                                   # (B, T, nh*hs) -> (B, nh, T, hs)
    return a.reshape(B, T, nh, -1).transpose(0, 2, 1, 3)


def attention_ref(qkv, nh):
    B, T, C3 = qkv.shape
    q, k, v = (_heads(a, B, T, nh) for a in np.split(qkv, 3, axis=-1))   # each (B, nh, T, hs)
    s = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])    # (B, nh, T, T)
    s[..., np.triu(np.ones((T, T), bool), k=1)] = -np.inf
    lse = np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1)) + s.max(-1)   # (B, nh, T)
    y = np.exp(s - lse[..., None]) @ v                     # (B, nh, T, hs)
    return y.transpose(0, 2, 1, 3).reshape(B, T, C3 // 3), lse


def attention_backward_ref(qkv, y, dy, lse, nh):
    B, T, C3 = qkv.shape
    q, k, v = (_heads(a, B, T, nh) for a in np.split(qkv, 3, axis=-1))
    dy4, y4 = _heads(dy, B, T, nh), _heads(y, B, T, nh)    # (B, nh, T, hs)
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = q @ k.swapaxes(-1, -2) * scale
    s[..., np.triu(np.ones((T, T), bool), k=1)] = -np.inf
    p = np.exp(s - lse[..., None])                         # recomputed probabilities (B, nh, T, T)
    dv = p.swapaxes(-1, -2) @ dy4                          # fwd: y = p v -> dv = p^T dy, dp = dy v^T
    dp = dy4 @ v.swapaxes(-1, -2)
    ds = p * (dp - (dy4 * y4).sum(-1, keepdims=True)) * scale   # sum_j p dp = dy . y
    dq, dk = ds @ k, ds.swapaxes(-1, -2) @ q
    return np.concatenate([a.transpose(0, 2, 1, 3).reshape(B, T, -1) for a in (dq, dk, dv)], axis=-1)


def attention(qkv, nh, out=None):
    if not _use(qkv):
        y, lse = attention_ref(qkv, nh)
        return _into(out, y), lse
    B, T, C3 = qkv.shape
    y, lse = _new(out, qkv, (B, T, C3 // 3)), np.empty((B, nh, T), qkv.dtype)
    _nb.attention_fwd(_c(qkv), nh, y, lse)
    return y, lse


# ----------------------------------------------------------------------------
# attention of a few new positions against a KV cache (generation): k_all, v_all (B, nh, S, hs) hold keys and
# values at positions 0..n+T-1 (this call's included); new position n+t sees keys 0..n+t. The kernel reads the
# cache in place: no copy of the filled part, no (B, nh, T, S) scores.

DECODE_T = 8             # calls with more new positions (a prompt's prefill) take the matmul path in layers.py


def attention_cached_ref(qkv, k_all, v_all, n):            # qkv (B, T, 3C) -> y (B, T, C)
    B, T, C3 = qkv.shape
    nh = k_all.shape[1]
    q = _heads(qkv[..., :C3 // 3], B, T, nh)              # (B, nh, T, hs)
    k, v = k_all[:, :, :n + T], v_all[:, :, :n + T]        # (B, nh, n+T, hs)
    s = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])    # (B, nh, T, n+T)
    s[..., np.triu(np.ones((T, n + T), bool), k=n + 1)] = -np.inf
    p = np.exp(s - s.max(-1, keepdims=True))
    y = (p / p.sum(-1, keepdims=True)) @ v                 # (B, nh, T, hs)
    return y.transpose(0, 2, 1, 3).reshape(B, T, C3 // 3)


def attention_cached(qkv, k_all, v_all, n, out=None):
    if not _use(qkv, work=k_all[:, :, :n + qkv.shape[1]].size // 4):   # ~1 FMA per cached element: light work
        return _into(out, attention_cached_ref(qkv, k_all, v_all, n))
    B, T, C3 = qkv.shape
    y = _new(out, qkv, (B, T, C3 // 3))
    _nb.attention_cached_fwd(_c(qkv), k_all, v_all, n, y)
    return y


def attention_backward(qkv, y, dy, lse, nh, out=None):
    if not _use(qkv):
        return _into(out, attention_backward_ref(qkv, y, dy, lse, nh))
    dqkv = _new(out, qkv)
    _nb.attention_bwd(_c(qkv), _c(y), _c(dy), lse, nh, dqkv)
    return dqkv


# ----------------------------------------------------------------------------
# softmax cross-entropy: loss = mean_n (lse_n - logits[n, t_n]); backward (softmax - onehot) * scale

def cross_entropy_ref(logits, t):                          # logits (N, V), t (N,) -> loss, lse (N,)
    m = logits.max(-1)
    lse = m + np.log(np.exp(logits - m[:, None]).sum(-1))  # log-sum-exp, never log(softmax)
    return float(np.mean(lse - logits[np.arange(t.size), t])), lse


def cross_entropy_backward_ref(logits, t, lse, scale):
    d = np.exp(logits - lse[:, None])                      # softmax
    d[np.arange(t.size), t] -= 1.0
    return d * scale


def cross_entropy(logits, t):
    if not _use(logits):
        return cross_entropy_ref(logits, t)
    lse = np.empty(logits.shape[0], logits.dtype)
    total = _nb.xent_fwd(_c(logits), t.astype(np.int64, copy=False), lse)
    return total / max(1, t.size), lse


def cross_entropy_backward(logits, t, lse, scale, out=None):
    if not _use(logits):
        return _into(out, cross_entropy_backward_ref(logits, t, lse, scale))
    d = _new(out, logits)
    _nb.xent_bwd(_c(logits), t.astype(np.int64, copy=False), lse, scale, d)
    return d


# ----------------------------------------------------------------------------
# embedding scatter-add and AdamW

def scatter_add(g, idx, dout):
    """g[idx[n]] += dout[n] for every n, repeated ids summed: g (V, C), idx (N,), dout (N, C)."""
    if not _use(g):
        np.add.at(g, idx, dout)
        return
    _nb.scatter_add(g, idx.astype(np.int64, copy=False), _c(dout))


def adamw_ref(p, g, m, v, lr, b1, b2, eps, wd, bc1, bc2):
    """One in-place AdamW update (torch.optim.AdamW): decoupled decay, bias-corrected moments."""
    p *= 1.0 - lr * wd                                     # p -= lr * wd * p
    m *= b1
    m += (1.0 - b1) * g                                    # m = b1 m + (1 - b1) g
    v *= b2
    v += (1.0 - b2) * (g * g)                              # v = b2 v + (1 - b2) g^2
    p -= (lr / bc1) * m / (np.sqrt(v) / math.sqrt(bc2) + eps)   # p -= lr m_hat / (sqrt(v_hat) + eps)


def adamw(p, g, m, v, lr, b1, b2, eps, wd, bc1, bc2):
    if not (_use(p) and p.flags.c_contiguous and g.flags.c_contiguous):
        return adamw_ref(p, g, m, v, lr, b1, b2, eps, wd, bc1, bc2)
    _nb.adamw(p.reshape(-1), g.reshape(-1), m.reshape(-1), v.reshape(-1), lr, b1, b2, eps, wd, bc1, bc2)

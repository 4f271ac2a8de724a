"""The numpy backend: every op of the interface in plain NumPy. This is the executable specification.

It is dtype-generic (the finite-difference tests run it in float64), and tests/test_ops.py compares every
other backend with it. The products are np.matmul on OpenBLAS, which reads any strided view. The rest is
written for reading first: each op is the formula, computed into the caller's arrays where that costs no
clarity. Temporaries of activation size are allowed here and nowhere else.
"""
import math

import numpy as np

from . import Ops

GELU_C, GELU_A = math.sqrt(2.0 / math.pi), 0.044715


def _t(x, flag):
    return x.swapaxes(-1, -2) if flag else x


class NumpyOps(Ops):
    name = "numpy"

    # ---- products
    def _matmul(self, a, b, ta, tb, out, acc):
        if acc:
            out += np.matmul(_t(a, ta), _t(b, tb))
            return out
        return np.matmul(_t(a, ta), _t(b, tb), out=out)

    _bmm = _matmul

    # ---- LayerNorm over the last axis: keep mean and rstd (N,), recompute xhat in backward
    def layernorm(self, x, w, b, out, mean, rstd, eps=1e-5):      # x (N, C) -> out (N, C)
        np.mean(x, axis=-1, out=mean)
        xc = x - mean[:, None]
        rstd[...] = 1.0 / np.sqrt((xc * xc).mean(-1) + eps)
        np.multiply(xc * rstd[:, None], w, out=out)                 # y = xhat * w + b
        if b is not None:
            out += b
        return out

    def layernorm_backward(self, dy, x, w, mean, rstd, dx, dw, db):   # dy (N, C) -> dx (N, C)
        xhat = (x - mean[:, None]) * rstd[:, None]                  # recomputed, not stored
        dw += (dy * xhat).sum(0)                                    # fwd: y = xhat * w + b
        if db is not None:
            db += dy.sum(0)
        dxhat = dy * w
        # fwd: xhat = (x - mean) * rstd  ->  dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
        dx[...] = rstd[:, None] * (dxhat - dxhat.mean(-1, keepdims=True)
                                   - xhat * (dxhat * xhat).mean(-1, keepdims=True))
        return dx

    # ---- GELU, tanh form as GPT-2: y = 0.5 x (1 + tanh(c (x + 0.044715 x^3))), of x + b
    def gelu(self, x, b, out, dgelu):                                # x (..., H), b (H,) or None
        xb = x if b is None else x + b
        t = np.tanh(GELU_C * (xb + GELU_A * xb * xb * xb))
        y = 0.5 * xb * (1.0 + t)
        # dy/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 * 0.044715 x^2): kept, so backward is one multiply
        dgelu[...] = 0.5 * (1.0 + t) + 0.5 * xb * (1.0 - t * t) * GELU_C * (1.0 + 3 * GELU_A * xb * xb)
        out[...] = y                                                # last: out may be x itself
        return out

    def gelu_backward(self, dout, dgelu, dx, db):                  # dout (..., H) -> dx (..., H)
        np.multiply(dout, dgelu, out=dx)                            # fwd: y = gelu(x + b)
        if db is not None:
            db += dx.reshape(-1, dx.shape[-1]).sum(0)               # b is added to every row
        return dx

    # ---- causal softmax over the last axis of scaled scores (..., T, Tk)
    def causal_softmax(self, att, scale, start=0):
        T, Tk = att.shape[-2:]
        future = np.triu(np.ones((T, Tk), bool), k=start + 1)      # query i sees keys 0..start+i
        s = np.where(future, -np.inf, att * scale)                  # -inf, never a finite -1e4
        e = np.exp(s - s.max(-1, keepdims=True))                    # max-subtracted: exp never overflows
        att[...] = e / e.sum(-1, keepdims=True)
        return att

    def causal_softmax_backward(self, att, datt, scale, start=0):
        # fwd: att = softmax(scale * s) -> ds = scale * att * (datt - sum_j datt_j att_j); masked att are 0
        datt[...] = scale * att * (datt - (datt * att).sum(-1, keepdims=True))
        return datt

    # ---- softmax cross-entropy: loss = mean_n (lse_n - logits[n, t_n])
    def cross_entropy(self, logits, targets, lse):                  # logits (N, V), targets (N,) -> loss
        m = logits.max(-1)
        lse[...] = m + np.log(np.exp(logits - m[:, None]).sum(-1))  # log-sum-exp, never log(softmax)
        return float(np.mean(lse - logits[np.arange(targets.size), targets]))

    def cross_entropy_backward(self, logits, targets, lse, scale, dlogits):
        dlogits[...] = np.exp(logits - lse[:, None]) * scale        # softmax * scale
        dlogits[np.arange(targets.size), targets] -= scale          # - onehot * scale
        return dlogits

    # ---- embedding scatter-add and AdamW
    def embedding_backward(self, dW, idx, dout):                    # dW (V, C), idx (N,), dout (N, C)
        np.add.at(dW, idx, dout)                                    # fwd: out = W[idx]; repeated ids add up

    def adamw(self, p, g, m, v, lr, b1, b2, eps, wd, bc1, bc2):
        """One in-place update as torch.optim.AdamW: decoupled decay, bias-corrected moments."""
        p *= 1.0 - lr * wd                                          # p -= lr * wd * p
        m *= b1
        m += (1.0 - b1) * g                                         # m = b1 m + (1 - b1) g
        v *= b2
        v += (1.0 - b2) * (g * g)                                   # v = b2 v + (1 - b2) g^2
        p -= (lr / bc1) * m / (np.sqrt(v) / math.sqrt(bc2) + eps)   # p -= lr m_hat / (sqrt(v_hat) + eps)

    def set_threads(self, n):
        from threadpoolctl import threadpool_limits
        threadpool_limits(n, user_api="blas")                       # OpenBLAS's own pool


_backend = NumpyOps()


def backend():
    return _backend

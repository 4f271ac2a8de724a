"""The layers of a GPT as pure functions: each forward beside its hand-written backward, with shape comments.

A forward writes its outputs into arrays the caller passes in (outputs first, then inputs, then parameters, as
llm.c's layernorm_forward(out, mean, rstd, inp, weight, bias)); its backward writes the input gradient and ADDS
(+=) into the parameters' gradients, so weight tying and gradient accumulation just work. A layer keeps nothing
between calls and allocates nothing of activation size. A layer that runs a backend op takes the backend first,
`ops` (an Ops of minigpt/backends, bound to the model's precision), and calls `ops.<op>` without asking which
backend it is; the plain-NumPy ones (the embedding lookup, QK-norm, the soft-cap) take none. The model (model.py)
owns every array, in its activation table, and hands each layer its backend and its slice. The dtype is the
caller's: float32 in training, float64 in the finite-difference tests.

B batch, T positions, C width, nh heads, hs = C / nh per head, V vocabulary, Tk keys a query may look at.
"""
import math

import numpy as np


def flat(a):
    """(B, T, C) -> (B*T, C), a view of a contiguous array: products and row ops see a 2-D matrix. (A strided
    array would reshape into a copy, and an out= written into a copy is lost: hence the assert.)"""
    assert a.flags.c_contiguous, f"flat() of a strided {a.shape} array would copy it"
    return a.reshape(-1, a.shape[-1])


def heads(a, n_head, k=1):
    """(B, T, k*C) -> k strided views (B, nh, T, hs), the heads of each C-wide part, in place (no copy)."""
    B, T, kC = a.shape
    parts = a.reshape(B, T, k, n_head, kC // (k * n_head))
    return tuple(parts[:, :, s].transpose(0, 2, 1, 3) for s in range(k))


# ----------------------------------------------------------------------------
# token + position embedding

def embedding_forward(out, idx, wte, wpe, start=0):               # idx (B, T) ints -> out (B, T, C)
    np.take(wte, idx, axis=0, out=out, mode="clip")               # out = wte[idx]  (the model checks the ids)
    out += wpe[start:start + idx.shape[1]]                        #     + wpe[t], the learned position t
    return out


def embedding_backward(ops, dwte, dwpe, dout, idx):               # dout (B, T, C); ids have no gradient
    ops.embedding_backward(dwte, idx.reshape(-1), flat(dout))     # fwd: out = wte[idx] -> dwte[idx] += dout
    dwpe[:idx.shape[1]] += dout.sum(axis=0)                       # fwd: out[b, t] += wpe[t]


# ----------------------------------------------------------------------------
# LayerNorm: keeps mean and rstd, recomputes xhat in backward (the math: backends/numpy_ops.py)

LN_EPS = 1e-5                                                     # GPT-2's layer_norm_epsilon


def layernorm_forward(ops, out, mean, rstd, x, w, b, eps=LN_EPS):  # x (B, T, C) -> out (B, T, C); mean, rstd (B*T,)
    ops.layernorm(flat(x), w, b, flat(out), mean, rstd, eps)      # out = (x - mean) * rstd * w + b
    return out


def layernorm_backward(ops, dx, dw, db, dout, x, w, mean, rstd, acc=False):   # dout (B, T, C) -> dx (B, T, C)
    ops.layernorm_backward(flat(dout), flat(x), w, mean, rstd, flat(dx), dw, db, acc)   # (acc: dx +=); dw, db +=
    return dx


# ----------------------------------------------------------------------------
# Linear (w stored (in, out), as GPT-2's Conv1D), and the MLP's first layer: Linear with GELU fused, or relu^2

def linear_forward(ops, out, x, w, b, res=None, drop=None):       # x (B, T, in) -> out (B, T, out)
    if res is not None:                                           # the residual add after it, in one pass (drop:
        ops.matmul_add(flat(x), w, b, flat(res), out=flat(out), drop=drop)   # dropout's (p, seed) between):
        return out                                                # out = res + dropout(x w + b)
    ops.matmul(flat(x), w, out=flat(out))                         # out = x w
    if b is not None:
        out += b                                                  #     + b
    return out


def linear_backward(ops, dx, dw, db, dout, x, w, dact=None):      # dout (B, T, out) -> dx (B, T, in); dw, db +=
    if db is not None:
        db += flat(dout).sum(axis=0)                              # fwd: out = z + b -> db += sum of dout's rows
    ops.matmul(flat(x), flat(dout), ta=True, out=dw, acc=True)    # fwd: z = x w -> dw += x^T dout
    if dact is None:
        ops.matmul(flat(dout), w, tb=True, out=flat(dx))          #                 dx = dout w^T
    else:                                                         # x = act(z') (linear_gelu_forward, which kept
        ops.matmul_mul(flat(dout), w, flat(dact), out=flat(dx), tb=True)   # act'(z') in dact): dx = dout w^T act'(z'),
                                                                  # d loss / d z', the act's backward done too
    return dx


def linear_gelu_forward(ops, out, dact, x, w, b):                 # x (B, T, in) -> out (B, T, out)
    ops.matmul_gelu(flat(x), w, b, out=flat(out), dgelu=flat(dact))   # out = gelu(x w + b); keeps gelu'(x w + b)
    return out


def linear_gelu_backward(ops, dx, dw, db, dout, dact, x, w):      # dout (B, T, out), overwritten with dz
    ops.gelu_backward(dout, dact, dout, db)                       # fwd: out = gelu(z + b) -> dz = dout gelu',
                                                                  #      db += sum of dz's rows
    return linear_backward(ops, dx, dw, None, dout, x, w)         # fwd: z = x w -> dw += x^T dz, dx = dz w^T


def linear_relu2_forward(ops, out, dact, x, w, b):                # x (B, T, in) -> out (B, T, out)
    z = linear_forward(ops, out, x, w, b)                         # z = x w + b, in out's memory
    r = np.maximum(z, 0.0, out=dact)                              # r = relu(z)
    np.multiply(z, r, out=z)                                      # out = relu(z)^2 = z relu(z)
    r *= 2.0                                                      # keeps relu2'(z) = 2 relu(z)
    return out


# fwd: out = relu(z)^2 -> dz = dout 2 relu(z): GELU's backward, which multiplies by the derivative the forward kept
linear_relu2_backward = linear_gelu_backward


# ----------------------------------------------------------------------------
# QK-norm: each head's q and k scaled to RMS 1 (no gain), in place in qkv, before attention

def qk_norm_forward(rstd, qkv, n_head, eps=LN_EPS):
    """qkv (B, T, 3C): q and k of every head -> q / rms(q), k / rms(k) over hs, in place; v untouched.
    rstd (B, T, 2, nh) keeps 1 / sqrt(mean(x^2) + eps); the backward needs only it and the normalised values."""
    B, T, C3 = qkv.shape
    qk = qkv.reshape(B, T, 3, n_head, C3 // (3 * n_head))[:, :, :2]   # (B, T, 2, nh, hs), a view
    np.einsum("...i,...i->...", qk, qk, out=rstd)                 # sum of squares, no temporary
    rstd *= 1.0 / qk.shape[-1]
    rstd += eps
    np.sqrt(rstd, out=rstd)
    np.divide(1.0, rstd, out=rstd)                                # rstd = 1 / sqrt(mean(x^2) + eps)
    qk *= rstd[..., None]                                         # xhat = x rstd
    return qkv


def qk_norm_backward(dqkv, tmp, qkv, rstd, n_head):
    """dqkv (B, T, 3C): d loss / d the normalised q, k (and v) -> d loss / d q, k before the norm, in place.
    tmp (B, T, C) is scratch."""
    B, T, C3 = qkv.shape
    hs = C3 // (3 * n_head)
    xhat = qkv.reshape(B, T, 3, n_head, hs)                       # q, k: what the forward left (normalised)
    dxhat = dqkv.reshape(B, T, 3, n_head, hs)
    tmp = tmp.reshape(B, T, n_head, hs)
    # fwd: xhat = x rstd, rstd = 1 / sqrt(mean(x^2) + eps) -> dx = rstd (dxhat - xhat mean(dxhat xhat))
    for s in range(2):                                            # q, then k: (B, T, nh, hs) each
        dot = np.einsum("...i,...i->...", dxhat[:, :, s], xhat[:, :, s])   # sum(dxhat xhat)  (B, T, nh)
        dot *= 1.0 / hs
        dxhat[:, :, s] -= np.multiply(xhat[:, :, s], dot[..., None], out=tmp)
        dxhat[:, :, s] *= rstd[:, :, s, :, None]
    return dqkv


# ----------------------------------------------------------------------------
# causal self-attention over the heads of a fused qkv, and dropout

def attention_forward(ops, y, att, qkv, n_head, start=0, kv=None, drop=None):
    """y (B, T, C) = softmax(q k^T / sqrt(hs) + causal mask) v for every head, where q, k, v are the thirds of
    qkv (B, T, 3C); att (B, nh, T, >=Tk) keeps the probabilities. drop = (p, seed), when given, is attention
    dropout: dropout(att) is what multiplies v. Generation passes kv = (k, v) (B, nh, block_size, hs)
    holding the start positions before this call's: the call appends its own and its query i sees keys
    0..start+i. The products and softmax: Ops.attention (backends/interface.py)."""
    T = qkv.shape[1]
    q, k, v = heads(qkv, n_head, 3)                               # each (B, nh, T, hs), views of qkv
    if kv is not None:
        kc, vc = kv
        kc[:, :, start:start + T], vc[:, :, start:start + T] = k, v
        k, v = kc[:, :, :start + T], vc[:, :, :start + T]          # (B, nh, Tk, hs), Tk = start + T
    (yh,) = heads(y, n_head)                                      # heads side by side in y (B, T, C)
    scale = 1.0 / math.sqrt(q.shape[-1])                          # 1 / sqrt(hs)
    # att = softmax(scale q k^T), causal; y = att v (attd v under dropout)
    ops.attention(q, k, v, att[..., :start + T], yh, scale, start, drop)
    return y


def attention_backward(ops, dqkv, dy, qkv, att, n_head, drop=None):
    """dy (B, T, C) -> dqkv (B, T, 3C). drop: the forward's dropout (p, seed)."""
    q, k, v = heads(qkv, n_head, 3)                               # (B, nh, T, hs)
    dq, dk, dv = heads(dqkv, n_head, 3)                           # views of dqkv
    (dyh,) = heads(dy, n_head)
    scale = 1.0 / math.sqrt(q.shape[-1])                          # 1 / sqrt(hs), as the forward's
    # dv = att^T dy (attd^T dy under dropout); ds = the softmax's backward of dy v^T; dq = ds k, dk = ds^T q
    ops.attention_backward(q, k, v, att, dyh, dq, dk, dv, scale, drop)
    return dqkv


def dropout_seed(rng):
    """A fresh 64-bit seed for one dropout mask, from the model's generator: a forward draws one per mask and keeps
    it in its activation table; its backward draws the same mask again from it."""
    return int(rng.integers(2**64, dtype=np.uint64))


def dropout(ops, out, x, p, seed):                                # x (any shape) -> out (x's shape); out may be x
    """Inverted dropout: out = x * mask, the mask 1 / (1 - p) with probability 1 - p, else 0, so that out keeps
    the expectation of x. Each element's draw is a hash of (seed, its index) (Ops.dropout): every backend draws
    the same mask, on all its threads at once, and nothing is stored. The backward is the same call on dout:
    fwd out = x * mask -> dx = dout * mask."""
    return ops.dropout(x, p, int(seed), out=out)


# ----------------------------------------------------------------------------
# logit soft-capping: logits = cap tanh(z / cap), bounded in (-cap, cap), in place

def softcap_forward(out, dcap, z, cap):                          # z (B, T, V) -> out (B, T, V); out may be z
    np.multiply(z, 1.0 / cap, out=out)
    np.tanh(out, out=out)                                         # t = tanh(z / cap)
    np.square(out, out=dcap)
    np.subtract(1.0, dcap, out=dcap)                              # keeps d out / d z = 1 - t^2
    out *= cap                                                    # out = cap t
    return out


def softcap_backward(dz, dout, dcap):                            # dout (B, T, V) -> dz (B, T, V); dz may be dout
    return np.multiply(dout, dcap, out=dz)                        # fwd: out = cap tanh(z / cap) -> dz = dout (1 - t^2)


# ----------------------------------------------------------------------------
# softmax + cross-entropy, fused: keeps the row log-sum-exp, not the probabilities

def crossentropy_forward(ops, lse, logits, targets):             # logits (B, T, V), targets (B, T) -> mean loss
    return ops.cross_entropy(flat(logits), targets.reshape(-1), lse)   # lse (B*T,): log-sum-exp of each row


def crossentropy_backward(ops, dlogits, logits, targets, lse, scale=1.0):   # -> dlogits (B, T, V)
    # fwd: loss = mean over N = B*T of (lse - logits[target]) -> dlogits = (softmax - onehot) * scale / N
    # (scale: d total loss / d this loss, 1 / grad_accum in training; the op's own scale is the whole factor)
    ops.cross_entropy_backward(flat(logits), targets.reshape(-1), lse, scale / targets.size, flat(dlogits))
    return dlogits

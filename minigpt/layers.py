"""The layers of a GPT, each with its forward and its hand-written backward side by side.

The Module contract (README.md): forward(...) keeps in self.cache exactly what backward needs;
backward(dout) returns the input gradient, ADDS (+=) into self.g, and frees the cache. self.p and self.g
are dicts with the same keys; params()/grads() walk the children and return the live arrays under dotted
names. A layer keeps the dtype of its parameters (float32 for training, float64 for gradient tests).
Randomness comes in through an np.random.Generator. Every matmul goes through kernels.py; the rest of the
math (LayerNorm, GELU, softmax, attention, cross-entropy, scatter-add) goes through fused.py, which runs its
numba kernels or its NumPy references (MINIGPT_FUSED=0).
"""
import math

import numpy as np

from . import fused as F
from . import kernels as K
from .config import UserError


# ----------------------------------------------------------------------------
# Module: the contract

class Module:
    def __init__(self):
        self.p, self.g = {}, {}
        self.cache = None
        self.training = True
        self._bufs = {}

    def children(self):                        # [(name, Module)] in forward order
        return []

    def params(self, prefix=""):
        out = {prefix + k: v for k, v in self.p.items()}
        for name, m in self.children():
            out.update(m.params(f"{prefix}{name}."))
        return out

    def grads(self, prefix=""):
        out = {prefix + k: v for k, v in self.g.items()}
        for name, m in self.children():
            out.update(m.grads(f"{prefix}{name}."))
        return out

    def zero_grad(self):
        for g in self.grads().values():
            g.fill(0)

    def train(self, mode=True):
        self.training = mode
        for _, m in self.children():
            m.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def _make_grads(self):
        self.g = {k: np.zeros_like(v) for k, v in self.p.items()}

    def _buf(self, name, shape, dtype, shared=False):
        """A scratch array kept across steps: the same array while name, shape and dtype repeat (no allocation,
        no page faults). For arrays used inside this module between its forward and its backward, arrays passed
        as out= to a child, and arrays it returns to a parent that uses them up before the next call (the
        residual stream, a backward's dx); each such return says so. Never for an array that a caller outside
        the model keeps: GPT.forward's logits are new. shared=True: one array for every module of this class,
        for a temporary that dies before the next module of the class runs."""
        bufs, key = (_SHARED, (type(self).__name__, name)) if shared else (self._bufs, name)
        a = bufs.get(key)
        if a is None or a.shape != tuple(shape) or a.dtype != dtype:
            a = bufs[key] = np.empty(shape, dtype)
        return a

    def _take_cache(self):
        if self.cache is None:
            raise RuntimeError(f"{type(self).__name__}.backward called without a forward before it "
                               "(each forward allows exactly one backward)")
        c, self.cache = self.cache, None
        return c


_SHARED = {}                                   # Module._buf(shared=True): per-call temporaries, shared by layers


def _normal(rng, shape, std, dtype):
    return (std * rng.standard_normal(shape)).astype(dtype)


# ----------------------------------------------------------------------------
# Linear, Embedding, PositionalEncoding

class Linear(Module):
    """y = x @ W + b with W stored (in, out), as GPT-2's Conv1D."""

    def __init__(self, n_in, n_out, rng, bias=True, std=0.02, dtype=np.float32):
        super().__init__()
        self.p["weight"] = _normal(rng, (n_in, n_out), std, dtype)      # (in, out)
        if bias:
            self.p["bias"] = np.zeros(n_out, dtype)                    # (out,)
        self._make_grads()

    def forward(self, x, out=None, bias=True):                         # x (..., in) -> (..., out)
        """out: an (N, out) array to write y into (a parent's buffer), else y is a new array.
        bias=False: the caller adds the bias (and its gradient) itself, fused into its next operation."""
        x2 = x.reshape(-1, x.shape[-1])                                # (N, in)
        y = K.matmul(x2, self.p["weight"], out=out)                    # (N, out)
        if bias and "bias" in self.p:
            y += self.p["bias"]
        self.cache = x2
        return y.reshape(*x.shape[:-1], -1)

    def backward(self, dy, out=None, bias=True):                       # dy (..., out) -> dx (..., in)
        x2 = self._take_cache()
        dy2 = dy.reshape(-1, dy.shape[-1])                             # (N, out)
        K.matmul(x2, dy2, ta=True, out=self.g["weight"], acc=True)     # fwd: y = x W -> dW += x^T dy
        if bias and "bias" in self.g:
            self.g["bias"] += dy2.sum(axis=0)                          # fwd: y += b  -> db += sum_N dy
        dx = K.matmul(dy2, self.p["weight"], tb=True, out=out)         # dx = dy W^T  (N, in)
        return dx.reshape(*dy.shape[:-1], -1)


class Embedding(Module):
    """Token embedding: row lookup forward, scatter-add (np.add.at) backward."""

    def __init__(self, n, d, rng, std=0.02, dtype=np.float32):
        super().__init__()
        self.p["weight"] = _normal(rng, (n, d), std, dtype)            # (V, C)
        self._make_grads()

    def forward(self, idx):                                            # idx (B, T) ints -> (B, T, C)
        V = self.p["weight"].shape[0]
        if idx.size and (idx.min() < 0 or idx.max() >= V):
            raise ValueError(f"token ids must lie in [0, {V}), got min {idx.min()} max {idx.max()}; "
                             "encode the text with the model's own tokenizer")
        self.cache = idx
        W = self.p["weight"]
        return np.take(W, idx, axis=0, out=self._buf("y", (*idx.shape, W.shape[1]), W.dtype))   # W[idx]

    def backward(self, dout):                                          # dout (B, T, C); ids have no gradient
        idx = self._take_cache()
        C = dout.shape[-1]
        F.scatter_add(self.g["weight"], idx.reshape(-1), dout.reshape(-1, C))   # fwd: out = W[idx]; repeats add
        return None


class PositionalEncoding(Module):
    """Learned absolute positions: y = x + W[start : start+T]."""

    def __init__(self, n_pos, d, rng, std=0.02, dtype=np.float32):
        super().__init__()
        self.p["weight"] = _normal(rng, (n_pos, d), std, dtype)        # (block_size, C)
        self._make_grads()

    def forward(self, x, start=0):                                     # x (B, T, C) -> (B, T, C)
        T, n_pos = x.shape[1], self.p["weight"].shape[0]
        if start + T > n_pos:
            raise ValueError(f"positions {start}..{start + T - 1} exceed the positional table of length "
                             f"{n_pos} (block_size); crop the context to its last {n_pos} tokens")
        self.cache = (start, T)
        return np.add(x, self.p["weight"][start:start + T], out=self._buf("y", x.shape, x.dtype))

    def backward(self, dout):
        start, T = self._take_cache()
        self.g["weight"][start:start + T] += dout.sum(axis=0)          # fwd: y = x + W[t] for every b
        return dout


# ----------------------------------------------------------------------------
# LayerNorm, GELU, ReLU, Dropout

class LayerNorm(Module):
    def __init__(self, d, bias=True, eps=1e-5, dtype=np.float32):
        super().__init__()
        self.eps = eps
        self.p["weight"] = np.ones(d, dtype)
        if bias:
            self.p["bias"] = np.zeros(d, dtype)
        self._zero = None if bias else np.zeros(d, dtype)              # bias=False: a constant zero bias
        self._make_grads()

    def forward(self, x, out=None):                                    # x (..., C); out: y's buffer (a parent's)
        x2 = x.reshape(-1, x.shape[-1])                                # (N, C)
        y, mean, rstd = F.layernorm(x2, self.p["weight"], self._bias(), self.eps,
                                    out=None if out is None else out.reshape(x2.shape))   # y (N, C); mean, rstd (N,)
        self.cache = {"x": x2, "mean": mean, "rstd": rstd}            # x is the caller's array: no copy
        return y.reshape(x.shape)

    def backward(self, dy, out=None):                                  # dy (..., C) -> dx (..., C); out: dx's buffer
        c = self._take_cache()
        if "bias" in self.g:
            db = self.g["bias"]
        else:                                                          # bias=False: a sink, discarded
            db = self._buf("db", self.p["weight"].shape, self.p["weight"].dtype)
            db[...] = 0
        dx = F.layernorm_backward(dy.reshape(c["x"].shape), c["x"], self.p["weight"], c["mean"], c["rstd"],
                                  self.g["weight"], db,                # xhat recomputed from mean, rstd
                                  out=None if out is None else out.reshape(c["x"].shape))
        return dx.reshape(dy.shape)

    def _bias(self):
        return self.p["bias"] if "bias" in self.p else self._zero


class GELU(Module):
    """tanh approximation: y = 0.5 x (1 + tanh(c (x + 0.044715 x^3))), as GPT-2 (math in fused.py).
    forward(x, bias=b) applies it to x + b: the previous Linear's bias add, fused (MLP)."""

    def forward(self, x, out=None, bias=None):
        y, self.cache = F.gelu(x, out, self._buf("dydx", x.shape, x.dtype), bias)   # keeps dy/dx, not x
        return y

    def backward(self, dy, out=None, dbias=None):                     # out may be dy (in place)
        return F.gelu_backward(dy, self._take_cache(), out, dbias)     # dx = dy gelu'(x + b); dbias += sum dx


class ReLU(Module):
    def forward(self, x):
        self.cache = x > 0
        return x * self.cache

    def backward(self, dy):
        return dy * self._take_cache()


class Dropout(Module):
    """Inverted dropout: in training, keep with prob 1-p and scale by 1/(1-p); identity in eval."""

    def __init__(self, p, rng):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {p}")
        self.p_drop, self.rng = p, rng

    def forward(self, x):
        if not self.training or self.p_drop == 0.0:
            self.cache = 1                                             # backward is the identity
            return x
        keep = self.rng.random(x.shape, dtype=x.dtype) >= self.p_drop
        mask = keep.astype(x.dtype) * x.dtype.type(1.0 / (1.0 - self.p_drop))
        self.cache = mask
        return x * mask

    def backward(self, dy):
        mask = self._take_cache()
        return dy if isinstance(mask, int) else dy * mask             # fwd: y = x * mask


# ----------------------------------------------------------------------------
# Attention, MLP, Block

class CausalSelfAttention(Module):
    def __init__(self, n_embd, n_head, rng, dropout=0.0, bias=True, proj_std=0.02, dtype=np.float32):
        super().__init__()
        self.n_head = n_head
        self.c_attn = Linear(n_embd, 3 * n_embd, rng, bias, dtype=dtype)   # fused q, k, v
        self.c_proj = Linear(n_embd, n_embd, rng, bias, std=proj_std, dtype=dtype)
        self.attn_dropout = Dropout(dropout, rng)
        self.resid_dropout = Dropout(dropout, rng)

    def children(self):
        return [("c_attn", self.c_attn), ("c_proj", self.c_proj),
                ("attn_dropout", self.attn_dropout), ("resid_dropout", self.resid_dropout)]

    def forward(self, x, kv=None, out=None):                          # x (B, T, C)
        """kv: None in training; at inference a (k, v, n) slot of a KVCache, whose first n positions are filled.
        out: a (B*T, C) array for the output projection (the parent's residual-stream buffer)."""
        B, T, C = x.shape
        nh, hs = self.n_head, C // self.n_head
        dt, L = x.dtype, B * nh
        qkv = self.c_attn.forward(x, out=self._buf("qkv", (B * T, 3 * C), dt)).reshape(B, T, 3 * C)
        if kv is None and F.flash_attention(qkv):
            if self.attn_dropout.p_drop and self.training:
                raise UserError("MINIGPT_ATTENTION=flash has no attention dropout; train with --dropout 0 or "
                                "unset MINIGPT_ATTENTION")
            y, lse = F.attention(qkv, nh, out=self._buf("y", (B, T, C), dt))   # lse (B, nh, T): no (T, T) kept
            self.cache = {"qkv": qkv, "y": y, "lse": lse}
            return self.resid_dropout.forward(self.c_proj.forward(y, out=out))
        if kv is not None:
            return self._forward_cached(qkv, kv, out)
        q, k, v = self._heads(qkv.reshape(B, T, 3, nh, hs), "qkvh")    # each (B, nh, T, hs)
        att = K.bmm(q, k, tb=True, out=self._buf("att", (B, nh, T, T), dt))   # scores
        a3 = att.reshape(L, T, T)
        F.causal_softmax(a3, 1.0 / math.sqrt(hs), out=a3)              # -> probabilities, in place
        attd = self.attn_dropout.forward(att)
        y = self._buf("y", (B, T, C), dt)                              # heads side by side
        self._merge(lambda out: K.bmm(attd, v, out=out), y.reshape(B, T, 1, nh, hs), "yh")   # y = attd v
        self.cache = {"q": q, "k": k, "v": v, "att": att, "attd": attd}
        return self.resid_dropout.forward(self.c_proj.forward(y, out=out))

    def _heads(self, a5, name, shared=False):
        """(B, T, S, nh, hs) -> S arrays (B, nh, T, hs): strided views where bmm takes them (numpy, native),
        else one copy into a buffer (numba takes C-contiguous arrays only)."""
        if K.bmm_takes_views():
            return tuple(a5[:, :, s].transpose(0, 2, 1, 3) for s in range(a5.shape[2]))
        h = self._buf(name, (a5.shape[2], a5.shape[0], a5.shape[3], a5.shape[1], a5.shape[4]), a5.dtype, shared)
        np.copyto(h, a5.transpose(2, 0, 3, 1, 4))
        return tuple(h)

    def _merge(self, bmm, out5, name):
        """Run bmm(out=...) for each of S parts into out5 (B, T, S, nh, hs): straight into it where bmm takes views,
        else via a (B, nh, T, hs) buffer and one copy. bmm is a function of the out array for part s = 0 (S = 1)
        or a list."""
        B, T, S, nh, hs = out5.shape
        if K.bmm_takes_views():
            parts = [out5[:, :, s].transpose(0, 2, 1, 3) for s in range(S)]
            bmm(parts[0] if S == 1 else parts)
            return
        h = self._buf(name, (S, B, nh, T, hs), out5.dtype, True)      # dies within this call
        bmm(h[0] if S == 1 else list(h))
        np.copyto(out5, h.transpose(1, 3, 0, 2, 4))

    def _forward_cached(self, qkv, kv, out=None):                      # qkv (B, T, 3C)
        """Inference with a KV cache: append this call's keys/values at positions n.., attend over 0..n+T-1."""
        k_all, v_all, n = kv                                           # (B, nh, block_size, hs) each
        B, T, _ = qkv.shape
        _, nh, _, hs = k_all.shape
        q, k, v = qkv.reshape(B, T, 3, nh, hs).transpose(2, 0, 3, 1, 4)   # each (B, nh, T, hs)
        k_all[:, :, n:n + T], v_all[:, :, n:n + T] = k, v
        if T <= F.DECODE_T:                                            # decoding: read the cache in place
            y = F.attention_cached(qkv, k_all, v_all, n)
        else:                                                          # prefill: the backend's matmuls
            q = np.ascontiguousarray(q).reshape(B * nh, T, hs)         # (L, T, hs)
            k = np.ascontiguousarray(k_all[:, :, :n + T]).reshape(B * nh, n + T, hs)   # (L, n+T, hs)
            v = np.ascontiguousarray(v_all[:, :, :n + T]).reshape(B * nh, n + T, hs)
            att = F.causal_softmax(K.bmm(q, k, tb=True), 1.0 / math.sqrt(hs), start=n)   # (L, T, n+T)
            y = K.bmm(att, v).reshape(B, nh, T, hs).transpose(0, 2, 1, 3).reshape(B, T, nh * hs)
        return self.resid_dropout.forward(self.c_proj.forward(y, out=out))

    def backward(self, dout):                                          # dout (B, T, C)
        c = self._take_cache()
        B, T, C = dout.shape
        nh, hs = self.n_head, C // self.n_head
        dt, L = dout.dtype, B * nh
        dy = self.c_proj.backward(self.resid_dropout.backward(dout), out=self._buf("dy", (B * T, C), dt, True))
        dqkv = self._buf("dqkv", (B, T, 3 * C), dt, True)
        if "lse" in c:                                                 # fused: fwd y = attention(qkv)
            F.attention_backward(c["qkv"], c["y"], dy.reshape(B, T, C), c["lse"], nh, out=dqkv)
            return self.c_attn.backward(dqkv, out=self._buf("dx", (B * T, C), dt, True)).reshape(B, T, C)
        q, k, v, att, attd = c["q"], c["k"], c["v"], c["att"], c["attd"]   # (B, nh, T, hs), (B, nh, T, T)
        (dyh,) = self._heads(dy.reshape(B, T, 1, nh, hs), "dyh", True)   # (B, nh, T, hs)
        datt_buf = self._buf("datt", (B, nh, T, T), dt, True)
        dattd = K.bmm(dyh, v, tb=True, out=datt_buf)                   # fwd: y = attd v -> d(attd) = dy v^T
        datt = self.attn_dropout.backward(dattd)
        d3 = datt.reshape(L, T, T)                                     # fwd: att = softmax(q k^T / sqrt(hs))
        ds = F.causal_softmax_backward(att.reshape(L, T, T), d3, 1.0 / math.sqrt(hs), out=d3).reshape(B, nh, T, T)

        def grads(out):                                                # out: dq, dk, dv, each (B, nh, T, hs)
            K.bmm(ds, k, out=out[0])                                   # fwd: s = q k^T -> dq = ds k
            K.bmm(ds, q, ta=True, out=out[1])                          #                   dk = ds^T q
            K.bmm(attd, dyh, ta=True, out=out[2])                      # fwd: y = attd v -> dv = attd^T dy
        self._merge(grads, dqkv.reshape(B, T, 3, nh, hs), "dqkvh")
        dx = self.c_attn.backward(dqkv, out=self._buf("dx", (B * T, C), dt, True))   # (B, T, 3C) -> (B*T, C)
        return dx.reshape(B, T, C)                                     # dies in the parent's ln_1.backward


class MLP(Module):
    def __init__(self, n_embd, rng, dropout=0.0, bias=True, proj_std=0.02, dtype=np.float32):
        super().__init__()
        self.c_fc = Linear(n_embd, 4 * n_embd, rng, bias, dtype=dtype)
        self.gelu = GELU()
        self.c_proj = Linear(4 * n_embd, n_embd, rng, bias, std=proj_std, dtype=dtype)
        self.dropout = Dropout(dropout, rng)

    def children(self):
        return [("c_fc", self.c_fc), ("gelu", self.gelu), ("c_proj", self.c_proj), ("dropout", self.dropout)]

    def forward(self, x, out=None):                                    # (B, T, C) -> (B, T, C); out: (B*T, C)
        N, dt, H = x.size // x.shape[-1], x.dtype, self.c_fc.p["weight"].shape[1]
        h = self.c_fc.forward(x.reshape(N, -1), out=self._buf("h", (N, H), dt, True), bias=False)   # (N, 4C)
        g = self.gelu.forward(h, out=self._buf("g", (N, H), dt), bias=self.c_fc.p.get("bias"))   # gelu(h + b)
        return self.dropout.forward(self.c_proj.forward(g, out=out).reshape(x.shape))

    def backward(self, dout):                                          # dout (B, T, C)
        N, dt, H = dout.size // dout.shape[-1], dout.dtype, self.c_fc.p["weight"].shape[1]
        dg = self.c_proj.backward(self.dropout.backward(dout).reshape(N, -1), out=self._buf("dg", (N, H), dt, True))
        dh = self.gelu.backward(dg, out=dg, dbias=self.c_fc.g.get("bias"))   # in place; c_fc's db += sum dh
        dx = self.c_fc.backward(dh, bias=False, out=self._buf("dx", (N, dout.shape[-1]), dt, True))   # (N, C)
        return dx.reshape(dout.shape)                                  # dies in the parent's ln_2.backward


class Block(Module):
    """Pre-LN transformer block: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))."""

    def __init__(self, n_embd, n_head, rng, dropout=0.0, bias=True, proj_std=0.02, dtype=np.float32):
        super().__init__()
        self.ln_1 = LayerNorm(n_embd, bias, dtype=dtype)
        self.attn = CausalSelfAttention(n_embd, n_head, rng, dropout, bias, proj_std, dtype)
        self.ln_2 = LayerNorm(n_embd, bias, dtype=dtype)
        self.mlp = MLP(n_embd, rng, dropout, bias, proj_std, dtype)

    def children(self):
        return [("ln_1", self.ln_1), ("attn", self.attn), ("ln_2", self.ln_2), ("mlp", self.mlp)]

    def forward(self, x, kv=None):                                    # (B, T, C) -> (B, T, C)
        dt, N2 = x.dtype, (x.size // x.shape[-1], x.shape[-1])         # the residual stream lives in this
        x1 = self.attn.forward(self.ln_1.forward(x, out=self._buf("ln_1", x.shape, dt)), kv,   # block's buffers
                               out=self._buf("x1", N2, dt))
        x1 += x                                                        # x1 = x + attn(ln_1(x))
        x2 = self.mlp.forward(self.ln_2.forward(x1, out=self._buf("ln_2", x.shape, dt)), out=self._buf("x2", N2, dt))
        x2 += x1                                                       # x2 = x1 + mlp(ln_2(x1))
        return x2

    def backward(self, dout):
        # shared buffers: dx dies within this call; dx0 is the next block's dout, which that block reads for
        # the last time (dx += dout) before it writes its own dx0 into the same array
        dx = self.ln_2.backward(self.mlp.backward(dout), out=self._buf("dx", dout.shape, dout.dtype, True))
        dx += dout                                                     # fwd: x2 = x1 + mlp(ln_2(x1))
        dx0 = self.ln_1.backward(self.attn.backward(dx), out=self._buf("dx0", dout.shape, dout.dtype, True))
        dx0 += dx                                                      # fwd: x1 = x + attn(ln_1(x))
        return dx0


# ----------------------------------------------------------------------------
# fused softmax + cross-entropy

class CrossEntropy(Module):
    """Mean over N of -log softmax(logits)[target], from log-sum-exp; backward gives (softmax - onehot) / N.
    Keeps the logits and their row log-sum-exp, not the probabilities."""

    def forward(self, logits, targets):                                # logits (..., V), targets (...) ints
        V = logits.shape[-1]
        l2 = logits.reshape(-1, V)                                     # (N, V)
        t = targets.reshape(-1)                                        # (N,)
        if t.shape[0] != l2.shape[0]:
            raise ValueError(f"targets {targets.shape} do not match logits {logits.shape}")
        if t.size and (t.min() < 0 or t.max() >= V):
            raise ValueError(f"targets must lie in [0, {V})")
        loss, lse = F.cross_entropy(l2, t)                             # lse (N,): log-sum-exp of each row
        self.cache = {"logits": l2, "t": t, "lse": lse, "shape": logits.shape}
        return loss

    def backward(self, scale=1.0):
        c = self._take_cache()
        N = c["t"].size                                                # fwd: loss = mean over N
        d = F.cross_entropy_backward(c["logits"], c["t"], c["lse"], scale / N,
                                     out=self._buf("dlogits", c["logits"].shape, c["logits"].dtype))
        return d.reshape(c["shape"])

"""The layers of a GPT, each with its forward and its hand-written backward side by side.

The Module contract (README.md): forward(x) keeps in self.cache what backward needs; backward(dout) returns
the input gradient, ADDS (+=) into self.g, and frees the cache. self.p and self.g are dicts with the same keys;
params()/grads() walk the children and return the live arrays under dotted names. A layer keeps the dtype of
its input (float32 for training, float64 for gradient tests); randomness comes in through a Generator.

Layers hold only math. They compute into arrays they are handed (self.a, kept from forward to backward; self.d,
scratch such as the backward's gradients), which Activations allocates for the whole model at once, and every op runs through `ops`, the
selected backend (minigpt/backends), which a layer never asks about.
"""
import math
import re
from types import SimpleNamespace

import numpy as np

from .backends import ops


# ----------------------------------------------------------------------------
# Module: the contract

class Unbound:
    """A module's arrays before bind(): any use says what to do."""

    def __init__(self, module):
        self.module = module

    def __getattr__(self, name):
        raise RuntimeError(f"{self.module} has no arrays yet: call .bind(B, T, dtype) on it (or on the model that "
                           "holds it) before its forward; GPT.forward binds itself")


class Module:
    def __init__(self):
        self.p, self.g = {}, {}
        self.cache = None
        self.training = True
        self.a = self.d = Unbound(type(self).__name__)   # kept and scratch arrays, from Activations

    def __call__(self, *args):
        return self.forward(*args)

    def children(self):                         # [(name, Module)] in forward order
        return []

    def modules(self, prefix=""):
        """(dotted path, module) of this module and every descendant."""
        yield prefix.rstrip("."), self
        for name, m in self.children():
            yield from m.modules(f"{prefix}{name}.")

    def params(self):
        return {f"{path}.{k}" if path else k: v for path, m in self.modules() for k, v in m.p.items()}

    def grads(self):
        return {f"{path}.{k}" if path else k: v for path, m in self.modules() for k, v in m.g.items()}

    def zero_grad(self):
        for g in self.grads().values():
            g.fill(0)

    def train(self, mode=True):
        for _, m in self.modules():
            m.training = mode
        return self

    def eval(self):
        return self.train(False)

    def arrays(self, B, T):
        """Shapes of the arrays this module computes into for a (B, T) batch: ({kept}, {scratch}). Kept arrays
        live from its forward to its backward; scratch arrays die within one call (or in the caller's hands)."""
        return {}, {}

    def bind(self, B, T, dtype):
        """Allocate the arrays of this module and its children for (B, T) batches, unless they exist."""
        if getattr(self, "bound", None) != (B, T, np.dtype(dtype)):
            Activations(self, B, T, dtype)
        return self

    def _make_grads(self):
        self.g = {k: np.zeros_like(v) for k, v in self.p.items()}

    def _take_cache(self):
        if self.cache is None:
            raise RuntimeError(f"{type(self).__name__}.backward called without a forward before it "
                               "(each forward allows exactly one backward)")
        c, self.cache = self.cache, None
        return c


class Activations:
    """Every array a forward and backward at batch shape (B, T) compute into, allocated in one place (as llm.c's
    ActivationTensors), from the shapes each module declares in arrays(B, T). Kept arrays (m.a) belong to their
    module and live from its forward to its backward. Scratch arrays (m.d: backward gradients, temporaries) are
    shared by the same module of every block (h.0.attn.c_proj, h.1.attn.c_proj, ...): each call uses them up
    before the next block's call runs.
    A step that repeats (B, T) allocates nothing of activation size."""

    def __init__(self, root, B, T, dtype):
        shared = {}
        for path, m in root.modules():
            fwd, bwd = m.arrays(B, T)
            role = re.sub(r"^h\.\d+", "h.*", path)                     # the same module in every block
            m.a = SimpleNamespace(**{k: np.empty(s, dtype) for k, s in fwd.items()})
            m.d = SimpleNamespace(**{k: shared.setdefault((role, k), np.empty(s, dtype)) for k, s in bwd.items()})
        root.bound = (B, T, np.dtype(dtype))


def flat(a):
    """(B, T, C) -> (B*T, C), a view of a contiguous array: products and row ops see a 2-D matrix."""
    return a.reshape(-1, a.shape[-1])


def _normal(rng, shape, std, dtype):
    return (std * rng.standard_normal(shape)).astype(dtype)


# ----------------------------------------------------------------------------
# Linear, Embedding, PositionalEmbedding

class Linear(Module):
    """y = x W + b with W stored (in, out), as GPT-2's Conv1D; gelu=True makes it y = gelu(x W + b), the bias add
    and the GELU fused in one pass (the first layer of the MLP)."""

    def __init__(self, n_in, n_out, rng, bias=True, std=0.02, gelu=False, dtype=np.float32):
        super().__init__()
        self.gelu = gelu
        self.p["weight"] = _normal(rng, (n_in, n_out), std, dtype)      # (in, out)
        if bias:
            self.p["bias"] = np.zeros(n_out, dtype)                    # (out,)
        self._make_grads()

    def arrays(self, B, T):
        n_in, n_out = self.p["weight"].shape
        fwd = {"y": (B, T, n_out), **({"dgelu": (B, T, n_out)} if self.gelu else {})}
        return fwd, {"dx": (B, T, n_in), **({"z": (B, T, n_out)} if self.gelu else {})}   # z: z, later dz

    def forward(self, x):                                              # x (B, T, in) -> y (B, T, out)
        W, b, y = self.p["weight"], self.p.get("bias"), self.a.y
        if self.gelu:
            z = ops.matmul(flat(x), W, out=flat(self.d.z))             # z = x W
            ops.gelu(z, b, out=flat(y), dgelu=flat(self.a.dgelu))      # y = gelu(z + b); keeps gelu'(z + b)
        else:
            ops.matmul(flat(x), W, out=flat(y))                        # y = x W + b
            if b is not None:
                y += b
        self.cache = x
        return y

    def backward(self, dy):                                            # dy (B, T, out) -> dx (B, T, in)
        x = self._take_cache()
        db = self.g.get("bias")
        if self.gelu:                                                  # fwd: y = gelu(z + b)
            dy = ops.gelu_backward(dy, self.a.dgelu, self.d.z, db)     # dz = dy gelu'(z + b); db += sum dz
        elif db is not None:
            db += flat(dy).sum(axis=0)                                 # fwd: y = z + b -> db += sum dy
        ops.matmul(flat(x), flat(dy), ta=True, out=self.g["weight"], acc=True)   # fwd: z = x W -> dW += x^T dz
        ops.matmul(flat(dy), self.p["weight"], tb=True, out=flat(self.d.dx))    # dx = dz W^T
        return self.d.dx


class Embedding(Module):
    """Token embedding: y = W[idx], a row lookup; backward is a scatter-add into dW."""

    def __init__(self, n, d, rng, std=0.02, dtype=np.float32):
        super().__init__()
        self.p["weight"] = _normal(rng, (n, d), std, dtype)            # (V, C)
        self._make_grads()

    def arrays(self, B, T):
        return {"y": (B, T, self.p["weight"].shape[1])}, {}

    def forward(self, idx):                                            # idx (B, T) ints -> (B, T, C)
        V = self.p["weight"].shape[0]
        if idx.size and (idx.min() < 0 or idx.max() >= V):
            raise ValueError(f"token ids must lie in [0, {V}), got min {idx.min()} max {idx.max()}; "
                             "encode the text with the model's own tokenizer")
        self.cache = idx
        return np.take(self.p["weight"], idx, axis=0, out=self.a.y, mode="clip")   # y = W[idx] (mode="raise" copies out)

    def backward(self, dout):                                          # dout (B, T, C); ids have no gradient
        idx = self._take_cache()
        ops.embedding_backward(self.g["weight"], idx.reshape(-1), dout.reshape(-1, dout.shape[-1]))
        return None                                                    # fwd: y = W[idx] -> dW[idx] += dout


class PositionalEmbedding(Module):
    """Learned absolute positions: y = x + W[:T], the same row t added at position t of every sequence."""

    def __init__(self, n_pos, d, rng, std=0.02, dtype=np.float32):
        super().__init__()
        self.p["weight"] = _normal(rng, (n_pos, d), std, dtype)        # (block_size, C)
        self._make_grads()

    def arrays(self, B, T):
        return {"y": (B, T, self.p["weight"].shape[1])}, {}

    def forward(self, x):                                              # x (B, T, C) -> (B, T, C)
        T, n_pos = x.shape[1], self.p["weight"].shape[0]
        if T > n_pos:
            raise ValueError(f"{T} positions exceed the positional table of length {n_pos} (block_size); "
                             f"crop the context to its last {n_pos} tokens")
        self.cache = T
        return np.add(x, self.p["weight"][:T], out=self.a.y)           # y = x + W[:T]

    def backward(self, dout):                                          # dout (B, T, C)
        T = self._take_cache()
        self.g["weight"][:T] += dout.sum(axis=0)                       # fwd: y[b, t] = x[b, t] + W[t]
        return dout


# ----------------------------------------------------------------------------
# LayerNorm, GELU, Dropout

class LayerNorm(Module):
    """y = (x - mean) / sqrt(var + eps) * w + b over the last axis; keeps mean and rstd, recomputes xhat."""

    def __init__(self, d, bias=True, eps=1e-5, dtype=np.float32):
        super().__init__()
        self.eps = eps
        self.p["weight"] = np.ones(d, dtype)
        if bias:
            self.p["bias"] = np.zeros(d, dtype)
        self._make_grads()

    def arrays(self, B, T):
        C = self.p["weight"].shape[0]
        return {"y": (B, T, C), "mean": (B * T,), "rstd": (B * T,)}, {"dx": (B, T, C)}

    def forward(self, x):                                              # x (B, T, C) -> y (B, T, C)
        self.cache = x                                                 # the caller's array: no copy
        ops.layernorm(flat(x), self.p["weight"], self.p.get("bias"), flat(self.a.y), self.a.mean, self.a.rstd,
                      self.eps)
        return self.a.y

    def backward(self, dy):                                            # dy (B, T, C) -> dx (B, T, C)
        x = self._take_cache()                                         # dw, db += ; xhat from mean, rstd
        ops.layernorm_backward(flat(dy), flat(x), self.p["weight"], self.a.mean, self.a.rstd, flat(self.d.dx),
                               self.g["weight"], self.g.get("bias"))
        return self.d.dx


class GELU(Module):
    """y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), GPT-2's tanh form (the math: backends/numpy_ops.py).
    In the model it is fused into Linear(gelu=True); this standalone form serves tests and experiments."""

    def forward(self, x):
        y, dgelu = np.empty_like(x), np.empty_like(x)
        self.cache = dgelu                                             # gelu'(x): backward is one multiply
        return ops.gelu(x, None, out=y, dgelu=dgelu)

    def backward(self, dy):
        dgelu = self._take_cache()
        return ops.gelu_backward(dy, dgelu, np.empty_like(dy), None)   # dx = dy gelu'(x)


class Dropout(Module):
    """Inverted dropout: in training, keep with prob 1-p and scale by 1/(1-p); the identity in eval or at p = 0."""

    def __init__(self, p, rng):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {p}")
        self.p_drop, self.rng = p, rng

    def forward(self, x):
        if not self.training or self.p_drop == 0.0:
            self.cache = {"mask": None}                                # the identity
            return x
        keep = self.rng.random(x.shape, dtype=x.dtype) >= self.p_drop
        mask = keep.astype(x.dtype) * x.dtype.type(1.0 / (1.0 - self.p_drop))
        self.cache = {"mask": mask}
        return x * mask

    def backward(self, dy):
        mask = self._take_cache()["mask"]
        return dy if mask is None else dy * mask                       # fwd: y = x * mask


# ----------------------------------------------------------------------------
# Attention, MLP, Block

def heads(a, n_head, k=1):
    """(B, T, k*C) -> k strided views (B, nh, T, hs), the heads of each C-wide part, in place (no copy)."""
    B, T, kC = a.shape
    parts = a.reshape(B, T, k, n_head, kC // (k * n_head))
    return tuple(parts[:, :, s].transpose(0, 2, 1, 3) for s in range(k))


class CausalSelfAttention(Module):
    """y = softmax(q k^T / sqrt(hs) + causal mask) v per head, with q, k, v = x W_attn + b; out = y W_proj + b."""

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

    def arrays(self, B, T):
        C, nh = self.c_proj.p["weight"].shape[0], self.n_head
        return {"att": (B, nh, T, T), "y": (B, T, C)}, {"datt": (B, nh, T, T), "dqkv": (B, T, 3 * C)}

    def forward(self, x):                                              # x (B, T, C) -> (B, T, C)
        scale = 1.0 / math.sqrt(x.shape[-1] // self.n_head)
        qkv = self.c_attn(x)                                           # (B, T, 3C)
        q, k, v = heads(qkv, self.n_head, 3)                           # each (B, nh, T, hs), views of qkv
        att = ops.bmm(q, k, tb=True, out=self.a.att)                   # s = q k^T          (B, nh, T, T)
        ops.causal_softmax(att, scale)                                 # att = softmax(scale s), in place
        attd = self.attn_dropout(att)
        (y,) = heads(self.a.y, self.n_head)                            # heads side by side in y (B, T, C)
        ops.bmm(attd, v, out=y)                                        # y = att v
        self.cache = {"q": q, "k": k, "v": v, "att": att, "attd": attd, "scale": scale}
        return self.resid_dropout(self.c_proj(self.a.y))

    def backward(self, dout):                                          # dout (B, T, C) -> dx (B, T, C)
        c, nh = self._take_cache(), self.n_head
        (dy,) = heads(self.c_proj.backward(self.resid_dropout.backward(dout)), nh)   # (B, nh, T, hs)
        dattd = ops.bmm(dy, c["v"], tb=True, out=self.d.datt)          # fwd: y = attd v -> dattd = dy v^T
        datt = self.attn_dropout.backward(dattd)
        ds = ops.causal_softmax_backward(c["att"], datt, c["scale"])   # fwd: att = softmax(scale s)
        dq, dk, dv = heads(self.d.dqkv, nh, 3)                          # views of dqkv (B, T, 3C)
        ops.bmm(ds, c["k"], out=dq)                                    # fwd: s = q k^T -> dq = ds k
        ops.bmm(ds, c["q"], ta=True, out=dk)                           #                   dk = ds^T q
        ops.bmm(c["attd"], dy, ta=True, out=dv)                        # fwd: y = attd v -> dv = attd^T dy
        return self.c_attn.backward(self.d.dqkv)


class MLP(Module):
    """out = gelu(x W_fc + b_fc) W_proj + b_proj."""

    def __init__(self, n_embd, rng, dropout=0.0, bias=True, proj_std=0.02, dtype=np.float32):
        super().__init__()
        self.c_fc = Linear(n_embd, 4 * n_embd, rng, bias, gelu=True, dtype=dtype)
        self.c_proj = Linear(4 * n_embd, n_embd, rng, bias, std=proj_std, dtype=dtype)
        self.dropout = Dropout(dropout, rng)

    def children(self):
        return [("c_fc", self.c_fc), ("c_proj", self.c_proj), ("dropout", self.dropout)]

    def forward(self, x):                                              # x (B, T, C) -> (B, T, C)
        return self.dropout(self.c_proj(self.c_fc(x)))

    def backward(self, dout):                                          # dout (B, T, C) -> dx (B, T, C)
        return self.c_fc.backward(self.c_proj.backward(self.dropout.backward(dout)))


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

    def arrays(self, B, T):                                            # the residual stream after each half
        C = self.ln_1.p["weight"].shape[0]
        return {"x1": (B, T, C), "x2": (B, T, C)}, {}

    def forward(self, x):                                              # x (B, T, C) -> (B, T, C)
        x = np.add(x, self.attn(self.ln_1(x)), out=self.a.x1)
        return np.add(x, self.mlp(self.ln_2(x)), out=self.a.x2)

    def backward(self, dx):                                            # dx (B, T, C), updated in place
        dx += self.ln_2.backward(self.mlp.backward(dx))                # fwd: x2 = x1 + mlp(ln_2(x1))
        dx += self.ln_1.backward(self.attn.backward(dx))               # fwd: x1 = x + attn(ln_1(x))
        return dx


# ----------------------------------------------------------------------------
# fused softmax + cross-entropy

class CrossEntropy(Module):
    """Mean over N of -log softmax(logits)[target], from log-sum-exp; backward gives (softmax - onehot) / N.
    Keeps the logits and their row log-sum-exp, not the probabilities."""

    def __init__(self, n_classes):
        super().__init__()
        self.V = n_classes

    def arrays(self, B, T):
        return {"lse": (B * T,)}, {"dlogits": (B, T, self.V)}

    def forward(self, logits, targets):                                # logits (..., V), targets (...) ints
        V = logits.shape[-1]
        l2, t = logits.reshape(-1, V), targets.reshape(-1)             # (N, V), (N,)
        if t.shape[0] != l2.shape[0]:
            raise ValueError(f"targets {targets.shape} do not match logits {logits.shape}")
        if t.size and (t.min() < 0 or t.max() >= V):
            raise ValueError(f"targets must lie in [0, {V})")
        self.cache = {"logits": l2, "t": t}
        return ops.cross_entropy(l2, t, self.a.lse)                    # lse: log-sum-exp of each row

    def backward(self, scale=1.0):                                     # -> dlogits (B, T, V)
        c = self._take_cache()                                         # fwd: loss = mean over N
        ops.cross_entropy_backward(c["logits"], c["t"], self.a.lse, scale / c["t"].size, flat(self.d.dlogits))
        return self.d.dlogits

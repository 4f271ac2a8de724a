"""GPT: token + learned position embeddings -> n_layer pre-LN blocks -> final LayerNorm -> LM head.

The LM head is tied to the token embedding by default: logits = x @ wte^T, and wte's gradient is the sum
of the head's and the embedding's contributions. Parameter names follow GPT-2/nanoGPT attribute paths
(README.md), so weights map to those ecosystems by a rename (and a transpose: Linear weights are (in, out)).
"""
import math
from dataclasses import asdict, dataclass, fields

import numpy as np

from . import kernels as K
from .layers import Block, CrossEntropy, Dropout, Embedding, LayerNorm, Linear, Module, PositionalEncoding


@dataclass
class GPTConfig:
    vocab_size: int = 65
    block_size: int = 64
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = True
    tie_weights: bool = True

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            if f.type in (int, "int"):
                if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
                    raise ValueError(f"{f.name} must be a positive integer, got {v!r}")
            elif f.type in (bool, "bool") and not isinstance(v, (bool, np.bool_)):
                raise ValueError(f"{f.name} must be true or false, got {v!r}")
        if not isinstance(self.dropout, (int, float)) or not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {self.dropout!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head}); "
                             f"pick n_head among {[h for h in range(1, self.n_embd + 1) if self.n_embd % h == 0][:8]}...")

    def to_dict(self):
        return asdict(self)


class GPT(Module):
    def __init__(self, config, rng=None, dtype=np.float32):
        super().__init__()
        cfg = self.config = config
        self.rng = rng if rng is not None else np.random.default_rng(0)   # init, then dropout masks
        proj_std = 0.02 / math.sqrt(2 * cfg.n_layer)                     # GPT-2: scaled residual projections
        C = cfg.n_embd
        self.wte = Embedding(cfg.vocab_size, C, self.rng, dtype=dtype)
        self.wpe = PositionalEncoding(cfg.block_size, C, self.rng, dtype=dtype)
        self.drop = Dropout(cfg.dropout, self.rng)
        self.h = [Block(C, cfg.n_head, self.rng, cfg.dropout, cfg.bias, proj_std, dtype)
                  for _ in range(cfg.n_layer)]
        self.ln_f = LayerNorm(C, cfg.bias, dtype=dtype)
        self.lm_head = None if cfg.tie_weights else Linear(C, cfg.vocab_size, self.rng, bias=False, dtype=dtype)
        self.loss_fn = CrossEntropy()

    def children(self):
        out = [("wte", self.wte), ("wpe", self.wpe), ("drop", self.drop)]
        out += [(f"h.{i}", b) for i, b in enumerate(self.h)]
        out.append(("ln_f", self.ln_f))
        if self.lm_head is not None:
            out.append(("lm_head", self.lm_head))
        return out

    def num_params(self):
        return sum(p.size for p in self.params().values())

    # ------------------------------------------------------------------------

    def forward(self, idx, targets=None, kv=None):
        """idx (B, T) ints -> logits (B, T, V), and the mean cross-entropy when targets (B, T) are given.
        kv: a KVCache (inference only): idx continues the kv.n tokens already in it, at positions kv.n.."""
        idx = np.asarray(idx)
        if idx.ndim != 2:
            raise ValueError(f"idx must be (B, T) token ids, got shape {idx.shape}")
        B, T = idx.shape
        start = kv.n if kv is not None else 0
        x = self.drop.forward(self.wpe.forward(self.wte.forward(idx), start))   # (B, T, C)
        for i, block in enumerate(self.h):
            x = block.forward(x, None if kv is None else (kv.k[i], kv.v[i], start))
        if kv is not None:
            kv.n += T
        x = self.ln_f.forward(x, out=self._buf("ln_f", x.shape, x.dtype))  # (B, T, C)
        logits = self._head_forward(x.reshape(B * T, -1)).reshape(B, T, -1)   # (B, T, V)
        loss = None
        if targets is not None:
            loss = self.loss_fn.forward(logits, np.asarray(targets))
        else:
            self.loss_fn.cache = None                                     # backward() now refuses, not mixes
        return logits, loss

    def backward(self, scale=1.0):
        """Backpropagate the last forward's loss (times scale: 1/k for k accumulation micro-batches)."""
        if self.loss_fn.cache is None:
            raise RuntimeError("backward() needs a forward(idx, targets) with targets just before it")
        dlogits = self.loss_fn.backward(scale)                            # (B, T, V)
        B, T, V = dlogits.shape
        dx = self._head_backward(dlogits.reshape(B * T, V)).reshape(B, T, -1)   # (B, T, C)
        dx = self.ln_f.backward(dx, out=self._buf("dln_f", dx.shape, dx.dtype))
        for block in reversed(self.h):
            dx = block.backward(dx)
        self.wte.backward(self.wpe.backward(self.drop.backward(dx)))     # wte grad += embedding part

    def _head_forward(self, x2):                                          # x2 (N, C) -> (N, V)
        if self.lm_head is not None:
            return self.lm_head.forward(x2)
        self.cache = x2
        return K.matmul(x2, self.wte.p["weight"], tb=True)               # tied: logits = x wte^T

    def _head_backward(self, dlogits):                                    # (N, V) -> (N, C)
        if self.lm_head is not None:
            return self.lm_head.backward(dlogits)
        x2 = self._take_cache()
        K.matmul(dlogits, x2, ta=True, out=self.wte.g["weight"], acc=True)   # d(wte) += dlogits^T x
        N, C = dlogits.shape[0], self.wte.p["weight"].shape[1]
        return K.matmul(dlogits, self.wte.p["weight"], out=self._buf("dx", (N, C), dlogits.dtype))   # dlogits wte


class KVCache:
    """Keys and values of the tokens seen so far, per layer: k, v (n_layer, B, n_head, block_size, hs).
    n counts the filled positions; reset() empties it (the learned positions cannot slide, see sample.py)."""

    def __init__(self, config, batch_size, dtype=np.float32):
        hs = config.n_embd // config.n_head
        shape = (config.n_layer, batch_size, config.n_head, config.block_size, hs)
        self.k, self.v = np.zeros(shape, dtype), np.zeros(shape, dtype)
        self.n = 0

    def reset(self):
        self.n = 0

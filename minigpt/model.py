"""GPT: token + learned position embeddings -> n_layer pre-LN blocks -> final LayerNorm -> LM head.

The LM head is tied to the token embedding by default: logits = x @ wte^T, and wte's gradient is the sum
of the head's and the embedding's contributions. Parameter names follow GPT-2/nanoGPT attribute paths
(README.md), so weights map to those ecosystems by a rename (and a transpose: Linear weights are (in, out)).
"""
import math
from dataclasses import asdict, dataclass, fields

import numpy as np

from .backends import ops
from .layers import Block, CrossEntropy, Dropout, Embedding, LayerNorm, Linear, Module, PositionalEmbedding, flat


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
        self.wpe = PositionalEmbedding(cfg.block_size, C, self.rng, dtype=dtype)
        self.drop = Dropout(cfg.dropout, self.rng)
        self.h = [Block(C, cfg.n_head, self.rng, cfg.dropout, cfg.bias, proj_std, dtype)
                  for _ in range(cfg.n_layer)]
        self.ln_f = LayerNorm(C, cfg.bias, dtype=dtype)
        self.lm_head = None if cfg.tie_weights else Linear(C, cfg.vocab_size, self.rng, bias=False, dtype=dtype)
        self.loss_fn = CrossEntropy(cfg.vocab_size)
        self.loss = None                                                  # the last forward's, until backward

    def children(self):
        out = [("wte", self.wte), ("wpe", self.wpe), ("drop", self.drop)]
        out += [(f"h.{i}", b) for i, b in enumerate(self.h)]
        out.append(("ln_f", self.ln_f))
        if self.lm_head is not None:
            out.append(("lm_head", self.lm_head))
        return out + [("loss_fn", self.loss_fn)]

    def arrays(self, B, T):                                               # the tied head's logits and dx
        C, V = self.config.n_embd, self.config.vocab_size
        return ({"logits": (B, T, V)}, {"dx": (B, T, C)}) if self.lm_head is None else ({}, {})

    def num_params(self):
        return sum(p.size for p in self.params().values())

    # ------------------------------------------------------------------------

    def forward(self, idx, targets=None):
        """idx (B, T) ints -> logits (B, T, V), and the mean cross-entropy when targets (B, T) are given.
        The logits live in the model's arrays until the next forward: copy them to keep them longer."""
        idx = np.asarray(idx)
        if idx.ndim != 2:
            raise ValueError(f"idx must be (B, T) token ids, got shape {idx.shape}")
        self.bind(*idx.shape, self.wte.p["weight"].dtype)
        x = self.drop(self.wpe(self.wte(idx)))                            # (B, T, C)
        for block in self.h:
            x = block(x)
        logits = self.head(self.ln_f(x))                                  # (B, T, V)
        self.loss = None if targets is None else self.loss_fn(logits, np.asarray(targets))
        return logits, self.loss

    def backward(self, scale=1.0):
        """Backpropagate the last forward's loss (times scale: 1/k for k accumulation micro-batches)."""
        if self.loss is None:
            raise RuntimeError("backward() needs a forward(idx, targets) with targets just before it")
        self.loss = None
        dx = self.head_backward(self.loss_fn.backward(scale))              # (B, T, C)
        dx = self.ln_f.backward(dx)                                       # ln_f's own dx array: the residual
        for block in reversed(self.h):                                    # stream's gradient, updated in place
            dx = block.backward(dx)
        self.wte.backward(self.wpe.backward(self.drop.backward(dx)))      # wte's gradient += the embedding's part

    def head(self, x):                                                    # x (B, T, C) -> logits (B, T, V)
        if self.lm_head is not None:
            return self.lm_head(x)
        self.cache = x
        ops.matmul(flat(x), self.wte.p["weight"], tb=True, out=flat(self.a.logits))   # tied: logits = x wte^T
        return self.a.logits

    def head_backward(self, dlogits):                                     # (B, T, V) -> dx (B, T, C)
        if self.lm_head is not None:
            return self.lm_head.backward(dlogits)
        x, W = self._take_cache(), self.wte.p["weight"]
        ops.matmul(flat(dlogits), flat(x), ta=True, out=self.wte.g["weight"], acc=True)   # d(wte) += dlogits^T x
        return ops.matmul(flat(dlogits), W, out=flat(self.d.dx)).reshape(self.d.dx.shape)   # dx = dlogits wte

"""GPT: token + learned position embeddings -> n_layer pre-LN blocks -> final LayerNorm -> LM head.

Read it as llm.c's train_gpt2.c: parameter_shapes() lists every parameter, carved as named views out of one flat
buffer (and the gradients out of another: clipping is one norm, MPI's Allreduce takes the buffer itself);
activation_shapes() lists every array one step computes into, the activation table, and gradient_shapes() the
backward's. The model owns the tables (allocated once per batch shape) and hands each layer (layers.py: pure
functions) its backend and its slice. Generation runs this same forward over new positions with a KVCache.

The model holds the backend it runs on, model.ops (an Ops of minigpt/backends: given, or chosen once when the model
is made, for its dtype), bound to its precision: in bf16 (GPT(..., bf16=True)) every product takes bfloat16
operands and sums in float32 (Ops.with_bf16); the tables, the weights and the gradients stay float32.

The LM head is tied to the token embedding by default: logits = x wte^T, and wte's gradient is the sum of the
head's and the embedding's parts. Parameter names follow GPT-2/nanoGPT attribute paths (h.3.attn.c_attn.weight),
so weights map to those ecosystems by a rename (and a transpose: Linear weights are (in, out)).
"""
import math
from types import SimpleNamespace

import numpy as np

from . import backends
from . import layers as L
from .config import GPTConfig  # noqa: F401  (the model's config; re-exported for `from minigpt.model import`)
from .layers import flat


# ----------------------------------------------------------------------------
# the tables: parameters, activations, and the activations' gradients

def parameter_shapes(cfg):
    """{name: shape} of every parameter, in the order they lie in the flat buffer."""
    C, V = cfg.n_embd, cfg.vocab_size
    shapes = {"wte.weight": (V, C), "wpe.weight": (cfg.block_size, C)}
    for l in range(cfg.n_layer):
        for name, (n_in, n_out) in (("ln_1", (0, C)), ("attn.c_attn", (C, 3 * C)), ("attn.c_proj", (C, C)),
                                    ("ln_2", (0, C)), ("mlp.c_fc", (C, 4 * C)), ("mlp.c_proj", (4 * C, C))):
            shapes[f"h.{l}.{name}.weight"] = (n_in, n_out) if n_in else (n_out,)   # Linear (in, out); LN (C,)
            if cfg.bias:
                shapes[f"h.{l}.{name}.bias"] = (n_out,)
    shapes["ln_f.weight"] = (C,)
    if cfg.bias:
        shapes["ln_f.bias"] = (C,)
    if not cfg.tie_weights:
        shapes["lm_head.weight"] = (C, V)
    return shapes


def activation_shapes(cfg, B, T, Tk=None, dropout=False):
    """{name: shape} of every array a forward at (B, T) writes and the backward reads; per-layer ones lead
    with L. Tk: keys a query may see (T in training; block_size in a KVCache). dropout adds the masks' seeds."""
    C, nh, V, Ln, Tk = cfg.n_embd, cfg.n_head, cfg.vocab_size, cfg.n_layer, Tk or T
    shapes = {
        "emb":      (B, T, C),            # wte[idx] + wpe[t] (dropped out in place, in training): the residual stream
        "ln1":      (Ln, B, T, C),        # ln_1(x)
        "ln1_mean": (Ln, B * T),
        "ln1_rstd": (Ln, B * T),
        "qkv":      (Ln, B, T, 3 * C),    # ln1 W_attn + b: q, k, v side by side
        "att":      (Ln, B, nh, T, Tk),   # softmax(q k^T / sqrt(hs)), causal
        "atty":     (Ln, B, T, C),        # att v, the heads side by side
        "x_attn":   (Ln, B, T, C),        # the residual stream after attention: x + dropout(atty W_proj + b)
        "ln2":      (Ln, B, T, C),        # ln_2(x_attn)
        "ln2_mean": (Ln, B * T),
        "ln2_rstd": (Ln, B * T),
        "fc":       (Ln, B, T, 4 * C),    # act(ln2 W_fc + b), act = gelu | relu^2 (--activation)
        "fc_dact":  (Ln, B, T, 4 * C),    # the activation's derivative there (gelu' or relu2'): the backward's
                                          # multiply
        "x_mlp":    (Ln, B, T, C),        # the residual stream after the MLP: x_attn + dropout(fc W_proj + b)
        "lnf":      (B, T, C),            # ln_f(x) of the last layer's x_mlp
        "lnf_mean": (B * T,),
        "lnf_rstd": (B * T,),
        "logits":   (B, T, V),            # lnf wte^T (tied) or lnf W_head
        "lse":      (B * T,),             # log-sum-exp of each row of logits
    }
    if cfg.qk_norm:
        shapes["qk_rstd"] = (Ln, B, T, 2, nh)    # 1 / rms of each head's q and k (q, k in qkv are normalised)
    if cfg.logit_cap:
        shapes["logits_dcap"] = (B, T, V)        # 1 - tanh^2 of the capped logits: d logits / d the uncapped
    if dropout:                           # inverted dropout (layers.dropout): a mask is kept as its uint64 seed
        shapes.update({                   # (TABLE_DTYPES), drawn every forward; the backward draws it again
            "emb_seed":   (1,),           # on the embeddings
            "drop_seeds": (Ln, 3),        # [ATT] on att (what multiplies v), [ATTN_OUT] on the attention's output,
        })                                # [MLP_OUT] on the MLP's output
    return shapes


ATT, ATTN_OUT, MLP_OUT = range(3)         # the columns of drop_seeds
TABLE_DTYPES = {"emb_seed": np.uint64, "drop_seeds": np.uint64}   # the tables' arrays not of the model's dtype


def gradient_shapes(cfg, B, T):
    """{name: shape} of the backward's arrays: one of each, which every layer's backward uses up in turn."""
    C, V = cfg.n_embd, cfg.vocab_size
    return {
        "dresid":  (B, T, C),             # d loss / d the residual stream, carried down through the layers
        "dln":     (B, T, C),             # d loss / d a LayerNorm's output
        "dproj":   (B, T, C),             # d loss / d an output projection, under dropout
        "datty":   (B, T, C),
        "dqkv":    (B, T, 3 * C),
        "dfc":     (B, T, 4 * C),
        "dlogits": (B, T, V),
    }


def zeros_aligned(shape, dtype, align=64):
    """np.zeros(shape, dtype) starting on an `align`-byte boundary (a cache line). np.zeros of a large array
    starts 16 bytes into one, so every 64-byte row piece of a product's operands and result would straddle two
    lines: each piece then costs two loads in the kernels' packs and stores (reports/benchmarks.md, zeros_aligned)."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    raw = np.zeros(nbytes + align, np.uint8)
    start = -raw.ctypes.data % align
    return raw[start:start + nbytes].view(dtype).reshape(shape)


class Table(SimpleNamespace):
    """Named arrays allocated once from a {name: shape} table for a batch of B x T, each on a cache line
    (zeros_aligned), of dtype (the seeds: TABLE_DTYPES); .h[l] holds layer l's slices of the arrays named in
    per_layer (PER_LAYER: those of activation_shapes that lead with n_layer), so a layer reads a.qkv, not
    a.qkv[l]."""

    def __init__(self, shapes, dtype, B, T, n_layer=0, per_layer=()):
        super().__init__(**{k: zeros_aligned(s, TABLE_DTYPES.get(k, dtype)) for k, s in shapes.items()})
        self.shape = (B, T)                                               # what the table was made for
        self.h = [SimpleNamespace(**{k: getattr(self, k)[l] for k in per_layer if k in shapes})
                  for l in range(n_layer)]


# the arrays of activation_shapes that lead with n_layer (tests/test_model.py checks that the two agree)
PER_LAYER = ("ln1", "ln1_mean", "ln1_rstd", "qkv", "att", "atty", "x_attn", "ln2", "ln2_mean", "ln2_rstd", "fc",
             "fc_dact", "x_mlp", "qk_rstd", "drop_seeds")


def _normal(rng, shape, std, dtype):
    return (std * rng.standard_normal(shape)).astype(dtype)


# ----------------------------------------------------------------------------
# a block: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))

class Block:
    """Layer l: views of its parameters and gradients (p, g: "attn.c_attn.weight", ...), and the math of its
    two halves over its slice `a` of the activation table and the shared gradient arrays `d`, run by the
    backend `ops` the model hands it."""

    def __init__(self, cfg, l, params, grads):
        pre = f"h.{l}."
        self.p = {k[len(pre):]: v for k, v in params.items() if k.startswith(pre)}
        self.g = {k[len(pre):]: v for k, v in grads.items() if k.startswith(pre)}
        self.n_head, self.p_drop = cfg.n_head, cfg.dropout
        self.qk_norm, self.relu2 = cfg.qk_norm, cfg.activation == "relu2"

    def forward(self, ops, x, a, rng=None, start=0, kv=None):      # x (B, T, C) -> a.x_mlp (B, T, C)
        if rng is not None:                                        # dropout: this step's masks, as seeds
            a.drop_seeds[:] = [L.dropout_seed(rng) for _ in range(3)]
        x = self.attn_forward(ops, x, a, start, kv, rng is not None)   # a.x_attn = x + attn(ln_1(x))
        return self.mlp_forward(ops, x, a, rng is not None)        # a.x_mlp = x_attn + mlp(ln_2(x_attn))

    def backward(self, ops, dx, x, a, d, dropped=False):           # dx: d loss/d a.x_mlp -> d loss/d x, in place
        self.mlp_backward(ops, dx, a.x_attn, a, d, dropped)        # dx += ln_2.backward(mlp.backward(dx))
        return self.attn_backward(ops, dx, x, a, d, dropped)       # dx += ln_1.backward(attn.backward(dx))

    def att_dropout(self, a, dropped):                             # attention dropout's (p, seed), or None
        return (self.p_drop, int(a.drop_seeds[ATT])) if dropped else None

    # ---- the attention half
    def attn_forward(self, ops, x, a, start, kv, dropped):
        p, b = self.p, self.p.get                                  # b(name): that bias, or None (--bias off)
        L.layernorm_forward(ops, a.ln1, a.ln1_mean, a.ln1_rstd, x, p["ln_1.weight"], b("ln_1.bias"))
        L.linear_forward(ops, a.qkv, a.ln1, p["attn.c_attn.weight"], b("attn.c_attn.bias"))
        if self.qk_norm:
            L.qk_norm_forward(a.qk_rstd, a.qkv, self.n_head)      # q, k <- q / rms(q), k / rms(k), per head
        L.attention_forward(ops, a.atty, a.att, a.qkv, self.n_head, start, kv, self.att_dropout(a, dropped))
        drop = (self.p_drop, int(a.drop_seeds[ATTN_OUT])) if dropped else None   # x_attn = x + dropout(attn(ln_1(x)))
        return L.linear_forward(ops, a.x_attn, a.atty, p["attn.c_proj.weight"], b("attn.c_proj.bias"), res=x, drop=drop)

    def attn_backward(self, ops, dx, x, a, d, dropped):            # dx (B, T, C): d loss / d x_attn
        p, g, gb = self.p, self.g, self.g.get                      # gb(name): that bias's gradient, or None
        dy = L.dropout(ops, d.dproj, dx, self.p_drop, a.drop_seeds[ATTN_OUT]) if dropped else dx  # y = dropout(y)
        L.linear_backward(ops, d.datty, g["attn.c_proj.weight"], gb("attn.c_proj.bias"), dy, a.atty,
                          p["attn.c_proj.weight"])
        L.attention_backward(ops, d.dqkv, d.datty, a.qkv, a.att, self.n_head, self.att_dropout(a, dropped))
        if self.qk_norm:                                           # datty is free again: scratch
            L.qk_norm_backward(d.dqkv, d.datty, a.qkv, a.qk_rstd, self.n_head)
        L.linear_backward(ops, d.dln, g["attn.c_attn.weight"], gb("attn.c_attn.bias"), d.dqkv, a.ln1,
                          p["attn.c_attn.weight"])
        L.layernorm_backward(ops, dx, g["ln_1.weight"], gb("ln_1.bias"), d.dln, x, p["ln_1.weight"],
                             a.ln1_mean, a.ln1_rstd, acc=True)     # fwd: x_attn = x + attn(ln_1(x)) -> dx +=
        return dx

    # ---- the MLP half
    def mlp_forward(self, ops, x, a, dropped):                     # x = a.x_attn
        p, b = self.p, self.p.get                                  # b(name): that bias, or None (--bias off)
        L.layernorm_forward(ops, a.ln2, a.ln2_mean, a.ln2_rstd, x, p["ln_2.weight"], b("ln_2.bias"))
        act = L.linear_relu2_forward if self.relu2 else L.linear_gelu_forward
        act(ops, a.fc, a.fc_dact, a.ln2, p["mlp.c_fc.weight"], b("mlp.c_fc.bias"))
        drop = (self.p_drop, int(a.drop_seeds[MLP_OUT])) if dropped else None    # x_mlp = x + dropout(mlp(ln_2(x)))
        return L.linear_forward(ops, a.x_mlp, a.fc, p["mlp.c_proj.weight"], b("mlp.c_proj.bias"), res=x, drop=drop)

    def mlp_backward(self, ops, dx, x, a, d, dropped):             # dx (B, T, C): d loss / d x_mlp
        p, g, gb = self.p, self.g, self.g.get                      # gb(name): that bias's gradient, or None
        dy = L.dropout(ops, d.dproj, dx, self.p_drop, a.drop_seeds[MLP_OUT]) if dropped else dx  # y = dropout(y)
        # fc = act(z), z = ln2 W_fc + b: the product into fc's gradient multiplies by act'(z) (kept in fc_dact) as it
        # writes, so d.dfc is d loss / d z, and c_fc's backward is a plain Linear's (linear_gelu_backward's rest)
        L.linear_backward(ops, d.dfc, g["mlp.c_proj.weight"], gb("mlp.c_proj.bias"), dy, a.fc,
                          p["mlp.c_proj.weight"], dact=a.fc_dact)
        L.linear_backward(ops, d.dln, g["mlp.c_fc.weight"], gb("mlp.c_fc.bias"), d.dfc, a.ln2, p["mlp.c_fc.weight"])
        L.layernorm_backward(ops, dx, g["ln_2.weight"], gb("ln_2.bias"), d.dln, x, p["ln_2.weight"],
                             a.ln2_mean, a.ln2_rstd, acc=True)     # fwd: x_mlp = x + mlp(ln_2(x)) -> dx +=
        return dx


# ----------------------------------------------------------------------------
# the model

class GPT:
    def __init__(self, config, rng=None, dtype=np.float32, bf16=False, ops=None):
        """dtype: of every array (float32; float64 for gradient tests). bf16: every product (the Linears, the LM
        head, attention's q k^T and att v, forward and backward) rounds its operands to bfloat16 and sums in
        float32; all the rest, the weights and gradients included, stays float32. ops: the backend to run on
        (backends.load; BackendUnavailable if it cannot run dtype), default $MINIGPT_BACKEND, else auto's
        choice for dtype. The model holds it as self.ops, bound to its precision."""
        if bf16 and np.dtype(dtype) != np.float32:
            raise ValueError(f"bf16 products need a float32 model, not {np.dtype(dtype)}")
        if ops is None:
            ops = backends.load(dtype=dtype)
        backends.check_dtype(ops, dtype)
        self.ops = ops.with_bf16(bf16)                                    # every layer runs on it
        cfg = self.config = config
        self.rng = rng if rng is not None else np.random.default_rng(0)   # init, then dropout's seeds
        shapes = parameter_shapes(cfg)
        n = sum(math.prod(s) for s in shapes.values())
        self.param_memory, self.grad_memory = np.zeros(n, dtype), np.zeros(n, dtype)   # every parameter, gradient
        self._params, self._grads = _carve(self.param_memory, shapes), _carve(self.grad_memory, shapes)
        proj_std = 0.02 / math.sqrt(2 * cfg.n_layer)                      # GPT-2: scaled residual projections
        for k, p in self._params.items():                                 # in parameter_shapes' order, which
            if p.ndim == 2:                                               # sets the draws: reordering changes init
                p[...] = _normal(self.rng, p.shape, proj_std if k.endswith("c_proj.weight") else 0.02, dtype)
                if cfg.zero_init_proj and k.endswith("c_proj.weight"):   # drawn, then zeroed: the other
                    p[...] = 0.0                                          # weights keep their draws
            elif k.startswith("ln") or ".ln_" in k:
                p[...] = 1.0 if k.endswith("weight") else 0.0            # LayerNorm: w = 1, b = 0; biases 0
        self.h = [Block(cfg, l, self._params, self._grads) for l in range(cfg.n_layer)]
        self.training = True
        self.acts = self.dacts = None                                     # the tables, made at the first forward
        self.loss = self.targets = self.idx = None                        # the last forward's, until backward
        self.dropped = False                                              # did the last forward draw masks?

    @property
    def bf16(self):
        """Do the products take bfloat16 operands? The precision self.ops is bound to."""
        return self.ops.bf16

    def params(self):
        """{name: live view into param_memory}; the optimizer updates them in place."""
        return self._params

    def grads(self):
        """{name: live view into grad_memory}, the same names as params()."""
        return self._grads

    def zero_grad(self):
        self.grad_memory.fill(0)

    def train(self, mode=True):
        self.training = mode
        return self

    def eval(self):
        return self.train(False)

    def num_params(self):
        return self.param_memory.size

    def tables(self, B, T):
        """The activation table and its gradients' for (B, T): made once, reused while the shape repeats."""
        if self.acts is None or self.acts.shape != (B, T):
            dtype, dropout = self.param_memory.dtype, self.config.dropout > 0
            self.acts = Table(activation_shapes(self.config, B, T, dropout=dropout), dtype, B, T,
                              self.config.n_layer, PER_LAYER)
            self.dacts = Table(gradient_shapes(self.config, B, T), dtype, B, T)
        return self.acts, self.dacts

    # ------------------------------------------------------------------------

    def forward(self, idx, targets=None, cache=None):
        """idx (B, T) ints -> logits (B, T, V), and the mean cross-entropy when targets (B, T) are given.
        With a KVCache (generation), idx continues the cache.n positions it holds. The logits live in the
        model's (or the cache's) table until the next forward: copy them to keep them longer."""
        idx, targets = self._check(idx, targets, cache)
        B, T = idx.shape
        ops = self.ops
        a = self.tables(B, T)[0] if cache is None else cache.table(self, B, T)
        start = 0 if cache is None else cache.n
        rng = self.rng if self.training and self.config.dropout > 0 and cache is None else None
        p = self._params
        x = L.embedding_forward(a.emb, idx, p["wte.weight"], p["wpe.weight"], start)     # (B, T, C)
        if rng is not None:
            a.emb_seed[0] = L.dropout_seed(rng)
            L.dropout(ops, x, x, self.config.dropout, a.emb_seed[0])
        for l, block in enumerate(self.h):
            x = block.forward(ops, x, a.h[l], rng, start, None if cache is None else (cache.k[l], cache.v[l]))
        L.layernorm_forward(ops, a.lnf, a.lnf_mean, a.lnf_rstd, x, p["ln_f.weight"], p.get("ln_f.bias"))
        self.head_forward(a.logits, a.lnf, getattr(a, "logits_dcap", None))   # (B, T, V)
        if cache is not None:
            cache.n += T
        self.loss = None if targets is None else L.crossentropy_forward(ops, a.lse, a.logits, targets)
        self.idx, self.targets, self.dropped = idx, targets, rng is not None
        return a.logits, self.loss

    def backward(self, scale=1.0):
        """Backpropagate the last forward's loss (times scale: 1/k for k accumulation micro-batches), adding
        into grads()."""
        if self.loss is None:
            raise RuntimeError("backward() needs a forward(idx, targets) with targets just before it")
        self.loss = None
        ops, a, d, g = self.ops, self.acts, self.dacts, self._grads
        L.crossentropy_backward(ops, d.dlogits, a.logits, self.targets, a.lse, scale)
        if self.config.logit_cap:
            L.softcap_backward(d.dlogits, d.dlogits, a.logits_dcap)       # d loss / d the logits before the cap
        self.head_backward(d.dln, d.dlogits, a.lnf)                       # d loss / d lnf
        x = a.h[-1].x_mlp if self.h else a.emb                            # the last block's output
        dx = L.layernorm_backward(ops, d.dresid, g["ln_f.weight"], g.get("ln_f.bias"), d.dln, x,
                                  self._params["ln_f.weight"], a.lnf_mean, a.lnf_rstd)
        for l in reversed(range(len(self.h))):                            # dresid: d loss / d the residual
            x = a.h[l - 1].x_mlp if l else a.emb                          # stream, carried down in place
            self.h[l].backward(ops, dx, x, a.h[l], d, self.dropped)
        if self.dropped:
            L.dropout(ops, dx, dx, self.config.dropout, a.emb_seed[0])     # fwd: emb = dropout(emb)
        L.embedding_backward(ops, g["wte.weight"], g["wpe.weight"], dx, self.idx)   # wte's gradient += the lookup's

    def head_forward(self, logits, x, dcap=None):                         # x (B, T, C) -> logits (B, T, V)
        tied = self.config.tie_weights
        self.ops.matmul(flat(x), self.lm_head_weight, tb=tied, out=flat(logits))   # x wte^T (tied), or x W (C, V)
        if self.config.logit_cap:                                         # cap tanh(logits / cap); dcap for the
            L.softcap_forward(logits, np.empty_like(logits) if dcap is None else dcap, logits,   # backward
                              self.config.logit_cap)
        return logits

    def head_backward(self, dx, dlogits, x):                              # dlogits (B, T, V) -> dx (B, T, C)
        ops = self.ops
        if self.config.tie_weights:                                       # fwd: logits = x wte^T
            ops.matmul(flat(dlogits), flat(x), ta=True, out=self._grads["wte.weight"], acc=True)  # dwte += dl^T x
            ops.matmul(flat(dlogits), self._params["wte.weight"], out=flat(dx))                    # dx = dl wte
        else:                                                             # fwd: logits = x W
            ops.matmul(flat(x), flat(dlogits), ta=True, out=self._grads["lm_head.weight"], acc=True)   # dW += x^T dl
            ops.matmul(flat(dlogits), self._params["lm_head.weight"], tb=True, out=flat(dx))          # dx = dl W^T
        return dx

    @property
    def lm_head_weight(self):
        return self._params["wte.weight" if self.config.tie_weights else "lm_head.weight"]

    def _check(self, idx, targets, cache):
        idx = np.asarray(idx)
        if idx.ndim != 2 or not np.issubdtype(idx.dtype, np.integer):
            raise ValueError(f"idx must be (B, T) integer token ids, got shape {idx.shape} of {idx.dtype}")
        n_pos, V = self.config.block_size, self.config.vocab_size
        end = idx.shape[1] + (cache.n if cache is not None else 0)
        if end > n_pos:
            raise ValueError(f"{end} positions exceed the positional table of length {n_pos} (block_size); "
                             f"crop the context to its last {n_pos} tokens" + (" (or start a new KVCache)" if cache
                                                                               else ""))
        if idx.size and (idx.min() < 0 or idx.max() >= V):
            raise ValueError(f"token ids must lie in [0, {V}), got min {idx.min()} max {idx.max()}; "
                             "encode the text with the model's own tokenizer")
        if targets is not None:
            if cache is not None:
                raise ValueError("a forward with a KVCache is for generation: it takes no targets")
            targets = np.asarray(targets)
            if targets.shape != idx.shape:
                raise ValueError(f"targets {targets.shape} do not match idx {idx.shape}")
            if targets.size and (targets.min() < 0 or targets.max() >= V):
                raise ValueError(f"targets must lie in [0, {V})")
        return idx, targets


def _carve(memory, shapes):
    """{name: view of memory with that shape}, consecutive in the order of shapes."""
    out, offset = {}, 0
    for k, s in shapes.items():
        n = math.prod(s)
        out[k] = memory[offset:offset + n].reshape(s)
        offset += n
    return out


# ----------------------------------------------------------------------------
# generation: the keys and values of past positions, so each new token costs one position's forward

class KVCache:
    """k, v (n_layer, B, nh, block_size, hs): the keys and values of the n positions seen so far. Its own
    activation table (the model's layout, attention over up to block_size keys) holds the new positions'
    arrays, so generating leaves the training table alone."""

    def __init__(self, model, B):
        cfg = model.config
        shape = (cfg.n_layer, B, cfg.n_head, cfg.block_size, cfg.n_embd // cfg.n_head)
        self.k, self.v = np.zeros(shape, model.param_memory.dtype), np.zeros(shape, model.param_memory.dtype)
        self.n = 0
        self.acts = None

    def table(self, model, B, T):
        """The activation table for T new positions (the prompt's T once, then 1 per token)."""
        if self.acts is None or self.acts.shape != (B, T):
            cfg = model.config
            self.acts = Table(activation_shapes(cfg, B, T, Tk=cfg.block_size), model.param_memory.dtype, B, T,
                              cfg.n_layer, PER_LAYER)
        return self.acts

"""AdamW and Muon over the model's param/grad dicts, global-norm gradient clipping, and the learning-rate schedule.

AdamW follows PyTorch's torch.optim.AdamW (decoupled decay, bias-corrected moments, eps added after the
square root). Weight decay applies only to 2-D tensors (matrices and embeddings), never to LayerNorm
parameters or biases, as nanoGPT's configure_optimizers. Muon (Keller Jordan's, as in the modded-nanogpt
speedruns) orthogonalises the momentum of the blocks' hidden matrices by a Newton-Schulz iteration and leaves
every other parameter to the same AdamW update, in one optimizer that takes the schedule's single lr. Both run
their updates and products on the backend they are given (ops=model.ops: the model's own).
"""
import math

import numpy as np


class Optimizer:
    """What AdamW and Muon share: the backend their updates run on (ops), the step count t and their state, named
    slots of per-parameter arrays ({"m": {name: array}, ...}) that a checkpoint stores under the optimizer's name
    and restores by name."""
    name = "?"

    def __init__(self, ops, **slots):
        self.ops = ops                                                 # an Ops of minigpt/backends
        self.t = 0                                                     # steps taken
        self.slots = slots
        self.lr_ratio_of = {}                                          # name -> its AdamW lr / the schedule's

    def state(self):
        """-> (t, slots): what makes a resumed run bit-identical."""
        return self.t, self.slots

    def load_state(self, t, slots, name=None):
        """Restore state() as saved; a ValueError naming the difference if it belongs to another optimizer
        (name) or model."""
        if name is not None and name != self.name:
            raise ValueError(f"the optimizer state is {name}'s, not {self.name}'s")
        if set(slots) != set(self.slots):
            raise ValueError(f"the optimizer state holds {sorted(slots)}, not {self.name}'s {sorted(self.slots)} "
                             "(a checkpoint of another optimizer?)")
        for slot, want in self.slots.items():
            got = slots[slot]
            missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
            if missing or extra:
                raise ValueError(f"optimizer state {slot} does not match {self.name} on this model: missing "
                                 f"{missing[:3]}, unexpected {extra[:3]} (a checkpoint of another optimizer or model?)")
            for k, a in got.items():
                if a.shape != want[k].shape:
                    raise ValueError(f"optimizer state {slot}[{k}] has shape {a.shape}, expected {want[k].shape}")
        self.t = int(t)
        for slot, want in self.slots.items():
            for k, a in want.items():
                a[...] = slots[slot][k]

    def adamw_state(self, params, names, betas, eps, weight_decay):
        """AdamW's part of the state, for params[k] with k in names (adamw_names, in the params' order): zero
        moments m and v, the betas, eps, and decay, the names whose weights decay (the 2-D ones)."""
        self.adamw_names = [k for k in params if k in names]
        self.m = {k: np.zeros_like(params[k]) for k in self.adamw_names}       # first moments
        self.v = {k: np.zeros_like(params[k]) for k in self.adamw_names}       # second moments
        self.beta1, self.beta2 = betas
        self.eps, self.weight_decay = eps, weight_decay
        self.decay = {k for k in self.adamw_names if params[k].ndim >= 2}

    def adamw(self, params, grads, lr):
        """The AdamW update (backends/numpy_ops.py: the math) of params[k] for k in self.adamw_names, with the
        step's bias corrections; weight decay for those in self.decay."""
        b1, b2 = self.beta1, self.beta2
        bc1, bc2 = 1.0 - b1 ** self.t, 1.0 - b2 ** self.t
        for k in self.adamw_names:
            wd = self.weight_decay if k in self.decay else 0.0
            lr_k = lr * self.lr_ratio_of.get(k, 1.0)
            self.ops.adamw(params[k], grads[k], self.m[k], self.v[k], lr_k, b1, b2, self.eps, wd, bc1, bc2)

    def scale_lr(self, names, ratio):
        """Per-group learning rates: the AdamW lr of each parameter in names is ratio x the schedule's."""
        self.lr_ratio_of.update({k: ratio for k in names if ratio != 1.0})
        return self


class AdamW(Optimizer):
    name = "adamw"

    def __init__(self, params, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1, *, ops):
        self.adamw_state(params, set(params), betas, eps, weight_decay)   # every parameter
        super().__init__(ops, m=self.m, v=self.v)

    def step(self, params, grads, lr):
        """One in-place update of every array in params from the matching array in grads."""
        self.t += 1
        self.adamw(params, grads, lr)


# ----------------------------------------------------------------------------
# Muon: MomentUm Orthogonalized by Newton-Schulz, for the hidden matrices; AdamW for the rest

# the reference quintic's a, b, c: the largest slope at 0 (small singular values grow fastest) that keeps s near 1
NS_COEFFS = (3.4445, -4.7750, 2.0315)


def newton_schulz(ops, G, steps=5, bf16=False):
    """G (rows, cols), or a stack (L, rows, cols) of same-shaped matrices -> about U S' V^T each, in float32, where
    G = U S V^T and S' lies near [0.7, 1.2] rather than at 1: the quintic trades exact convergence for speed, which
    Muon does not need. Each step applies p(X) = a X + b (X X^T) X + c (X X^T)^2 X, which maps every singular value
    s to p(s) and keeps the vectors. The products run on the backend ops (ops.bmm), a stack in one call each;
    bf16=True rounds their operands to bfloat16 (sums and the rest stay float32), as the reference Muon runs the
    whole iteration in bfloat16: the band [0.7, 1.2] is wider than bf16's rounding (2^-8 relative)."""
    a, b, c = NS_COEFFS
    flat = G.ndim == 2
    G = G[None] if flat else G
    tall = G.shape[1] > G.shape[2]
    X = np.array(G.transpose(0, 2, 1) if tall else G, dtype=np.float32, order="C")   # (L, m, n), m <= n
    X /= np.linalg.norm(X, axis=(1, 2), keepdims=True) + 1e-7        # Frobenius 1, so every s <= 1
    L, m, n = X.shape
    A, B, Y = np.empty((L, m, m), np.float32), np.empty((L, m, m), np.float32), np.empty_like(X)
    for _ in range(steps):
        ops.bmm(X, X, tb=True, out=A, bf16=bf16)                     # A = X X^T          (L, m, m)
        ops.bmm(A, A, out=B, bf16=bf16)                              # B = b A + c A A    (L, m, m)
        B *= c
        B += b * A
        np.multiply(X, a, out=Y)                                     # Y = a X + B X      (L, m, n)
        ops.bmm(B, X, out=Y, acc=True, bf16=bf16)
        X, Y = Y, X
    X = X.transpose(0, 2, 1) if tall else X                          # (L, rows, cols)
    return X[0] if flat else X


def newton_schulz_parts(ops, U, parts, steps=5, bf16=False):
    """U (L, rows, parts * cols) -> newton_schulz of each of its `parts` column blocks (L, rows, cols) on its own,
    put back side by side; parts=1 is newton_schulz of U. The blocks go through as one stack of L * parts."""
    if parts == 1:
        return newton_schulz(ops, U, steps, bf16)
    L, rows, cols = U.shape[0], U.shape[1], U.shape[2] // parts
    blocks = U.reshape(L, rows, parts, cols).transpose(0, 2, 1, 3).reshape(L * parts, rows, cols)   # a copy
    O = newton_schulz(ops, blocks, steps, bf16)
    return O.reshape(L, parts, rows, cols).transpose(0, 2, 1, 3).reshape(L, rows, parts * cols)


def muon_params(params):
    """Names Muon updates: the 2-D parameters of the blocks (h.{i}.attn.c_attn/c_proj, h.{i}.mlp.c_fc/c_proj
    weights). Embeddings, the LM head, LayerNorms and biases stay with AdamW: they are lookups or vectors,
    not linear maps between hidden spaces, and the reference Muon leaves them to AdamW too."""
    return {k for k, p in params.items() if k.startswith("h.") and p.ndim == 2}


def muon_scale(shape):
    """sqrt(max(1, fan_out / fan_in)) for a weight stored (in, out), as ours are: the reference Muon's factor
    (written max(1, rows/cols) there, for PyTorch's (out, in) layout). An orthogonalised (in, out) update has
    RMS 1/sqrt(max(in, out)); scaled, its RMS is 1/sqrt(fan_in) for every shape (c_fc: x2, c_attn: x sqrt 3)."""
    fan_in, fan_out = shape
    return max(1.0, fan_out / fan_in) ** 0.5


class Muon(Optimizer):
    """Muon for muon_params(params), AdamW (Optimizer.adamw, as AdamW's) for the rest.

    step(params, grads, lr) takes the schedule's lr: AdamW's params move with lr (times their scale_lr ratio:
    --embed_lr_ratio for wte and wpe), the Muon matrices with lr_ratio * lr * muon_scale(shape), so one schedule
    (get_lr) drives both. muon_scale is the reference Muon's (not an RMS match to AdamW), so lr_ratio * lr is the
    "Muon lr" the speedruns quote (0.02-0.05): the default 20 makes config S's lr 1e-3 a Muon lr of 0.02, the best
    of 0.01-0.05 there.
    Weight decay is decoupled: AdamW's as in AdamW, the Muon matrices' p *= 1 - lr_ratio * lr * muon_weight_decay.
    State (Optimizer): momentum[k] for the Muon matrices; m[k], v[k] (AdamW's moments) for the rest.
    Newton-Schulz runs the backend's batched products over each stack of same-shaped matrices, on bfloat16
    operands with bf16=True (a --dtype bf16 model's); what it costs: reports/muon.md. split_qkv=True
    orthogonalises the q, k and v parts of each c_attn update (its three C x C column blocks) each on its own, as
    three square matrices (scaled as such), rather than the C x 3C whole, as the modded-nanogpt speedruns do."""

    name = "muon"

    def __init__(self, params, lr_ratio=20.0, momentum=0.95, nesterov=True, ns_steps=5, betas=(0.9, 0.99),
                 eps=1e-8, weight_decay=0.1, muon_weight_decay=0.1, momentum_warmup=0, bf16=False,
                 split_qkv=False, *, ops):
        self.lr_ratio, self.nesterov, self.ns_steps = lr_ratio, nesterov, ns_steps
        self.split_qkv = split_qkv                                     # c_attn as its q, k, v blocks
        self.momentum = momentum                                       # the coefficient mu (buffers: momentum_buf)
        self.bf16 = bf16                                               # Newton-Schulz's products in bfloat16
        self.momentum_warmup = momentum_warmup
        self.muon_weight_decay = muon_weight_decay
        self.muon = muon_params(params)
        self.momentum_buf = {k: np.zeros_like(params[k]) for k in params if k in self.muon}   # Muon's buffers
        self.adamw_state(params, set(params) - self.muon, betas, eps, weight_decay)          # the rest: AdamW
        super().__init__(ops, momentum=self.momentum_buf, m=self.m, v=self.v)
        self.groups = {}                                               # shape -> the Muon names of that shape
        for k in sorted(self.muon, key=list(params).index):
            self.groups.setdefault(params[k].shape, []).append(k)
        self.stacks = {shape: np.empty((len(names), *shape), params[names[0]].dtype)   # each group's momentum
                       for shape, names in self.groups.items()}                         # directions, reused

    def momentum_at(self, t):
        """Momentum of step t (1, 2, ...): with momentum_warmup N, linear from 0.85 at step 1 to the set value
        at step N and on (the modded-nanogpt speedruns warm it up so; early gradients change fast)."""
        if t >= self.momentum_warmup:
            return self.momentum
        frac = (t - 1) / (self.momentum_warmup - 1)                   # t < N, so N >= 2
        return (1.0 - frac) * 0.85 + frac * self.momentum

    def step(self, params, grads, lr):
        """One in-place update of every array in params from the matching array in grads."""
        self.t += 1
        self.adamw(params, grads, lr)                                  # everything but the Muon matrices
        lr_muon, mu = self.lr_ratio * lr, self.momentum_at(self.t)
        for shape, names in self.groups.items():                       # every layer's c_fc (say) in one stack
            U = self.stacks[shape]                                     # (L, rows, cols)
            for k, u in zip(names, U):
                buf, g = self.momentum_buf[k], grads[k]
                buf *= mu
                buf += g                                               # buf = mu buf + g
                if self.nesterov:                                      # look one momentum step ahead
                    np.multiply(buf, mu, out=u)
                    u += g                                             # u = g + mu buf
                else:
                    u[...] = buf
            parts = 3 if self.split_qkv and names[0].endswith("attn.c_attn.weight") else 1
            O = newton_schulz_parts(self.ops, U, parts, self.ns_steps, self.bf16)   # (L, rows, cols)
            scale = muon_scale((shape[0], shape[1] // parts))          # of one part
            for k, o in zip(names, O):
                p = params[k]
                p *= 1.0 - lr_muon * self.muon_weight_decay            # p -= lr wd p
                p -= (lr_muon * scale) * o


# ----------------------------------------------------------------------------
# clipping and the schedule

def clip_grad_norm(grads, max_norm):
    """Scale the gradients in place so their global L2 norm is at most max_norm (0: no clipping). grads is the
    model's flat buffer (model.grad_memory), or a dict of arrays. Returns the norm before clipping (as
    torch.nn.utils.clip_grad_norm_)."""
    arrays = list(grads.values()) if isinstance(grads, dict) else [grads]
    norm = math.sqrt(sum(float(np.dot(g.ravel(), g.ravel())) for g in arrays))
    if max_norm > 0 and norm > max_norm:
        scale = max_norm / (norm + 1e-6)
        for g in arrays:
            g *= scale
    return norm


def get_lr(it, lr, min_lr, warmup_iters, lr_decay_iters, cooldown=0.0):
    """Linear warmup to lr (non-zero at it=0), then down to min_lr at lr_decay_iters, then min_lr. The way down:
    cooldown=0, a cosine from the end of warmup; cooldown=f in (0, 1], the trapezoid of the modded-nanogpt
    speedruns: lr held until the last f of lr_decay_iters, then a straight line down."""
    if it < warmup_iters:
        return lr * (it + 1) / (warmup_iters + 1)
    if it >= lr_decay_iters:
        return min_lr
    if cooldown:
        start = max(warmup_iters, lr_decay_iters * (1.0 - cooldown))        # where the line down begins
        return lr if it < start else lr + (min_lr - lr) * (it - start) / (lr_decay_iters - start)
    progress = (it - warmup_iters) / max(1, lr_decay_iters - warmup_iters)   # 0 -> 1
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)

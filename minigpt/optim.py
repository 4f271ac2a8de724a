"""AdamW over the model's param/grad dicts, global-norm gradient clipping, and the learning-rate schedule.

AdamW follows PyTorch's torch.optim.AdamW (decoupled decay, bias-corrected moments, eps added after the
square root). Weight decay applies only to 2-D tensors (matrices and embeddings), never to LayerNorm
parameters or biases, as nanoGPT's configure_optimizers.
"""
import math

import numpy as np

from .backends import ops


class AdamW:
    def __init__(self, params, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1):
        self.beta1, self.beta2 = betas
        self.eps, self.weight_decay = eps, weight_decay
        self.t = 0                                                     # steps taken
        self.m = {k: np.zeros_like(p) for k, p in params.items()}      # first moments
        self.v = {k: np.zeros_like(p) for k, p in params.items()}      # second moments
        self.decay = {k for k, p in params.items() if p.ndim >= 2}

    def step(self, params, grads, lr):
        """One in-place update of every array in params from the matching array in grads."""
        self.t += 1
        b1, b2 = self.beta1, self.beta2
        bc1, bc2 = 1.0 - b1 ** self.t, 1.0 - b2 ** self.t
        for k, p in params.items():                                   # the math: backends/numpy_ops.py
            wd = self.weight_decay if k in self.decay else 0.0
            ops.adamw(p, grads[k], self.m[k], self.v[k], lr, b1, b2, self.eps, wd, bc1, bc2)

    def state(self):
        """Arrays and counters that make a resumed run bit-identical."""
        return {"t": self.t, "m": self.m, "v": self.v}

    def load_state(self, t, m, v):
        if set(m) != set(self.m) or any(m[k].shape != self.m[k].shape for k in m):
            raise ValueError("optimizer state does not match the model's parameters")
        self.t = int(t)
        for k in self.m:
            self.m[k][...] = m[k]
            self.v[k][...] = v[k]


def clip_grad_norm(grads, max_norm):
    """Scale all gradients in place so their global L2 norm is at most max_norm (0: no clipping).
    Returns the norm before clipping (as torch.nn.utils.clip_grad_norm_)."""
    norm = math.sqrt(sum(float(np.dot(g.ravel(), g.ravel())) for g in grads.values()))
    if max_norm > 0 and norm > max_norm:
        scale = max_norm / (norm + 1e-6)
        for g in grads.values():
            g *= scale
    return norm


def get_lr(it, lr, min_lr, warmup_iters, lr_decay_iters):
    """Linear warmup to lr (non-zero at it=0), then cosine decay to min_lr at lr_decay_iters, then min_lr."""
    if it < warmup_iters:
        return lr * (it + 1) / (warmup_iters + 1)
    if it >= lr_decay_iters:
        return min_lr
    progress = (it - warmup_iters) / max(1, lr_decay_iters - warmup_iters)   # 0 -> 1
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)

"""What a trained model computes on a text, read from its own forward: the numbers behind report.py.

Every figure comes out of the model's activation table (model.py) after GPT.forward, never from a second copy of
the model: attention probabilities are acts.att, the logit lens reads the residual stream acts.h[l].x_mlp through
the model's final LayerNorm and head, per-token losses are acts.lse minus the target's logit. The rest is
NumPy on the parameters (a PCA of the token embeddings, cosine similarities of the positions) and the sampler's
own distribution() for the next-token bars; layer_losses scores each layer's reading of the stream against the
targets. The model is put in eval mode (no dropout).
"""
import numpy as np

from . import layers as L
from .sample import distribution


def attention(model, ids):
    """ids (T,) -> att (n_layer, n_head, T, T): row i of every head is where query i looks (sums to 1)."""
    model.eval()
    model.forward(np.asarray(ids)[None])
    return model.acts.att[:, 0].astype(np.float64)                    # (L, B=1, nh, T, T) -> (L, nh, T, T)


def logit_lens(model, ids):
    """ids (T,) -> logits (n_layer, T, V): the final LayerNorm and the head applied to the residual stream after
    each layer. The last layer's are the model's own logits."""
    model.eval()
    model.forward(np.asarray(ids)[None])
    a, p, T = model.acts, model.params(), len(ids)
    C, dtype = model.config.n_embd, model.param_memory.dtype
    x_ln, mean, rstd = np.empty((1, T, C), dtype), np.empty(T, dtype), np.empty(T, dtype)
    out = np.empty((model.config.n_layer, 1, T, model.config.vocab_size), dtype)
    for l in range(model.config.n_layer):
        L.layernorm_forward(model.ops, x_ln, mean, rstd, a.h[l].x_mlp, p["ln_f.weight"], p.get("ln_f.bias"))
        model.head_forward(out[l], x_ln)
    return out[:, 0].astype(np.float64)


def stream_loss(model, x, targets):
    """The mean cross-entropy of targets (B, T) if the residual stream x (B, T, C) were the last block's output:
    the model's final LayerNorm and head applied to it, as GPT.forward ends, in arrays of this call's own."""
    B, T, C = x.shape
    p, dtype = model.params(), model.param_memory.dtype
    x_ln, mean, rstd = np.empty((B, T, C), dtype), np.empty(B * T, dtype), np.empty(B * T, dtype)
    logits, lse = np.empty((B, T, model.config.vocab_size), dtype), np.empty(B * T, dtype)
    L.layernorm_forward(model.ops, x_ln, mean, rstd, x, p["ln_f.weight"], p.get("ln_f.bias"))
    model.head_forward(logits, x_ln)
    return float(L.crossentropy_forward(model.ops, lse, logits, np.asarray(targets)))


def layer_losses(model, idx, targets):
    """idx, targets (B, T) -> (n_layer + 1,): the cross-entropy of the targets read from the residual stream before
    the first block (the embeddings alone) and after each block, through the final LayerNorm and the head (the
    logit lens as numbers). The last is the model's own loss."""
    model.eval()
    model.forward(np.asarray(idx), np.asarray(targets))
    a = model.acts
    streams = [a.emb] + [a.h[l].x_mlp for l in range(model.config.n_layer)]
    return np.array([stream_loss(model, x, targets) for x in streams])


def softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def token_losses(model, ids, block_size):
    """ids (N,) -> the loss of each of its N-1 targets, in nats, scored as evaluate.whole_split_loss scores them
    (blocks of block_size tokens, a last shorter one): their mean is that function's value on ids."""
    model.eval()
    ids = np.asarray(ids)
    n = len(ids) - 1
    out = np.empty(n)
    for s in range(0, n, block_size):
        chunk = ids[None, s:min(s + block_size, n) + 1]                # (1, t+1)
        logits, _ = model.forward(chunk[:, :-1], chunk[:, 1:])
        t = chunk.shape[1] - 1
        target_logit = np.take_along_axis(logits[0], chunk[0, 1:, None], -1)[:, 0]     # (t,)
        out[s:s + t] = model.acts.lse - target_logit                   # -log softmax(logits)[target]
    return out


def pca_2d(E, fit=None):
    """E (V, C) -> (coordinates (V, 2), share of the variance each of the 2 axes explains): the axes of a centred
    SVD of the rows `fit` (default: all; the shares are theirs), every row projected on them. With one row (or
    one channel) there is one axis: the second is all 0 and explains nothing."""
    E = E.astype(np.float64)
    F = E if fit is None else E[fit]
    mean = F.mean(0)
    _, S, Vt = np.linalg.svd(F - mean, full_matrices=False)
    k = min(2, S.size)
    xy, share = np.zeros((E.shape[0], 2)), np.zeros(2)
    xy[:, :k], share[:k] = (E - mean) @ Vt[:k].T, (S[:k] ** 2) / max((S ** 2).sum(), 1e-30)
    return xy, share


def cosine_similarity(W):
    """W (T, C) -> (T, T) cosine similarity of every pair of rows (the learned positions)."""
    Wn = W.astype(np.float64) / np.maximum(np.linalg.norm(W, axis=1, keepdims=True), 1e-30)
    return Wn @ Wn.T


def next_token(model, ids, settings):
    """ids (T,) -> ({label: probabilities (V,)} for each (label, temperature, top_k, top_p) in settings, the
    logits (V,)): the sampler's own distribution() at the end of the prompt."""
    model.eval()
    logits = model.forward(np.asarray(ids)[None])[0][0, -1].astype(np.float64)   # (V,)
    return {label: distribution(logits[None], t, k, p)[0] for label, t, k, p in settings}, logits

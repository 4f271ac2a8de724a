"""What the heads of a trained model do, and what each is worth: the numbers behind the report's circuits section.

Head roles, as TransformerLens's head detector defines them, read from the attention probabilities of the model's
own forward (acts.att) on sequences of random tokens repeated twice:

    previous-token   the attention mass a query puts on the position just before it (t - 1)
    duplicate-token  ... on earlier positions that hold the same token as the query
    induction        ... on the positions right after those earlier copies: the token that followed the current
                     token last time, which is what a model reads to continue a pattern it has seen once

TransformerLens divides the mass by every query; here it is averaged over the queries that have somewhere to look
(position 0 has no previous token; a token's first occurrence has no earlier copy), so that a head doing nothing
but its role scores 1. The same forward gives the in-context loss: the loss on the second copy against the first,
which only a model that reads its context (an induction circuit) can bring down on random tokens.

Head ablation replaces one head's output (its slice of acts.atty, before the output projection) by its mean over
the batch, position by position, and runs the rest of the model from there: the rise in loss is what the head is
worth. The per-layer cross-entropy (the logit lens as numbers) is lens.layer_losses.
"""
import numpy as np

from . import layers as L
from . import lens

ROLES = ("previous-token", "duplicate-token", "induction")
THRESHOLD = 0.4      # a head "has" a role when at least this share of its attention goes where the role looks
LOGITS_AT_ONCE = 2 ** 22    # logits read_repeats holds in float64 at a time (a GPT-2 vocabulary: one sequence)


def repeated_tokens(rng, tokens, batch, n):
    """-> (batch, 2n) ids: n tokens drawn uniformly (with replacement) from `tokens`, then the same n again."""
    first = rng.choice(np.asarray(tokens), size=(batch, n))
    return np.concatenate([first, first], axis=1)


def role_targets(seqs):
    """seqs (B, T) -> {role: (B, T, T) bool}: [b, t, s] is True where query t's role looks at key s."""
    B, T = seqs.shape
    same = seqs[:, :, None] == seqs[:, None, :]                      # token at query t == token at key s
    dup = same & np.tri(T, T, -1, dtype=bool)                          # ... at an earlier key, s < t
    ind = np.zeros_like(dup)
    ind[:, :, 1:] = dup[:, :, :-1]                                     # the key after each earlier copy, s + 1 <= t
    prev = np.broadcast_to(np.eye(T, k=-1, dtype=bool), (B, T, T))     # the key just before, s = t - 1
    return dict(zip(ROLES, (prev, dup, ind)))


def role_scores(att, seqs):
    """att (n_layer, B, nh, T, T) attention probabilities on seqs (B, T) -> (len(ROLES), n_layer, nh): for each
    role, the attention mass on the role's keys, averaged over the queries that have at least one."""
    mass, rows = _role_mass(att, seqs)
    with np.errstate(invalid="ignore"):                                  # no such query at all: NaN
        return mass / rows[:, None, None]


def _role_mass(att, seqs):
    """-> (the attention mass on each role's keys summed over the queries that have some (len(ROLES), n_layer,
    nh), how many queries have some (len(ROLES),))."""
    att = np.asarray(att, np.float64)
    mass = np.empty((len(ROLES),) + att.shape[:1] + att.shape[2:3])
    rows = np.empty(len(ROLES))
    for r, target in enumerate(role_targets(seqs).values()):
        mass[r] = np.einsum("lbhts,bts->lh", att, target.astype(np.float64))   # a query without keys adds 0
        rows[r] = target.any(-1).sum()
    return mass, rows


def read_repeats(model, seqs):
    """seqs (B, 2n) -> (role scores (len(ROLES), n_layer, nh), loss on the first copy, loss on the second), from
    the model's forward on them (a few sequences at a time, so that a large vocabulary's logits stay small). A
    copy's loss is the mean over its tokens 2..n, each predicted from the tokens before it: the first token of
    either copy follows nothing the model could copy, so neither counts it."""
    model.eval()
    seqs = np.asarray(seqs)
    (B, T), n = seqs.shape, seqs.shape[1] // 2
    mass, rows = 0.0, 0.0
    losses = np.empty((B, T - 1))
    step = max(1, LOGITS_AT_ONCE // (T * model.config.vocab_size))
    for s in range(0, B, step):
        part = seqs[s:s + step]
        logits = model.forward(part)[0][:, :-1].astype(np.float64)   # (b, T-1, V): positions 0..T-2
        m, r = _role_mass(model.acts.att, part)
        mass, rows = mass + m, rows + r
        z = logits - logits.max(-1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
        losses[s:s + step] = -np.take_along_axis(logp, part[:, 1:, None], -1)[..., 0]   # loss of token t+1 at t
    with np.errstate(invalid="ignore"):
        scores = mass / rows[:, None, None]
    return scores, float(losses[:, :n - 1].mean()), float(losses[:, n:].mean())


def top_heads(scores, k=3):
    """scores (n_layer, nh) -> [(layer, head, score)] of the k best heads, best first (0-based layer and head)."""
    flat = np.argsort(-scores, axis=None, kind="stable")[:k]
    return [(int(i // scores.shape[1]), int(i % scores.shape[1]), float(scores.flat[i])) for i in flat]


# ----------------------------------------------------------------------------
# what each head is worth: mean ablation

def ablation(model, idx, targets):
    """idx, targets (B, T) -> (the model's mean loss, rises (n_layer, nh)): rises[l, h] is how much the loss goes up
    when head h of layer l has its output replaced by its mean over the B sequences at each position (B >= 2, or
    the mean is the output itself). A head the rest of the model does not read rises by 0."""
    model.eval()
    base = float(model.forward(idx, targets)[1])
    a, cfg = model.acts, model.config
    inputs = [a.emb.copy()] + [a.h[l].x_mlp.copy() for l in range(cfg.n_layer - 1)]   # each block's input
    outputs = [a.h[l].atty.copy() for l in range(cfg.n_layer)]        # (B, T, C) each: the heads side by side
    hs = cfg.n_embd // cfg.n_head
    rises = np.empty((cfg.n_layer, cfg.n_head))
    for l in range(cfg.n_layer):
        for h in range(cfg.n_head):
            y = outputs[l].copy()
            head = y[..., h * hs:(h + 1) * hs]
            head[...] = head.mean(axis=0, keepdims=True)               # (1, T, hs): the mean over the batch
            rises[l, h] = loss_with(model, l, inputs[l], y, targets) - base
    return base, rises


def loss_with(model, l, x, atty, targets):
    """The loss when block l, with input x (B, T, C), has attention output atty (B, T, C), its heads side by side:
    the rest of block l as Block.attn_forward ends it (the output projection, the residual), its MLP, the blocks
    after it, then the final LayerNorm and the head."""
    ops, block, a = model.ops, model.h[l], model.acts.h[l]
    L.linear_forward(ops, a.x_attn, atty, block.p["attn.c_proj.weight"], block.p.get("attn.c_proj.bias"))
    x = np.add(x, a.x_attn, out=a.x_attn)                              # x_attn = x + attn(ln_1(x))
    x = block.mlp_forward(ops, x, a, False)
    for k in range(l + 1, model.config.n_layer):
        x = model.h[k].forward(ops, x, model.acts.h[k])
    return lens.stream_loss(model, x, targets)


# ----------------------------------------------------------------------------
# across training

def across_snapshots(models, seqs):
    """models: (iteration, model) pairs, in order -> {"iters", "scores" (S, len(ROLES), n_layer, nh), "first",
    "second"}: read_repeats of each on the same seqs, so that the curves compare like with like."""
    iters, scores, first, second = [], [], [], []
    for it, model in models:
        s, f, c = read_repeats(model, seqs)
        iters.append(it)
        scores.append(s)
        first.append(f)
        second.append(c)
    return {"iters": iters, "scores": np.array(scores), "first": np.array(first), "second": np.array(second)}

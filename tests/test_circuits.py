"""Head roles, the in-context loss, head ablation and the per-layer cross-entropy (minigpt/circuits.py, lens.py),
on a model whose weights are set by hand so that what each head does is known: one previous-token head and one
duplicate-token head in layer 1, an induction head in layer 2 that reads the previous-token head's output, and a
head in layer 2 that only looks at itself and writes where it is, the same in every sequence. The duplicate-token
head writes nothing."""
import math

import numpy as np
import pytest

from helpers import spec
from minigpt import circuits, lens
from minigpt.model import GPT, GPTConfig

V, T = 8, 16                                   # tokens; positions (two copies of a permutation of the 8 tokens)
TOK, POS, PREV, IND, BAL, WHERE = 0, V, V + T, 2 * V + T, 3 * V + T, 3 * V + T + 1   # residual channels
C, NH = 48, 2
HS = C // NH
SHARP = 30.0                                   # attention logits of a role's key over the others: softmax is hard


def hand_built():
    """The 2-layer, 2-head model of this file's docstring. Every vector written into the residual stream has a
    -1 in the balance channel for each +1, so the stream's mean over channels is 0 and its norm is the same at
    every position: LayerNorm only scales it, by a known factor (rstd below)."""
    cfg = GPTConfig(vocab_size=V, block_size=T, n_layer=2, n_head=NH, n_embd=C, bias=False, tie_weights=False)
    m = GPT(cfg, np.random.default_rng(0), dtype=np.float64, ops=spec())
    p = m.params()
    for k, w in p.items():
        w[...] = 1.0 if ".ln_" in k or k.startswith("ln_f") else 0.0   # LayerNorm gains 1; every other weight 0
    for v in range(V):
        p["wte.weight"][v, [TOK + v, BAL]] = 1, -1                   # token v: +1 at TOK + v
    for t in range(T):
        p["wpe.weight"][t, [POS + t, BAL]] = 1, -1                   # position t: +1 at POS + t
    r0 = rstd(6)                                                     # the stream holds 1, 1 and -2
    r1 = rstd(12)                                                    # ... and the previous token: 1, 1, 1, -3
    w0, w1 = sharp(r0), sharp(r1)
    a0, a1 = p["h.0.attn.c_attn.weight"], p["h.1.attn.c_attn.weight"]   # (C, 3C): q, k, v; heads of HS each
    q, k, v = (lambda h, d: d + h * HS), (lambda h, d: C + d + h * HS), (lambda h, d: 2 * C + d + h * HS)
    # layer 1, head 1: previous-token. Query t matches key t - 1 by position; the value is the key's token,
    # written at PREV.
    for t in range(1, T):
        a0[POS + t, q(0, t - 1)] = w0
    for t in range(T):
        a0[POS + t, k(0, t)] = w0
    for u in range(V):
        a0[TOK + u, v(0, u)] = 1.0
        p["h.0.attn.c_proj.weight"][u, [PREV + u, BAL]] = 1 / r0, -1 / r0
    # layer 1, head 2: duplicate-token. Same token +2 SHARP, itself -1 SHARP: an earlier copy first, else itself.
    for u in range(V):
        a0[TOK + u, q(1, u)], a0[TOK + u, k(1, u)] = 2 * w0, w0
    for t in range(T):
        a0[POS + t, q(1, V + t)], a0[POS + t, k(1, V + t)] = -w0, w0
    # layer 2, head 1: induction. Query token u matches a key whose previous token (PREV) is u, +2 SHARP; itself
    # +1 SHARP (where no earlier copy); position 0, whose PREV holds its own token, -3 SHARP (read off BAL, -3
    # everywhere). The value is the key's token, written at IND, which the head reads.
    for u in range(V):
        a1[TOK + u, q(0, u)], a1[PREV + u, k(0, u)] = 2 * w1, w1
        a1[TOK + u, v(0, u)] = 1.0
        p["h.1.attn.c_proj.weight"][u, [IND + u, BAL]] = 1 / r1, -1 / r1
    for t in range(T):
        a1[POS + t, q(0, V + t)], a1[POS + t, k(0, V + t)] = w1, w1
    a1[BAL, q(0, V)] = w1                                            # -3 w1 r1 at every query, times key 0's
    # layer 2, head 2: looks at itself only, and writes its position as an angle: cos, -cos, sin, -sin at WHERE
    # (sum 0, squares 1 at every position); nothing reads it, but the final LayerNorm's scale would change if it
    # wrote something else.
    for t in range(T):
        a1[POS + t, q(1, t)], a1[POS + t, k(1, t)] = w1, w1
        angle = 2 * math.pi * t / T
        a1[POS + t, [v(1, d) for d in range(4)]] = np.array([1, -1, 0, 0]) * math.cos(angle) + np.array(
            [0, 0, 1, -1]) * math.sin(angle)
    for d in range(4):
        p["h.1.attn.c_proj.weight"][HS + d, WHERE + d] = 1 / r1
    rf = rstd(21)                                                    # ... the copied token and WHERE: 1+1+1+1+16+1
    for u in range(V):                                               # logit 12 for the token the induction head
        p["lm_head.weight"][[IND + u, TOK + u], u] = 12 / rf, -12 / rf   # copied, -12 for the current one: where
    return m                                                         # it copied itself, no guess (all logits 0)


def rstd(sum_sq):
    """LayerNorm's 1 / std of a zero-mean stream whose squares sum to sum_sq over C channels."""
    return 1 / math.sqrt(sum_sq / C + 1e-5)


def sharp(r):
    """The weight that makes q . k / sqrt(hs) = SHARP for two unit one-hots LayerNorm scaled by r."""
    return math.sqrt(SHARP * math.sqrt(HS)) / r


def permutations_repeated(batch, seed=0):
    """(batch, 2V): a permutation of the V tokens, then the same again: no token twice within a copy."""
    rng = np.random.default_rng(seed)
    first = np.stack([rng.permutation(V) for _ in range(batch)])
    return np.concatenate([first, first], axis=1)


# ----------------------------------------------------------------------------

def test_role_targets_of_a_short_sequence():
    """a b a b: previous-token looks at t - 1; duplicate-token from the second a at the first, from the second b
    at the first; induction at the token after those copies (from the second a at the first b)."""
    got = circuits.role_targets(np.array([[0, 1, 0, 1]]))
    want = {"previous-token": [(1, 0), (2, 1), (3, 2)], "duplicate-token": [(2, 0), (3, 1)],
            "induction": [(2, 1), (3, 2)]}
    for role, pairs in want.items():
        assert sorted(zip(*np.nonzero(got[role][0]))) == pairs, role


def test_each_hand_built_head_scores_1_on_its_role_and_0_elsewhere():
    seqs = permutations_repeated(4)
    scores, first, second = circuits.read_repeats(hand_built(), seqs)
    want = {"previous-token": (0, 0), "duplicate-token": (0, 1), "induction": (1, 0)}    # (layer, head)
    for r, role in enumerate(circuits.ROLES):
        expected = np.zeros((2, NH))
        expected[want[role]] = 1.0
        np.testing.assert_allclose(scores[r], expected, atol=1e-3, err_msg=role)
    assert second < 0.01 and first == pytest.approx(math.log(V), abs=1e-3)   # the induction head copies the
                                                         # second copy; on the first it makes no guess


def test_a_few_sequences_at_a_time_read_as_all_at_once(monkeypatch):
    """read_repeats holds the logits of a few sequences at a time (a large vocabulary's): the same numbers."""
    seqs = circuits.repeated_tokens(np.random.default_rng(0), range(V), 5, V)
    whole = circuits.read_repeats(hand_built(), seqs)
    monkeypatch.setattr(circuits, "LOGITS_AT_ONCE", 1)                # one sequence at a time
    one = circuits.read_repeats(hand_built(), seqs)
    np.testing.assert_allclose(one[0], whole[0], rtol=1e-12)
    assert one[1:] == pytest.approx(whole[1:], rel=1e-12)


def test_top_heads_name_the_best_first():
    s = np.array([[0.1, 0.9], [0.5, 0.3]])
    assert circuits.top_heads(s, 3) == [(0, 1, 0.9), (1, 0, 0.5), (1, 1, 0.3)]


def test_ablation_costs_nothing_for_an_unused_head_and_breaks_the_circuit():
    """Mean-ablating the head that writes nothing leaves the loss as it was, and so does the head whose output is
    the same in every sequence (its mean over the batch is itself, where a mean over the positions would not be);
    either half of the induction circuit (the previous-token head, the induction head) raises the loss."""
    seqs = permutations_repeated(6, seed=1)
    model = hand_built()
    base, rises = circuits.ablation(model, seqs[:, :-1], seqs[:, 1:])
    assert base == pytest.approx(float(model.forward(seqs[:, :-1], seqs[:, 1:])[1]))
    np.testing.assert_allclose([rises[0, 1], rises[1, 1]], 0.0, atol=1e-9)    # duplicate-token, self
    assert rises[0, 0] > 1 and rises[1, 0] > 0.5, rises


@pytest.mark.parametrize("extra", [{}, {"qk_norm": True, "logit_cap": 5.0, "activation": "relu2"}],
                         ids=["default", "qk_norm-cap-relu2"])
def test_ablation_reruns_the_models_forward(extra):
    """The rest of the model that ablation runs after a replaced head gives the model's own loss when nothing is
    replaced, from any layer; and the per-layer cross-entropy's last entry is the model's loss."""
    cfg = GPTConfig(vocab_size=11, block_size=10, n_layer=3, n_head=2, n_embd=12, bias=True, **extra)
    m = GPT(cfg, np.random.default_rng(0), dtype=np.float64, ops=spec())
    rng = np.random.default_rng(1)
    for w in m.params().values():
        w += 0.3 * rng.standard_normal(w.shape)
    ids = rng.integers(0, 11, (3, 10))
    targets = rng.integers(0, 11, (3, 10))
    loss = float(m.forward(ids, targets)[1])
    a = m.acts
    inputs = [a.emb.copy()] + [a.h[l].x_mlp.copy() for l in range(2)]
    outputs = [a.h[l].atty.copy() for l in range(3)]
    for l in range(3):
        assert circuits.loss_with(m, l, inputs[l], outputs[l], targets) == pytest.approx(loss, rel=1e-12)
    layers = lens.layer_losses(m, ids, targets)
    assert layers.shape == (4,) and layers[-1] == pytest.approx(loss, rel=1e-12)
    assert len(set(np.round(layers, 6))) == 4                         # each layer reads something else
    _, rises = circuits.ablation(m, ids, targets)
    assert rises.shape == (3, 2) and np.abs(rises).min() > 1e-6       # every head of a random model counts


def test_layer_losses_see_the_circuit_complete_only_after_layer_2():
    seqs = permutations_repeated(4)
    layers = lens.layer_losses(hand_built(), seqs[:, :-1], seqs[:, 1:])
    np.testing.assert_allclose(layers[:2], math.log(V - 1), atol=1e-3)   # all but the current token alike
    assert layers[2] < layers[1] - 0.5, layers                        # the second copy is known after layer 2


def test_scores_across_snapshots_in_order():
    """across_snapshots reads each model on the same sequences: a model before and after its heads were set."""
    seqs = permutations_repeated(4)
    before = GPT(hand_built().config, np.random.default_rng(0), dtype=np.float64, ops=spec())
    got = circuits.across_snapshots([(0, before), (10, hand_built())], seqs)
    assert got["iters"] == [0, 10] and got["scores"].shape == (2, 3, 2, NH)
    ind = circuits.ROLES.index("induction")
    assert got["scores"][0, ind].max() < 0.3 and got["scores"][1, ind, 1, 0] > 0.99
    assert got["second"][1] < 0.01 < got["second"][0]


def test_repeated_tokens_are_two_copies_of_the_tokens_given():
    s = circuits.repeated_tokens(np.random.default_rng(0), [3, 5, 7], 4, 6)
    assert s.shape == (4, 12) and set(s.ravel()) <= {3, 5, 7}
    np.testing.assert_array_equal(s[:, :6], s[:, 6:])

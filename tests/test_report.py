"""The run report (minigpt/report.py, lens.py): its numbers are the model's own, the page is self-contained and
renders in a real headless browser without errors, and bad input gets a clear message; the same for the loss
curves of scripts/plot_losses.py."""
import html
import json
import math
import os
import re
import shutil
import subprocess
import sys

from dataclasses import fields

import numpy as np
import pytest

from helpers import spec, tiny_cfg, write_text
from minigpt import checkpoint, circuits, lens, report_page
from minigpt.model import GPT, GPTConfig
from minigpt.report import ReportConfig, write_report
from minigpt.report_page import shown
from minigpt.sample import distribution, sample_next
from minigpt.outdir import OutDir
from minigpt.train import train, whole_split_loss

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECTIONS = ("training", "tokens", "embeddings", "attention", "lens", "next", "wrong", "snapshots", "circuits",
            "samples")
CFG = GPTConfig(vocab_size=13, block_size=12, n_layer=2, n_head=2, n_embd=16, bias=True)


def model_and_ids(seed=0, T=9):
    m = GPT(CFG, np.random.default_rng(seed), dtype=np.float64, ops=spec())
    r = np.random.default_rng(seed + 1)
    for p in m.params().values():                                       # sharper attention than at init
        p += 0.3 * r.standard_normal(p.shape)
    return m, r.integers(0, 13, T)


# ----------------------------------------------------------------------------
# the numbers are the model's

def test_attention_rows_are_the_forwards_probabilities():
    """Every row sums to 1, is 0 in the future, and equals softmax(q k^T / sqrt(hs)) computed here from the
    forward's own q and k (the qkv in its activation table)."""
    m, ids = model_and_ids()
    att = lens.attention(m, ids)                                        # (L, nh, T, T)
    T, nh, hs = len(ids), CFG.n_head, CFG.n_embd // CFG.n_head
    np.testing.assert_allclose(att.sum(-1), 1.0, rtol=1e-12)
    assert not np.triu(att, 1).any()
    for l in range(CFG.n_layer):
        qkv = m.acts.qkv[l, 0].reshape(T, 3, nh, hs)                   # (T, 3, nh, hs)
        for h in range(nh):
            s = qkv[:, 0, h] @ qkv[:, 1, h].T / math.sqrt(hs)
            s[np.triu_indices(T, 1)] = -np.inf
            want = np.exp(s - s.max(-1, keepdims=True))
            np.testing.assert_allclose(att[l, h], want / want.sum(-1, keepdims=True), rtol=1e-10, atol=1e-14)


def test_logit_lens_last_layer_is_the_models_logits():
    m, ids = model_and_ids()
    got = lens.logit_lens(m, ids)
    assert got.shape == (CFG.n_layer, len(ids), CFG.vocab_size)
    np.testing.assert_allclose(got[-1], m.forward(ids[None])[0][0], rtol=1e-12, atol=1e-12)
    assert not np.allclose(got[0], got[-1])                             # the earlier layers read something else


def test_next_token_bars_are_the_samplers_distribution():
    m, ids = model_and_ids()
    settings = [("t", 0.7, 0, 1.0), ("k", 1.0, 4, 1.0), ("p", 1.0, 0, 0.8)]
    dists, logits = lens.next_token(m, ids, settings)
    np.testing.assert_allclose(logits, m.forward(ids[None])[0][0, -1])
    rng = np.random.default_rng(0)
    for label, t, k, p in settings:
        np.testing.assert_array_equal(dists[label], distribution(logits[None], t, k, p)[0])
        draws = sample_next(np.tile(logits, (20000, 1)), rng, t, k, p)       # what the sampler really draws
        freq = np.bincount(draws, minlength=CFG.vocab_size) / draws.size
        np.testing.assert_allclose(freq, dists[label], atol=0.015, err_msg=label)


def test_token_losses_average_to_the_evaluators_loss():
    m, _ = model_and_ids()
    ids = np.random.default_rng(5).integers(0, 13, 40)                  # 39 targets: 3 blocks of 12 and a tail
    losses = lens.token_losses(m, ids, CFG.block_size)
    assert losses.shape == (39,) and (losses > 0).all()
    np.testing.assert_allclose(losses.mean(), whole_split_loss(m, ids, CFG.block_size, 2), rtol=1e-12)


def test_pca_and_position_similarity():
    E = np.random.default_rng(0).standard_normal((30, 8)) * np.array([5, 3, 1, 1, 1, 1, 1, 1])
    xy, share = lens.pca_2d(E)
    assert xy.shape == (30, 2) and share[0] > share[1] > 0 and share.sum() < 1
    np.testing.assert_allclose(np.var(xy, axis=0).sum() / np.var(E - E.mean(0), axis=0).sum(), share.sum())
    S = lens.cosine_similarity(E)
    np.testing.assert_allclose(np.diag(S), 1.0)
    np.testing.assert_allclose(S, S.T)
    for one in (E[:1], E[:, :1]):                    # one token (a text of one character), or one channel
        xy, share = lens.pca_2d(one)
        assert xy.shape == (len(one), 2) and not xy[:, 1].any() and share[1] == 0
        np.testing.assert_allclose(np.abs(xy[:, 0]), np.abs(one[:, 0] - one[:, 0].mean()))


# ----------------------------------------------------------------------------
# a real run's report

@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    res = train(tiny_cfg(tmp, snapshots=3, max_iters=12, eval_interval=4))
    return tmp / "out", res


def test_token_labels_are_printable():
    """Labels show whitespace as symbols and other control characters (byte-level BPE's ids 0-31) as \\xNN: the
    fonts of the page and the plots have no glyph for them."""
    from minigpt.report_page import shown
    assert shown("a b\n\t") == "a\u2423b\u21b5\u21e5" and shown("") == "\u2205"
    assert shown("\x00\x1b\x7f") == "\\x00\\x1b\\x7f"
    assert all(shown(chr(i)).isprintable() for i in range(256))


def embedding_plots(monkeypatch, **kw):
    """write_report(ReportConfig(**kw)) -> (points, labels drawn) of each embedding plot: section 3's, then one per
    snapshot (as scatter_figure is given them: labels[k] goes on xy[k])."""
    calls, draw = [], report_page.scatter_figure

    def spy(xy, labels, title, size=(7, 6), max_labels=300):
        calls.append((xy, list(labels)[:max_labels]))
        return draw(xy, labels, title, size, max_labels)
    monkeypatch.setattr(report_page, "scatter_figure", spy)
    write_report(ReportConfig(backend="numpy", **kw))
    return calls


def test_embedding_labels_are_the_most_frequent_tokens(run_dir, tmp_path, monkeypatch):
    """Both embedding plots (section 3, each snapshot's in section 8) label the tokens most frequent in the
    validation text first, on their own points, and no token the validation text lacks; the axes are fitted on
    the tokens that occur there."""
    out, _ = run_dir
    val = ("to be or not to be\n" * 6)[:100]                      # space 26, o 21, t 16, ... (no k)
    data = tmp_path / "text.txt"
    data.write_text((out.parent / "text.txt").read_text()[:900] + val)   # split_text: the last 10% is val
    plots = embedding_plots(monkeypatch, out_dir=str(out), data=str(data))
    assert len(plots) == 1 + 3
    for _, labels in plots:
        assert labels[:3] == ["\u2423", "o", "t"] and sorted(labels) == sorted(shown(c) for c in set(val)), labels
    meta, params, _ = checkpoint.load(str(out / "ckpt_best.npz"))
    token_id = {shown(c): i for i, c in enumerate(json.loads(meta["tokenizer"]))}         # the char vocabulary
    xy, labels = plots[0]
    seen = [token_id[lab] for lab in labels]                     # the PCA's axes are those of the tokens that occur
    np.testing.assert_allclose(xy[:len(labels)], lens.pca_2d(params["wte.weight"], seen)[0][seen])
    assert not np.allclose(xy[:len(labels)], lens.pca_2d(params["wte.weight"])[0][seen], atol=1e-3)   # not all's


def test_embedding_labels_show_lone_bytes(tmp_path, monkeypatch):
    """A byte-level BPE's lone bytes >= 0x80, which decode() makes the same U+FFFD, are labelled <0xNN>;
    control characters \\xNN; and the 256 byte tokens the validation text lacks are not labelled."""
    from minigpt.report_page import shown_bytes
    assert shown_bytes(b"\xe2") == "<0xE2>" and shown_bytes(b"\x01") == "\\x01" and shown_bytes(b"") == "\u2205"
    assert shown_bytes(" \u00e9\u2019".encode()[:-1]) == "\u2423\u00e9<0xE2><0x80>"
    text = write_text(tmp_path / "text.txt").replace(" king", " k\u00e9ng")     # rare: 4 merges leave c3 a9 alone
    (tmp_path / "text.txt").write_text(text, encoding="utf-8")
    train(tiny_cfg(tmp_path, tokenizer="bpe", vocab_size=260, max_iters=2, eval_interval=2, snapshots=0))
    (_, labels), = embedding_plots(monkeypatch, out_dir=str(tmp_path / "out"))
    assert {"<0xC3>", "<0xA9>"} <= set(labels), labels
    assert not any("\ufffd" in lab or "\\x" in lab for lab in labels), labels


def test_single_tokens_show_lone_bytes_everywhere(tmp_path):
    """Every label of one token (the prompt's tokens and attention maps, the logit lens, the next-token tables)
    shows a byte-level BPE's lone byte as the embedding plots do, <0xNN>, never decode()'s U+FFFD; and section 7's
    text and worst tokens show no U+FFFD either."""
    text = write_text(tmp_path / "text.txt").replace(" king", " k\u00e9ng")     # c3 a9 stay two tokens
    (tmp_path / "text.txt").write_text(text, encoding="utf-8")
    train(tiny_cfg(tmp_path, tokenizer="bpe", vocab_size=260, max_iters=2, eval_interval=2, snapshots=0))
    page = open(write_report(ReportConfig(out_dir=str(tmp_path / "out"), backend="numpy", prompt="k\u00e9ng")),
                encoding="utf-8").read()
    data = json.loads(re.search(r'<script id="data" type="application/json">(.*?)</script>', page, re.S).group(1))
    assert data["labels"] == ["k", "<0xC3>", "<0xA9>", "n", "g"], data["labels"]
    assert data["next"] == data["labels"][1:] + [None]
    lens_labels = " ".join(lab for layer in data["lens"] for top in layer for lab, _ in top)
    next_tables = html.unescape(re.search(r'<section id="sec-next".*?</section>', page, re.S).group(0))
    for shown_there in (lens_labels, next_tables):                  # an untrained model: lone bytes among the top
        assert "<0x" in shown_there and "\ufffd" not in shown_there, shown_there
    wrong = html.unescape(re.search(r'<section id="sec-wrong".*?</section>', page, re.S).group(0))
    assert "\u00e9" in wrong and "\ufffd" not in wrong          # section 7: a character split over two byte tokens
                                                                # is shown whole, with the token that completes it


def test_next_token_reads_what_the_sampler_reads_and_the_worst_tokens_what_the_model_had(run_dir, monkeypatch):
    """A prompt longer than the maps draw: sections 2-5 show its last MAX_T tokens (a note says why), but section
    6 reads the last block_size, as the sampler does. Section 7's worst tokens show the context they were scored
    with: their block's tokens before them, at most 16 (not 16 across a block's start, which the model never saw)."""
    import minigpt.report as R
    out, _ = run_dir
    meta = checkpoint.load(str(out / "ckpt_best.npz"))[0]
    bs, text = meta["model_config"]["block_size"], open(meta["train_config"]["data"]).read()
    monkeypatch.setattr(R, "MAX_T", 6)                                   # below block_size 16 here
    read, next_token = [], lens.next_token
    monkeypatch.setattr(lens, "next_token", lambda model, ids, s: read.append(list(ids)) or next_token(model, ids, s))
    prompt = text[:40]
    page = open(write_report(ReportConfig(out_dir=str(out), backend="numpy", prompt=prompt, samples=0)),
                encoding="utf-8").read()
    vocab = json.loads(meta["tokenizer"])                                # the char tokenizer's characters
    assert read == [[vocab.index(c) for c in prompt[-bs:]]]
    data = json.loads(re.search(r'<script id="data" type="application/json">(.*?)</script>', page, re.S).group(1))
    assert "".join(data["labels"]) == shown(prompt[-6:])
    assert "sections 2-5 show the prompt&#x27;s last 6 tokens (the maps draw at most 6); section 6 reads the last " \
           f"{bs}, as the sampler does" in page
    val = text[int(len(text) * 0.9):][:2000]                              # the report's first val_chars of val
    losses = lens.token_losses(R.load_model(str(out / "ckpt_best.npz"), ops=spec())[0], [vocab.index(c) for c in val],
                               bs)
    want = [shown(val[max(k - 15, k - k % bs):k + 1]) for k in np.argsort(-losses, kind="stable")[:20]]
    wrong = html.unescape(re.search(r'<section id="sec-wrong".*?</section>', page, re.S).group(0))
    assert re.findall(r"<li><code>(.*?)</code>", wrong, re.S) == want
    assert any(len(c) < 16 for c in want)                                # a block's start: less than 16 seen


def test_snapshots_of_another_model_are_left_out_with_a_note(run_dir, tmp_path):
    """--ckpt from another run than --out_dir's snapshots (another model shape): the page is still made, its
    snapshot section says which it left out, instead of an error that blames the checkpoint."""
    out, _ = run_dir
    mix = tmp_path / "mix"
    shutil.copytree(out, mix)
    train(tiny_cfg(tmp_path / "one", n_layer=1, max_iters=2, eval_interval=2, snapshots=0))
    page = open(write_report(ReportConfig(out_dir=str(mix), ckpt=str(tmp_path / "one" / "out" / "ckpt_best.npz"),
                                          backend="numpy", samples=0)), encoding="utf-8").read()
    snaps = html.unescape(re.search(r'<section id="sec-snapshots".*?</section>', page, re.S).group(0))
    iters = OutDir(str(mix)).snapshot_iters()
    assert f"{len(iters)} snapshot(s) in {mix} (iteration {', '.join(map(str, iters))}) are of another model" in snaps
    assert "<figure>" not in snaps


def test_training_keeps_the_snapshots_it_was_asked_for(run_dir):
    out, _ = run_dir
    assert OutDir(str(out)).snapshot_iters() == [0, 8, 12]             # fractions 0, 1/2 (first eval past), end
    meta, params = checkpoint.load_snapshot(str(out / "snapshots" / "iter_0000012.npz"))
    assert meta["iter"] == 12 and params["wte.weight"].dtype == np.float32


def test_report_is_one_self_contained_file(run_dir):
    out, _ = run_dir
    path = write_report(ReportConfig(out_dir=str(out), backend="numpy"))
    text = open(path, encoding="utf-8").read()
    assert path == str(out / "report.html") and len(text) < 5 * 2 ** 20
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", text)          # nothing from the network
    assert "<link" not in text and "<script src" not in text
    assert "tokens of the start of the validation text" in text                      # where the prompt came from
    for key in SECTIONS:
        assert f'id="sec-{key}"' in text, key
    assert text.count("data:image/png;base64,") >= 3 + 3 + 3            # curves, PCA, positions; one per snapshot;
                                                                        # the circuits' roles, history and worth


def page_data(page):
    return json.loads(re.search(r'<script id="data" type="application/json">(.*?)</script>', page, re.S).group(1))


def section_text(page, key):
    return html.unescape(re.search(rf'<section id="sec-{key}".*?</section>', page, re.S).group(0))


def test_report_json_holds_the_numbers_the_page_draws(run_dir):
    """out_dir/report.json: the attention and the logit lens the page's script draws, the log's curves, and the
    circuits section's numbers, which are those of circuits.py on the model (the checkpoint's; each snapshot's),
    on the random sequences it names; the page names the same heads."""
    out, _ = run_dir
    page = open(write_report(ReportConfig(out_dir=str(out), backend="numpy", samples=1, sample_tokens=8)),
                encoding="utf-8").read()
    numbers = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert not (out / "report.json.part").exists()
    data = page_data(page)
    assert numbers["attention"] == data["att"] and numbers["logit_lens"] == data["lens"]
    steps = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert numbers["training"]["steps"]["loss"] == pytest.approx([r["loss"] for r in steps if r["kind"] == "train"],
                                                                 rel=1e-4)
    assert len(numbers["samples"]) == 1 and html.escape(numbers["samples"][0]) in page
    c = numbers["circuits"]
    seqs = np.array(c["sequences"]["ids"])
    assert seqs.shape == (16, 2 * 8)                                    # block 16: copies of 8 tokens
    model = load_spec_model(out / "ckpt_best.npz")
    scores, first, second = circuits.read_repeats(model, seqs)
    for r, role in enumerate(circuits.ROLES):
        np.testing.assert_allclose(c["scores"][role], scores[r], rtol=1e-4, atol=1e-5)
    assert c["copy_loss"] == pytest.approx({"first": first, "second": second}, rel=1e-4)
    snaps = c["snapshots"]
    assert snaps["iters"] == OutDir(str(out)).snapshot_iters() == [0, 8, 12]
    _, params = checkpoint.load_snapshot(str(out / "snapshots" / "iter_0000008.npz"))
    checkpoint.load_params(model, params)
    scores, first, second = circuits.read_repeats(model, seqs)
    np.testing.assert_allclose(snaps["scores"]["induction"][1], scores[2], rtol=1e-4, atol=1e-5)
    assert snaps["second"][1] == pytest.approx(second, rel=1e-4)
    assert np.array(c["ablation"]["rise"]).shape == (2, 2) and c["ablation"]["blocks"] == 16
    assert c["layer_loss"]["layer 2"] == pytest.approx(c["ablation"]["loss"], rel=1e-4)   # both the model's own
    text = re.sub("<[^>]+>", "", section_text(page, "circuits"))
    for role in circuits.ROLES:                                         # an untrained model: no role yet
        (l, h, v), = circuits.top_heads(np.array(c["scores"][role]), 1)
        assert f"{role}: none (the best, L{l + 1} H{h + 1}, scores {v:.2f})" in text
    assert ("No head has the previous-token or the duplicate-token or the induction role yet: no score reaches "
            "0.4.") in text


def load_spec_model(path):
    from minigpt.report import load_model
    return load_model(str(path), ops=spec())[0]


def test_the_circuits_section_names_the_heads_and_says_which_roles_none_has():
    from minigpt.report import _roles_part
    scores = np.zeros((3, 2, 3))
    scores[0, 0, 1], scores[0, 1, 2], scores[2, 1, 0], scores[1, 0, 0] = 0.9, 0.45, 0.39, 0.2
    text = re.sub("<[^>]+>", "", _roles_part(scores, 3.1, 3.2, 8, 20))
    assert "previous-token: L1 H2 (0.90), L2 H3 (0.45)" in text
    assert "induction: none (the best, L2 H1, scores 0.39)" in text
    assert "No head has the duplicate-token or the induction role yet: no score reaches 0.4." in text
    assert "3.20 nats per token against 3.10 on the first, not lower" in text
    scores[1:, 1, 1] = 0.5
    text = re.sub("<[^>]+>", "", _roles_part(scores, 3.1, 1.0, 8, 20))
    assert "Every role has at least one head scoring 0.4 or more." in text and "No head" not in text
    assert "1.00 nats per token against 3.10 on the first, lower: the model uses" in text


def figure_texts(monkeypatch, draw, *args):
    """The figure draw(*args) makes, drawn: (each visible text's (string, font size, box), the figure's width in
    the page's pixels)."""
    import matplotlib.text
    made, drawn = [], []
    monkeypatch.setattr(report_page, "png", lambda fig: made.append(fig) or "")
    draw(*args)
    fig, = made
    put = matplotlib.text.Text.draw                                   # the texts really drawn (not the ticks
    monkeypatch.setattr(matplotlib.text.Text, "draw", lambda t, r: drawn.append(t) or put(t, r))   # past the axes)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = [(t.get_text(), t.get_fontsize(), t.get_window_extent(renderer)) for t in drawn
             if t.get_visible() and t.get_text().strip()]
    return texts, fig.get_size_inches()[0] * 90                      # report_page.png saves at dpi 90


@pytest.mark.parametrize("n_layer,n_head", [(4, 4), (12, 12)], ids=["config-S", "gpt2-124M"])
def test_circuit_figures_are_legible(monkeypatch, n_layer, n_head):
    """Each figure of the circuits section as a reader needs it: titles, axis labels and legends there, no text
    drawn over another, none smaller than 7 points, and at most as wide as the page (1164 px of content at dpi 90),
    so that the browser does not shrink it."""
    import matplotlib.pyplot as plt
    rng = np.random.default_rng(0)
    scores = rng.uniform(0, 1, (3, n_layer, n_head))
    S = 21
    series = {"iters": list(range(0, 2100, 100)), "scores": rng.uniform(0, 1, (S, 3, n_layer, n_head)),
              "first": rng.uniform(3, 7, S), "second": rng.uniform(1, 7, S)}
    steps = [{"iter": i, "loss": 4 - i / 1000} for i in range(2001)]
    evals = [{"iter": i, "val_loss": 4 - i / 900} for i in range(0, 2001, 250)]
    names = ["embeddings"] + [f"layer {l + 1}" for l in range(n_layer)]
    draws = {"roles": (report_page.roles_figure, scores, circuits.ROLES, 0.4),
             "across": (report_page.across_figure, steps, evals, series, circuits.ROLES, 0.4),
             "worth": (report_page.worth_figure, rng.normal(0, 0.1, (n_layer, n_head)), 1.5, names,
                       rng.uniform(1, 4, n_layer + 1))}
    for name, (draw, *args) in draws.items():
        texts, width = figure_texts(monkeypatch, draw, *args)
        words = " ".join(t for t, _, _ in texts)
        for needed in {"roles": ("head", "layer", "induction score", "share of attention"),
                       "across": ("iteration", "nats per token", "second copy", "first copy", "threshold 0.4",
                                  "induction", "val (eval)"),
                       "worth": ("head", "layer", "embeddings", "loss rise when a head is ablated")}[name]:
            assert needed in words, (name, needed)
        assert min(size for _, size, _ in texts) >= 7, name
        assert width <= 1164 * 1.05, (name, width)
        for i, (a, _, ba) in enumerate(texts):
            for b, _, bb in texts[i + 1:]:
                assert not ba.overlaps(bb), (name, a, b)
        plt.close("all")


def _chromium():
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.skipif(_chromium() is None, reason="no Chromium here (Debian: apt-get install chromium; .ci/run "
                                                "installs it)")
def test_report_renders_in_headless_chromium(run_dir, tmp_path):
    """The page as a browser runs it: every section drawn, no script error, no console error, canvases as sharp as
    a high-resolution screen (devicePixelRatio 2), and a screenshot that is not blank."""
    out, _ = run_dir
    path = write_report(ReportConfig(out_dir=str(out), backend="numpy", prompt="To be or not"))
    flags = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
             "--virtual-time-budget=5000"]
    r = subprocess.run(flags + ["--force-device-scale-factor=2", "--dump-dom", f"file://{path}"],
                       capture_output=True, text=True, timeout=120)
    dom = r.stdout
    assert r.returncode == 0 and "<body" in dom, r.stderr[-2000:]
    console = [ln for ln in r.stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln]
    assert not console, console
    body = re.search(r"<body[^>]*>", dom).group(0)
    assert 'data-rendered="1"' in body and 'data-errors="0"' in body, body
    for key in SECTIONS:
        tag = re.search(rf'<section id="sec-{key}"[^>]*>', dom)
        assert tag and 'data-rendered="1"' in tag.group(0), key
    assert dom.count("<canvas") >= 2 * 2 * 2 and "<td" in dom           # the maps and the lens table were drawn
    for tag in re.findall(r"<canvas[^>]*>", dom):                      # 2 device pixels per CSS pixel: sharp
        width, css = re.search(r'width="(\d+)"', tag).group(1), re.search(r"width: (\d+)px", tag)
        assert css and int(width) == 2 * int(css.group(1)), tag
    shot = tmp_path / "shot.png"
    r = subprocess.run(flags + [f"--screenshot={shot}", "--window-size=1200,3000", f"file://{path}"],
                       capture_output=True, text=True, timeout=120)
    assert shot.exists(), r.stderr[-2000:]
    import matplotlib.image as mpimg
    pixels = mpimg.imread(str(shot))[..., :3].reshape(-1, 3)
    assert len(np.unique((pixels * 255).astype(np.uint8), axis=0)) > 50   # drawn, not a blank page



@pytest.mark.skipif(_chromium() is None, reason="no Chromium here (Debian: apt-get install chromium; .ci/run "
                                                "installs it)")
def test_the_circuits_section_as_chromium_draws_it(run_dir, tmp_path):
    """The circuits section alone (the page's other sections taken out), 1200 px wide in headless Chromium: no
    error, and a screenshot in which its figures show in their own colours: the top of the role grids' colour bar,
    the threshold's red, the second copy's purple."""
    out, _ = run_dir
    page = open(write_report(ReportConfig(out_dir=str(out), backend="numpy", samples=0)), encoding="utf-8").read()
    keep = re.search(r'<section id="sec-circuits".*?</section>', page, re.S).group(0)
    alone = re.sub(r'<section id="sec-.*?</section>', "", page, flags=re.S).replace(
        '<div id="errors"></div>', '<div id="errors"></div>' + keep, 1)
    path = tmp_path / "circuits.html"
    path.write_text(alone, encoding="utf-8")
    flags = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
             "--virtual-time-budget=5000", "--hide-scrollbars"]
    shot = tmp_path / "circuits.png"
    r = subprocess.run(flags + [f"--screenshot={shot}", "--window-size=1200,2000", f"file://{path}"],
                       capture_output=True, text=True, timeout=120)
    assert shot.exists(), r.stderr[-2000:]
    assert not [ln for ln in r.stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln], r.stderr[-2000:]
    import matplotlib.image as mpimg
    pixels = (mpimg.imread(str(shot))[..., :3] * 255).round().reshape(-1, 3)
    for name, rgb in (("Blues' darkest", (8, 48, 107)), ("threshold red", (214, 39, 40)),
                      ("the induction score's and the second copy's purple", (148, 103, 189))):
        assert (np.abs(pixels - rgb).max(axis=1) <= 12).sum() > 50, name


@pytest.mark.skipif(_chromium() is None, reason="no Chromium here (Debian: apt-get install chromium; .ci/run "
                                                "installs it)")
def test_tokens_that_look_like_markup_stay_text_in_the_page(tmp_path):
    """The logit-lens table is built as HTML in the page's script: a BPE token such as '</' shows as itself and
    breaks no markup (before the fix it ended the table's cells early)."""
    text = write_text(tmp_path / "text.txt").replace(" to ", " <i>to</i> ")
    (tmp_path / "text.txt").write_text(text, encoding="utf-8")
    train(tiny_cfg(tmp_path, tokenizer="bpe", vocab_size=300, max_iters=2, eval_interval=2, snapshots=0))
    path = write_report(ReportConfig(out_dir=str(tmp_path / "out"), backend="numpy", prompt="be <i>to</i> be"))
    r = subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                        f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000", "--dump-dom",
                        f"file://{path}"], capture_output=True, text=True, timeout=120)
    table = re.search(r'<table class="lens" id="lens-table".*?</table>', r.stdout, re.S)
    assert table, r.stderr[-2000:]
    header = re.findall(r'<th title="position \d+">(.*?)</th>', table.group(0))     # each token as its text
    assert header == ["b", "e", "\u2423&lt;", "i", "&gt;", "to", "&lt;/", "i", "&gt;", "\u2423be"], header

# ----------------------------------------------------------------------------
# the command

def report_cli(*args):
    return subprocess.run([sys.executable, "-m", "minigpt.report", *args], capture_output=True, text=True,
                          env={**os.environ, "MINIGPT_BACKEND": "numpy"})


def test_report_command_help_and_errors(run_dir, tmp_path):
    out, _ = run_dir
    r = report_cli("--help")
    assert r.returncode == 0 and "--val_chars" in r.stdout and "--prompt" in r.stdout
    assert r.stdout.count("(default:") == len(fields(ReportConfig))          # each option's default once
    for args, msg in [(["--out_dir", str(tmp_path / "none")], "no checkpoint in --out_dir"),
                      (["--out_dir", str(out), "--prompt", "\u00e9t\u00e9"], "not in the tokenizer's vocabulary"),
                      (["--out_dir", str(out), "--val_chars", "0"], "--val_chars must be positive"),
                      (["--out_dir", str(out), "--ckpt", str(out / "log.jsonl")], "not a minigpt checkpoint")]:
        r = report_cli(*args)                    # one line: the backend's comes only once every setting passed
        assert r.returncode == 2, (args, r.stderr)
        assert_one_error_line(r.stderr, msg)


def test_report_draws_what_it_can_without_log_or_text(run_dir, tmp_path):
    """A checkpoint alone (no log.jsonl, and the run's own --data gone since): the page says what is missing
    and draws the rest."""
    out, _ = run_dir
    alone = tmp_path / "alone"
    alone.mkdir()
    with np.load(out / "ckpt_best.npz") as z:
        files = {k: z[k] for k in z.files}
    meta = json.loads(files["meta"].tobytes())
    meta["train_config"]["data"] = str(tmp_path / "gone.txt")           # where the run's text was
    files["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    np.savez(alone / "ckpt_best.npz", **files)
    r = report_cli("--out_dir", str(alone))
    assert r.returncode == 0, r.stderr
    text = (alone / "report.html").read_text(encoding="utf-8")
    assert "log.jsonl is missing" in text and "is not here" in text and "No snapshots" in text
    (alone / "log.jsonl").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe" + bytes(range(256)))   # not a log at all
    r = report_cli("--out_dir", str(alone))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "cannot be read as a training log (UnicodeDecodeError)" in (alone / "report.html").read_text("utf-8")
    (alone / "log.jsonl").write_text('{"kind": "eval"}\n{"kind": "train", "iter": 1}\n[1, 2]\n')  # rows lacking keys
    r = report_cli("--out_dir", str(alone))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr


def assert_one_error_line(err, *needles):
    assert err.startswith("error: ") and err.count("\n") == 1 and err.endswith("\n"), err
    assert "Traceback" not in err and all(n in err for n in needles), (needles, err)


def test_report_typed_data_must_exist(run_dir, tmp_path):
    """A --data the user typed that is not there is a mistake (exit 2), unlike the run's own text gone since."""
    out, _ = run_dir
    here = tmp_path / "run"
    here.mkdir()
    shutil.copy(out / "ckpt_best.npz", here / "ckpt_best.npz")
    r = report_cli("--out_dir", str(here), "--data", str(tmp_path / "gone.txt"))
    assert r.returncode == 2, r.stderr
    assert_one_error_line(r.stderr, "gone.txt", "does not exist", "--data")
    assert not (here / "report.html").exists()


def test_report_out_dir_is_checked_before_the_work(run_dir, tmp_path):
    """--ckpt with an --out_dir that is a file: one line, before the report is built; a missing one is made."""
    out, _ = run_dir
    (tmp_path / "afile").write_text("x")
    r = report_cli("--ckpt", str(out / "ckpt_best.npz"), "--out_dir", str(tmp_path / "afile"), "--samples", "0")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.splitlines()[-1].startswith("error: --out_dir") and "is a file" in r.stderr
    r = report_cli("--ckpt", str(out / "ckpt_best.npz"), "--out_dir", str(tmp_path / "new"), "--samples", "0")
    assert r.returncode == 0 and (tmp_path / "new" / "report.html").exists(), r.stderr


# ----------------------------------------------------------------------------
# scripts/plot_losses.py: the curves from log.jsonl

def plot_main(*args):
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    try:
        import plot_losses
    finally:
        sys.path.pop(0)
    return plot_losses.main([str(a) for a in args])


@pytest.mark.parametrize("content,needle", [
    (None, "does not exist"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe", "is not text"),
    (b"step 0 loss 4.17\nstep 1 loss 4.01\n", "line 1 of log file"),
    (b'{"iter": 0, "loss": 4.17}\n{"iter": 1, "loss": 4.01}\n', 'no "kind"'),
    (b"", "no train or eval rows")], ids=["missing", "binary", "not-json", "no-kind", "empty"])
def test_plot_losses_rejects_what_is_not_a_training_log(content, needle, tmp_path, capsys):
    log = tmp_path / "log.jsonl"
    if content is not None:
        log.write_bytes(content)
    assert plot_main(log) == 2
    assert_one_error_line(capsys.readouterr().err, needle, str(log), "--out_dir")
    assert not (tmp_path / "loss_curve.png").exists()


def test_plot_losses_wants_one_label_per_log(run_dir, tmp_path, capsys):
    out, _ = run_dir
    assert plot_main(out / "log.jsonl", "--labels", "a", "b", "-o", tmp_path / "c.png") == 2
    assert_one_error_line(capsys.readouterr().err, "--labels got 2", "1 log")
    assert not (tmp_path / "c.png").exists()


@pytest.mark.parametrize("name,needle", [("curve.xyz", "does not write .xyz"), ("dir.png", "is a directory"),
                                         ("dir", "is a directory; name a PNG file in it")])   # not dir + .png
def test_plot_losses_says_when_it_cannot_write_the_png(name, needle, run_dir, tmp_path, capsys):
    out, _ = run_dir
    (tmp_path / "dir.png").mkdir()
    (tmp_path / "dir").mkdir()
    assert plot_main(out / "log.jsonl", "-o", tmp_path / name) == 2
    assert_one_error_line(capsys.readouterr().err, needle, name)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir", "dir.png"]     # no PNG, no temporary left


def test_plot_losses_writes_where_it_says(run_dir, tmp_path, capsys):
    """A bare -o name gets .png, as savefig gives it: the path printed is the file written, and no temporary
    is left beside it."""
    out, _ = run_dir
    assert plot_main(out / "log.jsonl", "-o", tmp_path / "curve") == 0
    assert capsys.readouterr().out == f"{tmp_path / 'curve.png'}\n"
    assert [p.name for p in tmp_path.iterdir()] == ["curve.png"]


def test_plot_losses_skips_a_torn_last_row(run_dir, tmp_path, capsys):
    """A kill mid-write leaves the last row without its newline: the run's log still plots. A row that is not
    JSON anywhere else is an error."""
    out, _ = run_dir
    rows = (out / "log.jsonl").read_text()
    log = tmp_path / "log.jsonl"
    log.write_text(rows + '{"iter": 12, "kind": "tr')
    assert plot_main(log) == 0 and (tmp_path / "loss_curve.png").stat().st_size > 10_000
    log.write_text('{"iter": 12, "kind": "tr\n' + rows)
    assert plot_main(log) == 2
    assert_one_error_line(capsys.readouterr().err, "line 1 of log file", "not JSON")


@pytest.mark.parametrize("args", [["none.jsonl"], []], ids=["missing-log", "no-arguments"])
def test_plot_losses_command_says_one_line_and_exits_2(args, tmp_path):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "plot_losses.py"), *args], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert_one_error_line(r.stderr)

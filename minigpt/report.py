"""See inside a trained model: one self-contained HTML page of a run (out_dir/report.html).

    python -m minigpt.report --out_dir out [--ckpt FILE] [--prompt TEXT] [--val_chars N]

Sections: training curves (log.jsonl), the prompt's tokens, the embeddings (a PCA of the token table, the
positions' similarities), attention (every layer and head on the prompt), the logit lens, the next-token
distribution under the sampler's settings, where the model is wrong on validation text, how training changed
it (the run's snapshots), and samples. Every number is the model's own (minigpt/lens.py reads the activation
table of its forward); the page is report_page.py's. scripts/train_shakespeare.py writes it at the end of a run.
"""
import codecs
import json
import os
import sys
import time

import numpy as np

from . import backends, checkpoint, lens
from . import report_page as P
from .backends import select_backend
from .config import ReportConfig, check_common, check_ranges, parse_args, run_command
from .errors import UserError
from .data import load_text, split_text
from .loss_curves import NEEDS
from .model import GPT, GPTConfig
from .outdir import OutDir
from .sample import generate, load_model, start_text

MAX_T = 64                  # prompt tokens drawn: attention maps are T x T per head
MAX_SNAPSHOTS = 6           # snapshots shown side by side (spread over those the run kept)
FREQ_CHARS = 20000          # characters of validation text whose token counts pick the embedding labels
VAL_DIR_TOKENS = 50000      # validation tokens decoded from a run's directory of token shards
BAR_SETTINGS = [("temperature 1", 1.0, 0, 1.0), ("temperature 0.8 (the sampler's default)", 0.8, 0, 1.0),
                ("temperature 0.5", 0.5, 0, 1.0), ("temperature 1.5", 1.5, 0, 1.0), ("top-k 5", 1.0, 5, 1.0),
                ("top-p 0.9", 1.0, 0, 0.9)]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        cfg = parse_args(argv, ReportConfig, prog="python -m minigpt.report", description=__doc__)
        t0 = time.perf_counter()
        path = write_report(cfg, verbose=True)                       # says which backend auto chose
        print(f"report: {path} ({os.path.getsize(path) / 2 ** 20:.1f} MB, {time.perf_counter() - t0:.1f} s)")
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def write_report(cfg, verbose=False):
    """Build out_dir/report.html for cfg (a ReportConfig); -> its path. Written to a temporary name, renamed."""
    check_ranges(cfg, positive=("val_chars", "sample_tokens"), non_negative=("samples", "seed"))
    check_common(cfg)
    if cfg.data and not os.path.isdir(cfg.data):
        load_text(cfg.data)                              # a typed --data must be readable: checked before any work
    run = OutDir(cfg.out_dir)
    ckpt = cfg.ckpt or run.checkpoint()
    loaded = checkpoint.load(ckpt)
    run.ensure_writable()              # where report.html goes: checked before the work
    ops = select_backend(cfg, verbose=False)             # said below, once every setting has passed
    model, tok = load_model(ckpt, loaded, ops)
    meta = loaded[0]
    notes, sections, data = [], [], {}
    rows = _read_log(run.log, notes)
    val_text = _validation_text(cfg.data, meta, notes, tok)
    prompt = cfg.prompt or (val_text[:MAX_T] if val_text else "\n")
    ids = _encode(tok, prompt, "--prompt")
    select_backend(cfg, verbose=verbose)                 # its "backend" line: once every setting has passed
    bs = model.config.block_size
    keep = min(MAX_T, bs)                                # the maps and the lens draw T x T per head
    context = ids[-bs:]                                  # what the sampler reads after the prompt (section 6)
    if len(ids) > keep and cfg.prompt:
        if keep == len(context):                         # block_size <= MAX_T: one crop for every section
            notes.append(f"the prompt is cropped to its last {keep} tokens, the model's block_size, as the sampler "
                         "crops it")
        else:
            notes.append(f"sections 2-5 show the prompt's last {keep} tokens (the maps draw at most {MAX_T}); "
                         f"section 6 reads the last {len(context)}, as the sampler does")
        ids = ids[-keep:]
    elif len(ids) > keep:                                # the default prompt: the validation text's start
        ids = context = ids[:keep]
    data["labels"] = [_label(tok, i) for i in ids]
    data["colors"] = [f"hsl({(int(i) * 47) % 360},70%,85%)" for i in ids]
    data["next"] = data["labels"][1:] + [None]

    sections.append(_training(rows))
    whence = ("your --prompt" if cfg.prompt else "the start of the validation text (--prompt TEXT for another)"
              if val_text else "a newline (no validation text here; --prompt TEXT for another)")
    sections.append(_tokens(ids, data, whence))
    order, labels = _by_frequency(tok, val_text, model.config.vocab_size)
    sections.append(_embeddings(model, order, labels, val_text))
    data["att"] = np.round(lens.attention(model, ids), 3).tolist()              # (L, nh, T, T)
    sections.append(P.section("attention", "4. Attention", "Where each head of each layer looks from every "
                              "position of the prompt: rows are queries, columns the keys they attend to (darker "
                              "is more, on a square-root scale so that small weights show; hover for the values; "
                              "the future is masked).", ATTENTION_BODY, drawn_by_script=True))
    logits = lens.logit_lens(model, ids)                                        # (L, T, V)
    probs = lens.softmax(logits)
    data["lens"] = [[[(_label(tok, j), float(p[j])) for j in np.argsort(-p)[:5]] for p in layer]
                    for layer in probs]
    sections.append(P.section("lens", "5. Logit lens", "The next token read from the residual stream after each "
                              "layer (the final LayerNorm and the head applied early; the last layer's row is the "
                              "model's own prediction): top guess and its probability; hover for the top 5, green "
                              "outline where the guess is the prompt's next token.",
                              '<div style="overflow-x:auto"><table class="lens" id="lens-table"></table></div>',
                              drawn_by_script=True))
    sections.append(_next_token(model, tok, context))
    sections.append(_wrong(model, tok, val_text, cfg.val_chars))
    data["snaps"] = []
    sections.append(_snapshots(cfg.out_dir, model.config, model.ops, ids, order, labels, val_text, rows, data))
    sections.append(_samples(model, tok, cfg))
    mc = model.config
    subtitle = P.esc(f"{ckpt} (iteration {meta.get('iter', '?')}): {model.num_params():,} parameters, "
                     f"{mc.n_layer} layers x {mc.n_head} heads, n_embd {mc.n_embd}, block {mc.block_size}, "
                     f"vocabulary {mc.vocab_size} ({type(tok).__name__}); backend {backends.label(model.ops, False)}"
                     + ("; trained with bf16 products, read here in float32"
                        if meta.get("train_config", {}).get("dtype") == "bf16" else ""))
    if notes:
        subtitle += "<br>" + "<br>".join(f'<span class="note">note: {P.esc(n)}</span>' for n in notes)
    text = P.page("What this model learned", subtitle, sections, data)
    out = run.report
    try:
        with open(out + ".part", "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(out + ".part", out)
    except OSError as e:                                  # a disk that filled meanwhile, say
        raise UserError(f"cannot write {out!r} ({e.strerror}); free space or pass another --out_dir") from None
    return out


ATTENTION_BODY = """<p>Click a token to pick a query; click a small map to open its layer; hover a cell for its
query and key tokens.</p>
<div id="attn-tokens"></div><div id="attn-layers"></div>
<div class="maps" id="attn-heads"></div>
<pre id="attn-looks"></pre>
<h3>Every layer and head</h3><div class="maps" id="attn-grid"></div>"""


# ----------------------------------------------------------------------------
# inputs

def _read_log(path, notes):
    if not os.path.exists(path):
        notes.append(f"{path} is missing: no training curves")
        return []
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except (OSError, UnicodeDecodeError) as e:
        notes.append(f"{path} cannot be read as a training log ({type(e).__name__}): no training curves")
        return []
    rows = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:                                              # a line torn by a kill mid-write
            continue
        if isinstance(row, dict) and all(k in row for k in NEEDS.get(row.get("kind"), ())):
            rows.append(row)                                            # the keys the figures read (loss_curves)
    return rows


def _validation_text(path, meta, notes, tok):
    """The validation split of path (the typed --data), else of the run's own --data, named in its checkpoint:
    that one may be gone since (moved, another machine), which is a note on the page, not an error. A directory
    of token shards gives the text of its first VAL_DIR_TOKENS validation tokens."""
    if not path:
        path = meta.get("train_config", {}).get("data", "")
        if not path or not os.path.exists(path):
            notes.append(f"the training text {path!r} is not here: no validation sections (pass --data PATH)")
            return ""
    if os.path.isdir(path):
        from .train import open_data                     # (train.py imports what the report does not need)
        _, data = open_data(path, tok, meta["model_config"]["block_size"])
        return tok.decode(data.ids("val", VAL_DIR_TOKENS))
    return split_text(load_text(path))[1]


def _encode(tok, text, what):
    ids = np.asarray(tok.encode(text), np.int64)          # a character the vocabulary lacks: the tokenizer's UserError
    if not len(ids):
        raise UserError(f"{what} is empty; pass at least one character")
    return ids


# ----------------------------------------------------------------------------
# the sections

def _training(rows):
    steps = [r for r in rows if r.get("kind") == "train"]
    evals = [r for r in rows if r.get("kind") == "eval"]
    if not steps and not evals:
        body = '<p class="note">No log.jsonl rows: nothing to draw.</p>'
    else:
        body = P.img(P.training_figure(steps, evals), "training curves")
        last = evals[-1] if evals else None
        if last:
            where = ("the whole validation split" if last.get("val_whole", True)    # --val_tokens may cap it
                     else f"the first {last['val_tokens_scored']:,} validation tokens")
            full = f", {where} {last['val_loss_full']:.4f}" if "val_loss_full" in last else ""
            body += (f"<p>Last evaluation at iteration {last['iter']}: train {last['train_loss']:.4f}, "
                     f"val {last['val_loss']:.4f} (both estimates over --eval_iters random batches){full} (nats "
                     "per token).</p>")
    return P.section("training", "1. Training", "How the loss fell as the run went on, against iterations and "
                     "against seconds, with the learning rate, the gradient norm and the speed.", body)


def _label(tok, i):
    """Token id i as the page labels a single token: its bytes made visible (report_page.shown_bytes), so a lone
    byte of a byte-level BPE shows as <0xNN> where decode() would give U+FFFD."""
    return P.shown_bytes(tok.token_bytes(int(i)))


def _tokens(ids, data, whence):
    spans = "".join(f'<span class="tok" style="background:{c}" title="id {i}">{P.esc(lab)}'
                    f'<small>{i}</small></span>' for i, lab, c in zip(ids, data["labels"], data["colors"]))
    return P.section("tokens", "2. Tokens", "The prompt as the model sees it: each token with its id, one colour "
                     "per id. Sections 4-6 and 8 look at it too.", f"<div>{spans}</div><p>{len(ids)} tokens of "
                     f"{P.esc(whence)}.</p>")


def _by_frequency(tok, val_text, V):
    """-> (every token id, the most frequent in the validation text's first FREQ_CHARS characters first; the labels
    of the ids that occur there, in that order): the embedding plots label the first ones. Without validation text:
    the ids in order, all labelled."""
    if not val_text:
        return np.arange(V), [_label(tok, i) for i in range(V)]
    counts = np.bincount(_encode(tok, val_text[:FREQ_CHARS], "validation text"), minlength=V)
    order = np.argsort(-counts, kind="stable")
    return order, [_label(tok, i) for i in order[:np.count_nonzero(counts)]]


def _fitted(order, labels, val_text):
    """The tokens the embedding PCA is fitted on: those that occur in the validation text (the labelled ones), so
    that the first axis is not spent telling them from tokens never trained (a BPE's unused bytes); all without
    validation text or with fewer than 3 of them."""
    return order[:len(labels)] if val_text and len(labels) >= 3 else None


def _embeddings(model, order, labels, val_text):
    p, fit = model.params(), _fitted(order, labels, val_text)
    xy, share = lens.pca_2d(p["wte.weight"], fit)
    V = model.config.vocab_size
    of = "" if fit is None or len(fit) == V else f" of the {len(fit)} that occur"
    body = P.img(P.scatter_figure(xy[order], labels, f"token embeddings, PCA: axes hold {share[0]:.0%} and "
                                  f"{share[1]:.0%} of the variance{of}"), "token embeddings PCA")
    sim = lens.cosine_similarity(p["wpe.weight"])
    body += P.img(P.matrix_figure(sim, "learned positions: cosine similarity", "position", "position"),
                  "positional similarity")
    n = min(300, len(labels))                                           # scatter_figure's max_labels
    if n < V:                                                           # under both figures, not between them
        text = f"the first {FREQ_CHARS:,} characters of the validation text"
        which = (f"the first {n} ids" if not val_text else
                 f"the {n} most frequent in {text}" if n < len(labels) else f"the {n} that occur in {text}")
        fitted = (f" The axes are those of the {len(fit)} tokens that occur there (the others, never seen in it, "
                  "are projected on them)." if of else "")
        body += f'<p class="note">{V} tokens: {which} are labelled.{fitted}</p>'
    return P.section("embeddings", "3. Embeddings", "Each token's learned vector projected to two dimensions "
                     "(similar tokens land close), and how alike the learned positions are.", body)


def _next_token(model, tok, ids):
    dists, _ = lens.next_token(model, ids, BAR_SETTINGS)
    tables = []
    for label, probs in dists.items():
        top = [j for j in np.argsort(-probs, kind="stable")[:10] if probs[j] > 0]
        rows = "".join(f"<tr><td>{P.esc(_label(tok, j))}</td><td>{probs[j]:.3f}</td>"
                       f'<td><span class="bar" style="width:{200 * probs[j]:.0f}px"></span></td></tr>' for j in top)
        tables.append(f"<div><b>{P.esc(label)}</b><table>{rows}</table></div>")
    return P.section("next", "6. Next token", "The probabilities of the token after the prompt, and how the "
                     "sampler's temperature, top-k and top-p reshape them (its own function).",
                     f'<div class="bars">{"".join(tables)}</div>')


def _wrong(model, tok, val_text, n_chars):
    if not val_text:
        return P.section("wrong", "7. Where the model is wrong", "Validation text coloured by each token's loss.",
                         '<p class="note">No validation text (see the note at the top).</p>')
    ids = _encode(tok, val_text[:n_chars], "validation text")
    if len(ids) < 2:
        return P.section("wrong", "7. Where the model is wrong", "Validation text coloured by each token's loss.",
                         '<p class="note">The validation text is too short to score.</p>')
    bs = model.config.block_size
    losses = lens.token_losses(model, ids, bs)                        # (N-1,), targets ids[1:], in blocks of bs
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")    # a character split over byte tokens
    pieces = [utf8.decode(tok.token_bytes(int(i))) for i in ids]      # goes with the token that completes it
    spans = [P.esc(pieces[0])]
    for p, l in zip(pieces[1:], losses):
        a = min(1.0, l / 5.0)
        spans.append(f'<span style="background:rgba(220,40,40,{a:.2f})" title="loss {l:.2f}">{P.esc(p)}</span>')
    worst = np.argsort(-losses, kind="stable")[:20]
    def seen(k):                                                      # target ids[k+1]'s context as scored:
        return ids[max(k - 15, k - k % bs):k + 1]                     # its block's tokens, at most 16
    items = "".join(f"<li><code>{P.esc(P.shown_bytes(b''.join(tok.token_bytes(int(i)) for i in seen(k))))}</code> "
                    f"\u2192 <b>{P.esc(_label(tok, ids[k + 1]))}</b>: {losses[k]:.2f} nats</li>" for k in worst)
    body = (f"<p>{len(losses)} tokens, mean loss {losses.mean():.4f} nats per token (the evaluator's whole-split "
            f'loss on this stretch).</p><div class="loss"><span>{"".join(spans)}</span></div>'
            f"<h3>The 20 worst tokens (after the context the model had: up to 16 tokens of their block)</h3>"
            f"<ol>{items}</ol>")
    return P.section("wrong", "7. Where the model is wrong", "Validation text coloured by each token's loss "
                     "(redder is more surprising to the model, full red from 5 nats), scored in blocks of "
                     f"block_size {bs} tokens as the evaluator scores them, and the tokens it got most wrong.", body)


def _snapshots(out_dir, config, ops, ids, order, labels, val_text, rows, data):
    run = OutDir(out_dir)
    iters = run.snapshot_iters()
    what = ("The embedding projection and the attention on the prompt (each layer, mean of its heads) at several "
            "points of the run.")
    if not iters:
        return P.section("snapshots", "8. How training changed it", what, '<p class="note">No snapshots in '
                         f'{P.esc(run.snapshots)} (train with --snapshots N).</p>',
                         drawn_by_script=True)
    if len(iters) > MAX_SNAPSHOTS:
        iters = [iters[int(k)] for k in np.linspace(0, len(iters) - 1, MAX_SNAPSHOTS).round()]
    val = {r["iter"]: r["val_loss"] for r in rows if r.get("kind") == "eval"}
    model = GPT(GPTConfig(**config.to_dict()), np.random.default_rng(0), ops=ops)
    final = None
    figures, other = [], []
    shape = {k: v for k, v in config.to_dict().items() if k != "dropout"}
    for k, it in enumerate(reversed(iters)):                         # the last first: the others align to it
        meta, params = checkpoint.load_snapshot(run.snapshot(it))
        if any(meta.get("model_config", {}).get(key, v) != v for key, v in shape.items()):
            other.append(it)                                         # another run's (--ckpt from elsewhere)
            continue
        checkpoint.load_params(model, params, f"snapshot {it}")
        xy, _ = lens.pca_2d(model.params()["wte.weight"], _fitted(order, labels, val_text))
        final = xy if final is None else final
        xy = xy * np.sign(np.sum(xy * final, axis=0) + 1e-30)          # PCA axes have no sign: match the last's
        att = lens.attention(model, ids).mean(axis=1)                   # (L, T, T), mean of the heads
        data["snaps"].insert(0, {"iter": it, "att": np.round(att, 3).tolist()})
        loss = f", val loss {val[it]:.3f}" if it in val else ""
        figures.insert(0, (it, loss, P.scatter_figure(xy[order], labels, "", size=(3.6, 3.2), max_labels=40)))
    n = min(40, len(labels))
    what += (" Each embedding panel is that snapshot's own PCA, only its axes' signs matched to the last panel's; "
             + (f"the {n} most frequent tokens" if val_text else f"the first {n} ids") + " are labelled.")
    layers = "layer 1" if config.n_layer == 1 else f"layer 1 to {config.n_layer}"
    body = '<div class="snaps">' + "".join(
        f'<figure><figcaption>iteration {it}{loss}</figcaption>{P.img(uri, f"embeddings at {it}")}'
        f'<div id="snap-maps-{k}"></div><figcaption>attention on the prompt, {layers} (mean of '
        f'the heads)</figcaption></figure>' for k, (it, loss, uri) in enumerate(figures)) + "</div>"
    if other:
        body += (f'<p class="note">{len(other)} snapshot(s) in {P.esc(out_dir)} (iteration '
                 f'{", ".join(map(str, sorted(other)))}) are of another model than the checkpoint\'s: left out.</p>')
    return P.section("snapshots", "8. How training changed it", what, body, drawn_by_script=True)


def _samples(model, tok, cfg):
    if not cfg.samples:
        return P.section("samples", "9. Samples", "Text the model writes.", "<p>--samples 0: none.</p>")
    start = _encode(tok, start_text(tok), "sample prompt")
    rng = np.random.default_rng(cfg.seed)
    out = [nxt for nxt in generate(model.eval(), np.tile(start, (cfg.samples, 1)), cfg.sample_tokens, rng,
                                   temperature=0.8)]
    rows = np.stack(out, axis=1) if out else np.zeros((cfg.samples, 0), int)
    body = "".join(f'<pre class="sample">{P.esc(tok.decode(r))}</pre>' for r in rows)
    return P.section("samples", "9. Samples", f"{cfg.samples} samples of {cfg.sample_tokens} tokens at temperature "
                     f"0.8 (the sampler's default), each from {_described(start_text(tok))}.", body)


def _described(text):
    """What a sample starts from, in words: 'a newline', or the text quoted (section() escapes it)."""
    return "a newline" if text == "\n" else repr(text)


if __name__ == "__main__":
    sys.exit(run_command(main))

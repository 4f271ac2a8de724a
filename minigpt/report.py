"""See inside a trained model: one self-contained HTML page of a run (out_dir/report.html).

    python -m minigpt.report --out_dir out [--ckpt FILE] [--prompt TEXT] [--val_chars N]

Sections: training curves (log.jsonl), the prompt's tokens, the embeddings (a PCA of the token table, the
positions' similarities), attention (every layer and head on the prompt), the logit lens, the next-token
distribution under the sampler's settings, where the model is wrong on validation text, how training changed
it (the run's snapshots), its circuits (what each head does, when it formed, what it is worth) and samples.
Every number is the model's own (minigpt/lens.py and circuits.py read the activation table of its forward); the
page is report_page.py's, and out_dir/report.json holds every number it draws. scripts/train_shakespeare.py
writes both at the end of a run.
"""
import codecs
import json
import os
import sys
import time

import numpy as np

from . import backends, checkpoint, circuits, lens
from . import report_page as P
from .backends import select_backend
from .config import ReportConfig, check_common, check_ranges, parse_args, run_command
from .errors import UserError
from .data import load_text, split_text
from .loss_curves import NEEDS
from .model import GPT, GPTConfig
from .outdir import PART, OutDir
from .sample import generate, load_model, start_text

MAX_T = 64                  # prompt tokens drawn: attention maps are T x T per head
MAX_SNAPSHOTS = 6           # snapshots shown side by side (spread over those the run kept)
FREQ_CHARS = 20000          # characters of validation text whose token counts pick the embedding labels
VAL_DIR_TOKENS = 50000      # validation tokens decoded from a run's directory of token shards
REPEAT_LEN = 48             # tokens of each random sequence the head roles read, repeated (at most half the block)
REPEAT_BATCH = 16           # random sequences the role scores and the copy losses average over
CURVE_SNAPSHOTS = 50        # snapshots scored for the roles across training (spread over those the run kept)
ABLATION_BLOCKS = 16        # validation blocks the ablation and the per-layer cross-entropy read, at most; fewer
ABLATION_WORK = 1e10        # for a large model: parameters x tokens x forwards the ablation may cost, at most
COPY_MARGIN = 0.1           # nats: a second copy's loss this much below the first's is "lower" (less is noise)
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
    """Build out_dir/report.html and out_dir/report.json for cfg (a ReportConfig); -> the page's path. Each is
    written to a temporary name, then renamed."""
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
    mc = model.config
    numbers = {"checkpoint": ckpt, "iter": meta.get("iter"), "model": mc.to_dict(), "tokenizer": type(tok).__name__,
               "notes": notes}                                           # report.json: every number drawn

    sections.append(_training(rows, numbers))
    whence = ("your --prompt" if cfg.prompt else "the start of the validation text (--prompt TEXT for another)"
              if val_text else "a newline (no validation text here; --prompt TEXT for another)")
    sections.append(_tokens(ids, data, whence))
    numbers["prompt"] = {"ids": ids.tolist(), "labels": data["labels"]}
    val_ids = _encode(tok, val_text[:FREQ_CHARS], "validation text") if val_text else None
    order, labels = _by_frequency(tok, val_ids, model.config.vocab_size)
    sections.append(_embeddings(model, order, labels, val_text, numbers))
    data["att"] = numbers["attention"] = np.round(lens.attention(model, ids), 3).tolist()   # (L, nh, T, T)
    sections.append(P.section("attention", "4. Attention", "Where each head of each layer looks from every "
                              "position of the prompt: rows are queries, columns the keys they attend to (darker "
                              "is more, on a square-root scale so that small weights show; hover for the values; "
                              "the future is masked).", ATTENTION_BODY, drawn_by_script=True))
    logits = lens.logit_lens(model, ids)                                        # (L, T, V)
    probs = lens.softmax(logits)
    data["lens"] = numbers["logit_lens"] = [[[(_label(tok, j), round(float(p[j]), 4)) for j in np.argsort(-p)[:5]]
                                             for p in layer] for layer in probs]
    sections.append(P.section("lens", "5. Logit lens", "The next token read from the residual stream after each "
                              "layer (the final LayerNorm and the head applied early; the last layer's row is the "
                              "model's own prediction): top guess and its probability; hover for the top 5, green "
                              "outline where the guess is the prompt's next token.",
                              '<div style="overflow-x:auto"><table class="lens" id="lens-table"></table></div>',
                              drawn_by_script=True))
    sections.append(_next_token(model, tok, context, numbers))
    sections.append(_wrong(model, tok, val_text, cfg.val_chars, numbers))
    data["snaps"] = []
    sections.append(_snapshots(cfg.out_dir, model.config, model.ops, ids, order, labels, val_text, rows, data,
                               numbers))
    sections.append(_circuits(model, order[:len(labels)] if val_text else order, val_ids, run, rows, numbers))
    sections.append(_samples(model, tok, cfg, numbers))
    subtitle = P.esc(f"{ckpt} (iteration {meta.get('iter', '?')}): {model.num_params():,} parameters, "
                     f"{mc.n_layer} layers x {mc.n_head} heads, n_embd {mc.n_embd}, block {mc.block_size}, "
                     f"vocabulary {mc.vocab_size} ({type(tok).__name__}); backend {backends.label(model.ops, False)}"
                     + ("; trained with bf16 products, read here in float32"
                        if meta.get("train_config", {}).get("dtype") == "bf16" else ""))
    if notes:
        subtitle += "<br>" + "<br>".join(f'<span class="note">note: {P.esc(n)}</span>' for n in notes)
    text = P.page("What this model learned", subtitle, sections, data)
    _write(run.report_json, json.dumps(_plain(numbers), separators=(",", ":"), allow_nan=False))
    return _write(run.report, text)


def _write(path, text):
    """text -> path, through a temporary name renamed into place: a reader never sees half a file."""
    try:
        with open(path + PART, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(path + PART, path)
    except OSError as e:                                  # a disk that filled meanwhile, say
        raise UserError(f"cannot write {path!r} ({e.strerror}); free space or pass another --out_dir") from None
    return path


def _plain(x, digits=5):
    """numbers -> what JSON holds: arrays as lists, floats rounded to `digits` significant digits, NaN as null."""
    if isinstance(x, dict):
        return {str(k): _plain(v, digits) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v, digits) for v in x]
    if isinstance(x, np.ndarray):
        return _plain(x.tolist(), digits)
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(f"{x:.{digits}g}") if np.isfinite(x) else None
    return x


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

def _training(rows, numbers):
    steps = [r for r in rows if r.get("kind") == "train"]
    evals = [r for r in rows if r.get("kind") == "eval"]
    numbers["training"] = {"steps": {k: [r.get(k) for r in steps] for k in ("iter", "loss", "lr", "grad_norm",
                                                                             "tokens_per_s")},
                           "evals": [{k: r[k] for k in ("iter", "train_loss", "val_loss", "elapsed", "val_loss_full")
                                      if k in r} for r in evals]}
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


def _by_frequency(tok, val_ids, V):
    """val_ids: the validation text's first FREQ_CHARS characters, encoded (None without validation text) -> (every
    token id, the most frequent there first; the labels of the ids that occur there, in that order): the embedding
    plots label the first ones. Without validation text: the ids in order, all labelled."""
    if val_ids is None:
        return np.arange(V), [_label(tok, i) for i in range(V)]
    counts = np.bincount(val_ids, minlength=V)
    order = np.argsort(-counts, kind="stable")
    return order, [_label(tok, i) for i in order[:np.count_nonzero(counts)]]


def _fitted(order, labels, val_text):
    """The tokens the embedding PCA is fitted on: those that occur in the validation text (the labelled ones), so
    that the first axis is not spent telling them from tokens never trained (a BPE's unused bytes); all without
    validation text or with fewer than 3 of them."""
    return order[:len(labels)] if val_text and len(labels) >= 3 else None


def _embeddings(model, order, labels, val_text, numbers):
    p, fit = model.params(), _fitted(order, labels, val_text)
    xy, share = lens.pca_2d(p["wte.weight"], fit)
    V = model.config.vocab_size
    sim = lens.cosine_similarity(p["wpe.weight"])
    numbers["embeddings"] = {"ids": order, "labels": labels[:300], "xy": xy[order], "variance_share": share,
                             "positions_cosine": np.round(sim, 3)}
    of = "" if fit is None or len(fit) == V else f" of the {len(fit)} that occur"
    body = P.img(P.scatter_figure(xy[order], labels, f"token embeddings, PCA: axes hold {share[0]:.0%} and "
                                  f"{share[1]:.0%} of the variance{of}"), "token embeddings PCA")
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


def _next_token(model, tok, ids, numbers):
    dists, _ = lens.next_token(model, ids, BAR_SETTINGS)
    tables, numbers["next_token"] = [], {}
    for label, probs in dists.items():
        top = [j for j in np.argsort(-probs, kind="stable")[:10] if probs[j] > 0]
        numbers["next_token"][label] = [(_label(tok, j), probs[j]) for j in top]
        rows = "".join(f"<tr><td>{P.esc(_label(tok, j))}</td><td>{probs[j]:.3f}</td>"
                       f'<td><span class="bar" style="width:{200 * probs[j]:.0f}px"></span></td></tr>' for j in top)
        tables.append(f"<div><b>{P.esc(label)}</b><table>{rows}</table></div>")
    return P.section("next", "6. Next token", "The probabilities of the token after the prompt, and how the "
                     "sampler's temperature, top-k and top-p reshape them (its own function).",
                     f'<div class="bars">{"".join(tables)}</div>')


def _wrong(model, tok, val_text, n_chars, numbers):
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
    numbers["wrong"] = {"mean_loss": losses.mean(), "targets": [_label(tok, i) for i in ids[1:]], "losses": losses,
                        "worst": [{"context": P.shown_bytes(b"".join(tok.token_bytes(int(i)) for i in seen(k))),
                                   "target": _label(tok, ids[k + 1]), "loss": losses[k]} for k in worst]}
    items = "".join(f"<li><code>{P.esc(P.shown_bytes(b''.join(tok.token_bytes(int(i)) for i in seen(k))))}</code> "
                    f"\u2192 <b>{P.esc(_label(tok, ids[k + 1]))}</b>: {losses[k]:.2f} nats</li>" for k in worst)
    body = (f"<p>{len(losses)} tokens, mean loss {losses.mean():.4f} nats per token (the evaluator's whole-split "
            f'loss on this stretch).</p><div class="loss"><span>{"".join(spans)}</span></div>'
            f"<h3>The 20 worst tokens (after the context the model had: up to 16 tokens of their block)</h3>"
            f"<ol>{items}</ol>")
    return P.section("wrong", "7. Where the model is wrong", "Validation text coloured by each token's loss "
                     "(redder is more surprising to the model, full red from 5 nats), scored in blocks of "
                     f"block_size {bs} tokens as the evaluator scores them, and the tokens it got most wrong.", body)


def _snapshots(out_dir, config, ops, ids, order, labels, val_text, rows, data, numbers):
    run = OutDir(out_dir)
    iters = run.snapshot_iters()
    numbers["snapshots"] = []
    what = ("The embedding projection and the attention on the prompt (each layer, mean of its heads) at several "
            "points of the run.")
    if not iters:
        return P.section("snapshots", "8. How training changed it", what, '<p class="note">No snapshots in '
                         f'{P.esc(run.snapshots)} (train with --snapshots N).</p>',
                         drawn_by_script=True)
    if len(iters) > MAX_SNAPSHOTS:
        iters = [iters[int(k)] for k in np.linspace(0, len(iters) - 1, MAX_SNAPSHOTS).round()]
    val = {r["iter"]: r["val_loss"] for r in rows if r.get("kind") == "eval"}
    final = None
    figures, other = [], []
    for it, model in _snapshot_models(run, config, ops, iters[::-1], other):   # the last first: the others
        xy, _ = lens.pca_2d(model.params()["wte.weight"], _fitted(order, labels, val_text))
        final = xy if final is None else final
        xy = xy * np.sign(np.sum(xy * final, axis=0) + 1e-30)          # align to it (PCA axes have no sign)
        att = lens.attention(model, ids).mean(axis=1)                   # (L, T, T), mean of the heads
        data["snaps"].insert(0, {"iter": it, "att": np.round(att, 3).tolist()})
        numbers["snapshots"].insert(0, {"iter": it, "val_loss": val.get(it), "xy": xy[order], "attention": data[
            "snaps"][0]["att"]})
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


ROLE_WORDS = {                          # each score in one sentence (circuits.py defines them)
    "previous-token": "the share of a head's attention on the token just before the one it reads from (1: all "
                      "of it, always)",
    "duplicate-token": "the share on earlier places where the token it reads from appeared before",
    "induction": "the share on the token that came right after an earlier copy of the token it reads from: what a "
                 "model looks at to continue a sequence it has seen once before in its context"}
CIRCUITS_WHAT = ("What each attention head does, scored as TransformerLens scores heads, on random tokens repeated "
                 "twice; when in the run it started doing it; and how much the loss needs it.")


def _head(l, h):
    return f"L{l + 1} H{h + 1}"


def _circuits(model, tokens, val_ids, run, rows, numbers):
    """Section 9: the heads' roles at this checkpoint and across the run's snapshots, the in-context loss, the
    ablation grid and the per-layer cross-entropy (circuits.py, lens.layer_losses)."""
    mc, R, th = model.config, circuits.ROLES, circuits.THRESHOLD
    out = numbers["circuits"] = {"roles": list(R), "threshold": th}
    n = min(REPEAT_LEN, mc.block_size // 2)
    if n < 2:
        return P.section("circuits", "9. Circuits: what the heads do", CIRCUITS_WHAT, '<p class="note">The block '
                         f"of {mc.block_size} tokens holds no sequence repeated: no head roles.</p>")
    seqs = circuits.repeated_tokens(np.random.default_rng(0), tokens, REPEAT_BATCH, n)
    scores, first, second = circuits.read_repeats(model, seqs)
    out["sequences"] = {"count": REPEAT_BATCH, "length": n, "tokens_drawn_from": len(tokens), "ids": seqs}
    out["scores"] = dict(zip(R, scores))
    out["copy_loss"] = {"first": first, "second": second}
    body = _roles_part(scores, first, second, n, len(tokens))
    body += _across_part(model, run, rows, seqs, out)
    body += _worth_part(model, val_ids, out)
    return P.section("circuits", "9. Circuits: what the heads do", CIRCUITS_WHAT, body)


def _roles_part(scores, first, second, n, n_tokens):
    R, th = circuits.ROLES, circuits.THRESHOLD
    words = "".join(f"<li><b>{r}</b>: {P.esc(ROLE_WORDS[r])}.</li>" for r in R)
    found, missing = [], []
    for r, s in zip(R, scores):
        top = [(l, h, v) for l, h, v in circuits.top_heads(s, 3) if v >= th]
        if top:
            found.append(f"<b>{r}</b>: " + ", ".join(f"{_head(l, h)} ({v:.2f})" for l, h, v in top))
        else:
            (l, h, v), = circuits.top_heads(s, 1)
            missing.append(r)
            found.append(f"<b>{r}</b>: none (the best, {_head(l, h)}, scores {v:.2f})")
    plain = (f"No head has the {' or the '.join(missing)} role yet: no score reaches {th}." if missing else
             f"Every role has at least one head scoring {th} or more.")
    uses = ("lower: the model uses what it saw earlier in its context" if second < first - COPY_MARGIN else
            "not lower: the model does not yet reuse what it saw earlier in its context")
    return (f"<h3>Head roles at this checkpoint</h3><p>Each score is the share of a head's attention that goes "
            f"where the role looks, averaged over the positions where it can look there, from 0 to 1 (a head "
            f"has the role from {th}):</p><ul>{words}</ul>"
            + P.img(P.roles_figure(scores, R, th), "head-role scores, layer by head")
            + f"<p>{'<br>'.join(found)}</p><p><b>{P.esc(plain)}</b></p>"
            f"<p>Read on {REPEAT_BATCH} sequences of {n} tokens drawn at random from the {n_tokens} tokens of "
            f"the validation text, each followed by itself again. The loss on the second copy is {second:.2f} nats "
            f"per token against {first:.2f} on the first, {uses}.</p>")


def _across_part(model, run, rows, seqs, out):
    """The same scores and copy losses at the run's snapshots (up to CURVE_SNAPSHOTS of them), beside the loss."""
    head = "<h3>When they formed: the run's snapshots</h3>"
    iters = run.snapshot_iters()
    if len(iters) > CURVE_SNAPSHOTS:
        iters = sorted({iters[int(k)] for k in np.linspace(0, len(iters) - 1, CURVE_SNAPSHOTS).round()})
    other = []
    series = circuits.across_snapshots(_snapshot_models(run, model.config, model.ops, iters, other), seqs)
    if not series["iters"]:
        why = "of another model than the checkpoint's" if other else "none here (train with --snapshots N)"
        return head + f'<p class="note">No snapshots to score: {why}.</p>'
    by_role = dict(zip(circuits.ROLES, series["scores"].swapaxes(0, 1)))           # role: (S, L, nh)
    out["snapshots"] = {"iters": series["iters"], "scores": by_role, "first": series["first"],
                        "second": series["second"]}
    steps = [r for r in rows if r.get("kind") == "train"]
    evals = [r for r in rows if r.get("kind") == "eval"]
    best = series["scores"][:, circuits.ROLES.index("induction")].max(axis=(1, 2))   # (S,)
    over = [it for it, v in zip(series["iters"], best) if v >= circuits.THRESHOLD]
    when = (f"first reached {circuits.THRESHOLD} at iteration {over[0]}" if over else
            f"never reached {circuits.THRESHOLD} in these snapshots")
    return (head + P.img(P.across_figure(steps, evals, series, circuits.ROLES, circuits.THRESHOLD),
                         "head-role scores and copy losses across the snapshots")
            + f"<p>{len(series['iters'])} snapshots, iterations {series['iters'][0]} to {series['iters'][-1]}. The "
            f"best induction score went from {best[0]:.2f} to {best[-1]:.2f} ({when}). The loss on the second copy was "
            f"{series['second'][0]:.2f} nats against {series['first'][0]:.2f} on the first at iteration "
            f"{series['iters'][0]}, and {series['second'][-1]:.2f} against {series['first'][-1]:.2f} at iteration "
            f"{series['iters'][-1]}. When an induction head forms, its score rises and the second copy's loss drops "
            "below the first's at the same snapshots.</p>")


def _worth_part(model, val_ids, out):
    """Mean ablation of every head and the per-layer cross-entropy on blocks of the validation text."""
    head = "<h3>What each head is worth</h3>"
    mc = model.config
    cost = model.num_params() * mc.block_size * (mc.n_layer * mc.n_head / 2 + 1)     # per block, all heads
    blocks = _val_blocks(val_ids, mc.block_size, int(np.clip(ABLATION_WORK // cost, 2, ABLATION_BLOCKS)))
    if blocks is None:
        return head + '<p class="note">Too little validation text to score (see the notes at the top).</p>'
    idx, targets = blocks
    base, rises = circuits.ablation(model, idx, targets)
    layer = lens.layer_losses(model, idx, targets)
    names = ["embeddings"] + [f"layer {l + 1}" for l in range(mc.n_layer)]
    out["ablation"] = {"blocks": idx.shape[0], "tokens_per_block": idx.shape[1], "loss": base, "rise": rises}
    out["layer_loss"] = dict(zip(names, layer))
    (l, h, v), = circuits.top_heads(rises, 1)
    idle = int((np.abs(rises) < 0.01).sum())
    cells = "".join(f"<td>{x:.3f}</td>" for x in layer)
    return (head + P.img(P.worth_figure(rises, base, names, layer), "loss rise per ablated head; loss per layer")
            + f"<p>Left: how much the validation loss ({base:.3f} nats on {idx.shape[0]} blocks of {idx.shape[1]} "
            "tokens) rises when one head's output is replaced by its mean over those blocks, position by position "
            f"(mean ablation): the head the loss needs most is {_head(l, h)} ({v:+.3f}); {idle} of {rises.size} "
            "heads change it by less than 0.01. Right: the cross-entropy of the same targets read from the residual "
            "stream before the first layer and after each one, through the final LayerNorm and the head (the logit "
            "lens as numbers; the last is the model's own loss).</p>"
            f'<table class="nums"><tr>{"".join(f"<th>{x}</th>" for x in names)}</tr><tr>{cells}</tr></table>')


def _val_blocks(val_ids, block_size, n):
    """-> (idx, targets) (B, T): up to n consecutive blocks of the validation ids with their next tokens, as the
    evaluator cuts them; at least 2 (the ablation's mean is over them), shorter than block_size if the text is.
    None when it holds fewer than 3 tokens."""
    if val_ids is None or len(val_ids) < 3:
        return None
    T = min(block_size, (len(val_ids) - 1) // 2)
    B = max(2, min(n, (len(val_ids) - 1) // T))
    rows = np.arange(B)[:, None] * T + np.arange(T + 1)                # (B, T+1)
    chunk = np.asarray(val_ids)[rows]
    return chunk[:, :-1], chunk[:, 1:]


def _snapshot_models(run, config, ops, iters, other):
    """(iteration, a model with that snapshot's weights) for each of iters whose snapshot is of config's shape (one
    model, loaded again each time); the iterations of the others (another run's: --ckpt from elsewhere) are appended
    to `other`."""
    model = GPT(GPTConfig(**config.to_dict()), np.random.default_rng(0), ops=ops)
    shape = {k: v for k, v in config.to_dict().items() if k != "dropout"}
    for it in iters:
        meta, params = checkpoint.load_snapshot(run.snapshot(it))
        if any(meta.get("model_config", {}).get(key, v) != v for key, v in shape.items()):
            other.append(it)
            continue
        checkpoint.load_params(model, params, f"snapshot {it}")
        yield it, model


def _samples(model, tok, cfg, numbers):
    numbers["samples"] = []
    if not cfg.samples:
        return P.section("samples", "10. Samples", "Text the model writes.", "<p>--samples 0: none.</p>")
    start = _encode(tok, start_text(tok), "sample prompt")
    rng = np.random.default_rng(cfg.seed)
    out = [nxt for nxt in generate(model.eval(), np.tile(start, (cfg.samples, 1)), cfg.sample_tokens, rng,
                                   temperature=0.8)]
    rows = np.stack(out, axis=1) if out else np.zeros((cfg.samples, 0), int)
    numbers["samples"] = [tok.decode(r) for r in rows]
    body = "".join(f'<pre class="sample">{P.esc(t)}</pre>' for t in numbers["samples"])
    return P.section("samples", "10. Samples", f"{cfg.samples} samples of {cfg.sample_tokens} tokens at temperature "
                     f"0.8 (the sampler's default), each from {_described(start_text(tok))}.", body)


def _described(text):
    """What a sample starts from, in words: 'a newline', or the text quoted (section() escapes it)."""
    return "a newline" if text == "\n" else repr(text)


if __name__ == "__main__":
    sys.exit(run_command(main))

"""The report's page: one self-contained HTML file (inline CSS, JS and PNG figures; no network) from report.py's
numbers. Figures that are only looked at are matplotlib PNGs; the interactive ones (attention, logit lens) are
drawn by the page's own script from the numbers embedded as JSON. The script marks each section it drew
(data-rendered="1") and shows any error at the top of the page, so a browser test can tell both.
"""
import base64
import html
import io
import json
import warnings

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def png(fig):
    """A matplotlib figure -> a data: URI of its PNG (the figure is closed). Labels the font has no glyph for (a
    text in CJK, say) are drawn as boxes, without one warning per character on the terminal."""
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .* missing from", category=UserWarning)
        fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def img(uri, alt):
    return f'<img src="{uri}" alt="{html.escape(alt)}">'


def esc(text):
    return html.escape(text, quote=True)


def shown(piece):
    """A token's text made visible: newlines, tabs and spaces as symbols; other control characters (a byte-level
    BPE's first ids), which the fonts have no glyph for, as \\xNN."""
    piece = piece.replace("\n", "\u21b5").replace("\t", "\u21e5").replace(" ", "\u2423")
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in piece) or "\u2205"


def shown_bytes(b):
    """A token's bytes made visible: as shown(), and each byte that is not part of a UTF-8 character (a lone
    byte >= 0x80 of a byte-level BPE, which decode() makes U+FFFD) as <0xNN>."""
    text = b.decode("utf-8", errors="surrogateescape")              # such a byte -> U+DC00 + the byte
    return ("".join(f"<0x{ord(c) - 0xDC00:02X}>" if "\udc80" <= c <= "\udcff" else shown(c) for c in text)
            or shown(""))


# ----------------------------------------------------------------------------
# figures

def training_figure(steps, evals):
    """log.jsonl rows -> loss against iterations and seconds, lr, gradient norm, tokens/s."""
    fig, ax = plt.subplots(1, 5, figsize=(20, 3.4))
    it = [r["iter"] for r in steps]
    ax[0].plot(it, [r["loss"] for r in steps], color="C0", alpha=0.25, lw=0.8, label="train (each step)")
    for k, (key, label) in enumerate((("train_loss", "train (eval)"), ("val_loss", "val (eval)"))):
        ax[0].plot([r["iter"] for r in evals], [r[key] for r in evals], "o-" if k else "o--", color=f"C{k}",
                   label=label)
        if all("elapsed" in r for r in evals):
            ax[1].plot([r["elapsed"] for r in evals], [r[key] for r in evals], "o-" if k else "o--",
                       color=f"C{k}", label=label)
    for a, key, title in ((ax[2], "lr", "learning rate"), (ax[3], "grad_norm", "gradient norm (before clipping)"),
                          (ax[4], "tokens_per_s", "tokens / s")):
        a.plot(it, [r.get(key, float("nan")) for r in steps], lw=0.8)
        a.set_title(title)
        a.set_xlabel("iteration")
    ax[0].set(title="loss against iterations", xlabel="iteration", ylabel="nats per token")
    ax[1].set(title="loss against seconds", xlabel="seconds of training")
    for a in ax:
        a.grid(alpha=0.3)
    ax[0].legend(fontsize=8)
    return png(fig)


def scatter_figure(xy, labels, title, size=(7, 6), max_labels=300):
    """2-D points, the first of them labelled: labels[k] is the label of xy[k], for k < max_labels (labels may be
    shorter than xy: the points past it are left unlabelled)."""
    fig, ax = plt.subplots(figsize=size)
    ax.scatter(xy[:, 0], xy[:, 1], s=8, color="#8899bb")
    for (x, y), lab in list(zip(xy, labels))[:max_labels]:
        ax.annotate(lab, (x, y), fontsize=8, ha="center", va="center")
    ax.set_title(title, fontsize=10)
    ax.set_xticks([])
    ax.set_yticks([])
    return png(fig)


def matrix_figure(M, title, xlabel, ylabel):
    fig, ax = plt.subplots(figsize=(5, 4.2))
    im = ax.imshow(M, cmap="RdBu_r", vmin=-1, vmax=1)
    fig.colorbar(im, ax=ax, fraction=0.046)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    return png(fig)


def _grid(ax, M, title, cmap, vmin, vmax, fmt):
    """One layer x head heatmap with its value written in each cell (layers down, heads across, both from 1)."""
    n_layer, n_head = M.shape
    im = ax.imshow(M, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
    ax.set_title(title, fontsize=11)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(range(n_head), [str(h + 1) for h in range(n_head)])
    ax.set_yticks(range(n_layer), [str(l + 1) for l in range(n_layer)])
    if M.size <= 256:                                       # room for the numbers (GPT-2's 144 heads still fit)
        size = 9 if M.size <= 64 else 7
        for (l, h), v in np.ndenumerate(M):
            dark = abs(v - vmin) > 0.6 * (vmax - vmin) if cmap != "RdBu_r" else abs(v) > 0.6 * vmax
            ax.text(h, l, format(v, fmt), ha="center", va="center", fontsize=size, color="white" if dark else "black")
    return im


def _grid_size(n_layer, n_head):
    return max(3.4, 0.6 * n_head + 1.6), max(2.4, 0.45 * n_layer + 1.5)


def roles_figure(scores, roles, threshold):
    """scores (n_roles, n_layer, nh) -> one heatmap per role, on the same 0-1 scale, the threshold on the bar."""
    w, h = _grid_size(*scores.shape[1:])
    fig, axes = plt.subplots(1, len(roles), figsize=(min(13, w * len(roles) + 1), h), squeeze=False)
    for ax, s, name in zip(axes[0], scores, roles):
        im = _grid(ax, s, f"{name} score", "Blues", 0.0, 1.0, ".2f")
    bar = fig.colorbar(im, ax=list(axes[0]), fraction=0.03, pad=0.02)
    bar.ax.axhline(threshold, color="#d62728", lw=2)
    bar.set_label(f"share of attention (red: {threshold})")
    return png(fig)


def across_figure(steps, evals, series, roles, threshold):
    """The loss curve of the run, the best head's score for each role at every snapshot, and the loss on the first
    and the second copy of the repeated sequences at every snapshot, side by side against iterations."""
    fig, ax = plt.subplots(1, 3, figsize=(13, 3.6))
    if steps:
        ax[0].plot([r["iter"] for r in steps], [r["loss"] for r in steps], color="C0", alpha=0.25, lw=0.8,
                   label="train (each step)")
    if evals:
        ax[0].plot([r["iter"] for r in evals], [r["val_loss"] for r in evals], "o-", color="C1", ms=3,
                   label="val (eval)")
    ax[0].set(title="loss of the run", xlabel="iteration", ylabel="nats per token")
    it = series["iters"]
    best = series["scores"].max(axis=(2, 3))                     # (S, n_roles): the best head at each snapshot
    for r, name in enumerate(roles):
        ax[1].plot(it, best[:, r], "o-", ms=4, color=f"C{r + 2}", label=name)
    ax[1].axhline(threshold, color="#d62728", ls="--", lw=1, label=f"threshold {threshold}")
    ax[1].set(title="head roles: the best head's score", xlabel="iteration (snapshot)", ylabel="score",
              ylim=(0, 1.38), yticks=np.linspace(0, 1, 6))              # the headroom holds the legend
    ax[2].plot(it, series["first"], "o-", ms=4, color="C7", label="first copy")
    ax[2].plot(it, series["second"], "o-", ms=4, color="C4", label="second copy")      # induction's colour
    ax[2].set(title="loss on a random sequence repeated", xlabel="iteration (snapshot)", ylabel="nats per token")
    ax[2].set_ylim(0, 1.25 * max(float(np.max(series["first"])), float(np.max(series["second"])), 1e-3))
    for a in ax:
        a.grid(alpha=0.3)
    ax[0].legend(fontsize=9)
    ax[1].legend(fontsize=9, ncol=2, loc="upper center")
    ax[2].legend(fontsize=9)
    fig.tight_layout()
    return png(fig)


def worth_figure(rises, base, names, layer_loss):
    """The rise in loss when each head is mean-ablated (a layer x head grid), and the cross-entropy read after each
    layer (bars)."""
    w, h = _grid_size(*rises.shape)
    fig, ax = plt.subplots(1, 2, figsize=(min(13, w + 6.5), max(h, 3.2)), width_ratios=[w, 6])
    top = max(float(np.abs(rises).max()), 1e-3)
    im = _grid(ax[0], rises, f"loss rise when a head is ablated\n(base {base:.3f} nats)", "RdBu_r", -top, top,
               ".3f")
    fig.colorbar(im, ax=ax[0], fraction=0.05, pad=0.03).set_label("nats per token")
    ax[1].bar(range(len(names)), layer_loss, color="#4a7bd0")
    ax[1].set_xticks(range(len(names)), names, rotation=90 if len(names) > 6 else 0)   # upright, they would meet
    for k, v in enumerate(layer_loss):
        ax[1].text(k, v, f"{v:.2f}", ha="center", va="bottom", fontsize=9)
    ax[1].set(title="cross-entropy read from the residual stream", ylabel="nats per token",
              ylim=(0, 1.15 * max(float(np.max(layer_loss)), 1e-3)))
    ax[1].grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return png(fig)


# ----------------------------------------------------------------------------
# the page

CSS = """
body{font:15px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1200px;padding:0 18px 60px;color:#222}
h1{margin:22px 0 4px} h2{margin:34px 0 4px;border-bottom:1px solid #ddd} p.what{margin:2px 0 10px;color:#555}
img{max-width:100%} .note{color:#8a5a00;background:#fff6e0;padding:4px 8px;border-radius:4px;display:inline-block}
#errors{color:#b00020;font-weight:bold;white-space:pre-wrap}
.tok{display:inline-block;margin:2px 1px;padding:1px 4px;border-radius:4px;font-family:monospace;cursor:pointer;
     border:2px solid transparent}
.tok small{display:block;font-size:10px;color:#444;text-align:center} .tok.sel{border-color:#000}
.maps{display:flex;flex-wrap:wrap;gap:10px} .maps figure{margin:0} .maps figcaption{font-size:12px;color:#555}
canvas{image-rendering:pixelated;border:1px solid #ccc}
table.lens{border-collapse:collapse;font-family:monospace;font-size:12px} .lens td,.lens th{border:1px solid #ddd;
     padding:2px 4px;text-align:center;min-width:28px} .lens th{background:#f4f4f4}
table.nums{border-collapse:collapse;font-size:13px} .nums td,.nums th{border:1px solid #ddd;padding:2px 8px;
     text-align:right} .nums th{background:#f4f4f4}
.bars{display:flex;flex-wrap:wrap;gap:22px} .bars table{font-family:monospace;font-size:12px}
.bar{height:12px;background:#4a7bd0;display:inline-block}
.loss{max-height:420px;overflow-y:auto;border:1px solid #ddd;padding:6px} .loss span{font-family:monospace;white-space:pre-wrap} pre.sample{background:#f7f7f7;padding:8px;white-space:pre-wrap}
.snaps{display:flex;flex-wrap:wrap;gap:14px} .snaps figure{margin:0;width:330px} .snaps canvas{margin:1px}
button{margin:2px} #tip{position:fixed;pointer-events:none;background:#222;color:#fff;font-size:12px;padding:2px 6px;
     border-radius:3px;display:none}
"""

SCRIPT = r"""
const D = JSON.parse(document.getElementById('data').textContent);
const errors = [];
window.onerror = (m, s, l) => { errors.push(m + ' (line ' + l + ')'); showErrors(); };
function showErrors() {
  document.getElementById('errors').textContent = errors.join('\n');
  document.body.dataset.errors = String(errors.length);
}
const tip = document.getElementById('tip');
function hover(el, text) {
  el.addEventListener('mousemove', e => { tip.style.display = 'block'; tip.style.left = (e.clientX + 12) + 'px';
    tip.style.top = (e.clientY + 12) + 'px'; tip.textContent = text(e); });
  el.addEventListener('mouseleave', () => { tip.style.display = 'none'; });
}
// square-root scale: a head that spreads its attention over 64 keys still shows where it looks
function heat(v) { const c = Math.round(255 * (1 - Math.sqrt(Math.min(1, Math.max(0, v))))); return `rgb(${c},${c},255)`; }
// one attention map: rows are queries, columns keys; token labels along both axes, at least 10 px apart so
// they stay readable (every other token on a long prompt; hovering a cell names both of its tokens), in a margin
// as wide as the longest label drawn, up to MAX_PAD px. The backing store has devicePixelRatio pixels per CSS
// pixel (sharp on a high-resolution screen); everything below is drawn and hit-tested in CSS pixels.
const MAX_PAD = 100;
function drawMap(canvas, A, labels, cell, sel) {
  const T = A.length, step = Math.ceil(10 / cell), font = Math.min(11, step * cell) + 'px monospace';
  const g = canvas.getContext('2d');
  let pad = 0;
  if (labels) { g.font = font;
    for (let i = 0; i < T; i += step) pad = Math.max(pad, g.measureText(labels[i]).width);
    pad = Math.min(MAX_PAD, Math.ceil(pad) + 6); }
  const size = pad + T * cell, dpr = window.devicePixelRatio || 1;
  canvas.style.width = canvas.style.height = size + 'px';
  canvas.width = canvas.height = Math.round(size * dpr);          // resets the context: transform, font
  g.scale(dpr, dpr);
  g.fillStyle = '#fff'; g.fillRect(0, 0, size, size);
  for (let i = 0; i < T; i++) for (let j = 0; j <= i; j++) {
    g.fillStyle = heat(A[i][j]); g.fillRect(pad + j * cell, pad + i * cell, cell, cell);
  }
  if (sel !== null && sel < T) { g.strokeStyle = '#e0a000'; g.lineWidth = 2;
    g.strokeRect(pad + 1, pad + sel * cell + 1, T * cell - 2, cell - 2); }
  if (labels) {
    g.fillStyle = '#333'; g.font = font; g.textBaseline = 'middle';
    g.textAlign = 'right';
    for (let i = 0; i < T; i += step) g.fillText(labels[i], pad - 3, pad + (i + 0.5) * cell);
    for (let j = 0; j < T; j += step) { g.save(); g.translate(pad + (j + 0.5) * cell, pad - 3);
      g.rotate(-Math.PI / 2); g.textAlign = 'left'; g.fillText(labels[j], 0, 0); g.restore(); }
  }
  hover(canvas, e => {     // offsetX/Y: CSS pixels from the drawing's corner (inside the border)
    const j = Math.floor((e.offsetX - pad) / cell), i = Math.floor((e.offsetY - pad) / cell);
    if (i < 0 || j < 0 || i >= T || j >= T) return '';
    return `query ${i} '${D.labels[i]}' -> key ${j} '${D.labels[j]}': ${j > i ? 'masked' : A[i][j].toFixed(3)}`; });
}
let sel = null, layer = 0;
function tokens() {
  const box = document.getElementById('attn-tokens'); box.innerHTML = '';
  D.labels.forEach((lab, i) => { const s = document.createElement('span'); s.className = 'tok' + (i === sel ? ' sel' : '');
    s.textContent = lab; s.style.background = D.colors[i]; s.onclick = () => { sel = (sel === i ? null : i); attention(); };
    box.appendChild(s); });
}
function attention() {
  tokens();
  const T = D.labels.length, big = Math.max(6, Math.min(16, Math.floor(420 / T)));
  const heads = document.getElementById('attn-heads'); heads.innerHTML = '';
  D.att[layer].forEach((A, h) => { const f = document.createElement('figure'); const c = document.createElement('canvas');
    drawMap(c, A, D.labels, big, sel); f.appendChild(c); const cap = document.createElement('figcaption');
    cap.textContent = `layer ${layer + 1}, head ${h + 1}`; f.appendChild(cap); heads.appendChild(f); });
  const grid = document.getElementById('attn-grid'); grid.innerHTML = '';
  D.att.forEach((L, l) => L.forEach((A, h) => { const f = document.createElement('figure'); const c = document.createElement('canvas');
    drawMap(c, A, null, Math.max(2, Math.floor(120 / T)), sel); c.onclick = () => { layer = l; attention(); };
    f.appendChild(c); const cap = document.createElement('figcaption'); cap.textContent = `L${l + 1} H${h + 1}`;
    f.appendChild(cap); grid.appendChild(f); }));
  const looks = document.getElementById('attn-looks');
  if (sel === null) { looks.textContent = 'Click a token to see where each head looks from it.'; return; }
  const rows = D.att.map((L, l) => L.map((A, h) => { const row = A[sel].map((v, j) => [v, j]).slice(0, sel + 1)
    .sort((a, b) => b[0] - a[0]).slice(0, 3); return `L${l + 1} H${h + 1}: ` +
    row.map(([v, j]) => `'${D.labels[j]}'(${j}) ${v.toFixed(2)}`).join(', '); }).join('\n')).join('\n');
  looks.textContent = `from query ${sel} '${D.labels[sel]}':\n` + rows;
}
function layerButtons() {
  const box = document.getElementById('attn-layers');
  D.att.forEach((_, l) => { const b = document.createElement('button'); b.textContent = 'layer ' + (l + 1);
    b.onclick = () => { layer = l; attention(); }; box.appendChild(b); });
}
function esc(s) {   // a token as text in the HTML built below: "<b" or "&lt" must not become markup
  return String(s).replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');
}
function lens() {
  const t = document.getElementById('lens-table'), T = D.labels.length;
  let h = '<tr><th>after</th>' + D.labels.map((l, i) => `<th title="position ${i}">${esc(l)}</th>`).join('') + '</tr>';
  D.lens.forEach((row, l) => { h += `<tr><th>layer ${l + 1}</th>`; row.forEach((top, i) => { const [lab, p] = top[0];
    const ok = D.next[i] !== null && lab === D.next[i]; const tip = top.map(([a, q]) => `${a} ${q.toFixed(2)}`).join('  ');
    h += `<td style="background:rgba(74,123,208,${p.toFixed(2)})${ok ? ';outline:2px solid #2a2' : ''}" title="${esc(tip)}">${esc(lab)}<br><small>${p.toFixed(2)}</small></td>`; });
    h += '</tr>'; });
  h += '<tr><th>next in prompt</th>' + D.next.map(n => `<th>${n === null ? '' : esc(n)}</th>`).join('') + '</tr>';
  t.innerHTML = h;
}
function snapshots() {
  D.snaps.forEach((s, k) => { const box = document.getElementById('snap-maps-' + k); if (!box) return;
    s.att.forEach((A, l) => { const c = document.createElement('canvas');
      drawMap(c, A, null, Math.max(2, Math.floor(100 / A.length)), null); c.title = 'layer ' + (l + 1) + ', mean of the heads';
      box.appendChild(c); }); });
}
const parts = {attention: () => { layerButtons(); attention(); }, lens: lens, snapshots: snapshots};
for (const [name, draw] of Object.entries(parts)) {
  const sec = document.getElementById('sec-' + name);
  if (!sec) continue;
  try { draw(); sec.dataset.rendered = '1'; } catch (e) { errors.push(name + ': ' + e); }
}
showErrors();
document.body.dataset.rendered = '1';
"""


def section(key, title, what, body, drawn_by_script=False):
    """One section: a heading, one plain sentence of what it shows, its body. Sections without script
    parts are complete as written (data-rendered="1"); the script marks the others when it has drawn them."""
    mark = "" if drawn_by_script else ' data-rendered="1"'
    return (f'<section id="sec-{key}"{mark}>\n<h2>{esc(title)}</h2>\n<p class="what">{esc(what)}</p>\n{body}\n'
            '</section>')


def page(title, subtitle, sections, data):
    payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")     # safe inside <script>
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>{CSS}</style></head>
<body>
<h1>{esc(title)}</h1><p class="what">{subtitle}</p>
<div id="errors"></div><div id="tip"></div>
{chr(10).join(sections)}
<script id="data" type="application/json">{payload}</script>
<script>{SCRIPT}</script>
</body></html>
"""

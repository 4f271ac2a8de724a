"""Induction heads forming in a run of a few minutes: a 2-layer model trained on text in which every segment is
written twice, its report (section 9: what the heads do, and when), and reports/induction.md with the numbers of
that section and reports/induction.png, a picture of it.

    python scripts/induction_experiment.py                       # the experiment docs/report.md describes
    python scripts/induction_experiment.py --optimizer adamw     # the same with AdamW: no induction head yet
    python scripts/induction_experiment.py --render              # only rewrite the report from the run's files

The corpus (--corpus, written once): tiny Shakespeare (downloaded into data/ as train_shakespeare.py does when it
is missing) cut into segments of 10 to 30 characters, each written twice in a row. Inside a segment it is text, so
reading the character before the current one pays off early: a previous-token head. The second copy can be
predicted only by finding the first copy in the context and reading what came after it, which is what an induction
head does with the previous-token head's output; a model of plain text meets that need too rarely to grow one in a
short run. The model: 2 layers of 4 heads, width 64, a block of 64 characters, Muon (the speedrun's optimizer), an
evaluation and a snapshot every 100 steps. Training is scripts/train_shakespeare.py's, run with the flags the report
quotes, so the same command trains it by hand; its report is python -m minigpt.report's.
"""
import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import train_shakespeare  # noqa: E402  (a sibling script: its download and its main)
from bench_util import command, cpu_line, revision, write_keeping_notes  # noqa: E402
from minigpt.config import ScriptParser, run_command  # noqa: E402
from minigpt.errors import UserError  # noqa: E402
from minigpt.outdir import OutDir  # noqa: E402

SEGMENT = (10, 30)                 # characters of a segment, shortest and longest; each is written twice
NOTES = "<!-- notes: hand-written text below this line is kept when the script rewrites the report -->"
WIDTH = 1200                       # the page's width in the picture, in CSS pixels
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--virtual-time-budget=5000"]


def main(argv=None):
    ap = ScriptParser(prog="python scripts/induction_experiment.py", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out_dir", default="out-induction", help="the run's directory (default: %(default)s)")
    ap.add_argument("--text", default=train_shakespeare.DEFAULT_DATA, help="the text cut into segments (default: "
                    "%(default)s, downloaded when missing)")
    ap.add_argument("--corpus", default="data/induction.txt", help="where the corpus is written (default: "
                    "%(default)s)")
    ap.add_argument("--max_iters", type=int, default=3000, help="training steps (default: %(default)s)")
    ap.add_argument("--optimizer", default="muon", help="muon | adamw (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=1337, help="seeds the corpus's cuts and the run (default: "
                    "%(default)s)")
    ap.add_argument("--threads", type=int, default=0, help="the backend's threads (default: 0, all CPUs)")
    ap.add_argument("--md", default=os.path.join(ROOT, "reports", "induction.md"), help="the report written "
                    "from the run ('' for none; default: %(default)s), and its picture beside it (.png)")
    ap.add_argument("--render", action="store_true", help="no training: rewrite --md from --out_dir's files")
    try:
        args = ap.parse_args(argv)
        if args.max_iters < 100:
            raise UserError(f"--max_iters must be at least 100 (a snapshot every 100 steps), got {args.max_iters}")
        flags = train_flags(args)
        if not args.render:
            write_corpus(args.text, args.corpus, args.seed)
            status = train_shakespeare.main(flags)               # trains, plots, samples, writes the report
            if status:
                return status
        if args.md:
            write_md(args, flags)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def write_corpus(text_path, corpus, seed):
    """text -> corpus: the text cut into segments of SEGMENT characters (lengths drawn with seed), each written
    twice in a row. Kept when it is already there with the same content."""
    if text_path == train_shakespeare.DEFAULT_DATA and not os.path.exists(text_path):
        train_shakespeare.download(text_path)
    try:
        with open(text_path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read --text {text_path!r} ({e}); pass a UTF-8 text file") from None
    rng = np.random.default_rng(seed)
    pieces, i = [], 0
    while i < len(text):
        n = int(rng.integers(SEGMENT[0], SEGMENT[1] + 1))
        pieces.append(text[i:i + n] * 2)
        i += n
    body = "".join(pieces)
    if os.path.exists(corpus) and open(corpus, encoding="utf-8").read() == body:
        return
    os.makedirs(os.path.dirname(corpus) or ".", exist_ok=True)
    with open(corpus + ".part", "w", encoding="utf-8") as f:
        f.write(body)
    os.replace(corpus + ".part", corpus)


def train_flags(args):
    """scripts/train_shakespeare.py's flags for the run: the model, Muon's recipe (as the speedrun preset: an LM
    head of its own, the embeddings at 10 times the lr), and an evaluation and a snapshot every 100 steps."""
    n = args.max_iters
    flags = ["--data", args.corpus, "--out_dir", args.out_dir, "--n_layer", "2", "--n_head", "4", "--n_embd", "64",
             "--block_size", "64", "--batch_size", "16", "--max_iters", n, "--lr_decay_iters", n,
             "--optimizer", args.optimizer, "--tie_weights", "false", "--embed_lr_ratio", "10",
             "--eval_interval", "100", "--eval_iters", "10", "--snapshots", n // 100 + 1, "--sample_chars", "200",
             "--seed", args.seed, "--threads", args.threads]
    return [str(f) for f in flags]


# ----------------------------------------------------------------------------
# reports/induction.md and its picture

def write_md(args, flags):
    run = OutDir(args.out_dir)
    try:
        with open(run.report_json, encoding="utf-8") as f:
            numbers = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {run.report_json} ({e}); run the experiment first (without --render)") from None
    picture = os.path.splitext(args.md)[0] + ".png"
    how = section_picture(run.report, picture)
    c = numbers["circuits"]
    steps = [r for r in read_log(run.log) if r.get("kind") == "train"]
    ms = np.median([r["ms"] for r in steps if "ms" in r]) if steps else float("nan")
    evals = numbers["training"]["evals"]
    took = f"{evals[-1]['elapsed']:.0f} s" if evals and "elapsed" in evals[-1] else "?"
    lines = ["# Induction heads forming in a run of a few minutes", "",
             f"Measured by `{command('induction_experiment.py').replace(' --render', '')}` at {revision(ROOT)} on "
             f"{cpu_line()}, {datetime.date.today().isoformat()}: training took {took} ({ms:.1f} ms per step, "
             "median), then the report a few seconds more.", "",
             f"The run: `python scripts/train_shakespeare.py {' '.join(flags)}`, on tiny Shakespeare cut into "
             f"segments of {SEGMENT[0]} to {SEGMENT[1]} characters, each written twice in a row "
             "(`scripts/induction_experiment.py` writes the corpus). What to look for in the picture: "
             "[docs/report.md](../docs/report.md#watching-induction-heads-form-the-experiment).", "",
             f"![The circuits section of the run's report]({os.path.basename(picture)})", "",
             f"The picture: {how}", ""]
    lines += summary(c)
    lines += ["", snapshot_table(c, numbers)]
    write_keeping_notes(args.md, "\n".join(lines), NOTES)
    print(f"wrote {args.md} and {picture}")


def read_log(path):
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass
    return rows


def summary(c):
    """Sentences on when the heads formed: the snapshot where the best induction score first reached the
    threshold, the copy losses before and after, the checkpoint's heads."""
    roles, th = c["roles"], c["threshold"]
    s = c.get("snapshots")
    out = []
    if s:
        ind = np.array(s["scores"]["induction"])                # (S, L, nh)
        best = ind.max(axis=(1, 2))
        over = np.flatnonzero(best >= th)
        if len(over):
            k = int(over[0])
            gap = np.array(s["first"]) - np.array(s["second"])  # what the second copy gains from the first
            out.append(f"The best induction score first reached {th} at iteration {s['iters'][k]} "
                       f"({best[k]:.2f}; {best[max(k - 1, 0)]:.2f} at the snapshot before). The loss on the second "
                       f"copy of a random sequence was {gap[max(k - 1, 0)]:.2f} nats per token below the first "
                       f"copy's at the snapshot before, {gap[k]:.2f} there, and {gap[-1]:.2f} at the end "
                       f"({s['second'][-1]:.2f} against {s['first'][-1]:.2f}).")
        else:
            out.append(f"No head's induction score reached {th} in this run (the best: {best.max():.2f}).")
    heads = []
    for role in roles:
        grid = np.array(c["scores"][role])
        l, h = np.unravel_index(np.argmax(grid), grid.shape)
        heads.append(f"{role} L{l + 1} H{h + 1} ({grid[l, h]:.2f})")
    out.append("At the checkpoint the best head of each role: " + ", ".join(heads) + f" (a head has a role from "
               f"{th}); the loss on the second copy {c['copy_loss']['second']:.2f} against "
               f"{c['copy_loss']['first']:.2f} on the first.")
    if "ablation" in c:
        rise = np.array(c["ablation"]["rise"])
        l, h = np.unravel_index(np.argmax(rise), rise.shape)
        per_layer = ", ".join(f"{k} {v:.3f}" for k, v in c["layer_loss"].items())
        out.append(f"Mean-ablating one head raises the validation loss ({c['ablation']['loss']:.3f}) by up to "
                   f"{rise[l, h]:.3f} (L{l + 1} H{h + 1}); the cross-entropy read after each layer: {per_layer}.")
    return [" ".join(out)]


def snapshot_table(c, numbers):
    s = c.get("snapshots")
    if not s:
        return "(no snapshots)"
    val = {r["iter"]: r["val_loss"] for r in numbers["training"]["evals"]}
    rows = ["| iteration | val loss | previous-token | duplicate-token | induction | loss, first copy | "
            "loss, second copy |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for k, it in enumerate(s["iters"]):
        best = [np.max(s["scores"][r][k]) for r in c["roles"]]
        v = f"{val[it]:.3f}" if it in val else ""
        rows.append(f"| {it} | {v} | " + " | ".join(f"{b:.2f}" for b in best)
                    + f" | {s['first'][k]:.2f} | {s['second'][k]:.2f} |")
    return ("The best head's score for each role, and the loss on the two copies of the report's random sequences, "
            "at every snapshot:\n\n" + "\n".join(rows))


def section_picture(page, png):
    """The report's section 9 alone (the other sections taken out), as headless Chromium draws it WIDTH pixels
    wide, cropped below its end -> png. Without Chromium: the section's figure of the snapshots alone. -> what the
    picture shows, in words."""
    text = open(page, encoding="utf-8").read()
    section = re.search(r'<section id="sec-circuits".*?</section>', text, re.S).group(0)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if chromium is None:
        import base64
        uris = re.findall(r'src="data:image/png;base64,([^"]+)"', section)
        with open(png, "wb") as f:
            f.write(base64.b64decode(uris[1]))                 # roles, snapshots, worth: the second
        return "the figure of the snapshots from the report's section 9 (no Chromium here for the whole section)."
    alone = re.sub(r'<section id="sec-.*?</section>', "", text, flags=re.S).replace(
        '<div id="errors"></div>', '<div id="errors"></div>' + section, 1)       # under the title and subtitle
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "section.html")
        with open(path, "w", encoding="utf-8") as f:
            f.write(alone)
        shot = os.path.join(tmp, "shot.png")
        subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp}/profile", f"--screenshot={shot}",
                        f"--window-size={WIDTH},3000", f"file://{path}"], capture_output=True, timeout=120)
        import matplotlib.image as mpimg
        pixels = mpimg.imread(shot)
    ink = np.flatnonzero((pixels[..., :3] < 0.95).any(axis=(1, 2)))
    mpimg.imsave(png, pixels[:ink[-1] + 20, :, :3])
    return (f"the report's section 9 opened {WIDTH} px wide in headless Chromium (the page's other sections taken "
            "out).")


if __name__ == "__main__":
    sys.exit(run_command(main))

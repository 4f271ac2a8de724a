"""Loss curves of training logs (out_dir/log.jsonl): read_log checks a log row by row, plot draws one or more
runs into one PNG (runs overlaid and labelled). Training's script plots its run at the end with it, and
scripts/plot_losses.py is its command line. Not the report's curves (minigpt/report.py reads a log leniently and
draws its own figures); matplotlib only, no numpy.
"""
import json
import os

from matplotlib.backend_bases import FigureCanvasBase
from matplotlib.figure import Figure                             # not pyplot: no global backend, no figure registry

from .errors import UserError
from .outdir import CURVE, PART

FIX = "pass the log.jsonl a training run wrote in its --out_dir"
NEEDS = {"train": ("iter", "loss"), "eval": ("iter", "train_loss", "val_loss")}   # the keys plot() reads


def read_log(path):
    """The rows of a training log; anything else is a UserError naming the file (and the line). A last line that
    is not JSON and lacks its newline is skipped, not an error: a row torn by a kill mid-write (training's resume
    drops it the same way)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except FileNotFoundError:
        raise UserError(f"log file {path!r} does not exist; {FIX}") from None
    except IsADirectoryError:
        raise UserError(f"log path {path!r} is a directory; pass the log.jsonl inside it") from None
    except UnicodeDecodeError as e:
        raise UserError(f"log file {path!r} is not text (byte offset {e.start} is not UTF-8); {FIX}") from None
    except OSError as e:
        raise UserError(f"cannot read log file {path!r} ({e.strerror}); fix its permissions or {FIX}") from None
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            if n == len(lines) and not line.endswith("\n"):
                continue
            raise UserError(f"line {n} of log file {path!r} is not JSON; {FIX}") from None
        if not isinstance(row, dict) or not isinstance(row.get("kind"), str):
            raise UserError(f"line {n} of log file {path!r} is not a training log row (no \"kind\"); {FIX}")
        missing = [k for k in NEEDS.get(row["kind"], ()) if k not in row]
        if missing:
            raise UserError(f"line {n} of log file {path!r} ({row['kind']} row) lacks {', '.join(missing)}; {FIX}")
        rows.append(row)
    if not any(r["kind"] in NEEDS for r in rows):
        raise UserError(f"log file {path!r} has no train or eval rows; {FIX}")
    return rows


def image_path(out_png):
    """-> (the path plot writes for out_png, its format): a bare name gets .png, as savefig gives it. A directory,
    or a format matplotlib does not write (a --plot that names the training text, say), is a UserError, found
    before a run starts rather than after it ends."""
    if os.path.isdir(out_png):
        raise UserError(f"cannot write {out_png!r}: it is a directory; name a PNG file in it, e.g. "
                        f"{os.path.join(out_png, CURVE)}")
    fmt = os.path.splitext(out_png)[1][1:].lower()               # told to savefig: the temporary name hides it
    if not fmt:
        out_png, fmt = out_png + ".png", "png"
    if fmt not in FigureCanvasBase.get_supported_filetypes():
        raise UserError(f"cannot write {out_png!r}: matplotlib does not write .{fmt} files; name a .png")
    return out_png, fmt


def plot(logs, out_png, labels=None, title="minigpt training"):
    """logs: paths of JSONL logs; -> the path written. Eval rows give the train/val curves; per-iteration losses
    are drawn faintly. A log that is not one, or an out_png that cannot be written (image_path), is a UserError."""
    out_png, fmt = image_path(out_png)
    runs = [read_log(path) for path in logs]                     # every log checked before anything is drawn
    fig = Figure(figsize=(8, 5))
    ax = fig.subplots()
    for i, (path, rows) in enumerate(zip(logs, runs)):
        label = labels[i] if labels else os.path.basename(os.path.dirname(os.path.abspath(path)))
        color = f"C{i}"
        steps = [r for r in rows if r["kind"] == "train"]
        evals = [r for r in rows if r["kind"] == "eval"]
        ax.plot([r["iter"] for r in steps], [r["loss"] for r in steps], color=color, alpha=0.2, lw=0.8)
        ax.plot([r["iter"] for r in evals], [r["train_loss"] for r in evals], "o--", color=color,
                label=f"{label} train")
        ax.plot([r["iter"] for r in evals], [r["val_loss"] for r in evals], "s-", color=color, label=f"{label} val")
    ax.set_xlabel("iteration")
    ax.set_ylabel("cross-entropy loss (nats per token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    tmp = out_png + PART
    try:
        os.makedirs(os.path.dirname(os.path.abspath(out_png)), exist_ok=True)
        fig.savefig(tmp, format=fmt, dpi=120, bbox_inches="tight")
        os.replace(tmp, out_png)                                 # a kill mid-write leaves an old PNG whole
    except OSError as e:
        if os.path.isfile(tmp):
            os.remove(tmp)
        raise UserError(f"cannot write {out_png!r} ({e.strerror}); name a PNG file in a directory you can write "
                        "to") from None
    return out_png

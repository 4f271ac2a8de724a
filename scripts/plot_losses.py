"""Plot one or more training logs (out_dir/log.jsonl) into one PNG, runs overlaid and labelled.

    python scripts/plot_losses.py out/log.jsonl other/log.jsonl -o compare.png

Without -o the PNG goes beside the first log: loss_curve.png for one log (what training writes), else
loss_compare.png. Nothing is written under reports/ unless you ask for it.
"""
import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_log(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def plot(logs, out_png, labels=None, title="minigpt training"):
    """logs: paths of JSONL logs. Eval rows give the train/val curves; per-iteration losses are drawn faintly."""
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, path in enumerate(logs):
        rows = read_log(path)
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
    os.makedirs(os.path.dirname(os.path.abspath(out_png)), exist_ok=True)
    fig.savefig(out_png, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return out_png


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", nargs="+", help="JSONL logs written by training")
    ap.add_argument("-o", "--out", help="the PNG (default: beside the first log, loss_curve.png for one log, "
                                        "loss_compare.png for several)")
    ap.add_argument("--labels", nargs="*", help="one label per log (default: the log's directory name)")
    a = ap.parse_args()
    name = "loss_curve.png" if len(a.logs) == 1 else "loss_compare.png"
    print(plot(a.logs, a.out or os.path.join(os.path.dirname(a.logs[0]), name), a.labels))

"""Plot one or more training logs (out_dir/log.jsonl) into one PNG, runs overlaid and labelled.

    python scripts/plot_losses.py out/log.jsonl other/log.jsonl -o compare.png

Without -o the PNG goes beside the first log: loss_curve.png for one log (what training writes), else
loss_compare.png. Nothing is written under reports/ unless you ask for it.
Every mistake is one line, "error: ...", and exit status 2.
"""
import argparse
import os
import sys

from minigpt.config import ScriptParser, run_command
from minigpt.errors import UserError
from minigpt.loss_curves import plot
from minigpt.outdir import CURVE


def main(argv):
    ap = ScriptParser(prog="plot_losses.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs", nargs="+", metavar="LOG", help="JSONL logs written by training (out_dir/log.jsonl)")
    ap.add_argument("-o", "--out", metavar="PNG", help="the PNG (default: beside the first log, loss_curve.png "
                                                       "for one log, loss_compare.png for several)")
    ap.add_argument("--labels", nargs="*", metavar="LABEL", help="one label per log, after the logs (default: the "
                                                                 "log's directory name)")
    try:
        a = ap.parse_args(argv)
        if a.labels is not None and len(a.labels) != len(a.logs):
            raise UserError(f"--labels got {len(a.labels)} label(s) for {len(a.logs)} log(s); give one label "
                            "per log, or leave --labels out")
        name = CURVE if len(a.logs) == 1 else "loss_compare.png"
        print(plot(a.logs, a.out or os.path.join(os.path.dirname(a.logs[0]), name), a.labels))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(run_command(main, sys.argv[1:]))

"""Train config S (nanoGPT's CPU Shakespeare-char run) on tiny Shakespeare; every setting can be overridden.

    python scripts/train_shakespeare.py                      # defaults: minigpt/config.py TrainConfig
    python scripts/train_shakespeare.py --n_layer=6 --max_iters 500 --data my.txt --out_dir out-mine

Downloads the text into data/ when it is missing; writes out_dir/log.jsonl, checkpoints, snapshots/, the loss
curve (out_dir/loss_curve.png; see --plot), the report (out_dir/report.html; see --report) and prints a sample
at the end. --help lists every setting.
Data-parallel on N processes (pip install -e ".[mpi]"; --batch_size is per process):

    mpiexec -n 2 python scripts/train_shakespeare.py --batch_size 6    # the same steps as one --batch_size 12
"""
import os
import sys
import urllib.request

import numpy as np

from minigpt import distributed
from minigpt.config import TrainConfig, parse_args, run_command
from minigpt.errors import UserError, exit_code
from minigpt.loss_curves import image_path, plot
from minigpt.outdir import OutDir
from minigpt.report import ReportConfig, write_report
from minigpt.sample import generate, start_text
from minigpt.train import interrupted_status, train

URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
DEFAULT_DATA = TrainConfig().data                # data/tinyshakespeare.txt: downloaded when missing


def download(path):
    print(f"downloading tiny Shakespeare to {path} ...", flush=True)
    try:
        with urllib.request.urlopen(URL, timeout=60) as r:
            body = r.read()
    except OSError as e:
        raise UserError(f"could not download {URL} ({e}); save it as {path} yourself, "
                        "or pass --data PATH to any UTF-8 text file") from None
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)           # only now: a failed download leaves nothing
    with open(path + ".part", "wb") as f:
        f.write(body)
    os.replace(path + ".part", path)


def main(argv):
    try:
        cfg = parse_args(argv, description=__doc__)                    # --help: prints, SystemExit(0)
        if cfg.plot:
            image_path(OutDir(cfg.out_dir).curve(cfg.plot))            # a --plot matplotlib cannot write: now
        result = train(cfg, given=cfg.given, fetch=lambda path: path == DEFAULT_DATA and download(path))
    except UserError as e:
        return distributed.exit_status(e, exit_code(e))
    if result["interrupted"] or not distributed.world().root:     # under mpiexec rank 0 plots, samples, reports
        return interrupted_status(result)                         # 130 / 143 after a signal (saved), else 0
    curve = OutDir(cfg.out_dir).curve(cfg.plot)
    if curve:
        label = os.path.basename(os.path.abspath(cfg.out_dir))
        try:
            print(f"loss curve: {plot([result['log']], curve, labels=[label])}")
        except UserError as e:                                          # the run itself succeeded
            print(f"note: no loss curve ({e})", file=sys.stderr)
    if cfg.sample_chars:
        model, tok = result["model"].eval(), result["tokenizer"]
        rng = np.random.default_rng(cfg.seed)
        ids = [int(t[0]) for t in generate(model, tok.encode(start_text(tok))[None], cfg.sample_chars, rng,
                                           temperature=0.8)]
        print("---- sample ----\n" + tok.decode(ids))
    if cfg.report:
        try:
            path = write_report(ReportConfig(out_dir=cfg.out_dir, data=cfg.data, seed=cfg.seed,
                                             backend=result["model"].ops.name, threads=cfg.threads))
            print(f"report: {path}")
        except UserError as e:                                          # the run itself succeeded
            print(f"note: no report ({e})", file=sys.stderr)
    print(f"done: val loss {result['final']['val']:.4f} at iter {result['iter']} "
          f"(best {result['best_val']:.4f}), {result['ms_per_iter']:.1f} ms/iter")
    return 0


if __name__ == "__main__":
    sys.exit(run_command(main, sys.argv[1:]))

"""The training loop, top to bottom: lr -> eval/checkpoint -> forward/backward (accumulated) -> clip -> step -> log.

Three generators, all seeded from cfg.seed: the model's (init, then dropout masks), the batch sampler's,
and the evaluation one, re-created at every eval so that curves are comparable between runs. Checkpoints
carry every state that the next step reads, so a resumed run is bit-identical to an uninterrupted one.
Run it with scripts/train_shakespeare.py or `python -m minigpt.train --data PATH ...`.
"""
import json
import math
import os
import signal
import sys
import time

import numpy as np

from . import checkpoint, kernels as K
from .config import TrainConfig, UserError, check, parse_args
from .data import CharTokenizer, Dataset, load_text
from .model import GPT, GPTConfig
from .optim import AdamW, clip_grad_norm, get_lr


class Diverged(UserError):
    """The loss or gradient norm stopped being finite."""


class StoppedTwice(UserError):
    """A second SIGINT/SIGTERM before the step finished: stop at once, without saving."""


def exit_code(e):
    """The command's exit status for a UserError: 3 diverged, 130 stopped by a second signal, else 2."""
    return 3 if isinstance(e, Diverged) else 130 if isinstance(e, StoppedTwice) else 2


def estimate_loss(model, data, cfg):
    """Mean loss over cfg.eval_iters batches of each split, drawn from a fixed evaluation generator."""
    rng = np.random.default_rng([cfg.seed, 2])
    model.eval()
    out = {}
    for split in ("train", "val"):
        losses = [model.forward(*data.batch(split, cfg.batch_size, cfg.block_size, rng))[1]
                  for _ in range(cfg.eval_iters)]
        out[split] = float(np.mean(losses))
    model.train()
    return out


def train(cfg, given=None, fetch=None):
    """Train per cfg. From the command line, `given` names the settings the user typed: on --resume the others
    come from the checkpoint, and a typed model setting must match it. given=None (a config built in code):
    on --resume only the model's shape comes from the checkpoint, every other setting is cfg's.
    fetch(path), if given, is called when the data file is missing (the script's download)."""
    out_dir = cfg.out_dir
    last_path, best_path = os.path.join(out_dir, "ckpt_last.npz"), os.path.join(out_dir, "ckpt_best.npz")
    log_path = os.path.join(out_dir, "log.jsonl")
    ckpt = _load_resume(cfg, last_path, given) if cfg.resume else None   # settings first: they may change cfg
    check(cfg)
    try:
        K.set_backend(cfg.backend, threads=cfg.threads or None, verbose=True)
    except K.BackendUnavailable as e:
        raise UserError(f"--backend {cfg.backend}: {e}") from None
    _ensure_writable(out_dir)

    # ---- data, model, optimizer (from the last checkpoint when resuming)
    if fetch is not None and not os.path.exists(cfg.data):
        fetch(cfg.data)
    text = load_text(cfg.data)
    tok = CharTokenizer.from_json(ckpt[0]["tokenizer"]) if ckpt else CharTokenizer.from_text(text)
    data = Dataset(text, tok, cfg.block_size, source=cfg.data)
    mcfg = GPTConfig(vocab_size=tok.vocab_size, **cfg.model_dict())
    model = GPT(mcfg, np.random.default_rng([cfg.seed, 0]))
    opt = AdamW(model.params(), (cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay)
    batch_rng = np.random.default_rng([cfg.seed, 1])
    start, best_val = 0, math.inf
    if ckpt:
        meta, params, m, v = ckpt
        checkpoint.load_params(model, params, last_path)
        opt.load_state(meta["adam_t"], m, v)
        model.rng.bit_generator.state = meta["rng"]["model"]
        batch_rng.bit_generator.state = meta["rng"]["batch"]
        start, best_val = meta["iter"], meta["best_val"]
        if start > cfg.max_iters:
            raise UserError(f"{last_path} is at iter {start}, past --max_iters {cfg.max_iters}; raise --max_iters")
        _truncate_log(log_path, start)
        print(f"resuming from {last_path} at iter {start}", flush=True)
    print(f"model: {model.num_params():,} parameters, vocab {tok.vocab_size}, backend {K.backend()}", flush=True)

    def save(path, it):
        meta = {"iter": it, "best_val": best_val, "tokenizer": tok.to_json(), "model_config": mcfg.to_dict(),
                "train_config": cfg.to_dict(), "rng": {"model": model.rng.bit_generator.state,
                                                       "batch": batch_rng.bit_generator.state}}
        checkpoint.save(path, model, opt, meta)

    log = open(log_path, "a", buffering=1)                   # line-buffered: rows reach disk as they are made
    stop = _StopFlag()                                       # restored in the finally below
    tokens_per_iter = cfg.batch_size * cfg.block_size * cfg.grad_accum
    last_loss, t_train, n_timed = None, 0.0, 0
    try:
        for it in range(start, cfg.max_iters + 1):
            if stop.signal:                                  # SIGINT/SIGTERM: save this step, exit cleanly
                save(last_path, it)
                print(f"\n{stop.signal} at iter {it}: saved {last_path}; continue with --resume", flush=True)
                return {"iter": it, "interrupted": stop.signal, "best_val": best_val}
            lr = get_lr(it, cfg.lr, cfg.min_lr, cfg.warmup_iters, cfg.lr_decay_iters)

            # ---- evaluate and checkpoint
            if it % cfg.eval_interval == 0 or it == cfg.max_iters:
                losses = estimate_loss(model, data, cfg)
                log.write(json.dumps({"iter": it, "kind": "eval", "train_loss": losses["train"],
                                      "val_loss": losses["val"], "rss_mb": _rss_mb()}) + "\n")
                print(f"iter {it}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}", flush=True)
                if losses["val"] < best_val:
                    best_val = losses["val"]
                    save(best_path, it)
                save(last_path, it)
            if it == cfg.max_iters:
                break

            # ---- one optimisation step: k micro-batches, each backward seeded with 1/k
            t0 = time.perf_counter()
            model.zero_grad()
            loss = 0.0
            for _ in range(cfg.grad_accum):
                x, y = data.batch("train", cfg.batch_size, cfg.block_size, batch_rng)
                loss += model.forward(x, y)[1] / cfg.grad_accum
                model.backward(scale=1.0 / cfg.grad_accum)
            gnorm = clip_grad_norm(model.grads(), cfg.grad_clip)
            if not (math.isfinite(loss) and math.isfinite(gnorm)):
                raise Diverged(f"non-finite {'loss' if not math.isfinite(loss) else 'gradient norm'} at iter {it} "
                               f"(last finite loss {last_loss}); the weights were not updated or saved. Resume "
                               f"from {last_path} with --resume and a lower --lr (now {cfg.lr}) or --grad_clip")
            opt.step(model.params(), model.grads(), lr)
            dt = time.perf_counter() - t0

            # ---- log
            last_loss = loss
            t_train, n_timed = t_train + dt, n_timed + 1
            log.write(json.dumps({"iter": it, "kind": "train", "loss": loss, "lr": lr, "grad_norm": gnorm,
                                  "ms": 1000 * dt, "tokens_per_s": tokens_per_iter / dt, "rss_mb": _rss_mb()}) + "\n")
            if it % cfg.log_interval == 0 or it == cfg.max_iters - 1:
                eta = (cfg.max_iters - it - 1) * t_train / n_timed
                print(f"iter {it:5d}/{cfg.max_iters} | loss {loss:.4f} | lr {lr:.2e} | {1000 * dt:6.1f} ms | "
                      f"{tokens_per_iter / dt:8,.0f} tok/s | ETA {_fmt_time(eta)}", flush=True)
    finally:
        log.close()
        stop.restore()
    return {"iter": cfg.max_iters, "interrupted": None, "best_val": best_val, "final": losses,
            "train_seconds": t_train, "ms_per_iter": 1000 * t_train / max(1, n_timed), "model": model,
            "tokenizer": tok, "log": log_path}


# ----------------------------------------------------------------------------
# helpers

class _StopFlag:
    """Turns SIGINT/SIGTERM into a flag the loop checks between steps; a second one stops at once."""

    def __init__(self):
        self.signal = None
        self._old = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}

    def _handle(self, signum, frame):
        if self.signal is not None:                          # the second one: the user means now
            self.restore()
            raise StoppedTwice(f"second {signal.Signals(signum).name}: stopped at once without saving this step; "
                               "the checkpoints in --out_dir are intact, continue with --resume")
        self.signal = signal.Signals(signum).name

    def restore(self):
        for s, h in self._old.items():
            signal.signal(s, h)


def _ensure_writable(out_dir):
    try:
        os.makedirs(out_dir, exist_ok=True)
        probe = os.path.join(out_dir, ".write-test")
        with open(probe, "w") as f:
            f.write("ok")
        os.unlink(probe)
    except OSError as e:
        raise UserError(f"cannot write to --out_dir {out_dir!r} ({e.strerror}); pass a writable directory") from None


def _load_resume(cfg, path, given):
    if not os.path.exists(path):
        raise UserError(f"--resume: no checkpoint at {path}; train without --resume first, or point --out_dir "
                        "at the directory of an earlier run")
    ckpt = checkpoint.load(path)
    saved = ckpt[0]["model_config"]
    for k, v in cfg.model_dict().items():
        if given is not None and k in given and saved[k] != v:
            raise UserError(f"--{k} {v} does not match the resumed model's {k}={saved[k]} "
                            f"({path}); drop --{k} or start a new --out_dir")
        setattr(cfg, k, saved[k])                             # the model's shape comes from the checkpoint
    for k, v in ckpt[0]["train_config"].items():             # every other setting too, unless given again
        env = k == "backend" and "MINIGPT_BACKEND" in os.environ                  # the variable counts as typed
        if given is not None and k not in given and k not in ("resume", "out_dir") and not env and hasattr(cfg, k):
            setattr(cfg, k, v)
    return ckpt


def _truncate_log(log_path, start):
    """Keep the rows of iterations before `start`, so a resumed log equals an uninterrupted one."""
    if not os.path.exists(log_path):
        return
    rows = []
    with open(log_path) as f:
        for line in f:
            try:
                if json.loads(line)["iter"] < start:
                    rows.append(line)
            except (ValueError, KeyError, TypeError):              # blank, or torn by a kill mid-write
                pass
    with open(log_path + ".tmp", "w") as f:                        # rewritten beside it, then renamed:
        f.writelines(rows)                                         # a crash here leaves the old log whole
    os.replace(log_path + ".tmp", log_path)


def _rss_mb():
    """Resident memory of this process now (Linux /proc), in MiB; None elsewhere."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20
    except (OSError, ValueError):
        return None


def _fmt_time(s):
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        cfg = parse_args(argv)
        train(cfg, given=cfg.given)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return exit_code(e)
    return 0


if __name__ == "__main__":
    sys.exit(main())

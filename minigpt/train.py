"""The training loop, top to bottom: lr -> eval/checkpoint -> forward/backward (accumulated) -> clip -> step -> log.

Three generators, all seeded from cfg.seed: the model's (init, then dropout's seeds), the batch sampler's,
and the evaluation one, re-created at every eval so that curves are comparable between runs. Checkpoints
carry every state that the next step reads, so a resumed run is bit-identical to an uninterrupted one (with
--max_time the lr follows the clock, so only the budget carries over). The last evaluation also scores the whole
validation split (whole_split_loss), in nats per token and bits per character.
The parts: setup (settings, backend, tokenizer, data, model, optimizer; it removes the temporary files a run
killed while saving left in out_dir), restore (--resume), loop (with evaluate and step).
Run it with scripts/train_shakespeare.py (which also downloads the text, plots the loss curve, samples and writes
report.html) or `python -m minigpt.train --data PATH ...` (training only); --help lists every setting. Under
`mpiexec -n N` it trains data-parallel (minigpt/distributed.py): each rank takes its slice of every batch, one
Allreduce sums the gradients, and rank 0 alone prints and writes.
"""
import contextlib
import json
import math
import os
import signal
import sys
import time

import numpy as np

from . import backends, checkpoint, distributed, gpt2
from .config import (PRESETS, ModelShape, UserError, check, default_backend, parse_args, plot_inside_out_dir,
                     quiet_stdout, run_command)
from .bpe import BPETokenizer
from .tokenizer import tokenizer_from_json
from .data import CharTokenizer, Dataset, load_text, split_text
from .evaluate import estimate_loss, whole_split_loss
from .model import GPT, activation_shapes, gradient_shapes, parameter_shapes
from .sample import select_backend
from .optim import AdamW, Muon, clip_grad_norm, get_lr


class Diverged(UserError):
    """The loss or gradient norm stopped being finite."""


class StoppedTwice(UserError):
    """A second SIGINT/SIGTERM before the step finished: stop at once, without saving."""
    everywhere = False                          # under mpiexec a rank may meet it alone (distributed.exit_status)


class OutOfMemory(UserError):
    """numpy could not allocate an array of the model, its optimizer state or a step's activations."""
    everywhere = False                          # under mpiexec a rank may meet it alone


class CannotSave(UserError):
    """A checkpoint or snapshot could not be written (a full disk, a directory made read-only)."""
    everywhere = False                          # rank 0 alone writes


@contextlib.contextmanager
def _saving(path):
    """An OSError while writing path (a checkpoint, a snapshot) becomes CannotSave: one line that names the fix."""
    try:
        yield
    except OSError as e:
        raise CannotSave(f"cannot write {path} ({e.strerror or e}); free space or make its directory writable, "
                         "then continue with --resume (the checkpoints written before it are whole)") from None


def exit_code(e):
    """The command's exit status for a UserError: 3 diverged, 130 stopped by a second signal, else 2."""
    return 3 if isinstance(e, Diverged) else 130 if isinstance(e, StoppedTwice) else 2


def interrupted_status(result):
    """The command's exit status after a run stopped by a signal and saved: 128 + the signal's number (130 for
    SIGINT, 143 for SIGTERM), as a shell reports a command a signal stopped, so `train && sample` stops too;
    130 on the ranks that stopped because another rank had the signal. 0 for a run that finished."""
    name = result["interrupted"]
    if not name:
        return 0
    return 128 + signal.Signals[name] if name in signal.Signals.__members__ else 130


def train(cfg, given=None, fetch=None):
    """Train per cfg. From the command line, `given` names the settings the user typed: on --resume the others
    come from the checkpoint, and a typed model setting must match it. given=None (a config built in code):
    on --resume only the model's shape and tokenizer come from the checkpoint, every other setting is cfg's.
    fetch(path), if given, is called when the data file is missing (the script's download)."""
    try:
        return loop(setup(cfg, given, fetch))
    except MemoryError as e:                   # past _check_memory's estimate: still one line, not a traceback
        raise OutOfMemory(f"out of memory ({e}); lower --batch_size, --block_size, --n_embd or --n_layer") from None


# ----------------------------------------------------------------------------
# setup: settings, backend, out_dir, data, model, optimizer; on --resume restored from the last checkpoint

class Run:
    """What the loop reads and a checkpoint holds: data, model, optimizer, the batch generator, and the
    position (the next iteration, the best val loss so far). save() writes all of it."""

    def __init__(self, cfg, tok, data, model, opt, world=distributed.World()):
        self.cfg, self.tok, self.data, self.model, self.opt, self.world = cfg, tok, data, model, opt, world
        self.batch_rng = np.random.default_rng([cfg.seed, 1])             # the same on every rank
        self.start, self.best_val = 0, math.inf
        self.last_path, self.best_path, self.log_path = _last_path(cfg), _best_path(cfg), _log_path(cfg)
        self.stop = None                                                   # the loop's _StopFlag
        self.elapsed = 0.0                                                 # seconds of training (--max_time)
        self.stop_agreed = False
        if world.rank > 0:                 # the same init on every rank, but each its own dropout masks
            model.rng.bit_generator.state = np.random.default_rng([cfg.seed, 3, world.rank]).bit_generator.state

    def save(self, path, it):
        """Rank 0 writes; every rank calls it (it gathers each rank's dropout generator)."""
        states = self.world.allgather(self.model.rng.bit_generator.state)
        if not self.world.root:
            return
        settings = {**self.cfg.to_dict(), "data": os.path.abspath(self.cfg.data)}   # found from any directory
        meta = {"iter": it, "best_val": self.best_val, "tokenizer": self.tok.to_json(),  # (resume, eval, report)
                "model_config": self.model.config.to_dict(), "train_config": settings,
                "rng": {"model": states[0], "batch": self.batch_rng.bit_generator.state}, "elapsed": self.elapsed}
        if self.world.size > 1:
            meta["rng"]["model_ranks"], meta["world_size"] = states, self.world.size
        with _saving(path):
            checkpoint.save(path, self.model, self.opt, meta)

    def sync(self, loss):
        """Sum the gradients over the ranks (the model's flat buffer, in place), then the loss and whether a
        signal reached any rank; -> the global loss. Nothing to do in one process."""
        if self.world.size == 1:
            return loss
        self.world.allreduce(self.model.grad_memory)
        both = self.world.allreduce(np.array([loss, self.stop is not None and self.stop.signal is not None]))
        self.stop_agreed = both[1] > 0
        return float(both[0])

    def clock(self, t_start):
        """Seconds of training since t_start; under mpiexec with --max_time, rank 0's (one lr, one end for all)."""
        elapsed = time.perf_counter() - t_start
        return self.world.bcast(elapsed) if self.cfg.max_time and self.world.size > 1 else elapsed

    def schedule(self, it):
        """Where the lr schedule is: iteration it, or with --max_time the elapsed fraction of the budget laid
        over the lr_decay_iters iterations of the schedule (so warmup and decay fit the budget on any machine)."""
        return it if not self.cfg.max_time else self.cfg.lr_decay_iters * self.elapsed / self.cfg.max_time

    def stopping(self):
        """A signal asks to stop: in one process, as soon as it arrives; under mpiexec, once the ranks agree."""
        return self.stop_agreed if self.world.size > 1 else self.stop.signal is not None


def _last_path(cfg):
    return os.path.join(cfg.out_dir, "ckpt_last.npz")


def _best_path(cfg):
    return os.path.join(cfg.out_dir, "ckpt_best.npz")


def _log_path(cfg):
    return os.path.join(cfg.out_dir, "log.jsonl")


def setup(cfg, given=None, fetch=None):
    """Check cfg, select the backend, make out_dir and build the Run (see train() for given and fetch); only
    then, with every setting checked, does a new run clear an old one's files from out_dir (_tidy). Under
    mpiexec rank 0 alone reads the checkpoint, makes out_dir, downloads and tidies; every rank builds the rest.
    An out_dir this call made is removed again, if still empty, when a setting turns out wrong (or on Ctrl-C)."""
    world = distributed.world()
    made = world.root and not os.path.exists(cfg.out_dir)
    try:
        ckpt, settings = world.agree(_prepare, cfg, given, fetch)
        vars(cfg).update(settings)                            # rank 0's settings (the checkpoint's) everywhere
        run = world.check(_build, cfg, ckpt, world)
    except (UserError, KeyboardInterrupt):                   # a wrong setting, or Ctrl-C (during a BPE's training)
        if made and os.path.isdir(cfg.out_dir) and not os.listdir(cfg.out_dir):
            os.rmdir(cfg.out_dir)
        raise
    if world.root:
        _tidy(cfg, ckpt is None)
    return run


def _prepare(cfg, given, fetch):
    """The checkpoint to resume from (its settings applied to cfg), a writable out_dir, the data file."""
    ckpt = _load_resume(cfg, _last_path(cfg), given) if cfg.resume else None   # settings first: they may change cfg
    if cfg.init_from and not ckpt:
        _apply_pretrained(cfg, given)
    check(cfg)
    if cfg.min_lr > cfg.lr:                                   # a default's or preset's --min_lr above a typed --lr
        say(f"note: --min_lr {cfg.min_lr:g} (not typed) is above --lr {cfg.lr:g}; the lr decays to --lr instead, "
            "so it never rises (type --min_lr to set where it ends)")
        cfg.min_lr = cfg.lr
    if not cfg.max_time and 0 < cfg.max_iters <= cfg.warmup_iters:     # a trial run shorter than its warmup
        say(f"note: --warmup_iters {cfg.warmup_iters} is not below --max_iters {cfg.max_iters}: the lr is still "
            f"rising when the run ends (peak --lr {cfg.lr:g} never reached); lower --warmup_iters for a short run")
    if given is not None and "vocab_size" in given and cfg.tokenizer != "bpe":
        raise UserError(f"--vocab_size sets the size of a BPE vocabulary, but this run's tokenizer is "
                        f"{cfg.tokenizer}; add --tokenizer bpe (a new run) or drop --vocab_size")
    if fetch is not None and not os.path.exists(cfg.data):
        fetch(cfg.data)
    load_text(cfg.data)                                        # a missing or unusable text fails before out_dir
    checkpoint.ensure_writable(cfg.out_dir)                    # is made (read again by _build, on every rank)
    return ckpt, dict(vars(cfg))


def _tidy(cfg, new_run):
    """Rank 0, after setup checked everything: the temporary files of a run killed while saving go (checkpoints'
    with a note; the log's, snapshots', report's and curve's silently), and a new run clears the old one's files
    (_start_over)."""
    stale = checkpoint.remove_stale(cfg.out_dir)
    for path in _partial_files(cfg):
        if os.path.isfile(path):
            os.remove(path)
    if new_run:
        _start_over(cfg)
    if stale:
        say(f"note: removed {len(stale)} temporary checkpoint file(s) that a run killed while saving left in "
            f"{cfg.out_dir} ({', '.join(n for n, _ in stale)}: {sum(b for _, b in stale) / 2 ** 20:.1f} MB)")


def _partial_files(cfg):
    """The temporary names under which a run writes its other files (the log when it is cut, the report, the
    curve, the snapshots) before renaming them into place: what a kill mid-write leaves in out_dir."""
    snaps = os.path.join(cfg.out_dir, checkpoint.SNAPSHOT_DIR)
    names = os.listdir(snaps) if os.path.isdir(snaps) else ()
    return [_log_path(cfg) + ".tmp", os.path.join(cfg.out_dir, "report.html.part"), (cfg.plot_path() or "") + ".part",
            *(os.path.join(snaps, n) for n in names if n.startswith("iter_") and n.endswith(".npz.part"))]


def _typed(v):
    """A setting's value as the command line spells it: booleans lower-case (--bias false)."""
    return str(v).lower() if isinstance(v, bool) else v


def _apply_pretrained(cfg, given):
    """--init_from: the model's shape comes from the GPT-2 directory's config.json; a typed model setting that
    differs, or a tokenizer setting, is an error (the tokenizer is the directory's too)."""
    config, _ = gpt2.read_config(cfg.init_from, cfg.block_size)
    typed = given if given is not None else frozenset()
    for k in ("n_layer", "n_head", "n_embd", "bias", "tie_weights", "activation", "qk_norm", "logit_cap"):
        if k in typed and getattr(cfg, k) != getattr(config, k):
            raise UserError(f"--{k} {_typed(getattr(cfg, k))} conflicts with {cfg.init_from}'s "
                            f"{k}={_typed(getattr(config, k))} (config.json); drop --{k}")
        setattr(cfg, k, getattr(config, k))
    if typed & {"tokenizer", "vocab_size"}:
        raise UserError("--tokenizer/--vocab_size: with --init_from the tokenizer is the directory's (GPT-2's); "
                        "drop them")


def _build(cfg, ckpt, world):
    threads = cfg.threads or (None if world.size == 1 else max(1, backends.cpus() // world.local_size))
    select_backend(cfg, verbose=world.root, threads=threads)
    text = load_text(cfg.data)
    if cfg.init_from and not ckpt:                         # a new fine-tune: GPT-2's shape, weights and tokenizer
        gpt2_config, gpt2_params, tok = gpt2.load_gpt2(cfg.init_from, cfg.block_size)
        vocab = gpt2_config.vocab_size
    else:
        tok = make_tokenizer(cfg, text, ckpt)
        vocab = ckpt[0]["model_config"]["vocab_size"] if ckpt else tok.vocab_size    # ckpt: (meta, params, state)
        gpt2_params = None
    data = Dataset(text, tok, cfg.block_size, source=cfg.data, fixed_block=bool(ckpt))
    _check_memory(cfg, vocab, world)
    model = GPT(cfg.model_config(vocab), np.random.default_rng([cfg.seed, 0]), bf16=cfg.dtype == "bf16")
    if gpt2_params is not None:
        checkpoint.load_params(model, gpt2_params, cfg.init_from)
        say(f"init from {cfg.init_from}: GPT-2 weights and tokenizer")
    opt = make_optimizer(cfg, model)
    run = Run(cfg, tok, data, model, opt, world)
    if ckpt:
        restore(run, ckpt)
    ranks = f", {world.size} ranks x {backends.threads()} threads" if world.size > 1 else ""
    bf16 = ", bf16 products" if model.bf16 else ""
    say(f"model: {model.num_params():,} parameters, vocab {tok.vocab_size}, "
        f"backend {backends.label(model.bf16)}{ranks}{bf16}")
    return run


def _check_memory(cfg, vocab, world):
    """A run that cannot fit is refused before numpy fails halfway through (or Linux kills the process): the
    weights, gradients and two optimizer moments (float32), and one step's activations and their gradients at
    (--batch_size, --block_size), times the processes on this machine, against the memory (swap included) that
    /proc/meminfo says is available. Elsewhere no check."""
    avail = _available_bytes()
    if avail is None:
        return
    mc = cfg.model_config(vocab)
    floats = lambda shapes: sum(math.prod(s) for s in shapes.values())             # noqa: E731
    B, T = cfg.batch_size, cfg.block_size
    need = 4 * (4 * floats(parameter_shapes(mc)) + floats(activation_shapes(mc, B, T, dropout=cfg.dropout > 0))
                + floats(gradient_shapes(mc, B, T))
                + B * mc.n_head * T * T * (2 if cfg.dropout > 0 else 1)) * world.local_size   # attention's d(scores)
                                                                # and, under dropout, attd: the backend's scratch
    if need > avail:
        raise UserError(f"this run needs about {need / 2 ** 30:,.1f} GiB (weights, gradients, optimizer state and "
                        f"one step's activations at --batch_size {B} --block_size {T}) but {avail / 2 ** 30:,.1f} "
                        "GiB is available; lower --batch_size, --block_size, --n_embd or --n_layer")


def _available_bytes():
    """MemAvailable + SwapFree of /proc/meminfo in bytes; None where there is no such file."""
    try:
        with open("/proc/meminfo") as f:
            kb = {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in f)}
        return 1024 * (kb["MemAvailable"] + kb.get("SwapFree", 0))
    except (OSError, KeyError, ValueError):
        return None


def make_optimizer(cfg, model):
    """AdamW over every parameter, or Muon for the blocks' matrices with AdamW for the rest (minigpt/optim.py)."""
    betas, params = (cfg.beta1, cfg.beta2), model.params()
    if cfg.optimizer == "muon":
        opt = Muon(params, lr_ratio=cfg.muon_lr_ratio, betas=betas, weight_decay=cfg.weight_decay,
                   muon_weight_decay=cfg.weight_decay, momentum_warmup=cfg.muon_momentum_warmup, bf16=model.bf16)
    else:
        opt = AdamW(params, betas, weight_decay=cfg.weight_decay)
    return opt.scale_lr(("wte.weight", "wpe.weight"), cfg.embed_lr_ratio)


def make_tokenizer(cfg, text, ckpt=None):
    """The checkpoint's tokenizer on --resume; else characters of the whole text (as nanoGPT), or a BPE trained
    on the training split (the same on every rank: training is deterministic)."""
    if ckpt:
        return tokenizer_from_json(ckpt[0]["tokenizer"])
    if cfg.tokenizer == "bpe":
        t0 = time.perf_counter()
        tok = BPETokenizer.train(split_text(text)[0], cfg.vocab_size)
        say(f"BPE: {tok.vocab_size} tokens trained in {time.perf_counter() - t0:.1f} s")
        if tok.vocab_size < cfg.vocab_size:                  # train() stops when no adjacent pair is left
            say(f"note: --vocab_size {cfg.vocab_size} asked, but the BPE vocabulary has {tok.vocab_size} tokens: "
                f"after {len(tok.merges)} merges the training split has no more pairs to merge")
        return tok
    return CharTokenizer.from_text(text)


def restore(run, ckpt):
    """Continue where ckpt = checkpoint.load(...) stopped: weights, optimizer state, generators, position, time.
    The log keeps only the rows before that point, so it ends up equal to an uninterrupted run's."""
    meta, params, state = ckpt
    checkpoint.load_params(run.model, params, run.last_path)
    try:
        run.opt.load_state(state["t"], state["slots"], state["name"])
    except ValueError as e:
        was = meta["train_config"].get("optimizer", "adamw")
        raise UserError(f"{run.last_path}: {e}; the run used --optimizer {was}: resume with it, or start a new "
                        "--out_dir") from None
    dropout = meta["rng"].get("model_ranks", [meta["rng"]["model"]])  # one state per rank that saved it
    if run.world.rank < len(dropout):                                  # a rank new to the run keeps its fresh seed
        run.model.rng.bit_generator.state = dropout[run.world.rank]
    run.batch_rng.bit_generator.state = meta["rng"]["batch"]
    run.start, run.best_val, run.elapsed = meta["iter"], meta["best_val"], meta.get("elapsed", 0.0)
    if run.start > run.cfg.max_iters:
        raise UserError(f"{run.last_path} is at iter {run.start}, past --max_iters {run.cfg.max_iters}; "
                        "raise --max_iters")
    if 0 < run.cfg.max_time <= run.elapsed:
        raise UserError(f"{run.last_path} has spent its time budget ({run.elapsed:.0f} s of --max_time "
                        f"{run.cfg.max_time:g}); raise --max_time to continue")
    if run.world.root:
        _truncate_log(run.log_path, run.start)
    say(f"resuming from {run.last_path} at iter {run.start}")
    if run.start == run.cfg.max_iters:
        say(f"note: iter {run.start} is --max_iters: no steps are left to train, only the final evaluation; raise "
            "--max_iters to train on")
    saved, batch = meta.get("world_size", 1), meta["train_config"].get("batch_size", run.cfg.batch_size)
    if saved != run.world.size:                                # a step draws ranks x B rows from one generator
        same = saved * batch == run.world.size * run.cfg.batch_size
        say(f"note: the checkpoint was made by {saved} process(es) and {run.world.size} continue: each step now "
            f"takes {run.world.size} x {run.cfg.batch_size} sequences (before: {saved} x {batch}), " +
            ("the same rows as before" if same else "so the data order from here on differs from the run's"))


# ----------------------------------------------------------------------------
# the loop: lr -> eval/checkpoint -> accumulate -> clip -> step -> log

def loop(run):
    """Iterations run.start .. max_iters, or until --max_time seconds are spent; returns the result dict (a
    shorter one when a signal stopped it)."""
    cfg = run.cfg
    # log.jsonl, line-buffered: each row reaches disk as it is made
    log = open(run.log_path if run.world.root else os.devnull, "a", buffering=1)
    run.stop = stop = _StopFlag()                            # SIGINT/SIGTERM handlers, restored in the finally below
    last_loss, t_train, n_timed = None, 0.0, 0
    t_start = time.perf_counter() - run.elapsed              # a resumed run spends what is left of the budget
    try:
        for it in range(run.start, cfg.max_iters + 1):
            run.elapsed = run.clock(t_start)
            if run.stopping():                               # SIGINT/SIGTERM: save this step, exit cleanly
                run.save(run.last_path, it)
                name = stop.signal or "a signal to another rank"
                say(f"\n{name} at iter {it}: saved {run.last_path}; continue with --resume")
                return {"iter": it, "interrupted": name, "best_val": run.best_val}
            last = it == cfg.max_iters or 0 < cfg.max_time <= run.elapsed
            lr = get_lr(run.schedule(it), cfg.lr, cfg.min_lr, cfg.warmup_iters, cfg.lr_decay_iters, cfg.cooldown)
            if it % cfg.eval_interval == 0 or last:
                losses = evaluate_and_checkpoint(run, it, log, final=last)
            if last and run.stopping():                      # a signal during the final evaluation: saved
                name = stop.signal or "a signal to another rank"
                say(f"\n{name} during the final evaluation: saved {run.last_path} at iter {it}, the run's end")
                return {"iter": it, "interrupted": name, "best_val": run.best_val}
            if last:
                if cfg.max_time and run.elapsed < cfg.max_time:
                    say(f"note: --max_iters {cfg.max_iters} ended the run {cfg.max_time - run.elapsed:.0f} s before "
                        f"--max_time, with the lr still at {lr:.2e}; raise --max_iters to spend the budget")
                break
            loss, gnorm, dt = step(run, it, lr, last_loss)
            last_loss, t_train, n_timed = loss, t_train + dt, n_timed + 1
            eta = (cfg.max_iters - it - 1) * t_train / n_timed
            if cfg.max_time:
                eta = min(eta, cfg.max_time - run.elapsed)
            _log_step(log, run, it, loss, lr, gnorm, dt, eta)
    finally:
        log.close()
        stop.restore()
    return {"iter": it, "interrupted": None, "best_val": run.best_val, "final": losses,
            "train_seconds": t_train, "ms_per_iter": 1000 * t_train / max(1, n_timed), "model": run.model,
            "tokenizer": run.tok, "log": run.log_path}


def evaluate_and_checkpoint(run, it, log, final=False):
    """Both splits' loss into the log; checkpoint ckpt_last (and ckpt_best when val improved). The final one
    also measures the whole validation split, in nats per token and bits per character."""
    losses = estimate_loss(run.model, run.data, run.cfg, run.world)
    run.world.same_weights(run.model.params())
    row = {"iter": it, "kind": "eval", "train_loss": losses["train"], "val_loss": losses["val"],
           "elapsed": run.elapsed, "rss_mb": _rss_mb()}
    say(f"iter {it}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
    if final:
        val = run.data.splits["val"]
        full = whole_split_loss(run.model, val, run.cfg.block_size, run.cfg.batch_size, run.world)
        chars = len(run.tok.decode(val[1:]))                 # the characters the targets spell
        losses["val_full"] = row["val_loss_full"] = full
        losses["val_bpc"] = row["val_bpc"] = full * (len(val) - 1) / (chars * math.log(2))
        say(f"iter {it}: val loss over the whole split {full:.4f} ({losses['val_bpc']:.4f} bits per character)")
    log.write(json.dumps(row) + "\n")
    if losses["val"] < run.best_val:
        run.best_val = losses["val"]
        run.save(run.best_path, it)
    run.save(run.last_path, it)
    if run.world.root and _snapshot_due(run, it, final):
        with _saving(os.path.join(run.cfg.out_dir, checkpoint.SNAPSHOT_DIR)):
            checkpoint.save_snapshot(run.cfg.out_dir, run.model, it, run.elapsed)
    return losses


def _snapshot_due(run, it, final):
    """--snapshots N spread over the run: at the first evaluation at or past each of the fractions 0, 1/(N-1),
    ..., 1 of --max_iters (of --max_time when it is set), the final evaluation always among them (a resumed run
    that raised --max_iters adds its own end to the N it took before)."""
    n, cfg = run.cfg.snapshots, run.cfg
    if n == 0 or run.model.num_params() > checkpoint.MAX_SNAPSHOT_PARAMS:
        return False
    if final or n == 1:
        return final
    taken = sum(i < it for i in checkpoint.snapshot_iters(cfg.out_dir))
    if taken >= n - 1:                                       # the last of the N is the final evaluation's
        return False
    progress = run.elapsed / cfg.max_time if cfg.max_time else it / max(1, cfg.max_iters)
    return progress >= taken / (n - 1)


def step(run, it, lr, last_loss):
    """One optimisation step: grad_accum micro-batches on each of the N ranks, each backward seeded with
    1/(grad_accum N), the ranks' gradients summed (run.sync), then clip and the optimizer's step. A non-finite loss
    or gradient norm raises Diverged before the weights change. -> (loss, gnorm, seconds)"""
    cfg, model, world = run.cfg, run.model, run.world
    t0 = time.perf_counter()
    model.zero_grad()
    loss, k = 0.0, cfg.grad_accum * world.size                # k: micro-batches in the step, over all ranks
    for _ in range(cfg.grad_accum):
        x, y = run.data.batch("train", cfg.batch_size, cfg.block_size, run.batch_rng, world.rank, world.size)
        loss += model.forward(x, y)[1] / k
        model.backward(scale=1.0 / k)
    loss = run.sync(loss)
    gnorm = clip_grad_norm(model.grad_memory, cfg.grad_clip)
    if not (math.isfinite(loss) and math.isfinite(gnorm)):
        raise Diverged(f"non-finite {'loss' if not math.isfinite(loss) else 'gradient norm'} at iter {it} "
                       f"(last finite loss {last_loss}); the weights were not updated or saved. Resume "
                       f"from {run.last_path} with --resume and a lower --lr (now {cfg.lr}) or --grad_clip")
    run.opt.step(model.params(), model.grads(), lr)
    return loss, gnorm, time.perf_counter() - t0


def _log_step(log, run, it, loss, lr, gnorm, dt, eta):
    """Every step into the log; a progress line every log_interval steps and at the last (tokens of all ranks)."""
    cfg = run.cfg
    tokens_per_iter = cfg.batch_size * cfg.block_size * cfg.grad_accum * run.world.size
    log.write(json.dumps({"iter": it, "kind": "train", "loss": loss, "lr": lr, "grad_norm": gnorm,
                          "elapsed": run.elapsed, "ms": 1000 * dt, "tokens_per_s": tokens_per_iter / dt,
                          "rss_mb": _rss_mb()}) + "\n")
    if it % cfg.log_interval == 0 or it == cfg.max_iters - 1:
        where = f"{it:5d} | {run.elapsed:.0f}/{cfg.max_time:g} s" if cfg.max_time else f"{it:5d}/{cfg.max_iters}"
        say(f"iter {where} | loss {loss:.4f} | lr {lr:.2e} | {1000 * dt:6.1f} ms | "       # --max_time: the budget,
            f"{tokens_per_iter / dt:8,.0f} tok/s | ETA {_fmt_time(eta)}")                   # not the iteration cap


# ----------------------------------------------------------------------------
# helpers

def say(msg):
    """Print on rank 0 only: every rank of a data-parallel run has the same thing to say. If stdout's reader
    went away (`| head`), the loop stops as on a signal, saving (SIGPIPE); outside the loop the command ends."""
    if distributed.world().root:
        try:
            print(msg, flush=True)
        except BrokenPipeError:
            quiet_stdout()
            if _StopFlag.active is None:
                raise                                        # run_command: exit status 141
            _StopFlag.active.signal = _StopFlag.active.signal or "SIGPIPE"


class _StopFlag:
    """Turns SIGINT/SIGTERM into a flag the loop checks between steps; a second one stops at once."""

    active = None                                            # the running loop's flag (say() sets SIGPIPE)

    def __init__(self):
        self.signal = None
        self._old = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        _StopFlag.active = self

    def _handle(self, signum, frame):
        if self.signal is not None:                          # the second one: the user means now
            self.restore()
            raise StoppedTwice(f"second {signal.Signals(signum).name}: stopped at once without saving this step; "
                               "the checkpoints in --out_dir are intact, continue with --resume")
        self.signal = signal.Signals(signum).name

    def restore(self):
        for s, h in self._old.items():
            signal.signal(s, h)
        _StopFlag.active = None


def _load_resume(cfg, path, given):
    best = _best_path(cfg)
    if not os.path.exists(path):
        copy = f"copy {best} to {path} to continue from the best one, or " if os.path.exists(best) else ""
        raise UserError(f"--resume: no checkpoint at {path}; {copy}train without --resume first, or point "
                        "--out_dir at the directory of an earlier run")
    fix = "start a new --out_dir"
    if os.path.exists(best) and os.path.abspath(best) != os.path.abspath(path):
        fix = f"copy {best} over {path} to resume from the best one, or {fix}"
    ckpt = checkpoint.load(path, fix=fix)
    saved = {**ModelShape().model_dict(), **ckpt[0]["model_config"]}   # older checkpoints: today's defaults
    for k, v in cfg.model_dict().items():
        if given is not None and k in given and saved[k] != v:
            preset = PRESETS.get(cfg.preset, {}).get(k) == v               # the preset set it (or a typed twin)
            fix = f"drop --preset {cfg.preset}, which sets {k}={_typed(v)}" if preset else f"drop --{k}"
            raise UserError(f"--{k} {_typed(v)} does not match the resumed model's {k}={_typed(saved[k])} "
                            f"({path}); {fix} or start a new --out_dir")
        setattr(cfg, k, saved[k])                             # the model's shape comes from the checkpoint
    trained = ckpt[0]["train_config"]                         # so does the tokenizer (older runs: char)
    for k in ("tokenizer", "vocab_size") if trained.get("tokenizer", "char") == "bpe" else ("tokenizer",):
        was = trained.get(k, "char")
        if given is not None and k in given and getattr(cfg, k) != was:
            raise UserError(f"--{k} {getattr(cfg, k)} does not match the resumed run's {k}={was} ({path}); "
                            f"drop --{k} or start a new --out_dir")
    for k, v in ckpt[0]["train_config"].items():             # every other setting too, unless given again
        env = k == "backend" and default_backend(unset=None) is not None          # the variable counts as typed
        # older runs could plot into reports/ or anywhere; now the curve goes inside out_dir
        legacy = k == "plot" and (os.path.dirname(v) == "reports" or not plot_inside_out_dir(v))
        if given is not None and k not in given and k not in ("resume", "out_dir") and not env and not legacy \
                and hasattr(cfg, k):
            setattr(cfg, k, v)
    return ckpt


def _start_over(cfg):
    """A new run (no --resume) in an out_dir that holds another (its log, last checkpoint or snapshots): the old
    log, snapshots, report and loss curve go, as its checkpoints are replaced, so that what the directory shows
    is this run's alone (also when this run makes no report or plot, or stops before it does). An out_dir that
    holds no run keeps every file: a report.html or a PNG there is someone else's."""
    out_dir = cfg.out_dir
    log = _log_path(cfg)
    logged = os.path.exists(log) and os.path.getsize(log) > 0
    if not (logged or os.path.exists(_last_path(cfg)) or checkpoint.snapshot_iters(out_dir)):
        return
    gone = checkpoint.remove_snapshots(out_dir)
    say(f"note: {out_dir} held a run (a log.jsonl, {gone} snapshot(s)): this new run replaces its log, "
        "snapshots, report, loss curve and checkpoints; --resume would have continued it")
    made = [os.path.join(out_dir, "report.html"), os.path.join(out_dir, "loss_curve.png"),   # the report, the
            cfg.plot_path() or ""]                                  # default --plot, this run's
    for path in [log] + made:
        if os.path.isfile(path) and not _same_file(path, cfg.data):    # never the text it trains on
            os.remove(path)


def _same_file(a, b):
    try:
        return os.path.samefile(a, b)
    except OSError:                                                  # b is gone (or a): not the same
        return False


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


SCRIPT_ONLY = {"plot", "report", "sample_chars"}       # settings only scripts/train_shakespeare.py acts on
DESCRIPTION = ("Train a GPT on a UTF-8 text file; writes out_dir/log.jsonl, checkpoints and snapshots/ (training only: "
               "scripts/train_shakespeare.py also downloads, plots, samples and writes report.html).")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        cfg = parse_args(argv, prog="python -m minigpt.train", description=DESCRIPTION)   # --help: SystemExit(0)
        skipped = sorted(k for k in SCRIPT_ONLY & cfg.given if getattr(cfg, k))   # asked for: not --plot '' etc.
        if skipped:
            flags = ", ".join("--" + k for k in skipped)
            say(f"note: python -m minigpt.train does not plot, sample or report: {flags} ignored "
                "(scripts/train_shakespeare.py does all three)")
        result = train(cfg, given=cfg.given)
    except UserError as e:
        return distributed.exit_status(e, exit_code(e))
    return interrupted_status(result)


if __name__ == "__main__":
    sys.exit(run_command(main))

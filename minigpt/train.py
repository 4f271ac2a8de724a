"""Training, top to bottom: settings -> setup -> resume -> the loop -> the final evaluation.

    train(cfg)
      start            the Run, ready for its first step:
        settings       on --resume the checkpoint's first, then every check (config.check), the data, out_dir
        setup          the backend, the tokenizer, the data, the model, the optimizer
        restore        --resume puts back the checkpoint's weights, optimizer state, generators and position
      training_loop    lr -> eval/checkpoint -> forward/backward (accumulated) -> sync -> clip -> step -> log;
                       the last evaluation also scores the validation split, each token once (its first
                       --val_tokens), in nats per token and bits per character

Three generators, all seeded from cfg.seed: the model's (init, then dropout's seeds), the batch sampler's, and the
evaluation one, re-created at every eval so that curves are comparable between runs. A checkpoint carries every
state the next step reads, so a resumed run is bit-identical to an uninterrupted one (with --max_time the lr follows
the clock, so only the budget carries over). The run's files and their names belong to minigpt/outdir.py.
Run it with scripts/train_shakespeare.py (which also downloads the text, plots the loss curve, samples and writes
report.html) or `python -m minigpt.train --data PATH ...` (training only); --help lists every setting. Under
`mpiexec -n N` it trains data-parallel: each rank takes its slice of every batch, and minigpt/distributed.py's World
sums the gradients, keeps one clock and agrees on a stop; rank 0 alone prints and writes.
"""
import contextlib
import json
import math
import os
import signal
import sys
import time
from dataclasses import dataclass

import numpy as np

from . import backends, checkpoint, distributed, gpt2
from .backends import select_backend
from .bpe import BPETokenizer
from .config import (PRESETS, ModelShape, TrainConfig, check, default_backend, parse_args, plot_inside_out_dir,
                     quiet_stdout, run_command)
from .data import CharTokenizer, Dataset, load_text, split_text
from .shards import open_prepared, tokenizer_from_path
from .errors import CannotSave, Diverged, OutOfMemory, StoppedTwice, UserError, exit_code
from .model import GPT, activation_shapes, gradient_shapes, parameter_shapes
from .optim import AdamW, Muon, clip_grad_norm, get_lr
from .outdir import MAX_SNAPSHOT_PARAMS, OutDir
from .tokenizer import tokenizer_from_json


VAL_PROGRESS_TOKENS = 1_000_000        # a final score of more tokens says first that it is under way
PROGRESS_SECONDS = 10                  # and then how far it is, this often


@dataclass
class Run:
    """What a run is made of (setup) and carries from step to step; a checkpoint holds all of it."""
    cfg: TrainConfig
    out: OutDir
    world: distributed.World
    tok: object                       # CharTokenizer, BPETokenizer or GPT2Tokenizer
    data: Dataset
    model: GPT
    opt: object                       # AdamW or Muon
    batch_rng: np.random.Generator    # the same on every rank
    it: int = 0                       # the next iteration
    best_val: float = math.inf        # the best evaluation's val loss so far
    elapsed: float = 0.0              # seconds of training (--max_time)


def train(cfg, given=None, fetch=None):
    """Train per cfg; -> the result dict (losses, the model, its tokenizer). From the command line, `given` names
    the settings the user typed: on --resume the others come from the checkpoint, and a typed model setting must
    match it. given=None (a config built in code): on --resume only the model's shape and tokenizer come from the
    checkpoint, every other setting is cfg's. fetch(path), if given, is called when the data file is missing (the
    script's download). Under mpiexec rank 0 alone reads the checkpoint, makes out_dir and downloads; every rank
    builds."""
    world, out = distributed.world(), OutDir(cfg.out_dir)
    try:
        run = start(cfg, given, fetch, world, out)           # settings -> setup -> resume, then out_dir tidied
        with np.errstate(over="ignore", invalid="ignore"):   # a run that diverges says so once (Diverged), not
            return training_loop(run)                        # in a warning of numpy's (numpy backend) per overflow
    except MemoryError as e:                                 # past check_memory's estimate: one line, no traceback
        raise OutOfMemory(f"out of memory ({e}); lower --batch_size, --block_size, --n_embd or --n_layer") from None


def start(cfg, given, fetch, world, out):
    """The Run, ready for its first step: the settings (rank 0's; on --resume the checkpoint's first), then setup
    and the checkpoint's state on every rank; once every setting has passed, out_dir is tidied. An out_dir this
    call made is removed again, if still empty, when a setting turns out wrong (or on Ctrl-C)."""
    made = world.root and not os.path.exists(cfg.out_dir)
    try:
        with world.settle():                                  # settings: rank 0's, then the same on every rank
            ckpt = settings(cfg, given, fetch, out) if world.root else None
        ckpt, agreed = world.bcast((ckpt, dict(vars(cfg))))
        vars(cfg).update(agreed)
        with world.settle():
            run = setup(cfg, out, world, ckpt)
            if ckpt:
                restore(run, ckpt)
            say_setup(run)
    except (UserError, KeyboardInterrupt):                   # a wrong setting, or Ctrl-C (during a BPE's training)
        if made and os.path.isdir(cfg.out_dir) and not os.listdir(cfg.out_dir):
            os.rmdir(cfg.out_dir)
        raise
    if world.root:                                           # every setting has passed: now tidy out_dir
        out.tidy(new_run=ckpt is None, plot=cfg.plot, data=cfg.data, say=say)
    return run


# ----------------------------------------------------------------------------
# settings: on --resume the checkpoint's first, then every check, then the data and out_dir (rank 0)

def settings(cfg, given, fetch, out):
    """Rank 0: the checkpoint to resume from (its settings applied to cfg), cfg checked, the data file there (or
    fetched) and readable, out_dir writable; -> the checkpoint, or None for a new run."""
    ckpt = None
    if cfg.resume:
        path, fix = out.resume_path()
        ckpt = checkpoint.load(path, fix=fix)
        resume_settings(cfg, ckpt, given, path)               # first: the checkpoint's settings may change cfg
    if cfg.init_from and not ckpt:
        pretrained_settings(cfg, given)
    for note in check(cfg, given):
        say(note)
    if fetch is not None and not os.path.exists(cfg.data):
        fetch(cfg.data)
    if not os.path.isdir(cfg.data):                           # a directory of shards: setup opens it
        load_text(cfg.data)                                   # a missing or unusable text fails before out_dir
    elif not ckpt and given and ({"vocab_size"} | ({"tokenizer"} if cfg.tokenizer in ("char", "bpe") else set())) & given:
        raise UserError(f"--data {cfg.data} is a directory of token shards, already tokenized: drop --tokenizer and "
                        "--vocab_size (or name the tokenizer of a folder of llm.c's shards with --tokenizer PATH)")
    out.ensure_writable()                                     # is made (read again by setup, on every rank)
    return ckpt


def resume_settings(cfg, ckpt, given, path):
    """The resumed run's settings into cfg: its model shape and tokenizer always (a typed one that differs is a
    UserError), every other setting unless typed again (given; None: a config built in code keeps its own)."""
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
    for k, v in trained.items():                              # every other setting too, unless given again
        env = k == "backend" and default_backend(unset=None) is not None          # the variable counts as typed
        # older runs could plot into reports/ or anywhere; now the curve goes inside out_dir
        legacy = k == "plot" and (os.path.dirname(v) == "reports" or not plot_inside_out_dir(v))
        if (given is not None and k not in given and k not in ("resume", "out_dir") and not env and not legacy
                and hasattr(cfg, k)):
            setattr(cfg, k, v)
    if cfg.dtype == "auto" and trained.get("dtype", "auto") != "auto":   # --dtype auto again: the run's choice
        cfg.dtype = trained["dtype"]                                    # stands (a resume is the same run)


def pretrained_settings(cfg, given):
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


def _typed(v):
    """A setting's value as the command line spells it: booleans lower-case (--bias false)."""
    return str(v).lower() if isinstance(v, bool) else v


# ----------------------------------------------------------------------------
# setup: backend, tokenizer, data, model, optimizer (every rank)

def setup(cfg, out, world, ckpt=None):
    """The Run of cfg: the backend selected (a --backend that cannot run here is an error first), the tokenizer
    (the checkpoint's on --resume; GPT-2's with --init_from), the data, the model (after a check that it fits in
    memory) and its optimizer."""
    ops = select_backend(cfg, verbose=False, threads=_threads(cfg, world))
    gpt2_params = None
    if cfg.init_from and not ckpt:                         # a new fine-tune: GPT-2's shape, weights and tokenizer
        gpt2_config, gpt2_params, tok = gpt2.load_gpt2(cfg.init_from, cfg.block_size)
        tok, data = make_data(cfg, tok)
        vocab = gpt2_config.vocab_size
    else:
        tok, data = make_data(cfg, tokenizer_from_json(ckpt[0]["tokenizer"]) if ckpt else None)
        vocab = ckpt[0]["model_config"]["vocab_size"] if ckpt else tok.vocab_size    # ckpt: (meta, params, state)
    check_memory(cfg, vocab, world)
    if cfg.dtype == "auto":                                # timed on rank 0; every rank takes its choice
        cfg.dtype = world.bcast(faster_dtype(cfg, vocab, ops) if world.root else None)
    model = GPT(cfg.model_config(vocab), np.random.default_rng([cfg.seed, 0]), bf16=cfg.dtype == "bf16", ops=ops)
    if gpt2_params is not None:
        checkpoint.load_params(model, gpt2_params, cfg.init_from)
        say(f"init from {cfg.init_from}: GPT-2 weights and tokenizer")
    if world.rank > 0:                     # the same init on every rank, but each its own dropout masks
        model.rng.bit_generator.state = np.random.default_rng([cfg.seed, 3, world.rank]).bit_generator.state
    return Run(cfg, out, world, tok, data, model, make_optimizer(cfg, model), np.random.default_rng([cfg.seed, 1]))


def faster_dtype(cfg, vocab, ops, passes=3):
    """--dtype auto: "bf16" or "float32", whichever runs a forward and backward pass of this run's model, on a
    batch of its shape, faster on this CPU. One model times both (its backend bound to each precision in turn),
    each warmed up once, then alternated; the medians decide, and a line says them. The optimizer's step is left
    out: it is no slower in bf16 (Muon's Newton-Schulz runs in bf16 there too)."""
    B, T = cfg.batch_size, cfg.block_size
    model = GPT(cfg.model_config(vocab), np.random.default_rng([cfg.seed, 4]), ops=ops)
    x = np.random.default_rng([cfg.seed, 5]).integers(0, vocab, (B, T + 1)).astype(np.int32)
    times = {"float32": [], "bf16": []}
    for i in range(passes + 1):                            # pass 0 warms up (tables, compiled code)
        for dtype in times:
            model.ops = ops.with_bf16(dtype == "bf16")
            t0 = time.perf_counter()
            model.forward(x[:, :-1], x[:, 1:])
            model.backward()
            if i:
                times[dtype].append(time.perf_counter() - t0)
    ms = {dtype: 1000 * float(np.median(t)) for dtype, t in times.items()}
    best = min(ms, key=ms.get)
    say(f"--dtype auto: {best} (a forward and backward pass of this model: {ms['bf16']:.1f} ms in bf16, "
        f"{ms['float32']:.1f} ms in float32, timed here)")
    return best


def say_setup(run):
    """The backend that runs (selected again, the one the model holds, now saying so: every setting has passed)
    and the model's size."""
    cfg, world, model = run.cfg, run.world, run.model
    select_backend(cfg, verbose=world.root, threads=_threads(cfg, world))
    ranks = f", {world.size} ranks x {backends.threads()} threads" if world.size > 1 else ""
    bf16 = ", bf16 products" if model.bf16 else ""
    say(f"model: {model.num_params():,} parameters, vocab {run.tok.vocab_size}, "
        f"backend {backends.label(model.ops, model.bf16)}{ranks}{bf16}")


def _threads(cfg, world):
    """--threads, or under mpiexec the CPUs shared by this machine's ranks (0 alone: every CPU)."""
    return cfg.threads or (None if world.size == 1 else max(1, backends.cpus() // world.local_size))


def make_data(cfg, tok=None):
    """(tokenizer, dataset) of --data. A directory of token shards (scripts/prepare_data.py's, llm.c's or
    nanoGPT's) is memory-mapped: nothing is tokenized, and its tokenizer is the directory's, or for a folder
    without one --tokenizer PATH. A text file is read whole, split 90/10 and encoded. tok: the tokenizer the
    run must use (the checkpoint's on --resume, GPT-2's with --init_from), else made here (make_tokenizer)."""
    if os.path.isdir(cfg.data):
        if tok is None and cfg.tokenizer not in ("char", "bpe"):
            tok = tokenizer_from_path(cfg.tokenizer)
        tok, data = open_data(cfg.data, tok, cfg.block_size, fixed_block=cfg.resume)
        say(f"data: {cfg.data}: {data.num_tokens('train'):,} train and {data.num_tokens('val'):,} val tokens, "
            "memory-mapped")
        return tok, data
    text = load_text(cfg.data)
    tok = tok or make_tokenizer(cfg, text)
    return tok, Dataset(text, tok, cfg.block_size, source=cfg.data, fixed_block=cfg.resume)


def open_data(path, tok, block_size, fixed_block=True):
    """(tokenizer, dataset) of a run's data for the commands that read a trained model (report, evaluation):
    a directory of token shards (its own tokenizer must be tok), or a text file encoded with tok."""
    if os.path.isdir(path):
        tok, data, _ = open_prepared(path, block_size, tok, fixed_block=fixed_block)
        return tok, data
    return tok, Dataset(load_text(path), tok, block_size, source=path, fixed_block=fixed_block)


def make_tokenizer(cfg, text):
    """Characters of the whole text (as nanoGPT), or a BPE trained on the training split (the same on every
    rank: training is deterministic)."""
    if cfg.tokenizer == "bpe":
        t0 = time.perf_counter()
        tok = BPETokenizer.train(split_text(text)[0], cfg.vocab_size)
        say(f"BPE: {tok.vocab_size} tokens trained in {time.perf_counter() - t0:.1f} s")
        if tok.vocab_size < cfg.vocab_size:                  # train() stops when no adjacent pair is left
            say(f"note: --vocab_size {cfg.vocab_size} asked, but the BPE vocabulary has {tok.vocab_size} tokens: "
                f"after {len(tok.merges)} merges the training split has no more pairs to merge")
        return tok
    if cfg.tokenizer != "char":
        raise UserError(f"--tokenizer {cfg.tokenizer} names the tokenizer of a folder of token shards; for a text "
                        f"file, prepare it with that tokenizer first: python scripts/prepare_data.py {cfg.data} "
                        f"--tokenizer {cfg.tokenizer} --out DIR, then train with --data DIR")
    return CharTokenizer.from_text(text)


def make_optimizer(cfg, model):
    """AdamW over every parameter, or Muon for the blocks' matrices with AdamW for the rest (minigpt/optim.py), on
    the model's backend."""
    betas, params = (cfg.beta1, cfg.beta2), model.params()
    if cfg.optimizer == "muon":
        opt = Muon(params, lr_ratio=cfg.muon_lr_ratio, betas=betas, weight_decay=cfg.weight_decay,
                   muon_weight_decay=cfg.weight_decay, momentum_warmup=cfg.muon_momentum_warmup, bf16=model.bf16,
                   split_qkv=cfg.muon_split_qkv, ops=model.ops)
    else:
        opt = AdamW(params, betas, weight_decay=cfg.weight_decay, ops=model.ops)
    return opt.scale_lr(("wte.weight", "wpe.weight"), cfg.embed_lr_ratio)


def check_memory(cfg, vocab, world):
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


# ----------------------------------------------------------------------------
# resume: the checkpoint's state, put back (its settings came first, in resume_settings)

def restore(run, ckpt):
    """Continue where ckpt = checkpoint.load(...) stopped: weights, optimizer state, generators, position, time.
    The log keeps only the rows before that point, so it ends up equal to an uninterrupted run's."""
    meta, params, state = ckpt
    path, world = run.out.last, run.world
    checkpoint.load_params(run.model, params, path)
    try:
        run.opt.load_state(state["t"], state["slots"], state["name"])
    except ValueError as e:
        was = meta["train_config"].get("optimizer", "adamw")
        raise UserError(f"{path}: {e}; the run used --optimizer {was}: resume with it, or start a new "
                        "--out_dir") from None
    dropout = meta["rng"].get("model_ranks", [meta["rng"]["model"]])  # one state per rank that saved it
    if world.rank < len(dropout):                                      # a rank new to the run keeps its fresh seed
        run.model.rng.bit_generator.state = dropout[world.rank]
    run.batch_rng.bit_generator.state = meta["rng"]["batch"]
    run.it, run.best_val, run.elapsed = meta["iter"], meta["best_val"], meta.get("elapsed", 0.0)
    cfg = run.cfg
    if run.it > cfg.max_iters:
        raise UserError(f"{path} is at iter {run.it}, past --max_iters {cfg.max_iters}; raise --max_iters")
    if 0 < cfg.max_time <= run.elapsed:
        raise UserError(f"{path} has spent its time budget ({run.elapsed:.0f} s of --max_time "
                        f"{cfg.max_time:g}); raise --max_time to continue")
    if world.root:
        run.out.truncate_log(run.it)
    say(f"resuming from {path} at iter {run.it}")
    if run.it == cfg.max_iters:
        say(f"note: iter {run.it} is --max_iters: no steps are left to train, only the final evaluation; raise "
            "--max_iters to train on")
    saved, batch = meta.get("world_size", 1), meta["train_config"].get("batch_size", cfg.batch_size)
    if saved != world.size:                                    # a step draws ranks x B rows from one generator
        same = saved * batch == world.size * cfg.batch_size
        say(f"note: the checkpoint was made by {saved} process(es) and {world.size} continue: each step now "
            f"takes {world.size} x {cfg.batch_size} sequences (before: {saved} x {batch}), " +
            ("the same rows as before" if same else "so the data order from here on differs from the run's"))


# ----------------------------------------------------------------------------
# the training loop: lr -> eval/checkpoint -> accumulate -> sync -> clip -> step -> log

def training_loop(run):
    """Iterations run.it .. max_iters, or until --max_time seconds are spent; returns the result dict (a shorter
    one when a signal stopped it)."""
    cfg, world = run.cfg, run.world
    world.stop_agreed = False                                # no stop agreed yet (an earlier run's was its own)
    log = open(run.out.log if world.root else os.devnull, "a", buffering=1)   # line-buffered: each row reaches disk
    stop = StopFlag()                                        # SIGINT/SIGTERM handlers, restored in the finally below
    last_loss, t_train, n_timed, losses = None, 0.0, 0, None
    t_start = time.perf_counter() - run.elapsed              # a resumed run spends what is left of the budget
    try:
        for it in range(run.it, cfg.max_iters + 1):
            run.it, run.elapsed = it, world.clock(t_start, cfg.max_time)
            if world.stopping(stop.signalled()):             # SIGINT/SIGTERM: save this step, exit cleanly
                save(run, run.out.last)
                name = stop.signal or "a signal to another rank"
                say(f"\n{name} at iter {it}: saved {run.out.last}; continue with --resume")
                return {"iter": it, "interrupted": name, "best_val": run.best_val}
            last = it == cfg.max_iters or 0 < cfg.max_time <= run.elapsed
            schedule = it if not cfg.max_time else cfg.lr_decay_iters * run.elapsed / cfg.max_time
            lr = get_lr(schedule, cfg.lr, cfg.min_lr, cfg.warmup_iters, cfg.lr_decay_iters, cfg.cooldown)
            done = schedule / cfg.lr_decay_iters             # the share of the run done: the warm-ups halve
            B = cfg.batch_size // 2 if done < cfg.batch_warmup else cfg.batch_size         # the batch
            T = cfg.block_size // 2 if done < cfg.context_warmup else cfg.block_size       # and the context
            if it % cfg.eval_interval == 0 or last:
                losses = evaluate_and_checkpoint(run, log, final=last)
            if last and world.stopping(stop.signalled(), ask=True):   # a signal during the final evaluation: saved
                name = stop.signal or "a signal to another rank"
                say(f"\n{name} during the final evaluation: saved {run.out.last} at iter {it}, the run's end")
                return {"iter": it, "interrupted": name, "best_val": run.best_val}
            if last:
                if cfg.max_time and run.elapsed < cfg.max_time:
                    say(f"note: --max_iters {cfg.max_iters} ended the run {cfg.max_time - run.elapsed:.0f} s before "
                        f"--max_time, with the lr still at {lr:.2e}; raise --max_iters to spend the budget")
                break
            loss, gnorm, dt = step(run, lr, B, T, last_loss, stop)
            last_loss, t_train, n_timed = loss, t_train + dt, n_timed + 1
            eta = (cfg.max_iters - it - 1) * t_train / n_timed
            if cfg.max_time:
                eta = min(eta, cfg.max_time - run.elapsed)
            log_step(log, run, loss, lr, B * T, gnorm, dt, eta)
    finally:
        log.close()
        stop.restore()
    return {"iter": run.it, "interrupted": None, "best_val": run.best_val, "final": losses,
            "train_seconds": t_train, "ms_per_iter": 1000 * t_train / max(1, n_timed), "model": run.model,
            "tokenizer": run.tok, "log": run.out.log}


def step(run, lr, B, T, last_loss, stop):
    """One optimisation step: grad_accum micro-batches of B sequences of T tokens on each of the N ranks, each backward seeded with
    1/(grad_accum N), the ranks' gradients summed (world.sync), then clip and the optimizer's step. A non-finite
    loss or gradient norm raises Diverged before the weights change. -> (loss, gnorm, seconds)"""
    cfg, model, world = run.cfg, run.model, run.world
    t0 = time.perf_counter()
    model.zero_grad()
    loss, k = 0.0, cfg.grad_accum * world.size                # k: micro-batches in the step, over all ranks
    for _ in range(cfg.grad_accum):
        x, y = run.data.batch("train", B, T, run.batch_rng, world.rank, world.size)
        loss += model.forward(x, y)[1] / k
        model.backward(scale=1.0 / k)
    loss = world.sync(model.grad_memory, loss, stop.signalled())
    gnorm = clip_grad_norm(model.grad_memory, cfg.grad_clip)
    if not (math.isfinite(loss) and math.isfinite(gnorm)):
        raise Diverged(f"non-finite {'loss' if not math.isfinite(loss) else 'gradient norm'} at iter {run.it} "
                       f"(last finite loss {last_loss}); the weights were not updated or saved. Resume "
                       f"from {run.out.last} with --resume and a lower --lr (now {cfg.lr}) or --grad_clip")
    run.opt.step(model.params(), model.grads(), lr)
    return loss, gnorm, time.perf_counter() - t0


def log_step(log, run, loss, lr, tokens, gnorm, dt, eta):
    """Every step into the log; a progress line every log_interval steps and at the last (tokens: of one
    micro-batch on one rank; the line counts all of the step's)."""
    cfg, it = run.cfg, run.it
    tokens_per_iter = tokens * cfg.grad_accum * run.world.size
    log.write(json.dumps({"iter": it, "kind": "train", "loss": loss, "lr": lr, "grad_norm": gnorm,
                          "elapsed": run.elapsed, "ms": 1000 * dt, "tokens_per_s": tokens_per_iter / dt,
                          "rss_mb": _rss_mb()}) + "\n")
    if it % cfg.log_interval == 0 or it == cfg.max_iters - 1:
        where = f"{it:5d} | {run.elapsed:.0f}/{cfg.max_time:g} s" if cfg.max_time else f"{it:5d}/{cfg.max_iters}"
        say(f"iter {where} | loss {loss:.4f} | lr {lr:.2e} | {1000 * dt:6.1f} ms | "       # --max_time: the budget,
            f"{tokens_per_iter / dt:8,.0f} tok/s | ETA {_fmt_time(eta)}")                   # not the iteration cap


# ----------------------------------------------------------------------------
# evaluation and checkpoints

def evaluate_and_checkpoint(run, log, final=False):
    """Both splits' loss into the log; checkpoint ckpt_last (and ckpt_best when val improved). The final one
    also scores the validation split, each token once (its first --val_tokens: whole_split_loss), in nats per
    token and bits per character."""
    it, world = run.it, run.world
    losses = estimate_loss(run.model, run.data, run.cfg, world)
    world.same_weights(run.model.params())
    row = {"iter": it, "kind": "eval", "train_loss": losses["train"], "val_loss": losses["val"],
           "elapsed": run.elapsed, "rss_mb": _rss_mb()}
    say(f"iter {it}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
    if final:
        val = run.data.ids("val", run.cfg.val_tokens or None)    # the whole split, or its first val_tokens
        whole = len(val) == run.data.num_tokens("val")
        if not whole or len(val) > VAL_PROGRESS_TOKENS:
            say(f"iter {it}: scoring {'the whole validation split' if whole else 'the first'} {len(val):,} tokens"
                f"{'' if whole else ' of the validation split (--val_tokens)'} ...")
        full = whole_split_loss(run.model, val, run.cfg.block_size, run.cfg.batch_size, world, _Progress())
        chars = len(run.tok.decode(val[1:]))                 # the characters the targets spell
        losses["val_full"] = row["val_loss_full"] = full
        losses["val_bpc"] = row["val_bpc"] = full * (len(val) - 1) / (chars * math.log(2))
        row["val_tokens_scored"], row["val_whole"] = len(val), whole
        what = "the whole split" if whole else f"its first {len(val):,} tokens"
        say(f"iter {it}: val loss over {what} {full:.4f} ({losses['val_bpc']:.4f} bits per character)")
    log.write(json.dumps(row) + "\n")
    if losses["val"] < run.best_val:
        run.best_val = losses["val"]
        save(run, run.out.best)
    save(run, run.out.last)
    if world.root and snapshot_due(run, final):
        with _saving(run.out.snapshots):
            checkpoint.save_snapshot(run.out.snapshot(it), run.model, it, run.elapsed)
    return losses


def estimate_loss(model, data, cfg, world=distributed.World()):
    """Mean loss over cfg.eval_iters batches of each split, drawn from a generator seeded afresh at every call,
    so curves are comparable between evaluations and runs. Under mpiexec each rank evaluates its slice of every
    batch and the ranks average (the batches of one process with --batch_size N*B)."""
    rng = np.random.default_rng([cfg.seed, 2])
    was_training = model.training
    model.eval()
    means = np.zeros(2)                                      # train, val
    for i, split in enumerate(("train", "val")):
        losses = [model.forward(*data.batch(split, cfg.batch_size, cfg.block_size, rng, world.rank, world.size))[1]
                  for _ in range(cfg.eval_iters)]
        means[i] = np.mean(losses)
    if world.size > 1:
        means = world.allreduce(means) / world.size
    model.train(was_training)
    return {"train": float(means[0]), "val": float(means[1])}


def whole_split_loss(model, ids, block_size, batch_size, world=distributed.World(), progress=None):
    """Mean loss over every target of ids (N,): the blocks ids[i : i+T+1] for i = 0, T, 2T, ... and a last,
    shorter one, so each target counts once with up to T tokens of context: the figure to compare tokenizers
    and runs by. Ranks share the blocks; the model is left in the mode it was in. progress(done, total), if
    given, is called after each batch with this rank's blocks."""
    n = len(ids) - 1                                         # targets
    if n < 1:
        raise ValueError(f"whole_split_loss: {len(ids)} token(s) hold no target; it needs at least 2")
    starts = np.arange(0, n - block_size + 1, block_size)     # full blocks
    mine = starts[world.rank::world.size]
    total = np.zeros(1)                                      # the sum of the losses of this rank's targets
    was_training = model.training
    model.eval()
    for s in range(0, len(mine), batch_size):
        rows = mine[s:s + batch_size, None] + np.arange(block_size + 1)            # (b, T+1)
        chunk = ids[rows].astype(np.int32)
        total += model.forward(chunk[:, :-1], chunk[:, 1:])[1] * chunk[:, 1:].size
        if progress is not None:
            progress(min(s + batch_size, len(mine)), len(mine))
    tail = n - len(starts) * block_size
    if tail and world.root:                                  # the last targets, in one shorter block
        chunk = ids[None, len(starts) * block_size:].astype(np.int32)                # (1, tail+1)
        total += model.forward(chunk[:, :-1], chunk[:, 1:])[1] * tail
    model.train(was_training)
    return float(world.allreduce(total)[0] / n)


class _Progress:
    """whole_split_loss's progress: a line every PROGRESS_SECONDS, with the share done and the time left."""

    def __init__(self):
        self.t0 = self.shown = time.perf_counter()

    def __call__(self, done, total):
        now = time.perf_counter()
        if now - self.shown >= PROGRESS_SECONDS and done < total:
            self.shown = now
            left = (now - self.t0) * (total - done) / done
            say(f"  scored {done / total:.0%} of the validation tokens, {_fmt_time(left)} left")


def snapshot_due(run, final):
    """--snapshots N spread over the run: at the first evaluation at or past each of the fractions 0, 1/(N-1),
    ..., 1 of --max_iters (of --max_time when it is set), the final evaluation always among them (a resumed run
    that raised --max_iters adds its own end to the N it took before)."""
    n, cfg = run.cfg.snapshots, run.cfg
    if n == 0 or run.model.num_params() > MAX_SNAPSHOT_PARAMS:
        return False
    if final or n == 1:
        return final
    taken = sum(i < run.it for i in run.out.snapshot_iters())
    if taken >= n - 1:                                       # the last of the N is the final evaluation's
        return False
    progress = run.elapsed / cfg.max_time if cfg.max_time else run.it / max(1, cfg.max_iters)
    return progress >= taken / (n - 1)


def save(run, path):
    """A checkpoint of everything the next step reads. Rank 0 writes; every rank calls it (it gathers each rank's
    dropout generator)."""
    states = run.world.allgather(run.model.rng.bit_generator.state)
    if not run.world.root:
        return
    settings = {**run.cfg.to_dict(), "data": os.path.abspath(run.cfg.data)}   # found from any directory, as
    if run.cfg.tokenizer not in ("char", "bpe"):                                 # a tokenizer's path is
        settings["tokenizer"] = os.path.abspath(run.cfg.tokenizer)
    meta = {"iter": run.it, "best_val": run.best_val, "tokenizer": run.tok.to_json(),   # (resume, eval, report)
            "model_config": run.model.config.to_dict(), "train_config": settings,
            "rng": {"model": states[0], "batch": run.batch_rng.bit_generator.state}, "elapsed": run.elapsed}
    if run.world.size > 1:
        meta["rng"]["model_ranks"], meta["world_size"] = states, run.world.size
    with _saving(path):
        checkpoint.save(path, run.model, run.opt, meta)


@contextlib.contextmanager
def _saving(path):
    """An OSError while writing path (a checkpoint, a snapshot) becomes CannotSave: one line that names the fix."""
    try:
        yield
    except OSError as e:
        raise CannotSave(f"cannot write {path} ({e.strerror or e}); free space or make its directory writable, "
                         "then continue with --resume (the checkpoints written before it are whole)") from None


# ----------------------------------------------------------------------------
# messages and signals

def say(msg):
    """Print on rank 0 only: every rank of a data-parallel run has the same thing to say. If stdout's reader
    went away (`| head`), the loop stops as on a signal, saving (SIGPIPE); outside the loop the command ends."""
    if distributed.world().root:
        try:
            print(msg, flush=True)
        except BrokenPipeError:
            quiet_stdout()
            if StopFlag.active is None:
                raise                                        # run_command: exit status 141
            StopFlag.active.signal = StopFlag.active.signal or "SIGPIPE"


class StopFlag:
    """Turns SIGINT/SIGTERM into a flag the loop checks between steps; a second one stops at once."""

    active = None                                            # the running loop's flag (say() sets SIGPIPE)

    def __init__(self):
        self.signal = None
        self._old = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        StopFlag.active = self

    def signalled(self):
        return self.signal is not None

    def _handle(self, signum, frame):
        if self.signal is not None:                          # the second one: the user means now
            self.restore()
            raise StoppedTwice(f"second {signal.Signals(signum).name}: stopped at once without saving this step; "
                               "the checkpoints in --out_dir are intact, continue with --resume")
        self.signal = signal.Signals(signum).name

    def restore(self):
        for s, h in self._old.items():
            signal.signal(s, h)
        StopFlag.active = None


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


# ----------------------------------------------------------------------------
# the command line

def interrupted_status(result):
    """The command's exit status after a run stopped by a signal and saved: 128 + the signal's number (130 for
    SIGINT, 143 for SIGTERM), as a shell reports a command a signal stopped, so `train && sample` stops too;
    130 on the ranks that stopped because another rank had the signal. 0 for a run that finished."""
    name = result["interrupted"]
    if not name:
        return 0
    return 128 + signal.Signals[name] if name in signal.Signals.__members__ else 130


SCRIPT_ONLY = {"plot", "report", "sample_chars"}       # settings only scripts/train_shakespeare.py acts on
DESCRIPTION = ("Train a GPT on a UTF-8 text file or a directory of token shards; writes out_dir/log.jsonl, "
               "checkpoints and snapshots/ (training only: scripts/train_shakespeare.py also downloads, plots, "
               "samples and writes report.html).")


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


# ----------------------------------------------------------------------------
# from Python: minigpt.train(data=..., out_dir=..., **settings)

def python_train(data=None, out_dir="out", **settings):
    """Train as `python -m minigpt.train --data DATA --out_dir OUT_DIR --key value ...` does, with the same checks,
    losses and files; -> a dict: "model" (a minigpt.Model), "final" (the last evaluation's losses), "best_val",
    "iter", "ms_per_iter", "log" (out_dir/log.jsonl) and "rows" (its rows: each step and each evaluation). A run
    that a signal stopped (saved, to continue with resume=True) returns "iter", "interrupted" and "best_val" alone.
    Settings are TrainConfig's (minigpt/config.py; `python -m minigpt.train --help` lists them)."""
    from . import Model
    if data is not None:
        settings["data"] = data
    settings["out_dir"] = out_dir
    argv = [f"--{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in settings.items()]   # as typed
    cfg = parse_args(argv, prog="minigpt.train()")
    result = train(cfg, given=cfg.given)
    if result["interrupted"]:
        return result
    model = Model(result.pop("model"), result.pop("tokenizer"), cfg.out_dir)
    with open(result["log"]) as f:
        rows = [json.loads(line) for line in f]
    return {**result, "model": model, "rows": rows}


class _CallableModule(type(sys)):
    """`minigpt.train` is this module; calling it is python_train (a submodule would hide a function of its name)."""

    def __call__(self, data=None, out_dir="out", **settings):
        return python_train(data, out_dir, **settings)


sys.modules[__name__].__class__ = _CallableModule

if __name__ == "__main__":
    sys.exit(run_command(main))

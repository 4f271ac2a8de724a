"""How a training run is made: setup() checks the settings, selects the backend, prepares out_dir and builds the
Run (minigpt/run.py) that the loop (minigpt/train.py) runs on.

A new run clears an old run's files from out_dir, and the temporaries of a run killed while saving go, but only
once every setting has passed. Then come the tokenizer, the data, the model (after a check that it fits in
memory) and the optimizer. On --resume the last checkpoint's settings come first (the model's shape and tokenizer
always, the other settings unless typed again) and run.restore puts back its state. Under mpiexec rank 0 alone
reads the checkpoint, makes out_dir and downloads; every rank builds.
"""
import math
import os
import time

import numpy as np

from . import backends, checkpoint, distributed, gpt2
from .backends import select_backend
from .bpe import BPETokenizer
from .config import PRESETS, ModelShape, UserError, check, default_backend, plot_inside_out_dir
from .data import CharTokenizer, Dataset, load_text, split_text
from .model import GPT, activation_shapes, gradient_shapes, parameter_shapes
from .optim import AdamW, Muon
from .run import Run, best_path, last_path, log_path, restore, say
from .tokenizer import tokenizer_from_json

# ----------------------------------------------------------------------------
# setup: settings, backend, out_dir, data, model, optimizer

def setup(cfg, given=None, fetch=None):
    """Check cfg, select the backend, make out_dir and build the Run (see minigpt/train.py's train() for given
    and fetch); only then, with every setting checked, does a new run clear an old one's files from out_dir
    (_tidy). Under mpiexec rank 0 alone reads the checkpoint, makes out_dir, downloads and tidies; every rank
    builds the rest. An out_dir this call made is removed again, if still empty, when a setting turns out wrong
    (or on Ctrl-C)."""
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
    ckpt = _load_resume(cfg) if cfg.resume else None
    if ckpt is not None:
        _resume_settings(cfg, ckpt, given)                    # first: the checkpoint's settings may change cfg
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
    return [log_path(cfg) + ".tmp", os.path.join(cfg.out_dir, "report.html.part"), (cfg.plot_path() or "") + ".part",
            *(os.path.join(snaps, n) for n in names if n.startswith("iter_") and n.endswith(".npz.part"))]


def _start_over(cfg):
    """A new run (no --resume) in an out_dir that holds another (its log, last checkpoint or snapshots): the old
    log, snapshots, checkpoints, report and loss curve go, so that what the directory shows is this run's alone
    (also when this run makes no report or plot, or stops before its first checkpoint: --resume must not continue
    the old run under the new one's log). An out_dir that
    holds no run keeps every file: a report.html or a PNG there is someone else's."""
    out_dir = cfg.out_dir
    log = log_path(cfg)
    logged = os.path.exists(log) and os.path.getsize(log) > 0
    if not (logged or os.path.exists(last_path(cfg)) or checkpoint.snapshot_iters(out_dir)):
        return
    gone = checkpoint.remove_snapshots(out_dir)
    say(f"note: {out_dir} held a run (a log.jsonl, {gone} snapshot(s)): this new run replaces its log, "
        "snapshots, report, loss curve and checkpoints; --resume would have continued it")
    made = [os.path.join(out_dir, "report.html"), os.path.join(out_dir, "loss_curve.png"),   # the report, the
            cfg.plot_path() or ""]                                  # default --plot, this run's
    for path in [log, last_path(cfg), best_path(cfg)] + made:
        if os.path.isfile(path) and not _same_file(path, cfg.data):    # never the text it trains on
            os.remove(path)


def _same_file(a, b):
    try:
        return os.path.samefile(a, b)
    except OSError:                                                  # b is gone (or a): not the same
        return False


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
    select_backend(cfg, verbose=False, threads=threads)     # a --backend that cannot run here: an error first
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
    select_backend(cfg, verbose=world.root, threads=threads)     # says which runs, once every setting has passed
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


# ----------------------------------------------------------------------------
# --resume: the checkpoint, and its settings (its state goes back in run.restore)

def _load_resume(cfg):
    """--resume's checkpoint, out_dir/ckpt_last.npz; a UserError naming ckpt_best.npz, if there is one, when it is
    missing or unreadable."""
    path, best = last_path(cfg), best_path(cfg)
    if not os.path.exists(path):
        copy = f"copy {best} to {path} to continue from the best one, or " if os.path.exists(best) else ""
        raise UserError(f"--resume: no checkpoint at {path}; {copy}train without --resume first, or point "
                        "--out_dir at the directory of an earlier run")
    fix = "start a new --out_dir"
    if os.path.exists(best) and os.path.abspath(best) != os.path.abspath(path):
        fix = f"copy {best} over {path} to resume from the best one, or {fix}"
    return checkpoint.load(path, fix=fix)


def _resume_settings(cfg, ckpt, given):
    """The resumed run's settings into cfg: its model shape and tokenizer always (a typed one that differs is a
    UserError), every other setting unless typed again (given; None: a config built in code keeps its own)."""
    path = last_path(cfg)
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

"""TrainConfig: every setting of a training run, and the type-checked `--key value` / `--key=value` parser.

The defaults are config S, nanoGPT's documented CPU Shakespeare-char run (config/train_shakespeare_char.py
with the README's CPU overrides). Unknown keys and wrong types are UserErrors that name the fix.
"""
import difflib
import math
import os
from dataclasses import asdict, dataclass, field, fields


class UserError(Exception):
    """A problem with the user's input: the scripts print the message (no traceback) and exit with status 2."""


def default_backend():
    """--backend when it is not typed: $MINIGPT_BACKEND if set, else auto."""
    return os.environ.get("MINIGPT_BACKEND", "auto")


@dataclass
class TrainConfig:
    # data and output
    data: str = "data/tinyshakespeare.txt"
    out_dir: str = "out"
    plot: str = "reports/loss_curve.png"       # loss-curve PNG written at the end ("" for none)
    resume: bool = False
    # model (config S)
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    block_size: int = 64
    dropout: float = 0.0
    bias: bool = False                         # nanoGPT's train.py default
    tie_weights: bool = True
    # optimisation
    batch_size: int = 12
    grad_accum: int = 1
    max_iters: int = 2000
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_iters: int = 100
    lr_decay_iters: int = 2000
    beta1: float = 0.9
    beta2: float = 0.99
    weight_decay: float = 0.1
    grad_clip: float = 1.0                     # 0 disables clipping
    # evaluation, logging, sampling
    eval_interval: int = 250
    eval_iters: int = 20
    log_interval: int = 10
    sample_chars: int = 500
    seed: int = 1337
    # execution
    backend: str = field(default_factory=default_backend)   # auto | numpy | numba | native
    threads: int = 0                           # 0: all cores

    def model_dict(self):
        return {k: getattr(self, k) for k in
                ("block_size", "n_layer", "n_head", "n_embd", "dropout", "bias", "tie_weights")}

    def to_dict(self):
        return asdict(self)


_POSITIVE = {"n_layer", "n_head", "n_embd", "block_size", "batch_size", "grad_accum", "eval_interval",
             "eval_iters", "log_interval", "lr_decay_iters"}
_NON_NEGATIVE = {"max_iters", "warmup_iters", "sample_chars", "threads", "lr", "min_lr", "weight_decay", "grad_clip"}


def check(cfg):
    """Range checks that need no model: each failure names the setting and a valid value."""
    for k in _POSITIVE:
        if getattr(cfg, k) <= 0:
            raise UserError(f"--{k} must be positive, got {getattr(cfg, k)}")
    for k in _NON_NEGATIVE:
        if getattr(cfg, k) < 0:
            raise UserError(f"--{k} must be zero or more, got {getattr(cfg, k)}")
    if not 0.0 <= cfg.dropout < 1.0:
        raise UserError(f"--dropout must lie in [0, 1), got {cfg.dropout}")
    if cfg.n_embd % cfg.n_head:
        raise UserError(f"--n_embd ({cfg.n_embd}) must be divisible by --n_head ({cfg.n_head})")
    for k in ("beta1", "beta2"):
        if not 0.0 <= getattr(cfg, k) < 1.0:
            raise UserError(f"--{k} must lie in [0, 1), got {getattr(cfg, k)}")
    if cfg.backend not in ("auto", "numpy", "numba", "native"):
        raise UserError(f"--backend must be one of auto, numpy, numba, native; got {cfg.backend!r} "
                        "(from --backend, else MINIGPT_BACKEND)")
    return cfg


# ----------------------------------------------------------------------------
# command line: --key value, --key=value, --flag (true), --flag=false

_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


def _convert(key, typ, text):
    if typ is bool:
        if text.lower() in _TRUE | _FALSE:
            return text.lower() in _TRUE
        raise UserError(f"--{key} expects true or false, got {text!r}")
    try:
        value = typ(text)
        if typ is float and not math.isfinite(value):
            raise ValueError(text)
        return value
    except ValueError:
        kind = {int: "an integer", float: "a number"}.get(typ, typ.__name__)
        raise UserError(f"--{key} expects {kind}, got {text!r}") from None


def parse_args(argv, cls=TrainConfig, **defaults):
    """Build cls(**defaults) and apply the overrides in argv; returns the config."""
    types = {f.name: f.type for f in fields(cls)}
    values = dict(defaults)
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            raise UserError(f"unexpected argument {arg!r}; settings are given as --key value or --key=value")
        key, eq, text = arg[2:].partition("=")
        key = key.replace("-", "_")
        if key not in types:
            near = difflib.get_close_matches(key, types, n=1)
            hint = f"; did you mean --{near[0]}?" if near else f"; valid settings: {', '.join(types)}"
            raise UserError(f"unknown setting --{key}{hint}")
        if not eq:
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            if types[key] is bool and (nxt is None or nxt.startswith("--")):
                text = "true"                                 # a bare flag
            elif nxt is None:
                raise UserError(f"--{key} needs a value")
            else:
                text, i = nxt, i + 1
        values[key] = _convert(key, types[key], text)
        i += 1
    cfg = cls(**values)
    cfg.given = frozenset(values) - set(defaults)            # what the user set explicitly
    return cfg

"""Every setting of every command, and the type-checked command-line parser built from them.

The defaults are config S, nanoGPT's documented CPU Shakespeare-char run (config/train_shakespeare_char.py
with the CPU overrides of nanoGPT's README). Every setting is declared once here: TrainConfig's, and the other
commands' (SampleConfig, ReportConfig, EvalConfig, ExportConfig, PrepareConfig), which take the settings they
share from COMMON.
Each field carries its one-line help (setting(...)), and parse_args makes the argparse parser, --help included,
from the fields, so the command line and the dataclass cannot drift.
Unknown keys and wrong types are UserErrors that name the fix; run_command is how every command ends when it is
stopped early (Ctrl-C, a closed pipe). Nothing here trains or imports numpy.
"""
import argparse
import difflib
import math
import numbers
import os
import re
import sys
from dataclasses import MISSING, asdict, dataclass, field, fields


from .errors import UserError
from .outdir import CURVE


def run_command(main, argv=None):
    """main(argv) -> its exit status, as a shell expects of a command stopped early: Ctrl-C (outside the training
    loop, which saves and stops on its own) is one line and status 130; a reader that closed stdout early
    (`| head`) ends it quietly with 141 (128 + SIGPIPE, as for a C program that signal stops)."""
    try:
        return main(argv)
    except KeyboardInterrupt:
        print("\nstopped by Ctrl-C", file=sys.stderr)
        return 130
    except BrokenPipeError:
        quiet_stdout()
        return 141


def quiet_stdout():
    """Point stdout at /dev/null after its reader went away, so that later prints, and Python's own flush at
    exit, find a writable file instead of raising BrokenPipeError again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def default_backend(unset="auto"):
    """--backend when it is not typed: $MINIGPT_BACKEND if set, else `unset`. The one place the variable is read."""
    return os.environ.get("MINIGPT_BACKEND", unset)


def setting(default, help):
    """A dataclass field with its one-line --help text. A callable default is called for each new config
    (a default_factory: default_backend reads the environment when the config is made, not at import)."""
    if callable(default):
        return field(default_factory=default, metadata={"help": help})
    return field(default=default, metadata={"help": help})


# ----------------------------------------------------------------------------
# settings that several commands take: each declared here once (its default and --help line) and checked once
# (check_common); a command's dataclass picks the ones it takes with common(name)

COMMON = {
    "out_dir": ("out", "the run's directory: training writes log.jsonl, the checkpoints, snapshots/, the loss curve "
                       "and report.html there; the other commands read its ckpt_best.npz, else ckpt_last.npz"),
    "ckpt": ("", "a checkpoint file to read instead of the one in --out_dir"),
    "backend": (default_backend, "auto | numpy | numba | native; $MINIGPT_BACKEND sets the default"),
    "threads": (0, "threads of the backend's pools (0: all CPUs, or CPUs / ranks on this machine under mpiexec); "
                   "BLAS gets them on numpy and numba, 1 thread on native"),
    "dtype": ("float32", "float32 | bf16: bf16 rounds the operands of every product (the Linears, the LM head, "
                         "attention's two) to bfloat16 and sums in float32; weights, gradients, optimizer state, "
                         "LayerNorm, softmax, loss and checkpoints stay float32 (a checkpoint reads either way) | "
                         "auto (training only): whichever of the two runs this model's step faster on this CPU, "
                         "timed at the start of the run, which says what it chose"),
    "tokenizer": ("char", "char: one token per character | bpe: byte-level BPE trained on the training text "
                          "(minigpt/bpe.py) | PATH: a GPT-2 directory or a tokenizer.json"),
    "vocab_size": (512, "tokens of the BPE vocabulary (with --tokenizer bpe): 256 bytes + merges"),
}


def common(name, more=""):
    """The dataclass field of a setting several commands take (COMMON); `more`: what it means to this command
    alone, appended to the shared help."""
    default, text = COMMON[name]
    return setting(default, f"{text}; {more}" if more else text)


def check_common(cfg):
    """The COMMON settings that cfg (any command's config) has, checked alike for every command."""
    if hasattr(cfg, "threads"):
        check_ranges(cfg, non_negative=("threads",))
    if hasattr(cfg, "backend"):
        check_backend(cfg.backend, getattr(cfg, "given", None))
    if hasattr(cfg, "dtype"):
        check_dtype(cfg.dtype, auto=isinstance(cfg, TrainConfig))
    return cfg


def check_tokenizer(cfg):
    """--tokenizer and --vocab_size, as training and prepare_data.py take them (a resumed run's tokenizer is its
    checkpoint's, so its path is not looked for again)."""
    if cfg.tokenizer not in ("char", "bpe") and not getattr(cfg, "resume", False) and not os.path.exists(
            cfg.tokenizer):
        raise UserError(f"--tokenizer must be char, bpe or the path of a tokenizer (a GPT-2 directory, a "
                        f"tokenizer.json or a prepared directory), got {cfg.tokenizer!r}")
    if cfg.tokenizer == "bpe" and cfg.vocab_size < 257:
        raise UserError(f"--vocab_size must be at least 257 (256 byte tokens and one merge), got {cfg.vocab_size}; "
                        "try 512 or 1024")


# Named sets of defaults (--preset NAME); settings typed on the command line win over them.
PRESETS = {
    # scripts/speedrun.py's recipe: more of nanoGPT's wall time spent learning. It needs --max_time (the seconds
    # you have; check() says so); max_iters is only a cap. Muon for the blocks' matrices, a larger lr for the
    # embeddings, a longer context at a smaller batch, fewer evaluation batches (their time goes to steps), an
    # LM head of its own, the faster precision of this CPU (timed at the start) and the lr decayed to 0;
    # reports/speedrun.md says what each change gained and on which seeds it was chosen.
    "speedrun": dict(optimizer="muon", batch_size=24, block_size=128, max_iters=10 ** 6, embed_lr_ratio=10.0,
                     dtype="auto", min_lr=0.0,
                     eval_iters=5, tie_weights=False),
    # fine-tuning a pretrained GPT-2 (--init_from DIR sets it when no --preset is typed): nanoGPT's
    # finetune_shakespeare (constant lr 3e-5, 20 iterations, eval every 5) at llm.c's CPU shapes (B=4, T=64)
    "finetune": dict(block_size=64, batch_size=4, grad_accum=8, lr=3e-5, min_lr=3e-5, warmup_iters=0,
                     max_iters=20, lr_decay_iters=20, eval_interval=5, eval_iters=10, sample_chars=200),
}


@dataclass
class ModelShape:
    """The model's settings (config S), declared once: TrainConfig has them as --keys, GPTConfig as the model's."""
    n_layer: int = setting(4, "transformer blocks")
    n_head: int = setting(4, "attention heads per block")
    n_embd: int = setting(128, "embedding width (a multiple of --n_head)")
    block_size: int = setting(64, "context length in tokens")
    dropout: float = setting(0.0, "dropout probability in training, in [0, 1)")
    bias: bool = setting(False, "biases in the Linear and LayerNorm layers (off: nanoGPT's train.py default)")
    tie_weights: bool = setting(True, "the LM head shares the token-embedding matrix")
    activation: str = setting("gelu", "the MLP's activation: gelu (tanh form, GPT-2's) | relu2 (relu(x)^2)")
    qk_norm: bool = setting(False, "scale each head's q and k to RMS 1 (no gain) before attention's q k^T")
    logit_cap: float = setting(0.0, "soft-cap the logits to cap * tanh(logits / cap) (0: off)")
    zero_init_proj: bool = setting(False, "the blocks' output projections (attn and mlp c_proj) start at 0, so "
                                          "every block starts as the identity")

    def model_dict(self):
        return {f.name: getattr(self, f.name) for f in fields(ModelShape)}


@dataclass
class GPTConfig(ModelShape):
    """The model: its shape and the vocabulary size its tokenizer gives. Checked when made (check_model)."""
    vocab_size: int = setting(65, "tokens in the vocabulary (the tokenizer's)")

    def __post_init__(self):
        check_model(self)

    def to_dict(self):
        return asdict(self)


@dataclass
class TrainConfig(ModelShape):
    """Every setting of a training run; each is a --key on the command line (the model's first)."""
    # data and output
    data: str = setting("data/tinyshakespeare.txt", "a UTF-8 text file to train on (train_shakespeare.py downloads "
                                                    "the default when it is missing), or a directory of token "
                                                    "shards (scripts/prepare_data.py's, llm.c's or nanoGPT's)")
    out_dir: str = common("out_dir")
    plot: str = setting(CURVE, "loss-curve PNG made at the end, in --out_dir: a name, or a path inside "
                                          "it; '' for none (train_shakespeare.py only)")
    report: bool = setting(True, "write out_dir/report.html at the end: what the model learned (python -m "
                                 "minigpt.report; train_shakespeare.py only)")
    snapshots: int = setting(5, "weights kept in out_dir/snapshots/ (float16) at this many points of the run, for "
                                "the report's 'how training changed it'; taken at evaluations, so fewer when the "
                                "run has fewer (0: none; skipped above 20M parameters)")
    resume: bool = setting(False, "continue from out_dir/ckpt_last.npz; settings not typed again come from it")
    preset: str = setting("", "a named set of defaults that typed settings override: " + ", ".join(
        f"{k} ({', '.join(f'{n}={str(v).lower() if isinstance(v, bool) else v}' for n, v in d.items())})"   # as typed
        for k, d in PRESETS.items()))
    init_from: str = setting("", "a transformers GPT-2 directory to fine-tune (config.json, model.safetensors, "
                                 "tokenizer.json; a Hugging Face cache snapshot works): the model's shape and "
                                 "tokenizer come from it, and --preset finetune's defaults apply (block 64, batch "
                                 "4 x 8, lr 3e-5, 20 iterations: sized for a 124M model on 2 cores)")
    tokenizer: str = common("tokenizer", "in training PATH names the tokenizer of a --data folder of llm.c's or "
                                         "nanoGPT's shards")
    vocab_size: int = common("vocab_size")
    # optimisation
    batch_size: int = setting(12, "sequences per micro-batch")
    grad_accum: int = setting(1, "micro-batches accumulated into each optimisation step")
    max_iters: int = setting(2000, "optimisation steps in total")
    max_time: float = setting(0.0, "seconds of training wall time (0: off): the run ends when they are spent and the "
                                   "lr schedule follows their elapsed fraction; --max_iters stays a cap")
    lr: float = setting(1e-3, "peak learning rate (after warmup)")
    min_lr: float = setting(1e-4, "learning rate at the end of the decay")
    warmup_iters: int = setting(100, "steps of linear warmup")
    lr_decay_iters: int = setting(2000, "step at which the decay reaches --min_lr")
    cooldown: float = setting(0.0, "0: a cosine decay after warmup; F in (0, 1]: the lr held at --lr, then a straight "
                                   "line down to --min_lr over the last F of --lr_decay_iters")
    context_warmup: float = setting(0.0, "F in [0, 1): the first F of the run (of --lr_decay_iters, or of "
                                         "--max_time) trains on half of --block_size, at the same batch: cheaper "
                                         "steps while the model learns what short contexts teach (0: off)")
    batch_warmup: float = setting(0.0, "F in [0, 1): the first F of the run (of --lr_decay_iters, or of "
                                       "--max_time) takes half of --batch_size a step: more, noisier steps early, "
                                       "when the gradient's direction matters more than its precision (0: off)")
    optimizer: str = setting("adamw", "adamw | muon: Muon (Newton-Schulz orthogonalised momentum) for the blocks' "
                                      "matrices, AdamW for the rest (minigpt/optim.py)")
    muon_lr_ratio: float = setting(20.0, "with --optimizer muon: the Muon matrices' lr is this times --lr's schedule")
    muon_momentum_warmup: int = setting(0, "with --optimizer muon: Muon's momentum rises linearly from 0.85 to "
                                           "0.95 over this many steps (0: 0.95 from the start)")
    muon_split_qkv: bool = setting(False, "with --optimizer muon: orthogonalise c_attn's update as its q, k and v "
                                          "parts, three C x C matrices, each on its own (the modded-nanogpt "
                                          "speedruns' way), not as one C x 3C matrix")
    embed_lr_ratio: float = setting(1.0, "the embeddings' (wte, wpe) AdamW lr is this times --lr's schedule")
    beta1: float = setting(0.9, "AdamW beta1, in [0, 1)")
    beta2: float = setting(0.99, "AdamW beta2, in [0, 1)")
    weight_decay: float = setting(0.1, "decoupled weight decay of matrices and embeddings (with --optimizer muon the "
                                       "blocks' matrices decay at Muon's lr, muon_lr_ratio x AdamW's)")
    grad_clip: float = setting(1.0, "clip the global gradient norm to this (0: no clipping)")
    # evaluation, logging, sampling
    eval_interval: int = setting(250, "evaluate and checkpoint every this many steps (and at the end)")
    eval_iters: int = setting(20, "batches per split in each evaluation")
    val_tokens: int = setting(2_000_000, "tokens of the validation split the final evaluation scores, each once: "
                                         "its first N (0: all of it)")
    log_interval: int = setting(10, "print a progress line every this many steps (log.jsonl gets every step)")
    sample_chars: int = setting(500, "tokens sampled at the end: characters, or BPE tokens (0: no sample; "
                                     "train_shakespeare.py only)")
    seed: int = setting(1337, "seeds the init, dropout, batches and evaluation batches")
    # execution
    backend: str = common("backend")
    threads: int = common("threads")
    dtype: str = common("dtype")

    def model_config(self, vocab_size):
        """The GPTConfig of this run, for a tokenizer of vocab_size tokens."""
        return GPTConfig(vocab_size=vocab_size, **self.model_dict())

    def to_dict(self):
        return asdict(self)


# ----------------------------------------------------------------------------
# the other commands' settings (each picks the COMMON ones it takes)

@dataclass
class SampleConfig:
    """python -m minigpt.sample"""
    out_dir: str = common("out_dir")
    ckpt: str = common("ckpt")
    prompt: str = setting("\n", "text the samples continue")
    prompt_file: str = setting("", "read the prompt from this UTF-8 file instead of --prompt")
    num_samples: int = setting(1, "samples generated together in one batch")
    max_new_tokens: int = setting(500, "tokens generated per sample")
    temperature: float = setting(0.8, "divides the logits: lower is more conservative, higher more random")
    top_k: int = setting(0, "sample among the k most likely tokens only (0: off, 1: greedy)")
    top_p: float = setting(1.0, "sample among the most likely tokens that hold this much probability (1: off)")
    seed: int = setting(1337, "seed of the sampling generator")
    kv_cache: bool = setting(True, "keep the keys and values of past positions (false: recompute every step)")
    backend: str = common("backend")
    threads: int = common("threads")
    dtype: str = common("dtype")


@dataclass
class ReportConfig:
    """python -m minigpt.report"""
    out_dir: str = common("out_dir")
    ckpt: str = common("ckpt")
    prompt: str = setting("", "text the attention, logit-lens and next-token sections look at (default: the "
                              "start of the validation text, else a newline)")
    data: str = setting("", "the text the run trained on, or its directory of token shards, for the validation "
                            "sections (default: the run's --data)")
    val_chars: int = setting(2000, "characters of validation text scored token by token")
    samples: int = setting(3, "samples at the end of the page")
    sample_tokens: int = setting(200, "tokens per sample")
    seed: int = setting(1337, "seed of the samples")
    backend: str = common("backend")
    threads: int = common("threads")


@dataclass
class EvalConfig:
    """scripts/eval_checkpoint.py"""
    out_dir: str = common("out_dir")
    ckpt: str = common("ckpt")
    data: str = setting("", "the UTF-8 text it was trained on, split as in training, or its directory of token "
                            "shards (default: the run's --data, from the checkpoint)")
    draws: int = setting(10, "independent draws of eval_iters batches, for the spread of the estimate (0: none)")
    context: int = setting(0, "tokens of context at most, in blocks of that length (0: the model's block_size)")
    splits: str = setting("train,val", "the splits to measure, comma-separated")
    max_tokens: int = setting(0, "tokens of each split scored, each once: its first N (0: the whole split)")
    backend: str = common("backend")
    threads: int = common("threads")
    dtype: str = common("dtype")


@dataclass
class ExportConfig:
    """scripts/export_hf.py"""
    out_dir: str = common("out_dir")
    ckpt: str = common("ckpt")
    out: str = setting("", "directory to write the Hugging Face model into (required)")
    force: bool = setting(False, "write into --out even if it holds files (same-named files are replaced, and an "
                                 "earlier export's other tokenizer files removed)")


@dataclass
class PrepareConfig:
    """scripts/prepare_data.py (minigpt.prepare_data in code)"""
    inputs: list = field(default_factory=list, metadata={
        "help": "text files, folders (their .txt files), globs, .jsonl/.json or .parquet files", "positional": "INPUT"})
    out: str = setting("", "the directory to write: new, empty or an earlier preparation (required)")
    tokenizer: str = common("tokenizer", "PATH may also be a directory prepare_data.py wrote (its tokenizer)")
    vocab_size: int = common("vocab_size")
    bpe_sample_mb: float = setting(20.0, "with --tokenizer bpe: MB of the corpus (its first) the BPE learns from")
    val_fraction: float = setting(0.1, "share of the tokens in the validation split, as whole documents")
    field: str = setting("text", "the text field of JSON lines, the column of Parquet")
    workers: int = setting(0, "encoding processes (0: one per CPU; characters: this process alone, their table "
                              "lookup being faster than sending the text to workers)")
    shard_tokens: int = setting(100_000_000, "tokens per shard at most")
    name: str = setting("", "the shards' name prefix (default: the directory's name)")
    skip_bad: bool = setting(False, "skip (and count) files that are not UTF-8 and bad JSON lines instead of "
                                    "stopping")
    quiet: bool = setting(False, "no progress on stderr")


def check_prepare(cfg):
    """A PrepareConfig's settings, as scripts/prepare_data.py and minigpt.prepare_data check them."""
    if not cfg.inputs:
        raise UserError("no INPUT given: name a text file, a folder, a glob or a .jsonl file")
    if not cfg.out:
        raise UserError("--out is required: the directory to write the shards into")
    if not 0 < cfg.val_fraction < 1:
        raise UserError(f"--val_fraction must lie between 0 and 1 (e.g. 0.1), got {cfg.val_fraction}")
    check_ranges(cfg, positive=("bpe_sample_mb", "shard_tokens", "vocab_size"), non_negative=("workers",))
    if cfg.shard_tokens >= 2 ** 31:
        raise UserError(f"--shard_tokens {cfg.shard_tokens}: llm.c's header holds a count below 2**31; use fewer")
    check_tokenizer(cfg)
    return check_common(cfg)


def check_sample(cfg):
    """A SampleConfig's (or the Python API's) sampling settings, as python -m minigpt.sample checks them."""
    check_ranges(cfg, positive=("num_samples",), non_negative=("max_new_tokens", "top_k", "seed"))
    if not cfg.temperature > 0:                                         # NaN too
        raise UserError(f"--temperature must be positive, got {cfg.temperature}; use --top_k 1 for greedy decoding")
    if not 0 < cfg.top_p <= 1:
        raise UserError(f"--top_p must lie in (0, 1], got {cfg.top_p}")
    return check_common(cfg)


_POSITIVE = ("batch_size", "grad_accum", "eval_interval", "eval_iters", "log_interval", "lr_decay_iters")
_NON_NEGATIVE = ("snapshots", "val_tokens", "max_iters", "max_time", "muon_lr_ratio", "warmup_iters", "sample_chars",
                 "seed", "lr", "min_lr", "weight_decay", "grad_clip", "muon_momentum_warmup", "embed_lr_ratio")


def check_ranges(cfg, positive=(), non_negative=()):
    """The named settings of cfg (any config dataclass) must be positive / zero or more: the one check that
    every command (training, sampling, the scripts) makes, so one value gets one message everywhere."""
    for k in positive:
        if getattr(cfg, k) <= 0:
            raise UserError(f"--{k} must be positive, got {getattr(cfg, k)}")
    for k in non_negative:
        if getattr(cfg, k) < 0:
            raise UserError(f"--{k} must be zero or more, got {getattr(cfg, k)}")
    return cfg


def check_model(cfg):
    """The model's rules, for a GPTConfig or a TrainConfig: the one place they are checked."""
    for f in fields(cfg) if isinstance(cfg, GPTConfig) else fields(ModelShape):
        v, typ = getattr(cfg, f.name), _TYPES.get(f.type, f.type)
        if typ is int and (isinstance(v, bool) or not isinstance(v, numbers.Integral) or v <= 0):
            raise UserError(f"--{f.name} must be positive (a whole number), got {v!r}")
        if typ is bool and not isinstance(v, bool):
            raise UserError(f"--{f.name} must be true or false, got {v!r}")
    if isinstance(cfg.dropout, bool) or not isinstance(cfg.dropout, (int, float)) or not 0.0 <= cfg.dropout < 1.0:
        raise UserError(f"--dropout must lie in [0, 1), got {cfg.dropout!r}")
    if cfg.activation not in ("gelu", "relu2"):
        raise UserError(f"--activation must be gelu or relu2, got {cfg.activation!r}")
    cap = cfg.logit_cap
    if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not 0 <= cap < math.inf:
        raise UserError(f"--logit_cap must be zero (off) or a positive number such as 30, got {cfg.logit_cap!r}")
    if cfg.n_embd % cfg.n_head:
        near = [h for h in range(1, cfg.n_embd + 1) if cfg.n_embd % h == 0][:8]
        raise UserError(f"--n_embd ({cfg.n_embd}) must be divisible by --n_head ({cfg.n_head}); "
                        f"n_head could be one of {near}...")
    return cfg


def check(cfg, given=None):
    """Training's settings, checked once: each failure is a UserError naming the setting and a valid value.
    given: the settings typed (default cfg.given; None for a config built in code). -> notes to print: a setting
    the user did not type that this call changed (a preset's --min_lr above a typed --lr goes down to it), and a
    run that will not do what its settings suggest (a warmup longer than the run)."""
    given = getattr(cfg, "given", None) if given is None else given
    check_ranges(cfg, _POSITIVE, _NON_NEGATIVE)
    check_model(cfg)
    for k in ("beta1", "beta2"):
        if not 0.0 <= getattr(cfg, k) < 1.0:
            raise UserError(f"--{k} must lie in [0, 1), got {getattr(cfg, k)}")
    if cfg.min_lr > cfg.lr and (given is None or "min_lr" in given):   # typed, or set in code (else: a note below)
        raise UserError(f"--min_lr {cfg.min_lr:g} is above --lr {cfg.lr:g}, so the decay would raise the learning "
                        "rate; pass a --min_lr at most --lr (e.g. --lr / 10)")
    for k, halved in (("context_warmup", "block_size"), ("batch_warmup", "batch_size")):
        if not 0.0 <= getattr(cfg, k) < 1.0:
            raise UserError(f"--{k} must lie in [0, 1) (0: off; 0.3: half the {halved.split('_')[0]} for the first "
                            f"30% of the run), got {getattr(cfg, k)}")
        if getattr(cfg, k) and getattr(cfg, halved) < 2:
            raise UserError(f"--{k} halves --{halved}, which is 1; use a --{halved} of at least 2 or --{k} 0")
    if not 0.0 <= cfg.cooldown <= 1.0:
        raise UserError(f"--cooldown must lie in [0, 1] (0: a cosine; 0.4: a straight line over the last 40%), "
                        f"got {cfg.cooldown}")
    if cfg.preset == "speedrun" and not cfg.max_time:
        raise UserError("--preset speedrun trains to a time budget: add --max_time SECONDS (e.g. --max_time 60)")
    if cfg.optimizer not in ("adamw", "muon"):
        raise UserError(f"--optimizer must be adamw or muon, got {cfg.optimizer!r}")
    if not plot_inside_out_dir(cfg.plot):
        raise UserError(f"--plot {cfg.plot!r} lies outside --out_dir, where a run writes everything; pass a name "
                        "such as curve.png, then copy it, or draw one anywhere with scripts/plot_losses.py "
                        "OUT_DIR/log.jsonl -o PATH")
    check_tokenizer(cfg)
    if given is not None and "vocab_size" in given and cfg.tokenizer != "bpe" and not os.path.isdir(cfg.data):
        raise UserError(f"--vocab_size sets the size of a BPE vocabulary, but this run's tokenizer is "
                        f"{cfg.tokenizer}; add --tokenizer bpe (a new run) or drop --vocab_size")
    if cfg.val_tokens == 1:
        raise UserError("--val_tokens 1 holds no next token to score; pass 0 (the whole split) or at least 2")
    check_common(cfg)
    notes = []
    if cfg.min_lr > cfg.lr:                                   # a default's or preset's --min_lr above a typed --lr
        notes.append(f"note: --min_lr {cfg.min_lr:g} (not typed) is above --lr {cfg.lr:g}; the lr decays to --lr "
                     "instead, so it never rises (type --min_lr to set where it ends)")
        cfg.min_lr = cfg.lr
    if not cfg.max_time and 0 < cfg.max_iters <= cfg.warmup_iters:     # a trial run shorter than its warmup
        notes.append(f"note: --warmup_iters {cfg.warmup_iters} is not below --max_iters {cfg.max_iters}: the lr is "
                     f"still rising when the run ends (peak --lr {cfg.lr:g} never reached); lower --warmup_iters "
                     "for a short run")
    return notes


def plot_inside_out_dir(plot):
    """Does --plot name a file inside --out_dir: '' (none), a name, or a relative path that stays inside it?"""
    return not plot or not (os.path.isabs(plot) or os.path.normpath(plot).split(os.sep)[0] == os.pardir)


def check_backend(name, given=None):
    """--backend, typed or from $MINIGPT_BACKEND (default_backend): every command checks it with these words.
    given: the settings typed (parse_args' cfg.given), to name the source; None when unknown."""
    if name in ("auto", "numpy", "numba", "native"):
        return
    if given is not None and "backend" not in given and default_backend(unset=None) == name:
        raise UserError(f"MINIGPT_BACKEND={name!r} is not a backend; set it to one of auto, numpy, numba, native, "
                        "or unset it")
    source = "" if given is not None else " (from --backend, else MINIGPT_BACKEND)"
    raise UserError(f"--backend must be one of auto, numpy, numba, native; got {name!r}{source}")


def check_dtype(dtype, auto=False):
    """--dtype: float32 or bf16 (products in bfloat16, the rest float32); auto=True (training) also takes auto,
    which times a step of each (minigpt/train.py's faster_dtype)."""
    if dtype == "auto" and not auto:
        raise UserError("--dtype auto is training's (it times a step of each); here pass float32 or bf16")
    if dtype not in ("float32", "bf16", "auto"):
        raise UserError(f"--dtype must be {'float32, bf16 or auto' if auto else 'float32 or bf16'}, got {dtype!r}")
    return dtype


# ----------------------------------------------------------------------------
# command line: --key value, --key=value, --key-with-dashes, --flag (true), --flag=false, --help

_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}
_TYPES = {"bool": bool, "int": int, "float": float, "str": str}   # annotations that are strings (PEP 563)
_METAVAR = {bool: "BOOL", int: "INT", float: "FLOAT", str: "STR"}
_EPILOG = ("Each setting is --key VALUE or --key=VALUE (dashes or underscores also work: {dashed}).\n"
           "A true/false setting alone means true; it also takes true/false, 1/0, yes/no, on/off.")


def _converter(key, typ):
    """argparse's type= for one setting; its errors are UserErrors, which argparse lets through untouched."""
    def convert(text):
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
    return convert


class _Parser(argparse.ArgumentParser):
    """argparse, but a mistake raises UserError (the caller prints it) instead of printing usage and exit(2)."""

    def error(self, message):
        m = re.fullmatch(r"argument (--\w+): expected one argument", message)
        raise UserError(f"{m[1]} needs a value" if m else message)


class ScriptParser(argparse.ArgumentParser):
    """argparse for a script's own options (scripts/plot_losses.py, speedrun.py): a mistake raises UserError,
    "<argparse's message>; see --help", which the script prints as one line, instead of usage and exit(2)."""

    def error(self, message):
        raise UserError(f"{message}; see --help")


def _shown(value):
    return str(value).lower() if isinstance(value, bool) else repr(value) if isinstance(value, str) else str(value)


def _default(f, defaults):
    if f.name in defaults:
        return defaults[f.name]
    return f.default_factory() if f.default is MISSING else f.default


def _formatter(prog):                    # description and epilog keep their line breaks (docstrings, examples)
    return argparse.RawDescriptionHelpFormatter(prog, max_help_position=32)


def make_parser(cls=TrainConfig, prog=None, description=None, defaults=None):
    """The argparse parser of dataclass cls: one --name per field, its help line and default in --help
    (`defaults` replace the field's; a help line that words its own "(default: ...)", or says "(required)",
    keeps only that). No argparse defaults (SUPPRESS): the namespace holds exactly what was typed, which is what
    .given needs."""
    dashed = next(("--" + f.name.replace("_", "-") for f in fields(cls) if "_" in f.name), "--key-name")
    p = _Parser(prog=prog, usage="%(prog)s [--key VALUE ...]", description=description,
                epilog=_EPILOG.format(dashed=dashed),
                allow_abbrev=False, formatter_class=_formatter)
    for f in fields(cls):
        typ = _TYPES.get(f.type, f.type)
        text = f.metadata.get("help", "").replace("%", "%%")              # argparse %-formats help strings
        if "positional" in f.metadata:                                    # a list of arguments without a --key
            p.add_argument(f.name, nargs="*", default=argparse.SUPPRESS, metavar=f.metadata["positional"],
                           help=text)
            p.usage = f"%(prog)s {f.metadata['positional']}... [--key VALUE ...]"
            continue
        if "(default:" not in text and "(required)" not in text:
            text += f" (default: {_shown(_default(f, defaults or {}))})"
        p.add_argument(f"--{f.name}", type=_converter(f.name, typ), default=argparse.SUPPRESS,
                       metavar=_METAVAR.get(typ, "VALUE"), help=text,
                       **({"nargs": "?", "const": True} if typ is bool else {}))    # a bare --flag is true
    return p


def _unknown(arg, keys):
    """The UserError for the first argument argparse did not recognise."""
    if not arg.startswith("--"):
        return UserError(f"unexpected argument {arg!r}; settings are given as --key value or --key=value")
    key = arg[2:].partition("=")[0]
    near = difflib.get_close_matches(key, keys, n=1)
    hint = f"; did you mean --{near[0]}?" if near else f"; valid settings: {', '.join(keys)}"
    return UserError(f"unknown setting --{key}{hint}")


def _bare_flags(argv, cls):
    """For a command that takes words (INPUT...): a true/false setting typed alone (--skip_bad) before a word that
    is no true/false value becomes --skip_bad=true, so the word is not read as its value."""
    flags = {f"--{f.name}" for f in fields(cls) if _TYPES.get(f.type, f.type) is bool}
    return [f"{a}=true" if a in flags and i + 1 < len(argv) and not argv[i + 1].startswith("-")
            and argv[i + 1].lower() not in _TRUE | _FALSE else a for i, a in enumerate(argv)]


def _underscored(arg):
    """--key-with-dashes[=value] -> --key_with_dashes[=value]; values and other arguments unchanged."""
    if not arg.startswith("--"):
        return arg
    key, eq, value = arg.partition("=")
    return "--" + key[2:].replace("-", "_") + eq + value


def parse_args(argv, cls=TrainConfig, *, prog=None, description=None, **defaults):
    """Build cls(**defaults) with the overrides in argv applied; works for any dataclass (best with setting()
    fields). The config's .given is the frozenset of keys typed in argv (not those in defaults), and a typed
    --preset's keys (they count as typed: on --resume they win over the checkpoint's). --help prints the
    settings and raises SystemExit(0); every mistake is a UserError."""
    positional = next((f.name for f in fields(cls) if "positional" in f.metadata), None)
    words = []                                                        # after "--": positional words alone
    if positional and "--" in argv:
        argv, words = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    argv = [_underscored(a) for a in argv]
    if positional:                                                    # elsewhere no word may follow: argparse
        argv = _bare_flags(argv, cls)                                 # says why
    parser = make_parser(cls, prog, description, defaults)
    typed, extra = (parser.parse_known_intermixed_args if positional else parser.parse_known_args)(argv)
    if words:
        setattr(typed, positional, getattr(typed, positional, []) + words)
    if extra:
        raise _unknown(extra[0], [f.name for f in fields(cls) if "positional" not in f.metadata])
    given = frozenset(vars(typed)) - set(defaults)                    # what the user set explicitly
    preset = vars(typed).get("preset") or defaults.get("preset") or ("finetune" if vars(typed).get("init_from") else "")
    if preset:                                                        # its values become defaults
        if preset not in PRESETS:
            raise UserError(f"unknown --preset {preset!r}; choose one of {', '.join(PRESETS)}")
        defaults = {**PRESETS[preset], **defaults}
        if "preset" in given:                                         # typed: they count as typed (on --resume
            given |= PRESETS[preset].keys() - set(vars(typed))        # they win over the checkpoint's)
    cfg = cls(**{**defaults, **vars(typed)})
    cfg.given = given
    return cfg


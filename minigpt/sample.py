"""Sampling from a checkpoint: temperature, top-k, top-p (nucleus), a seeded generator.

    python -m minigpt.sample --out_dir out --prompt "ROMEO:" --num_samples 3 --max_new_tokens 300

The context given to the model is cropped to its last block_size tokens. top_k=1 is greedy. Generation runs
the model's own forward: with a KV cache (model.KVCache) over the new positions only. This file holds sampling
and no model math.
"""
import codecs
import os
import sys
import time

import numpy as np

from . import backends, checkpoint
from .backends import select_backend
from .tokenizer import tokenizer_from_json
from .config import SampleConfig, check_common, check_ranges, parse_args, run_command
from .errors import UserError
from .model import GPT, GPTConfig, KVCache
from .outdir import OutDir


def load_model(path, loaded=None, ops=None, bf16=False):
    """-> (GPT in eval mode, its tokenizer) from a checkpoint file (or from its checkpoint.load(path) result),
    running on backend ops (None: GPT's default) with bf16 products or not."""
    meta, params, _ = loaded if loaded is not None else checkpoint.load(path)
    model = GPT(GPTConfig(**meta["model_config"]), np.random.default_rng(0), bf16=bf16, ops=ops)
    checkpoint.load_params(model, params, path)
    tok = tokenizer_from_json(meta["tokenizer"])
    if tok.vocab_size != model.config.vocab_size:
        raise UserError(f"{path}: tokenizer has {tok.vocab_size} symbols but the model {model.config.vocab_size}")
    return model.eval(), tok


# ----------------------------------------------------------------------------
# one sampling step and the generation loop

def check_temperature(t):
    if not t > 0:                                                       # NaN too
        raise UserError(f"--temperature must be positive, got {t}; use --top_k 1 for greedy decoding")


def distribution(logits, temperature=1.0, top_k=0, top_p=1.0):
    """logits (B, V) -> the probabilities (B, V) the sampler draws from: softmax(logits / temperature), then
    top_k keeps the k largest, top_p the smallest set with mass >= p, renormalised (float64)."""
    check_temperature(temperature)
    z = logits.astype(np.float64)
    z -= z.max(-1, keepdims=True)                                      # <= 0, the largest 0: a tiny temperature
    with np.errstate(over="ignore"):                                   # sends the others to -inf (greedy), not
        z /= temperature                                               # the largest to inf (NaN after exp)
    if top_k and top_k < z.shape[-1]:
        kth = np.partition(z, -top_k, axis=-1)[:, -top_k][:, None]     # (B, 1) k-th largest
        z = np.where(z < kth, -np.inf, z)
    probs = np.exp(z)                                                  # the largest z is 0 (subtracted above)
    probs /= probs.sum(-1, keepdims=True)                              # (B, V)
    if top_p < 1.0:
        order = np.argsort(-probs, axis=-1, kind="stable")              # (B, V) most likely first
        sorted_p = np.take_along_axis(probs, order, -1)
        keep_sorted = np.cumsum(sorted_p, -1) - sorted_p < top_p       # mass before this token < p
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, -1)
        probs = np.where(keep, probs, 0.0)
        probs /= probs.sum(-1, keepdims=True)
    return probs


def sample_next(logits, rng, temperature=1.0, top_k=0, top_p=1.0):
    """logits (B, V) -> next ids (B,), drawn from distribution(...); top_k=1 is greedy."""
    probs = distribution(logits, temperature, top_k, top_p)
    if top_k == 1:
        return probs.argmax(-1)                                        # greedy, no randomness used
    cdf = np.cumsum(probs, -1)                                         # (B, V)
    u = rng.random((probs.shape[0], 1)) * cdf[:, -1:]
    return np.minimum((cdf <= u).sum(-1), probs.shape[-1] - 1)         # inverse-CDF draw; skips p = 0 even at u = 0


def start_text(tok):
    """What an unprompted sample starts from: a newline, or the first symbol of a character vocabulary without
    one (BPE and GPT-2 tokenizers encode any text)."""
    chars = getattr(tok, "chars", "\n")
    return "\n" if "\n" in chars else chars[0]


class Decoder:
    """The logits of the next token for a growing batch of contexts, from the model's own forward: with a KV
    cache over the positions it has not seen yet, or by recomputing the cropped context.

    KV-cache policy: the prompt is prefilled in one pass, then each new token costs one position's forward pass.
    The learned positional table cannot slide, so once the context is longer than block_size every step sees a
    new window of the last block_size tokens, whose keys and values the cache does not hold: from there each
    step recomputes that window, as without a cache (reports/generation.md)."""

    def __init__(self, model, idx, use_cache=True):
        self.model, self.idx = model, np.asarray(idx)                  # idx (B, T0)
        self.T = model.config.block_size
        self.kv = KVCache(model, self.idx.shape[0]) if use_cache else None

    def logits(self):
        """(B, V) logits for the token after the current context."""
        if self.kv is None or self.idx.shape[1] > self.T:             # no cache, or a sliding window
            return self.model.forward(self.idx[:, -self.T:])[0][:, -1]
        new = self.idx[:, self.kv.n:]                                  # the prompt, then one new position
        return self.model.forward(new, cache=self.kv)[0][:, -1]

    def append(self, nxt):                                             # nxt (B,)
        self.idx = np.concatenate([self.idx, nxt[:, None]], axis=1)


SPIN_US = 200      # native workers wait this long on the CPU between decoding's back-to-back products


def generate(model, idx, max_new_tokens, rng, temperature=1.0, top_k=0, top_p=1.0, use_cache=True):
    """Yield the next token ids (B,) max_new_tokens times, continuing idx (B, T0). model must be in eval mode."""
    dec = Decoder(model, idx, use_cache)
    model.ops.spin(SPIN_US)
    try:
        for _ in range(max_new_tokens):
            nxt = sample_next(dec.logits(), rng, temperature, top_k, top_p)
            dec.append(nxt)
            yield nxt
    finally:
        model.ops.spin()                                              # back to the default


# ----------------------------------------------------------------------------
# command line

def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        cfg, prompt = _settings(argv)                                  # every check before loading or printing
        path = cfg.ckpt or OutDir(cfg.out_dir).checkpoint()
        loaded = checkpoint.load(path)
        ops = select_backend(cfg, verbose=False)                       # said below, once every setting has passed
        model, tok = load_model(path, loaded, ops, bf16=cfg.dtype == "bf16")
        ids = tok.encode(prompt)                                       # a prompt outside the vocabulary: before
        select_backend(cfg)                                            # "backend auto -> ..." is printed
        rng = np.random.default_rng(cfg.seed)
        idx = np.tile(ids, (cfg.num_samples, 1))                       # (N, T0): all samples in one batch
        out = []
        print(prompt, end="", flush=True)
        t0 = time.perf_counter()
        utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a BPE token may end mid-character
        for nxt in generate(model, idx, cfg.max_new_tokens, rng, cfg.temperature, cfg.top_k, cfg.top_p, cfg.kv_cache):
            out.append(nxt)
            print(utf8.decode(tok.token_bytes(nxt[0])), end="", flush=True)   # stream the first sample
        print(utf8.decode(b"", final=True), end="")
        dt = time.perf_counter() - t0
        rows = np.stack(out, axis=1) if out else np.zeros((cfg.num_samples, 0), int)   # (N, new)
        for s in range(1, cfg.num_samples):
            print("\n" + "-" * 40 + "\n" + prompt + tok.decode(rows[s]), end="")
        print("\n" + "-" * 40, flush=True)
        n_tok, n = rows.size, cfg.num_samples
        print(f"{path}: {n_tok} tokens in {dt:.2f} s: {n_tok / max(dt, 1e-9):,.0f} tokens/s "
              f"({n} sample{'s' * (n != 1)}, kv_cache={cfg.kv_cache}, backend {backends.label(model.ops, model.bf16)})",
              file=sys.stderr)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def _settings(argv):
    """-> (SampleConfig, prompt text), every setting checked: nothing is loaded or printed before this."""
    cfg = parse_args(argv, SampleConfig, prog="python -m minigpt.sample", description=__doc__)
    check_ranges(cfg, positive=("num_samples",), non_negative=("max_new_tokens", "top_k", "seed"))
    check_temperature(cfg.temperature)
    if not 0 < cfg.top_p <= 1:
        raise UserError(f"--top_p must lie in (0, 1], got {cfg.top_p}")
    check_common(cfg)
    prompt = cfg.prompt
    if cfg.prompt_file:
        if not os.path.isfile(cfg.prompt_file):
            what = ("is a directory" if os.path.isdir(cfg.prompt_file) else
                    "is not a regular file" if os.path.exists(cfg.prompt_file) else "does not exist")
            raise UserError(f"--prompt_file {cfg.prompt_file!r} {what}; pass a UTF-8 text file, or the text itself "
                            "with --prompt TEXT")
        try:
            with open(cfg.prompt_file, encoding="utf-8") as f:
                prompt = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(f"--prompt_file {cfg.prompt_file!r} cannot be read as UTF-8 text ({e}); "
                            "convert it to UTF-8 or pass --prompt TEXT") from None
    if not prompt:
        where = f"--prompt_file {cfg.prompt_file!r} is empty" if cfg.prompt_file else "the prompt is empty"
        raise UserError(f"{where}; pass at least one character (--prompt TEXT, or a file that holds some)")
    return cfg, prompt


if __name__ == "__main__":
    sys.exit(run_command(main))

"""minigpt: a GPT trainer in NumPy in which every layer has a hand-written forward and backward pass.

Use it from Python with the same functions the commands call:

    import minigpt
    m = minigpt.load("out")                              # a run's --out_dir, or a checkpoint file
    print(m.generate("ROMEO:", 200, seed=1))             # what `python -m minigpt.sample` prints for that seed
    result = minigpt.train(data="my.txt", out_dir="out-mine", max_iters=200)   # python -m minigpt.train's run
    minigpt.prepare_data(["books/"], "data/books", tokenizer="bpe")           # scripts/prepare_data.py's shards

A setting given in code gets the command line's checks and its one-line UserError. Importing minigpt loads only
this file and minigpt/errors.py; numpy, numba, the C library and matplotlib load when a call needs them.
docs/walkthrough.ipynb goes from here into the layers, a gradient checked by hand, training and sampling.
"""
from .errors import UserError

__all__ = ["load", "train", "prepare_data", "Model", "UserError"]


def load(path="out", backend=None, threads=0, dtype="float32"):
    """The model a training run wrote, with its tokenizer: path is a run's --out_dir (its ckpt_best.npz, else
    ckpt_last.npz, as the sampler reads) or a checkpoint file. backend: auto | numpy | numba | native (default:
    $MINIGPT_BACKEND, else auto); dtype: float32 | bf16 products, as the commands' --dtype. -> Model"""
    import os

    from . import checkpoint
    from .backends import select_backend
    from .config import SampleConfig, check_common
    from .outdir import OutDir
    from .sample import load_model

    cfg = SampleConfig(out_dir=path, threads=threads, dtype=dtype)
    if backend is not None:
        cfg.backend = backend
    check_common(cfg)
    ckpt = path if os.path.isfile(path) else OutDir(path).checkpoint()
    loaded = checkpoint.load(ckpt)
    gpt, tok = load_model(ckpt, loaded, select_backend(cfg), bf16=dtype == "bf16")
    return Model(gpt, tok, ckpt)


def __getattr__(name):
    """minigpt.train and minigpt.prepare_data: the modules minigpt/train.py and minigpt/prepare_data.py, callable
    as the API's functions (train.python_train, prepare_data.prepare); imported on first use, so that importing
    minigpt stays light."""
    if name in ("train", "prepare_data"):
        import importlib
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'minigpt' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))


class Model:
    """A trained GPT (minigpt/model.py) with its tokenizer: generate text, score text."""

    def __init__(self, gpt, tokenizer, path=None):
        self.gpt, self.tokenizer, self.path = gpt, tokenizer, path

    @property
    def config(self):
        return self.gpt.config

    def __repr__(self):
        c = self.config
        return (f"Model({self.path!r}: {self.gpt.num_params():,} parameters, {c.n_layer} layers, {c.n_head} heads, "
                f"width {c.n_embd}, context {c.block_size}, vocabulary {c.vocab_size})")

    def stream(self, text="\n", max_new_tokens=500, temperature=0.8, top_k=0, top_p=1.0, seed=1337, kv_cache=True):
        """Yield the continuation of text piece by piece, as the sampler prints it (the defaults are
        `python -m minigpt.sample`'s)."""
        import codecs

        import numpy as np

        from .config import SampleConfig, check_sample
        from .sample import generate

        check_sample(SampleConfig(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                                  seed=seed))
        ids = self.tokenizer.encode(text)
        rng = np.random.default_rng(seed)
        utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")    # a BPE token may end mid-character
        self.gpt.eval()
        for nxt in generate(self.gpt, ids[None], max_new_tokens, rng, temperature, top_k, top_p, kv_cache):
            yield utf8.decode(self.tokenizer.token_bytes(nxt[0]))
        yield utf8.decode(b"", final=True)

    def generate(self, text="\n", max_new_tokens=500, temperature=0.8, top_k=0, top_p=1.0, seed=1337,
                 kv_cache=True):
        """text followed by max_new_tokens sampled tokens: what `python -m minigpt.sample --prompt TEXT --seed
        SEED --max_new_tokens N --num_samples 1` prints as its sample."""
        return text + "".join(self.stream(text, max_new_tokens, temperature, top_k, top_p, seed, kv_cache))

    def token_losses(self, text):
        """-> (the tokens of text as strings, the loss of each token after the first in nats): how surprised the
        model is by each next token, with up to block_size tokens of context (as the report's section 6)."""
        from .lens import token_losses

        ids = self.tokenizer.encode(text)
        if len(ids) < 2:
            raise UserError(f"text of {len(ids)} token(s) has no next token to score; pass at least two")
        return [self.tokenizer.decode([i]) for i in ids], token_losses(self.gpt, ids, self.config.block_size)

    def loss(self, text):
        """The mean loss over text's next tokens, in nats per token (the whole-split score of a run)."""
        return float(self.token_losses(text)[1].mean())

"""Small texts and configs the training tests write themselves."""
import numpy as np

from minigpt.config import TrainConfig

TINY_TRAIN = dict(n_layer=2, n_head=2, n_embd=16, block_size=16, batch_size=4, max_iters=12, eval_interval=4,
                  eval_iters=2, warmup_iters=2, lr_decay_iters=12, lr=3e-3, min_lr=3e-4, log_interval=4,
                  sample_chars=0, plot="", backend="numpy")


def write_text(path, n_chars=6000, seed=0):
    """A deterministic, learnable text: words from a small vocabulary in short lines."""
    rng = np.random.default_rng(seed)
    words = ["to", "be", "or", "not", "the", "king", "shall", "speak", "my", "lord", "and", "good", "night"]
    out, n = [], 0
    while n < n_chars:
        line = " ".join(rng.choice(words, rng.integers(3, 8))).capitalize() + ".\n"
        out.append(line)
        n += len(line)
    text = "".join(out)[:n_chars]
    path.write_text(text, encoding="utf-8")
    return text


def tiny_cfg(tmp_path, **kw):
    data = tmp_path / "text.txt"
    if not data.exists():
        tmp_path.mkdir(parents=True, exist_ok=True)
        write_text(data)
    return TrainConfig(**{**TINY_TRAIN, "data": str(data), "out_dir": str(tmp_path / "out"), **kw})

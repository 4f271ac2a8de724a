"""Text data: load a UTF-8 file, a character tokenizer, a 90/10 train/val split, random (B, T) batches.
(The byte-level BPE tokenizer, with the same interface, is minigpt/bpe.py.)

Token ids are stored once as compact uint16 (int32 past 65,536 symbols) and batches are gathered from them
with one fancy-index; the file is never re-read. Every bad input raises a UserError naming the fix.
"""
import json
import os

import numpy as np

from .config import UserError


# ----------------------------------------------------------------------------
# text and tokenizer

def load_text(path):
    """Read a whole UTF-8 text file, with a clear error for each way it can be unusable."""
    if not os.path.exists(path):
        raise UserError(f"data file {path!r} does not exist; pass --data PATH to a UTF-8 text file")
    if os.path.isdir(path):
        raise UserError(f"data path {path!r} is a directory; pass --data PATH to a text file inside it")
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise UserError(f"cannot read data file {path!r} ({e.strerror}); fix its permissions or pass another "
                        "--data") from None
    if not raw:
        raise UserError(f"data file {path!r} is empty; pass --data PATH to a file with text in it")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        if b"\0" in raw[:8192]:                                    # text in no encoding has NUL bytes
            raise UserError(f"data file {path!r} is a binary file (NUL bytes), not text; pass --data PATH to a "
                            "UTF-8 text file") from None
        raise UserError(f"data file {path!r} is not UTF-8 text: byte offset {e.start} "
                        f"(0x{raw[e.start]:02x}) cannot be decoded; convert the file to UTF-8 "
                        f"(e.g. iconv -f latin1 -t utf-8) or pass another --data") from None


def checked_ids(ids, vocab_size):
    """ids (any shape) -> a list of ints, each in [0, vocab_size), or ValueError (a negative id would index from
    the end of a Python list)."""
    ids = np.asarray(ids).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"token ids must lie in [0, {vocab_size}), got min {ids.min()} max {ids.max()}")
    return ids.tolist()


class CharTokenizer:
    """One token per distinct character, ids in sorted order (as nanoGPT's shakespeare_char)."""

    def __init__(self, chars):
        self.chars = list(chars)
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        self.dtype = np.uint16 if len(self.chars) <= 65536 else np.int32

    @classmethod
    def from_text(cls, text):
        return cls(sorted(set(text)))

    @property
    def vocab_size(self):
        return len(self.chars)

    def encode(self, text):
        unknown = sorted(set(text) - self.stoi.keys())
        if unknown:
            shown = ", ".join(repr(c) for c in unknown[:20]) + (" ..." if len(unknown) > 20 else "")
            raise UserError(f"{len(unknown)} character(s) are not in the tokenizer's vocabulary: {shown}; "
                            "use only characters of the training text")
        return np.fromiter((self.stoi[c] for c in text), self.dtype, count=len(text))

    def decode(self, ids):
        return "".join(self.chars[i] for i in checked_ids(ids, len(self.chars)))

    def token_bytes(self, i):
        """The UTF-8 bytes of token i (for decoding a stream token by token, as BPETokenizer.token_bytes)."""
        return self.chars[checked_ids(i, len(self.chars))[0]].encode("utf-8")

    def to_json(self):
        return json.dumps(self.chars, ensure_ascii=True)

    @classmethod
    def from_json(cls, s):
        return cls(json.loads(s))


# ----------------------------------------------------------------------------
# dataset

def split_text(text):
    """The text's first 90% of characters for training, the rest for validation: the same validation text for
    every tokenizer (so their losses convert to bits per character on equal terms); a BPE trains on the first."""
    n = int(0.9 * len(text))
    return text[:n], text[n:]


class Dataset:
    """Text split 90/10 into train and val (split_text), each encoded; batch() draws (x, y), y shifted by one."""

    def __init__(self, text, tokenizer, block_size, source="text", fixed_block=False):
        """fixed_block: block_size is a checkpoint's (a resumed or evaluated model's): the error then offers no
        smaller --block_size."""
        texts = dict(zip(("train", "val"), split_text(text)))
        self.splits = {k: tokenizer.encode(t) for k, t in texts.items()}   # (N,) each: uint16, int32 past 65,536 ids
        for split, arr in self.splits.items():
            if len(arr) < block_size + 1:
                whose = " (the checkpoint's)" if fixed_block else ""
                smaller = "" if fixed_block else " or a smaller --block_size"
                raise UserError(f"{source}: the {split} split has {len(arr)} tokens but block_size {block_size}"
                                f"{whose} needs at least {block_size + 1}; use a longer text (about "
                                f"{10 * (block_size + 1)} characters or more){smaller}")

    def batch(self, split, batch_size, block_size, rng, rank=0, ranks=1):
        """(x, y) int32 (B, T) drawn from split with rng; y is x shifted by one token. With ranks > 1 (data
        parallel), rng draws the whole batch of ranks * B rows, the same on every rank, and rank takes its B."""
        data = self.splits[split]
        ix = rng.integers(0, len(data) - block_size, batch_size * ranks)  # (ranks * B,) start offsets
        ix = ix[rank * batch_size:(rank + 1) * batch_size]               # (B,) this rank's
        rows = ix[:, None] + np.arange(block_size + 1)                     # (B, T+1)
        chunk = data[rows].astype(np.int32)
        return chunk[:, :-1], chunk[:, 1:]

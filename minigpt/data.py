"""Text data: load a UTF-8 file, a character tokenizer, a 90/10 train/val split, random (B, T) batches.
(The byte-level BPE tokenizer, with the same interface, is minigpt/bpe.py.)

Token ids are stored once as compact uint16 (int32 past 65,536 symbols) and batches are gathered from them
with one fancy-index; the file is never re-read. Every bad input raises a UserError naming the fix.
A corpus too big for memory is prepared once into token shards (minigpt/prepare_data.py) and memory-mapped
(minigpt/shards.py: ShardDataset, with this Dataset's batch() and ids()).
"""
import glob
import json
import os

import numpy as np

from .errors import UserError


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


def code_points(text):
    """str -> (N,) its code points: the bytes themselves for ASCII, else UTF-32 (lone surrogates kept)."""
    if text.isascii():
        return np.frombuffer(text.encode("ascii"), np.uint8)
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), np.uint32)


class CharTokenizer:
    """One token per distinct character, ids in sorted order (as nanoGPT's shakespeare_char)."""

    def __init__(self, chars):
        self.chars = list(chars)
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        self.dtype = np.uint16 if len(self.chars) <= 65536 else np.int32
        self._lut = None                                 # code point -> id (-1: not in the vocabulary), on first use

    @classmethod
    def from_text(cls, text):
        return cls(sorted(set(text)))

    @property
    def vocab_size(self):
        return len(self.chars)

    def encode(self, text):
        """str -> (N,) ids: one table lookup over the text's code points (no Python loop per character)."""
        if self._lut is None:
            cps = [ord(c) for c in self.chars]
            self._lut = np.full(max(256, max(cps, default=0) + 2), -1, np.int64)  # the last: past the alphabet
            self._lut[cps] = np.arange(len(cps))
        cps = code_points(text)                                             # (N,) uint8 or uint32
        if cps.dtype != np.uint8:                                           # (every byte lies inside the table)
            cps = np.minimum(cps, np.uint32(len(self._lut) - 1))
        ids = self._lut[cps]                                                # (N,)
        if ids.size and ids.min() < 0:
            unknown = sorted(set(text) - self.stoi.keys())
            shown = ", ".join(repr(c) for c in unknown[:20]) + (" ..." if len(unknown) > 20 else "")
            raise UserError(f"{len(unknown)} character(s) are not in the tokenizer's vocabulary: {shown}; "
                            "use only characters of the training text")
        return ids.astype(self.dtype)

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


def check_block(n, block_size, fixed_block, what, remedy):
    """A split (or its longest shard) of n tokens must hold one block and its next token; else a UserError that
    starts with `what` and offers `remedy`, and a smaller --block_size unless the block is a checkpoint's."""
    if n < block_size + 1:
        whose = " (the checkpoint's)" if fixed_block else ""
        smaller = "" if fixed_block else " or a smaller --block_size"
        raise UserError(f"{what} {n} tokens but block_size {block_size}{whose} needs at least {block_size + 1}; "
                        f"{remedy}{smaller}")


class Dataset:
    """Text split 90/10 into train and val (split_text), each encoded; batch() draws (x, y), y shifted by one."""

    def __init__(self, text, tokenizer, block_size, source="text", fixed_block=False):
        """fixed_block: block_size is a checkpoint's (a resumed or evaluated model's): the error then offers no
        smaller --block_size."""
        texts = dict(zip(("train", "val"), split_text(text)))
        self.splits = {k: tokenizer.encode(t) for k, t in texts.items()}   # (N,) each: uint16, int32 past 65,536 ids
        for split, arr in self.splits.items():
            check_block(len(arr), block_size, fixed_block, f"{source}: the {split} split has",
                        f"use a longer text (about {10 * (block_size + 1)} characters or more)")

    def num_tokens(self, split):
        return len(self.splits[split])

    def ids(self, split, max_tokens=None):
        """(N,) the split's first max_tokens tokens (all if None): what evaluation scores (as ShardDataset.ids)."""
        return self.splits[split][:max_tokens]

    def batch(self, split, batch_size, block_size, rng, rank=0, ranks=1):
        """(x, y) int32 (B, T) drawn from split with rng; y is x shifted by one token. With ranks > 1 (data
        parallel), rng draws the whole batch of ranks * B rows, the same on every rank, and rank takes its B."""
        data = self.splits[split]
        ix = rng.integers(0, len(data) - block_size, batch_size * ranks)  # (ranks * B,) start offsets
        ix = ix[rank * batch_size:(rank + 1) * batch_size]               # (B,) this rank's
        rows = ix[:, None] + np.arange(block_size + 1)                     # (B, T+1)
        chunk = data[rows].astype(np.int32)
        return chunk[:, :-1], chunk[:, 1:]


# ----------------------------------------------------------------------------
# a corpus on disk (minigpt/prepare_data.py): files, folders, globs, JSON lines, Parquet, read in pieces

TEXT, JSONL, PARQUET = "text", "jsonl", "parquet"
_KINDS = {".jsonl": JSONL, ".json": JSONL, ".parquet": PARQUET}


def find_inputs(inputs):
    """[(path, kind)] of the INPUT arguments, in order, each file once: a file (kind by its extension), a folder
    (its .txt files, recursively, sorted) or a glob (its matches, sorted)."""
    found = []
    for arg in inputs:
        if os.path.isdir(arg):
            paths = sorted(os.path.join(d, n) for d, _, names in os.walk(arg) for n in names if n.endswith(".txt"))
            if not paths:
                raise UserError(f"input folder {arg!r} has no .txt files (searched recursively); pass the files "
                                "themselves for other extensions")
        elif os.path.exists(arg):
            paths = [arg]
        elif any(c in arg for c in "*?["):
            paths = sorted(p for p in glob.glob(arg, recursive=True) if os.path.isfile(p))
            if not paths:
                raise UserError(f"input pattern {arg!r} matches no file; check it (quote it so the shell does not "
                                "expand it first)")
        else:
            raise UserError(f"input {arg!r} does not exist; pass a text file, a folder, a glob or a .jsonl file")
        found += [(p, _KINDS.get(os.path.splitext(p)[1].lower(), TEXT)) for p in paths]
    if not found:
        raise UserError("no input given; pass a text file, a folder of .txt files, a glob or a .jsonl file")
    seen, out = set(), []
    for p, kind in found:
        key = os.path.realpath(p)
        if key not in seen:
            seen.add(key)
            out.append((p, kind))
    return out


def cut_point(buf, mode, lo=0, avoid=b""):
    """The last offset k in buf[lo:] (bytes) where the text can be cut in two, 0 if none. "words" (a tokenizer
    whose regex splits text into words: bpe, gpt2): just before a newline that a printable ASCII character
    follows: every such regex ends a piece there in the whole text and in its first part alike (a whitespace
    run before a non-space is cut before its last character), and starts afresh after it; avoid: the first bytes
    of the tokenizer's added tokens (<|endoftext|>), which end a text of their own. "lines": just after a
    newline. "chars": before the last character that starts in buf."""
    end = len(buf) - 1
    while mode != "chars":
        p = buf.rfind(b"\n", lo, end)
        if p < 1:
            return 0
        if mode == "lines":
            return p + 1
        if 0x21 <= buf[p + 1] <= 0x7e and buf[p + 1] not in avoid:
            return p
        end = p
    k = len(buf) - 1
    while k > lo and buf[k] & 0xC0 == 0x80:                                 # UTF-8 continuation bytes
        k -= 1
    return max(k, 0)


def read_pieces(path, mode, start=0, end=None, piece_bytes=1 << 20, avoid=b""):
    """Yield (offset, raw bytes) covering path[start:end] in pieces of about piece_bytes, each cut at
    cut_point(mode, avoid) (a piece grows until it has one). Memory: a piece, whatever the file's size."""
    end = os.path.getsize(path) if end is None else end
    with open(path, "rb") as f:
        f.seek(start)
        pos, carry = start, b""
        while pos < end:
            data = f.read(min(piece_bytes, end - pos))
            if not data:                                                    # the file shrank under us
                break
            pos += len(data)
            buf = carry + data
            k = cut_point(buf, mode, max(0, len(carry) - 1), avoid) if pos < end else len(buf)
            if k:
                yield pos - len(buf), buf[:k]
            carry = buf[k:]
        if carry:
            yield pos - len(carry), carry


def decode(raw, path, offset=0):
    """raw bytes of path (from byte offset) -> str; not UTF-8: a UserError naming the file and the byte offset."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise NotUTF8(f"{path} is not UTF-8 text: byte offset {offset + e.start} (0x{raw[e.start]:02x}) cannot be "
                      "decoded; convert it (e.g. iconv -f latin1 -t utf-8), leave it out, or pass --skip_bad to "
                      "skip such files") from None


class NotUTF8(UserError):
    """A file (or a JSON line) that is not UTF-8."""


def read_lines(path, piece_bytes=1 << 20):
    """Yield (line number of the first, raw bytes of whole lines) of a JSON-lines file, about piece_bytes each."""
    line = 1
    for _, raw in read_pieces(path, "lines", piece_bytes=piece_bytes):
        yield line, raw
        line += raw.count(b"\n")


def jsonl_texts(raw, path, line, field, skip_bad=False):
    """(texts, bad): the string field of each JSON line of raw (line: the number of its first), blank lines
    skipped; a line that is not JSON, not UTF-8 or has no such string is a UserError naming file and line, or,
    with skip_bad, counted in bad."""
    texts, bad = [], 0
    first = raw.lstrip()[:1] == b"[" and line == 1

    def hint(i):
        return "; the file is one JSON document, not JSON lines: convert it with jq -c '.[]'" if first and not i else ""
    for i, ln in enumerate(raw.split(b"\n")):
        if not ln.strip():
            continue
        try:
            try:
                d = json.loads(ln)
            except UnicodeDecodeError as e:
                raise NotUTF8(f"{path}: line {line + i} is not UTF-8 (byte {e.start} of the line); fix it or pass "
                              "--skip_bad to skip such lines") from None
            except ValueError as e:
                raise UserError(f"{path}: line {line + i} is not JSON ({e.msg}){hint(i)}; fix it or pass "
                                "--skip_bad to skip such lines") from None
            text = d.get(field) if isinstance(d, dict) else None
            if not isinstance(text, str):
                keys = ", ".join(list(d)[:8]) if isinstance(d, dict) else f"a JSON {type(d).__name__}"
                raise UserError(f"{path}: line {line + i} has no string field {field!r} (it has: {keys}){hint(i)}; "
                                "pass --field NAME, or --skip_bad to skip such lines")
        except UserError:
            if not skip_bad:
                raise
            bad += 1
            continue
        texts.append(text)
    return texts, bad


def read_parquet(path, field, rows=1024):
    """Yield (first row, [str]) of a Parquet file's string column field; pyarrow is imported only here."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UserError(f"{path}: reading Parquet needs pyarrow (pip install 'minigpt[parquet]' or pip install "
                        "pyarrow), or convert the file to JSON lines") from None
    try:
        pf = pq.ParquetFile(path)
        if field not in pf.schema_arrow.names:
            raise UserError(f"{path} has no column {field!r} (it has: {', '.join(pf.schema_arrow.names[:8])}); "
                            "pass --field NAME")
        row = 0
        for b in pf.iter_batches(batch_size=rows, columns=[field]):
            texts = b.column(0).to_pylist()
            yield row, [t for t in texts if isinstance(t, str)]
            row += len(texts)
    except OSError as e:
        raise UserError(f"{path} is not a readable Parquet file ({e})") from None

"""Token shards in llm.c's .bin format, the directories that hold them, and the dataset that trains on them.

A shard is a header of 256 int32 (magic, version, token count) and then the tokens: uint16 (magic 20240520,
version 1) or, for vocabularies past 65,536, uint32 (magic 20240801, version 7), as llm.c's
dev/data/data_common.py writes them. A prepared directory (scripts/prepare_data.py) holds `<name>_train_000000.bin`,
..., `<name>_val_000000.bin`, ..., tokenizer.json (the tokenizer's to_json) and manifest.json, written last: a
directory with a tokenizer.json and no manifest is a prepare that did not finish, and is refused. Also read: a
folder of llm.c's own shards (`*_train*.bin`, `*_val*.bin`, no manifest) and nanoGPT's raw train.bin / val.bin
(uint16, no header), each with the tokenizer given. Shards are memory-mapped, never read whole.
Not here: tokenizing and writing a directory (minigpt/prepare_data.py), text files (minigpt/data.py).
"""
import glob
import json
import mmap
import os
import re

import numpy as np

from .data import check_block
from .errors import UserError
from .gpt2_tokenizer import GPT2Tokenizer
from .tokenizer import tokenizer_from_json, tokenizer_kind

HEADER_INTS = 256
HEADER_BYTES = 4 * HEADER_INTS
FORMATS = {np.dtype("<u2"): (20240520, 1), np.dtype("<u4"): (20240801, 7)}     # token dtype -> (magic, version)
MANIFEST, TOKENIZER = "manifest.json", "tokenizer.json"                           # a prepared directory's files
MANIFEST_FORMAT = "minigpt-shards"
_SAMPLE_BLOCKS, _SAMPLE_TOKENS = 8, 32768           # ids checked per shard of a folder without a manifest
_SHARD_FILE = re.compile(r".+_(train|val)_\d{6}\.bin")


def shard_dtype(vocab_size):
    """The token dtype of a shard for a vocabulary: uint16 up to 65,536 ids, else uint32."""
    return np.dtype("<u2") if vocab_size <= 65536 else np.dtype("<u4")


def shard_name(name, split, index):
    """llm.c's file name of a shard: <name>_<split>_<index, 6 digits>.bin."""
    return f"{name}_{split}_{index:06d}.bin"


def header(n_tokens, dtype):
    """(256,) int32: llm.c's header of a shard of n_tokens tokens of dtype."""
    h = np.zeros(HEADER_INTS, "<i4")
    h[0], h[1] = FORMATS[np.dtype(dtype)]
    h[2] = n_tokens
    return h


# ----------------------------------------------------------------------------
# writing: one shard at a time, under a temporary name until it is complete

def write_shard(path, tokens, dtype=None):
    """Write tokens (N,) as one llm.c shard at path (via path.tmp, then renamed)."""
    dtype = np.dtype(dtype or shard_dtype(int(np.max(tokens, initial=0)) + 1))
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(header(len(tokens), dtype).tobytes())
        f.write(np.asarray(tokens).astype(dtype).tobytes())
    os.replace(tmp, path)


class ShardWriter:
    """Streams one split's tokens into shards of at most shard_tokens tokens each. A shard is written as
    <file>.tmp and renamed when full (or at close); close() returns the shards' records for the manifest:
    [{"file", "tokens", "max_id"}]. llm.c's loader refuses an empty shard, so none is written."""

    def __init__(self, directory, name, split, dtype, shard_tokens):
        self.directory, self.name, self.split = directory, name, split
        self.dtype, self.shard_tokens = np.dtype(dtype), int(shard_tokens)
        self.records, self._f, self._n, self._max = [], None, 0, 0

    def write(self, ids):
        """Append ids (N,) to the split."""
        ids = np.asarray(ids)
        while len(ids):
            if self._f is None:
                self._open()
            take = ids[:self.shard_tokens - self._n]
            self._f.write(take.astype(self.dtype, copy=False).tobytes())
            self._n += len(take)
            self._max = max(self._max, int(take.max()))
            ids = ids[len(take):]
            if self._n == self.shard_tokens:
                self._finish()

    def close(self):
        if self._f is not None:
            self._finish()
        return self.records

    def _path(self):
        return os.path.join(self.directory, shard_name(self.name, self.split, len(self.records)))

    def _open(self):
        self._f = open(self._path() + ".tmp", "wb")
        self._f.write(bytes(HEADER_BYTES))                                 # the count is known at the end
        self._n, self._max = 0, 0

    def _finish(self):
        f, path = self._f, self._path()
        f.seek(0)
        f.write(header(self._n, self.dtype).tobytes())
        f.flush()
        os.fsync(f.fileno())                                               # on disk before the manifest names it
        f.close()
        os.replace(path + ".tmp", path)
        self.records.append({"file": os.path.basename(path), "tokens": self._n, "max_id": self._max})
        self._f = None


def write_json(path, obj):
    """Write obj as JSON (a str is written as is) via path.tmp, synced, then renamed: whole or not at all."""
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(obj if isinstance(obj, str) else json.dumps(obj, indent=1, ensure_ascii=False))
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


def prepared_files(names):
    """(ours, shards): of the file names in a directory, those a prepare writes (manifest, tokenizer, shards and
    their temporaries), and among them the finished shards."""
    ours = [n for n in names if n.removesuffix(".tmp") in (MANIFEST, TOKENIZER)
            or _SHARD_FILE.fullmatch(n.removesuffix(".tmp"))]
    return ours, [n for n in ours if _SHARD_FILE.fullmatch(n)]


# ----------------------------------------------------------------------------
# reading: headers checked as llm.c checks them, tokens memory-mapped

def read_header(path):
    """(dtype, n_tokens) of an llm.c shard: its magic and version known, its size what the count says."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            h = np.frombuffer(f.read(HEADER_BYTES), "<i4")
    except OSError as e:
        raise UserError(f"cannot read the shard {path} ({e.strerror}); fix its permissions or prepare the data "
                        "again") from None
    if size < HEADER_BYTES:
        raise UserError(f"{path} has {size} bytes, less than the {HEADER_BYTES}-byte header of an llm.c token shard: "
                        "it was cut short or is not a shard; prepare the data again")
    formats = {mv: dt for dt, mv in FORMATS.items()}
    dtype = formats.get((int(h[0]), int(h[1])))
    if dtype is None:
        raise UserError(f"{path}: header magic {h[0]} version {h[1]} is not an llm.c token shard's (20240520 version "
                        "1: uint16 tokens; 20240801 version 7: uint32); it is not a shard, or is damaged")
    n, want = int(h[2]), HEADER_BYTES + int(h[2]) * dtype.itemsize
    if n < 0 or size != want:
        raise UserError(f"{path}: its header says {n:,} tokens ({want:,} bytes) but the file has {size:,} bytes: it "
                        "was cut short or damaged; prepare the data again")
    return dtype, n


def _mapped(path, dtype, offset, count):
    """(count,) dtype: the file's tokens from offset, memory-mapped read-only (no copy in RAM)."""
    if count == 0:
        return np.zeros(0, dtype)
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)            # stays mapped after the close
    return np.frombuffer(mm, dtype, count=count, offset=offset)


def open_shard(path):
    """(N,) the tokens of an llm.c shard, memory-mapped, its header checked."""
    dtype, n = read_header(path)
    return _mapped(path, dtype, HEADER_BYTES, n)


def _sampled_max(arr):
    """The largest id in a few evenly spaced blocks of arr: a cheap check at start-up, not a scan of the file."""
    if len(arr) <= _SAMPLE_BLOCKS * _SAMPLE_TOKENS:
        return int(arr.max(initial=0))
    starts = np.linspace(0, len(arr) - _SAMPLE_TOKENS, _SAMPLE_BLOCKS).astype(np.int64)
    return max(int(arr[s:s + _SAMPLE_TOKENS].max()) for s in starts)


# ----------------------------------------------------------------------------
# the dataset: batches drawn across a split's shards

class ShardDataset:
    """Each split as a list of token arrays (shards, memory-mapped). batch() draws (x, y) as data.Dataset does;
    ids() gives evaluation a split (or its first max_tokens tokens) as one array."""

    def __init__(self, shards, vocab_size, block_size, source, fixed_block=False):
        """shards: {"train": [(path, (N_i,) array), ...], "val": [...]}."""
        self.paths = {k: [p for p, _ in v] for k, v in shards.items()}
        self.shards = {k: [a for _, a in v] for k, v in shards.items()}
        self.vocab_size, self.source = vocab_size, source
        for split, arrs in self.shards.items():
            check_block(max((len(a) for a in arrs), default=0), block_size, fixed_block,
                        f"{source}: the {split} split's longest shard has",
                        "prepare more data (or a larger --val_fraction)")

    def num_tokens(self, split):
        return sum(len(a) for a in self.shards[split])

    def ids(self, split, max_tokens=None):
        """(N,) the split's first max_tokens tokens (all of them if None), in shard order: a view of the first
        shard when they lie in it, else a copy of just those tokens (the fixed subset evaluation scores)."""
        arrs, n = self.shards[split], self.num_tokens(split) if max_tokens is None else max_tokens
        if len(arrs[0]) >= n:
            return arrs[0][:n]
        out, parts = [], 0
        for a in arrs:
            out.append(a[:n - parts])
            parts += len(out[-1])
            if parts == n:
                break
        return np.concatenate(out)

    def batch(self, split, batch_size, block_size, rng, rank=0, ranks=1):
        """(x, y) int32 (B, T) as data.Dataset.batch: one rng.integers draw of ranks * B offsets over the split's
        windows (a shard of N tokens has N - T; none crosses into the next shard), rank taking its B. With one
        shard the draw and rows are data.Dataset's exactly."""
        arrs = self.shards[split]
        counts = np.array([max(0, len(a) - block_size) for a in arrs])     # (shards,) windows of each
        ix = rng.integers(0, int(counts.sum()), batch_size * ranks)        # (ranks * B,) over all windows
        ix = ix[rank * batch_size:(rank + 1) * batch_size]                 # (B,) this rank's
        span = np.arange(block_size + 1)
        if len(arrs) == 1:
            chunk = arrs[0][ix[:, None] + span].astype(np.int32)           # (B, T+1)
        else:
            ends = np.cumsum(counts)                                        # window ix lies in shard k with
            which = np.searchsorted(ends, ix, side="right")                 # ends[k-1] <= ix < ends[k]
            local = ix - (ends[which] - counts[which])                      # (B,) offset inside its shard
            chunk = np.empty((len(ix), block_size + 1), np.int32)           # (B, T+1)
            for k in np.unique(which):
                rows = which == k
                chunk[rows] = arrs[k][local[rows, None] + span]
        if chunk.size and chunk.max() >= self.vocab_size:
            raise UserError(f"{self.source}: the {split} split holds token id {chunk.max()}, but the tokenizer has "
                            f"{self.vocab_size} ids; give the tokenizer the shards were made with")
        return chunk[:, :-1], chunk[:, 1:]


# ----------------------------------------------------------------------------
# opening a directory: prepared (manifest), llm.c's folder, nanoGPT's folder

def open_prepared(path, block_size, tok=None, fixed_block=False):
    """(tok, dataset, info) for a directory of token shards. A prepared directory brings its tokenizer (a tok
    given must equal it); an llm.c folder (*_train*.bin, *_val*.bin) or a nanoGPT one (train.bin, val.bin) needs
    tok. info: {"format", "path", "tokens": {split: n}, "shards": {split: n}, "manifest": dict or None}."""
    if not os.path.isdir(path):
        raise UserError(f"{path} is not a directory of token shards; prepare one with scripts/prepare_data.py "
                        f"INPUT --out {path}")
    if os.path.exists(os.path.join(path, MANIFEST)):
        tok, shards, manifest, fmt = *_prepared(path, tok), "minigpt"
    elif os.path.exists(os.path.join(path, TOKENIZER)):
        raise UserError(f"{path} has a {TOKENIZER} but no {MANIFEST}: a prepare_data.py run into it did not finish; "
                        f"run it again (python scripts/prepare_data.py INPUT... --out {path}: it starts over)")
    else:
        shards, fmt = _folder(path), "llm.c" if _llmc_files(path, "train") or _llmc_files(path, "val") else "nanoGPT"
        if tok is None:
            raise UserError(f"{path} holds {fmt} token shards without a tokenizer: give the tokenizer they were made "
                            "with, --tokenizer PATH (a GPT-2 directory or a tokenizer.json: GPT-2's for llm.c's and "
                            "nanoGPT's data scripts)")
        manifest = None
        for split, items in shards.items():
            for p, arr in items:
                _check_ids(p, _sampled_max(arr), tok.vocab_size)
    data = ShardDataset(shards, tok.vocab_size, block_size, path, fixed_block)
    info = {"format": fmt, "path": path, "tokens": {k: data.num_tokens(k) for k in shards},
            "shards": {k: len(v) for k, v in shards.items()}, "manifest": manifest}
    return tok, data, info


def read_manifest(path):
    """The manifest.json of a prepared directory as a dict, or None if there is none."""
    p = os.path.join(path, MANIFEST)
    if not os.path.exists(p):
        return None
    try:
        with open(p, encoding="utf-8") as f:
            m = json.load(f)
        assert isinstance(m, dict) and m.get("format") == MANIFEST_FORMAT and m.get("version") == 1
        for split in ("train", "val"):
            for r in m["shards"][split]:
                assert isinstance(r["file"], str) and isinstance(r["tokens"], int) and isinstance(r["max_id"], int)
        return m
    except (OSError, ValueError, KeyError, TypeError, AssertionError):
        raise UserError(f"{p} is damaged or not minigpt's (format {MANIFEST_FORMAT}, version 1); prepare the data "
                        "again") from None


def _prepared(path, tok):
    manifest = read_manifest(path)
    try:
        with open(os.path.join(path, TOKENIZER), encoding="utf-8") as f:
            own = tokenizer_from_json(f.read())
    except OSError as e:
        raise UserError(f"cannot read {os.path.join(path, TOKENIZER)} ({e.strerror}); prepare the data "
                        "again") from None
    if tok is not None and tok.to_json() != own.to_json():
        raise UserError(f"the tokenizer given is not {path}'s ({TOKENIZER}, a {tokenizer_kind(own)} tokenizer of "
                        f"{own.vocab_size} ids): use the directory's, or prepare the data with this tokenizer")
    shards = {}
    for split in ("train", "val"):
        shards[split] = []
        for r in manifest["shards"][split]:
            p = os.path.join(path, r["file"])
            if not os.path.exists(p):
                raise UserError(f"{p}, a shard its {MANIFEST} lists, is missing; prepare the data again")
            arr = open_shard(p)
            if len(arr) != r["tokens"]:
                raise UserError(f"{p} holds {len(arr):,} tokens but {MANIFEST} says {r['tokens']:,}: the directory "
                                "was changed after it was prepared; prepare the data again")
            _check_ids(p, r["max_id"], own.vocab_size)
            shards[split].append((p, arr))
    return own, shards, manifest


def _check_ids(path, max_id, vocab_size):
    if max_id >= vocab_size:
        raise UserError(f"{path} holds token id {max_id}, but the tokenizer has {vocab_size} ids (0..{vocab_size - 1})"
                        ": give the tokenizer the shards were made with")


def _llmc_files(path, split):
    return sorted(glob.glob(os.path.join(glob.escape(path), f"*_{split}*.bin")))


def _folder(path):
    """{split: [(path, tokens)]} of an llm.c folder (headers checked) or of nanoGPT's raw uint16 train/val.bin."""
    found = {split: _llmc_files(path, split) for split in ("train", "val")}
    if any(found.values()):
        for split, files in found.items():
            if not files:
                raise UserError(f"{path} has llm.c shards for one split but none named *_{split}*.bin; add them (or "
                                "prepare the data with scripts/prepare_data.py)")
        return {split: [(p, open_shard(p)) for p in files] for split, files in found.items()}
    raw = {split: os.path.join(path, f"{split}.bin") for split in ("train", "val")}
    if not any(os.path.exists(p) for p in raw.values()):
        raise UserError(f"{path} has no token shards ({MANIFEST}, *_train*.bin / *_val*.bin, or train.bin / val.bin); "
                        f"prepare the data with scripts/prepare_data.py INPUT --out {path}")
    out = {}
    for split, p in raw.items():
        if not os.path.exists(p):
            raise UserError(f"{path} has nanoGPT's {'val' if split == 'train' else 'train'}.bin but no {split}.bin; "
                            "add it (or prepare the data with scripts/prepare_data.py)")
        size = os.path.getsize(p)
        if size % 2:
            raise UserError(f"{p} has an odd number of bytes ({size:,}), so it is not nanoGPT's uint16 tokens: it was "
                            "cut short or is another format")
        out[split] = [(p, _mapped(p, np.dtype("<u2"), 0, size // 2))]
    return out


def tokenizer_from_path(path):
    """The tokenizer at path: a prepared directory's tokenizer.json (minigpt's JSON), a GPT-2 model directory
    (tokenizer.json or vocab.json + merges.txt), or a file: Hugging Face's tokenizer.json or minigpt's JSON."""
    if os.path.isdir(path):
        own = os.path.join(path, TOKENIZER)
        if os.path.exists(own) and os.path.exists(os.path.join(path, MANIFEST)):
            path = own                                                  # a prepared directory: minigpt's JSON
        else:
            return GPT2Tokenizer.from_pretrained(path)
    if not os.path.isfile(path):
        raise UserError(f"tokenizer {path!r} does not exist; pass char, bpe, a GPT-2 directory or a tokenizer.json")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        d = json.loads(text)
    except (OSError, ValueError) as e:
        raise UserError(f"{path} is not a readable tokenizer JSON ({type(e).__name__}: {e}); pass a GPT-2 directory, "
                        "its tokenizer.json, or a prepared directory's") from None
    if isinstance(d, dict) and "model" in d:                            # Hugging Face's tokenizer.json
        return GPT2Tokenizer.from_hf_json(path)
    return tokenizer_from_json(text)

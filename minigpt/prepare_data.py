"""Prepare a corpus once into token shards: `python scripts/prepare_data.py INPUT... --out DIR` (prepare() in code).

INPUT: text files, folders (their .txt files, recursively), globs, JSON-lines files (--field), Parquet (with
pyarrow). Each file, JSON line or Parquet row is a document. The steps: scan the text files (UTF-8 checked,
characters counted, the character alphabet), fit the tokenizer (characters; a BPE trained on the first
--bpe_sample_mb; or one read from a path), encode the documents in worker processes, in order, into the
train and val shards (minigpt/shards.py), and write manifest.json last. A single text file is split as
data.split_text splits it (the first 90% of its characters train), so a run on the directory sees the very
tokens a run on the file sees; else whole documents go to val, in turn, while val holds less than
--val_fraction of the tokens. Documents are separated by the tokenizer's <|endoftext|>, if it has one.
Not here: reading the directory back (shards.open_prepared), training.
"""
import multiprocessing
import os
import signal
import sys
import time
from collections import Counter, deque

import numpy as np

from . import data
from .bpe import BPETokenizer, count_words
from .config import PrepareConfig, check_prepare, parse_args
from .data import JSONL, PARQUET, TEXT, CharTokenizer, NotUTF8, code_points, decode, find_inputs, read_pieces
from .errors import UserError, exit_code
from .shards import (MANIFEST, MANIFEST_FORMAT, TOKENIZER, ShardWriter, prepared_files, read_manifest,
                     shard_dtype, tokenizer_from_path, write_json)
from .tokenizer import tokenizer_from_json, tokenizer_kind

EOT = "<|endoftext|>"
PIECE_BYTES = 1 << 20                         # bytes of text per task handed to a worker


def say(msg, quiet=False):
    if not quiet:
        print(msg, file=sys.stderr, flush=True)


class Progress:
    """MB done of a total, MB/s and ETA on stderr: one line rewritten on a terminal, a line a minute elsewhere."""

    def __init__(self, label, total, quiet=False):
        self.label, self.total, self.quiet, self.done = label, max(total, 1), quiet, 0
        self.t0 = self.shown = time.perf_counter()
        self.tty = sys.stderr.isatty()

    def add(self, nbytes):
        self.done += nbytes
        now = time.perf_counter()
        if not self.quiet and now - self.shown >= (0.5 if self.tty else 60):
            self.shown = now
            rate = self.done / max(now - self.t0, 1e-9)
            eta = (self.total - self.done) / max(rate, 1e-9)
            line = (f"{self.label}: {self.done / 1e6:,.1f} of {self.total / 1e6:,.1f} MB, {rate / 1e6:.2f} MB/s, "
                    f"ETA {int(eta) // 60}m{int(eta) % 60:02d}s")
            print("\r" + line if self.tty else line, end="", file=sys.stderr, flush=True)
            if not self.tty:
                print(file=sys.stderr)

    def end(self):
        s = time.perf_counter() - self.t0
        if not self.quiet:
            print(("\r" if self.tty else "") + f"{self.label}: {self.done / 1e6:,.1f} MB in {s:.1f} s, "
                  f"{self.done / 1e6 / max(s, 1e-9):.2f} MB/s" + " " * 20, file=sys.stderr, flush=True)
        return s


# ----------------------------------------------------------------------------
# scan: the text files checked and counted, the alphabet; the BPE's sample

class Scan:
    """What a first pass over the inputs learns: the files kept, those skipped (not UTF-8, with --skip_bad), each
    text file's characters, the single file's pieces [(offset, bytes, chars)], the alphabet (char tokenizer)."""

    def __init__(self, sources, alphabet, field, skip_bad, quiet):
        self.files, self.bad, self.chars, self.pieces = [], [], {}, []
        self.seen = np.zeros(0x110000, bool) if alphabet else None       # (code points,) in the corpus
        single = len(sources) == 1 and sources[0][1] == TEXT
        todo = [(p, k) for p, k in sources if k == TEXT or alphabet]
        progress = Progress("scan", sum(os.path.getsize(p) for p, _ in todo), quiet)
        for path, kind in sources:
            if (path, kind) in todo:
                try:
                    self._scan(path, kind, field, skip_bad, single, progress)
                except NotUTF8 as e:
                    if not skip_bad or kind != TEXT:
                        raise
                    self.bad.append(path)
                    say(f"skipped: {e}", quiet)
                    continue
            self.files.append((path, kind))
        progress.end()

    def _scan(self, path, kind, field, skip_bad, single, progress):
        if kind == TEXT:
            n = 0
            for off, raw in read_pieces(path, "chars"):
                text = decode(raw, path, off)
                self._see(text)
                if single:
                    self.pieces.append((off, len(raw), len(text)))
                n += len(text)
                progress.add(len(raw))
            self.chars[path] = n
        else:
            for texts, nbytes in _documents(path, kind, field, skip_bad):
                for t in texts:
                    self._see(t)
                progress.add(nbytes)

    def _see(self, text):
        if self.seen is not None:
            self.seen[code_points(text)] = True

    def alphabet(self):
        return [chr(c) for c in np.flatnonzero(self.seen)]

    def split_byte(self, path, val_fraction):
        """The byte offset in the single file of data.split_text's cut: character int((1 - f) * N)."""
        n = int((1 - val_fraction) * self.chars[path])
        before = 0
        for off, nbytes, nchars in self.pieces:
            if before + nchars > n:
                with open(path, "rb") as f:
                    f.seek(off)
                    text = f.read(nbytes).decode("utf-8")
                return off + len(text[:n - before].encode("utf-8"))
            before += nchars
        return os.path.getsize(path)


def _documents(path, kind, field, skip_bad):
    """Yield ([texts], bytes read) of a JSON-lines or Parquet file, a batch of documents at a time."""
    if kind == JSONL:
        for line, raw in data.read_lines(path):
            yield data.jsonl_texts(raw, path, line, field, skip_bad)[0], len(raw)
    else:
        for _, texts in data.read_parquet(path, field):
            yield texts, sum(len(t) for t in texts)


def bpe_sample(scan, single_end, sample_bytes, field, skip_bad):
    """Word counts (bpe.count_words) of the first sample_bytes of the training text: the single file's training
    split (to single_end) or the documents in order, each cut between words."""
    counts, got = Counter(), 0
    for path, kind in scan.files:
        if kind == TEXT:
            for off, raw in read_pieces(path, "words", end=single_end):
                count_words(decode(raw, path, off), counts)
                got += len(raw)
                if got >= sample_bytes:
                    return counts
        else:
            for texts, nbytes in _documents(path, kind, field, skip_bad):
                for t in texts:
                    count_words(t, counts)
                got += nbytes
                if got >= sample_bytes:
                    return counts
    return counts


# ----------------------------------------------------------------------------
# encoding: tasks in order, in worker processes, at most a few in flight per worker

_TOK = None                                   # the worker's tokenizer


def _init_worker(tok_json):
    global _TOK
    signal.signal(signal.SIGINT, signal.SIG_IGN)                      # Ctrl-C is the parent's to handle
    _TOK = tokenizer_from_json(tok_json)


def encode_task(task):
    """A task -> (ids (N,), token counts per document or None for a piece of a text file, bad lines skipped)."""
    kind, path, where, payload = task[:4]
    if kind == TEXT:
        return _TOK.encode(decode(payload, path, where)), None, 0
    texts, bad = data.jsonl_texts(payload, path, where, *task[4:]) if kind == JSONL else (payload, 0)
    ids = [_TOK.encode(t) for t in texts]
    dtype = ids[0].dtype if ids else np.uint16
    return np.concatenate(ids) if ids else np.zeros(0, dtype), np.array([len(i) for i in ids], np.int64), bad


def encoded(tasks, tok, workers):
    """Yield (meta, encode_task's result) for each (meta, task), in order; workers > 1: in that many processes."""
    global _TOK
    if workers <= 1:
        _TOK = tok
        for meta, task in tasks:
            yield meta, encode_task(task)
        return
    with multiprocessing.Pool(workers, _init_worker, (tok.to_json(),)) as pool:
        pending = deque()
        for meta, task in tasks:
            pending.append((meta, pool.apply_async(encode_task, (task,))))
            if len(pending) >= 3 * workers:                             # memory: a few pieces per worker
                m, r = pending.popleft()
                yield m, r.get()
        while pending:
            m, r = pending.popleft()
            yield m, r.get()


def tasks(scan, tok, single_at, field, skip_bad):
    """Yield (meta, task) over the documents in order. meta: {"bytes", "split" (the single file's, else None),
    "first" (a text file's first piece)}."""
    mode = "chars" if isinstance(tok, CharTokenizer) else "words"
    avoid = bytes(sorted({t.encode("utf-8")[0] for t in getattr(tok, "added", {})}))
    for path, kind in scan.files:
        if kind == TEXT:
            if not scan.chars[path]:
                continue                                                # an empty file: no document
            parts = ([("train", 0, single_at), ("val", single_at, None)] if single_at is not None
                     else [(None, 0, None)])
            for split, start, end in parts:
                for i, (off, raw) in enumerate(read_pieces(path, mode, start, end, PIECE_BYTES, avoid)):
                    yield {"bytes": len(raw), "split": split, "first": i == 0}, (TEXT, path, off, raw)
        elif kind == JSONL:
            for line, raw in data.read_lines(path, PIECE_BYTES):
                yield {"bytes": len(raw)}, (JSONL, path, line, raw, field, skip_bad)
        else:
            for row, texts in data.read_parquet(path, field):
                yield {"bytes": sum(len(t) for t in texts)}, (PARQUET, path, row, texts)


class Splits:
    """The train and val shard writers; documents go to val in turn while it holds less than val_fraction of
    the tokens written, and are separated by eot (if not None) within a split."""

    def __init__(self, out, name, tok, shard_tokens, val_fraction, eot):
        dtype = shard_dtype(tok.vocab_size)
        self.writers = {s: ShardWriter(out, name, s, dtype, shard_tokens) for s in ("train", "val")}
        self.docs, self.tokens = {"train": 0, "val": 0}, {"train": 0, "val": 0}
        self.val_fraction, self.eot, self.current = val_fraction, eot, None

    def next_split(self):
        return "val" if self.tokens["val"] < self.val_fraction * sum(self.tokens.values()) else "train"

    def add(self, split, ids, new_doc):
        if new_doc:
            if self.docs[split] and self.eot is not None:
                self.writers[split].write(np.array([self.eot]))
                self.tokens[split] += 1
            self.docs[split] += 1
        self.writers[split].write(ids)
        self.tokens[split] += len(ids)

    def take(self, meta, result):
        """One encoded task into the splits; returns the documents that were empty."""
        ids, lengths, _ = result
        if lengths is None:                                             # a piece of a text file
            if meta["first"]:
                self.current = meta["split"] or self.next_split()
            self.add(self.current, ids, meta["first"])
            return 0
        ends = np.cumsum(lengths)
        for n, end in zip(lengths, ends):
            if n:
                self.add(self.next_split(), ids[end - n:end], True)
        return int((lengths == 0).sum())

    def close(self):
        return {s: w.close() for s, w in self.writers.items()}


# ----------------------------------------------------------------------------
# the command

def prepare(inputs, out, **settings):
    """Prepare inputs (a path, or a list of them) into the directory out, as `scripts/prepare_data.py INPUT...
    --out OUT --key value ...` does, with the same checks (the settings are PrepareConfig's, minigpt/config.py);
    returns its manifest."""
    inputs = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
    argv = [f"--{k}={v}" for k, v in {"out": out, **settings}.items() if v is not None]   # None: the default
    argv += ["--", *map(str, inputs)]                                    # "--": an input may start with "-"
    return prepare_config(parse_args(argv, PrepareConfig, prog="minigpt.prepare_data()"))


def prepare_config(cfg):
    """Prepare the corpus a PrepareConfig names (see the module's docstring); returns its manifest. A directory
    already prepared from the same files (sizes, mtimes) and settings is left as it is."""
    check_prepare(cfg)
    tokenizer, field, skip_bad, quiet = cfg.tokenizer, cfg.field, cfg.skip_bad, cfg.quiet
    t0 = time.perf_counter()
    out = os.path.abspath(cfg.out)
    name = cfg.name or "".join(c if c.isalnum() or c in "-." else "_" for c in os.path.basename(out)) or "data"
    sources = find_inputs(cfg.inputs)
    files = [{"path": os.path.abspath(p), "bytes": os.path.getsize(p), "mtime": os.path.getmtime(p)}
             for p, _ in sources]
    path_tok = tokenizer not in ("char", "bpe")
    settings = {"tokenizer": os.path.abspath(tokenizer) if path_tok else tokenizer, "val_fraction": cfg.val_fraction,
                "field": field, "shard_tokens": cfg.shard_tokens, "name": name, "skip_bad": skip_bad,
                **({"vocab_size": cfg.vocab_size, "bpe_sample_mb": cfg.bpe_sample_mb} if tokenizer == "bpe" else {})}
    given = tokenizer_from_path(tokenizer) if path_tok else None
    old = read_manifest(out) if os.path.isdir(out) else None
    if old and old["sources"] == files and old["settings"] == settings and _same_tokenizer(out, given):
        say(f"{out} is already prepared from these files and settings: nothing to do", quiet)
        return old
    scan = Scan(sources, tokenizer == "char", field, skip_bad, quiet)
    if not scan.files:
        raise UserError(f"every input was skipped ({len(scan.bad)} not UTF-8): nothing to prepare")
    single = len(sources) == 1 and sources[0][1] == TEXT
    if single and not scan.chars[sources[0][0]]:
        raise UserError(f"input {sources[0][0]} is empty; pass a file with text in it")
    single_at = scan.split_byte(sources[0][0], cfg.val_fraction) if single else None
    tok = given or _fit(tokenizer, scan, single_at, cfg.vocab_size, cfg.bpe_sample_mb, field, skip_bad, quiet)
    eot = getattr(tok, "added", {}).get(EOT)
    made = _claim(out)
    try:
        write_json(os.path.join(out, TOKENIZER), tok.to_json())         # first: it marks the directory ours
        splits = Splits(out, name, tok, cfg.shard_tokens, cfg.val_fraction, eot)
        progress, bad = Progress("encode", sum(f["bytes"] for f in files), quiet), 0
        empty = sum(1 for p, k in scan.files if k == TEXT and not scan.chars[p])
        # characters: one table lookup, faster here than sending the text to workers and the ids back
        workers = cfg.workers or (1 if isinstance(tok, CharTokenizer) else _cpus())
        for meta, result in encoded(tasks(scan, tok, single_at, field, skip_bad), tok, workers):
            empty += splits.take(meta, result)
            bad += result[2]
            progress.add(meta["bytes"])
        seconds = progress.end()
        shards = splits.close()
        for split in ("train", "val"):
            if not splits.tokens[split]:
                raise UserError(f"the {split} split is empty ({splits.docs['train']} document(s) in all): prepare "
                                "at least two documents, or a single text file (split at 90% of its characters)")
        manifest = {"format": MANIFEST_FORMAT, "version": 1, "name": name, "dtype": shard_dtype(tok.vocab_size).name,
                    "tokenizer": {"kind": tokenizer_kind(tok), "vocab_size": tok.vocab_size, "eot": eot,
                                  "file": TOKENIZER},
                    "split": "single file: its first 90% of characters train (data.split_text)" if single else
                    f"whole documents, val while it holds less than {cfg.val_fraction} of the tokens",
                    "documents": splits.docs, "tokens": splits.tokens, "shards": shards,
                    "skipped": {"not_utf8_files": scan.bad, "bad_lines": bad, "empty_documents": empty},
                    "sources": files, "settings": settings, "seconds": round(time.perf_counter() - t0, 3)}
        write_json(os.path.join(out, MANIFEST), manifest)               # last: the directory is complete
    except (UserError, KeyboardInterrupt):
        _clear(out)
        if made:
            os.rmdir(out)
        raise
    say(f"{out}: {splits.tokens['train']:,} train and {splits.tokens['val']:,} val tokens, "
        f"{sum(splits.docs.values()):,} documents, {sum(len(v) for v in shards.values())} shard(s), "
        f"{tokenizer_kind(tok)} tokenizer of {tok.vocab_size} ids ({seconds:.1f} s encoding)", quiet)
    return manifest


def _cpus():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _fit(kind, scan, single_at, vocab_size, sample_mb, field, skip_bad, quiet):
    """The tokenizer made from the corpus: characters of all of it, or a BPE trained on a sample."""
    if kind == "char":
        return CharTokenizer(scan.alphabet())
    t0 = time.perf_counter()
    counts = bpe_sample(scan, single_at, int(sample_mb * 1e6), field, skip_bad)
    tok = BPETokenizer.train_words(counts, vocab_size)
    say(f"BPE: {tok.vocab_size} tokens trained on {sum(len(w) * c for w, c in counts.items()) / 1e6:.1f} M "
        f"characters in {time.perf_counter() - t0:.1f} s", quiet)
    return tok


def _same_tokenizer(out, given):
    if given is None:
        return True
    try:
        with open(os.path.join(out, TOKENIZER), encoding="utf-8") as f:
            return f.read() == given.to_json()
    except OSError:
        return False


def _claim(out):
    """Make out ready for a new preparation: created (True), or cleared of an earlier or unfinished one's files.
    A directory holding other files, or another program's shards, is refused."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise UserError(f"--out {out} is a file; pass a directory (new or empty) for the shards")
    made = not os.path.exists(out)
    os.makedirs(out, exist_ok=True)
    names = os.listdir(out)
    ours, shards = prepared_files(names)
    other = sorted(set(names) - set(ours))
    if other:
        raise UserError(f"--out {out} holds files prepare_data.py did not write ({', '.join(other[:4])}"
                        f"{' ...' if len(other) > 4 else ''}); pass a new or empty directory")
    if shards and MANIFEST not in names and TOKENIZER not in names:
        raise UserError(f"--out {out} holds token shards without a {TOKENIZER} (another program's?); pass a new or "
                        "empty directory")
    _clear(out)
    return made


def _clear(out):
    """Remove a preparation's files from out: the manifest first (the directory no longer reads as complete),
    the tokenizer last (until then it marks the rest as ours)."""
    ours, _ = prepared_files(os.listdir(out))
    for n in sorted(ours, key=lambda n: (n != MANIFEST, n == TOKENIZER)):
        os.remove(os.path.join(out, n))


def main(argv=None):
    try:
        prepare_config(parse_args(sys.argv[1:] if argv is None else argv, PrepareConfig, prog="prepare_data.py",
                                  description=__doc__))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return exit_code(e)
    return 0


class _CallableModule(type(sys)):
    """`minigpt.prepare_data` is this module; calling it is prepare() (a submodule would hide a function of its
    name), as minigpt.train is."""

    def __call__(self, inputs, out, **settings):
        return prepare(inputs, out, **settings)


sys.modules[__name__].__class__ = _CallableModule

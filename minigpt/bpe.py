"""Byte-level BPE: a tokenizer trained on a text, with the interface of data.CharTokenizer, exportable to Hugging Face.

The text is split into words by one regex (PATTERN), each word's UTF-8 bytes start as 256 byte tokens, and
training merges the most frequent adjacent pair again and again (GPT-2's scheme). Any text encodes: bytes the
training text never had stay byte tokens. PATTERN uses ASCII classes only, with whitespace spelled out, so that
Python's `re` and Oniguruma (Hugging Face `tokenizers`) split every Unicode string alike; to_hf_json() writes a
tokenizer.json whose ids equal encode()'s. Not here: special tokens, normalization, GPT-2's \\p{L} classes
(non-ASCII letters fall into the "other" class, in runs of at most 16 characters).
"""
import functools
import heapq
import json
import re
from collections import Counter, defaultdict
from itertools import chain

import numpy as np

from .errors import UserError
from .data import checked_ids

# ASCII whitespace written out: Python's \s also matches \x1c-\x1f, \x85, \xa0, \u2028, ... and Oniguruma's \s
# matches a different set, so the two engines would split such text differently.
_WS = r"\t\n\x0b\x0c\r "
# A word is merged pair by pair, so its time grows with its length squared: a long run of one class (a Chinese
# text without spaces, were the "other" class unbounded) would be one word and train and encode many times slower
# than as much English. Runs of 16 keep CJK words whole up to that length, and cost a merge every 16 characters.
_RUN = 16
PATTERN = (r"'(?:[sdmt]|ll|ve|re)"              # English contractions, as GPT-2
           r"| ?[A-Za-z]+"                      # a word, with the space before it
           r"| ?[0-9]+"
           rf"| ?[^{_WS}A-Za-z0-9]{{1,{_RUN}}}"   # punctuation and every non-ASCII character, in runs of at most
                                                # _RUN (a text without spaces, as Chinese, is not one word)
           rf"|[{_WS}]+(?![^{_WS}])"            # a whitespace run, less the space that starts the next word
           rf"|[{_WS}]+")
MIN_VOCAB = 257                                 # the 256 byte tokens and at least one merge
_CACHE_MAX = 500_000                            # distinct words kept by encode(); cleared when full
KERNEL_MIN_WORDS = 512                          # new words at once from which the compiled merge loop runs


def bytes_to_unicode():
    """GPT-2's map of the 256 bytes to printable characters (Hugging Face's byte-level alphabet): printable
    Latin-1 bytes map to themselves, the others to U+0100 onwards in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = iter(range(256, 512))
    return {b: chr(b) if b in keep else chr(next(shifted)) for b in range(256)}


def count_words(text, counts=None):
    """{word: count} of text split by PATTERN, added into counts (a Counter) if given."""
    counts = Counter() if counts is None else counts
    counts.update(re.findall(PATTERN, text))
    return counts


def _utf8(word):
    try:
        return word.encode("utf-8")
    except UnicodeEncodeError as e:
        raise UserError(f"text holds {word[e.start]!r}, a lone surrogate, which is not valid Unicode and has no "
                        "UTF-8 bytes; read the text with errors='replace' or fix its source") from None


def _merge(ids, a, b, new):
    """ids with every non-overlapping (a, b), left to right, replaced by new."""
    out, i, n = [], 0, len(ids)
    while i < n:
        if i + 1 < n and ids[i] == a and ids[i + 1] == b:
            out.append(new)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


# ----------------------------------------------------------------------------
# training: unique words, pair counts updated only in the words that hold the merged pair

def _check_vocab_size(vocab_size):
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)) or vocab_size < MIN_VOCAB:
        raise UserError(f"BPE vocab_size must be an integer of at least {MIN_VOCAB} (256 byte tokens and at least "
                        f"one merge), got {vocab_size!r}; use e.g. 512 or 1024")


class _PairStats:
    """The words of a text as lists of token ids, with each adjacent pair's count (weighted by word frequency)
    and the set of words holding it. A max-heap over counts is kept lazily: a pop that finds its count
    outdated pushes the current one back."""

    def __init__(self, word_counts):
        self.words = [list(w.encode("utf-8")) for w in word_counts]          # each (len,) byte ids
        self.freqs = list(word_counts.values())
        self.counts, self.where = defaultdict(int), defaultdict(set)
        for w, (ids, f) in enumerate(zip(self.words, self.freqs)):
            for pair in zip(ids, ids[1:]):
                self.counts[pair] += f
                self.where[pair].add(w)
        self.heap = [(-c, pair) for pair, c in self.counts.items()]
        heapq.heapify(self.heap)

    def pop_best(self):
        """The pair of highest count, ties to the smallest (a, b); None when no pair is left."""
        while self.heap:
            neg, pair = heapq.heappop(self.heap)
            c = self.counts.get(pair, 0)
            if c == -neg:
                return pair
            if c > 0:
                heapq.heappush(self.heap, (-c, pair))                      # outdated: it has fallen since
        return None

    def apply(self, pair, new):
        """Merge pair into token new in every word holding it, updating the counts and the index."""
        a, b = pair
        fresh = set()
        for w in self.where.pop(pair):
            old, f = self.words[w], self.freqs[w]
            ids = _merge(old, a, b, new)
            for p in zip(old, old[1:]):
                self.counts[p] -= f
            for p in zip(ids, ids[1:]):
                self.counts[p] += f
                if new in p:                                               # only pairs with `new` are new
                    self.where[p].add(w)
                    fresh.add(p)
            self.words[w] = ids
        del self.counts[pair]                                              # now 0: every occurrence merged
        for p in fresh:                                                    # the only counts that rose
            heapq.heappush(self.heap, (-self.counts[p], p))


# ----------------------------------------------------------------------------
# the tokenizer

class BPETokenizer:
    """Ids 0-255 are the bytes; id 256 + i is merges[i] = (a, b), the concatenation of tokens a and b."""

    def __init__(self, merges, pattern=PATTERN):
        self.merges = [tuple(m) for m in merges]
        self.pattern = pattern
        self._rx = re.compile(pattern)
        self._rank = {pair: i for i, pair in enumerate(self.merges)}        # (a, b) -> i; its token is 256 + i
        self._bytes = [bytes([b]) for b in range(256)]
        for a, b in self.merges:
            self._bytes.append(self._bytes[a] + self._bytes[b])
        self.dtype = np.uint16 if self.vocab_size <= 65536 else np.int32
        self._cache = {}                                                    # word -> its ids
        self._table = None                                                  # MergeTable, made on first use

    @classmethod
    def train(cls, text, vocab_size):
        """Learn vocab_size - 256 merges from text (fewer if the text runs out of pairs: see .vocab_size).
        Every token's bytes are distinct (a Hugging Face vocab maps strings to ids): a span of a word that no
        merge crosses is merged exactly as it would be alone, so only one pair can ever build a given string."""
        if not text:
            raise UserError("cannot train a BPE tokenizer on an empty text; pass a text with some words in it")
        return cls.train_words(count_words(text), vocab_size)

    @classmethod
    def train_words(cls, word_counts, vocab_size):
        """train() on word counts ({word: count}, count_words of a text or of a corpus's pieces): the merges
        depend on the counts only, so counting a text in pieces cut between words trains the same tokenizer."""
        _check_vocab_size(vocab_size)
        if not word_counts:
            raise UserError("cannot train a BPE tokenizer on an empty text; pass a text with some words in it")
        stats = _PairStats(word_counts)
        merges = []
        while 256 + len(merges) < vocab_size:
            pair = stats.pop_best()
            if pair is None:
                break
            merges.append(pair)
            stats.apply(pair, 255 + len(merges))
        return cls(merges)

    @property
    def vocab_size(self):
        return 256 + len(self.merges)

    def _encode_word(self, word):
        """One pre-tokenized word -> its ids: merge the lowest-ranked adjacent pair until none is a merge."""
        ids = list(_utf8(word))
        rank = self._rank
        while len(ids) > 1:
            pair = min(zip(ids, ids[1:]), key=lambda p: rank.get(p, len(rank)))
            if pair not in rank:
                break
            ids = _merge(ids, pair[0], pair[1], 256 + rank[pair])
        return ids

    def encode(self, text):
        """text -> (N,) ids of self.dtype. Each distinct word is encoded once and cached."""
        return np.array(encode_words(self._rx.findall(text), self._cache, self._encode_new), dtype=self.dtype)

    def _encode_new(self, words):
        """Words not in the cache -> their ids: one by one, or many at once by the compiled merge loop."""
        if len(words) < KERNEL_MIN_WORDS:
            return [self._encode_word(w) for w in words]
        if self._table is None:
            self._table = MergeTable(self._rank, [256 + i for i in range(len(self.merges))], np.arange(256),
                                     self.vocab_size)
        return self._table.merge(words, _utf8)

    def token_bytes(self, i):
        """The bytes of token i."""
        return self._bytes[i]

    def _checked(self, ids):
        return checked_ids(ids, self.vocab_size)

    def decode(self, ids):
        """ids -> text; bytes that do not form UTF-8 (a character split by the ids) become U+FFFD."""
        return b"".join([self._bytes[i] for i in self._checked(ids)]).decode("utf-8", errors="replace")

    def pieces(self, ids):
        """Each token as readable text, for debugging: bytes that are not UTF-8 on their own shown as \\xNN."""
        return [self._bytes[i].decode("utf-8", errors="backslashreplace") for i in self._checked(ids)]

    # ------------------------------------------------------------------------
    # serialization: minigpt's JSON (in checkpoints) and Hugging Face's tokenizer.json

    def to_json(self):
        """{"kind": "bpe", "version": 1, "pattern": regex, "merges": [[a, b], ...]} as a string."""
        return json.dumps({"kind": "bpe", "version": 1, "pattern": self.pattern,
                           "merges": [list(m) for m in self.merges]}, separators=(",", ":"))

    @classmethod
    def from_json(cls, s):
        try:
            d = json.loads(s)
            assert isinstance(d, dict) and d.get("kind") == "bpe" and d.get("version") == 1
            merges, pattern = d["merges"], d["pattern"]
            for i, m in enumerate(merges):       # each merge joins two tokens made before it
                assert len(m) == 2 and all(type(t) is int and 0 <= t < 256 + i for t in m)
            re.compile(pattern)
        except (ValueError, TypeError, KeyError, AssertionError, re.error):
            raise UserError("the tokenizer JSON is not a minigpt BPE tokenizer (kind 'bpe', version 1, a pattern and "
                            "merges of earlier token ids); the checkpoint may be damaged or from another "
                            "program") from None
        tok = cls(merges, pattern)
        if len(set(tok._bytes)) != tok.vocab_size:
            raise UserError("the BPE tokenizer JSON has two tokens with the same bytes, which training never makes; "
                            "the checkpoint may be damaged or from another program")
        return tok

    def to_hf_json(self):
        """A Hugging Face tokenizers tokenizer.json (as a string) that encodes exactly as encode(): the same
        regex split, then GPT-2's byte-to-character map, then these merges; no normalizer or special tokens."""
        char = bytes_to_unicode()
        names = ["".join(char[b] for b in piece) for piece in self._bytes]    # (V,) token strings
        byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
        model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                 "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                 "vocab": {name: i for i, name in enumerate(names)},
                 "merges": [f"{names[a]} {names[b]}" for a, b in self.merges]}   # the alphabet has no space
        pre = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": self.pattern}, "behavior": "Isolated", "invert": False},
            byte_level]}
        return json.dumps({"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
                           "normalizer": None, "pre_tokenizer": pre, "post_processor": None,
                           "decoder": byte_level, "model": model}, ensure_ascii=False, indent=1)

    def save_hf(self, path):
        """Write to_hf_json() to path (UTF-8)."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.to_hf_json())



# ----------------------------------------------------------------------------
# many words at once: the cache, and the merge loop compiled (for corpora: minigpt/prepare_data.py)

def encode_words(words, cache, encode_new, cache_max=_CACHE_MAX):
    """The ids of words (a list of str) concatenated, as a list: each distinct word looked up in cache (word ->
    ids), the words it lacks encoded together by encode_new(list) -> [ids] and added (the cache cleared first
    when they would overfill it)."""
    new = set(words).difference(cache)
    if len(cache) + len(new) > cache_max:
        cache.clear()
        new = set(words)
    if new:
        new = list(new)
        cache.update(zip(new, encode_new(new)))
    return list(chain.from_iterable(map(cache.__getitem__, words)))


class MergeTable:
    """A BPE's merges as arrays for the compiled merge loop: pair of ids (a, b) -> its rank j, in a hash table
    (open addressing), and token[j], the id it makes (-1 if the vocabulary lacks it); base[byte]: the id of each
    byte (-1 if none). merge() gives the ids that merging the lowest rank first, leftmost first, gives."""

    def __init__(self, rank, tokens, base, vocab_size):
        """rank: {(a, b): j}; tokens: (M,) id made by merge j; base: (256,) ids."""
        self.width = max(vocab_size, 1)
        self.keys = np.full(max(len(tokens), 1), -1, np.int64)              # (M,) a * width + b of merge j
        for (a, b), j in rank.items():
            self.keys[j] = a * self.width + b
        self.tokens = np.asarray(tokens, np.int64)
        self.base = np.asarray(base, np.int64)
        bits = max(4, int(4 * len(self.keys)).bit_length())                 # a quarter full at most
        self.slots = _kernels()[0](self.keys, bits)                          # (2**bits,) merge j or -1
        self.bits = bits

    def merge(self, words, to_bytes):
        """[ids] of each word (to_bytes(word): its bytes); a UserError if the vocabulary lacks a piece."""
        raw = [to_bytes(w) for w in words]
        starts = np.zeros(len(raw) + 1, np.int64)                            # (W+1,) word w: starts[w:w+2]
        np.cumsum([len(r) for r in raw], out=starts[1:])
        ids = self.base[np.frombuffer(b"".join(raw), np.uint8)]              # (N,) the bytes' ids
        if ids.size and ids.min() < 0:
            w = np.searchsorted(starts, int(np.argmin(ids)), side="right") - 1
            raise UserError(f"the tokenizer's vocabulary lacks a byte of {words[w]!r}, so it cannot encode it; the "
                            "tokenizer files are incomplete")
        out, ends, bad = _kernels()[1](ids, starts, self.slots, self.bits, self.keys, self.tokens, self.width)
        if bad >= 0:
            raise UserError(f"the tokenizer's vocabulary lacks the token of merge {bad}, which its merges make; the "
                            "tokenizer files are inconsistent")
        flat, ends = out.tolist(), ends.tolist()
        return [flat[a:b] for a, b in zip(ends, ends[1:])]


@functools.cache
def _kernels():
    """(fill_slots, merge_words) of minigpt/backends/numba_bpe.py, compiled by numba on first use."""
    from .backends import numba_bpe
    return numba_bpe.fill_slots, numba_bpe.merge_words
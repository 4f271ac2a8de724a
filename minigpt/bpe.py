"""Byte-level BPE: a tokenizer trained on a text, with the interface of data.CharTokenizer, exportable to Hugging Face.

The text is split into words by one regex (PATTERN), each word's UTF-8 bytes start as 256 byte tokens, and
training merges the most frequent adjacent pair again and again (GPT-2's scheme). Any text encodes: bytes the
training text never had stay byte tokens. PATTERN uses ASCII classes only, with whitespace spelled out, so that
Python's `re` and Oniguruma (Hugging Face `tokenizers`) split every Unicode string alike; to_hf_json() writes a
tokenizer.json whose ids equal encode()'s. Not here: special tokens, normalization, GPT-2's \\p{L} classes
(non-ASCII letters fall into the "other" class, in runs of at most 16 characters).
"""
import heapq
import json
import re
from collections import Counter, defaultdict

import numpy as np

from .errors import UserError
from .data import checked_ids

# ASCII whitespace written out: Python's \s also matches \x1c-\x1f, \x85, \xa0, \u2028, ... and Oniguruma's \s
# matches a different set, so the two engines would split such text differently.
_WS = r"\t\n\x0b\x0c\r "
# A word is merged pair by pair, so its time grows with its length squared: a 60 KB Chinese text, one word when
# the "other" class had no bound, took 10 s to train (vocab 1000) and 4.5 s to encode, against 0.5 s and 0.2 s
# for as much English. Runs of 16 keep CJK words whole up to that length, and cost a merge every 16 characters.
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
        try:
            ids = list(word.encode("utf-8"))
        except UnicodeEncodeError as e:
            raise UserError(f"text holds {word[e.start]!r}, a lone surrogate, which is not valid Unicode and has no "
                            "UTF-8 bytes; read the text with errors='replace' or fix its source") from None
        rank = self._rank
        while len(ids) > 1:
            pair = min(zip(ids, ids[1:]), key=lambda p: rank.get(p, len(rank)))
            if pair not in rank:
                break
            ids = _merge(ids, pair[0], pair[1], 256 + rank[pair])
        return ids

    def encode(self, text):
        """text -> (N,) ids of self.dtype. Each distinct word is encoded once and cached."""
        cache, out = self._cache, []
        if len(cache) > _CACHE_MAX:
            cache.clear()
        for word in self._rx.findall(text):
            ids = cache.get(word)
            if ids is None:
                ids = cache[word] = self._encode_word(word)
            out += ids
        return np.array(out, dtype=self.dtype)

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


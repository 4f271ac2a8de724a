"""numba kernels of the BPE encoder (minigpt/bpe.py's MergeTable): a pair -> merge hash table, and the merge loop
over many words at once. The merges are applied as bpe.py's _encode_word applies them (the lowest rank first, the
leftmost of equal ones), in compiled loops: a corpus has millions of new words to merge. Importing
numba_kernels first sets numba's environment as the numba backend sets it.
"""
import numpy as np

from . import numba_kernels  # noqa: F401  (numba's environment, then numba)
from numba import njit  # noqa: E402


@njit(cache=True)
def slot(key, bits):
    """Fibonacci hashing of a pair key to a slot in [0, 2**bits) (uint64 arithmetic wraps)."""
    return (np.uint64(key) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(64 - bits)


@njit(cache=True)
def fill_slots(keys, bits):
    slots = np.full(1 << bits, -1, np.int64)
    mask = (1 << bits) - 1
    for j in range(len(keys)):
        if keys[j] >= 0:
            h = np.int64(slot(keys[j], bits))
            while slots[h] >= 0:
                h = (h + 1) & mask
            slots[h] = j
    return slots


@njit(cache=True)
def find(key, slots, bits, keys):
    """The merge j of pair key, or len(keys) (no merge: ranks past every merge)."""
    mask = (1 << bits) - 1
    h = np.int64(slot(key, bits))
    while slots[h] >= 0:
        if keys[slots[h]] == key:
            return slots[h]
        h = (h + 1) & mask
    return len(keys)


@njit(cache=True)
def merge_words(ids, starts, slots, bits, keys, tokens, width):
    """ids (N,): every word's byte ids, word w at ids[starts[w]:starts[w+1]] -> (out, ends, bad): the merged
    words, word w at out[ends[w]:ends[w+1]]; bad: -1, or a merge whose token is missing. As bpe.py's _encode_word: the
    lowest-ranked pair merges, the leftmost of equal ones; rank[i] caches the pair at i, and a merge changes only
    the pairs beside it."""
    out = np.empty(len(ids), np.int64)
    rank = np.empty(len(ids), np.int64)                  # rank[i]: the merge of (out[i], out[i+1])
    ends = np.zeros(len(starts), np.int64)
    none, o = len(keys), 0
    for w in range(len(starts) - 1):
        n = starts[w + 1] - starts[w]
        out[o:o + n] = ids[starts[w]:starts[w + 1]]
        for i in range(o, o + n - 1):
            rank[i] = find(out[i] * width + out[i + 1], slots, bits, keys)
        while n > 1:
            at = o
            for i in range(o + 1, o + n - 1):
                if rank[i] < rank[at]:
                    at = i
            j = rank[at]
            if j == none:
                break
            if tokens[j] < 0:
                return out[:0], ends, j
            out[at] = tokens[j]                              # (out[at], out[at+1]) -> tokens[j]
            for i in range(at + 1, o + n - 1):
                out[i] = out[i + 1]
            for i in range(at + 1, o + n - 2):
                rank[i] = rank[i + 1]
            n -= 1
            if at > o:
                rank[at - 1] = find(out[at - 1] * width + out[at], slots, bits, keys)
            if at < o + n - 1:
                rank[at] = find(out[at] * width + out[at + 1], slots, bits, keys)
        o += n
        ends[w + 1] = o
    return out[:o], ends, -1

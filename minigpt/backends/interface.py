"""The op interface: Ops declares every op a training step needs, with its shapes, and checks each op's arguments
once for every backend before calling the backend's own (_<op>). The ops write caller-owned arrays (out=...),
accept strided views, and allocate nothing of activation size per call (scratch is kept per shape). A float32
model may run bfloat16 products: its backend is bound to that precision (ops.with_bf16(True)), and every backend
rounds the operands to bf16 and sums in float32: numpy by the formula (numpy_ops.round_bf16) into scratch before
the fp32 product (numba too: it runs the specification's products), native in C as it packs. Which backend a
model holds is chosen in __init__.py (load).
"""
import copy
import functools
import math

import numpy as np


def gemm_dims(a, b, ta, tb):
    """(M, N, K) of op(a) @ op(b) over the last two axes; ValueError if the inner dimensions differ."""
    M, Ka = (a.shape[-1], a.shape[-2]) if ta else (a.shape[-2], a.shape[-1])
    Kb, N = (b.shape[-1], b.shape[-2]) if tb else (b.shape[-2], b.shape[-1])
    if Ka != Kb:
        raise ValueError(f"matmul: inner dimensions differ: op(a) is {M}x{Ka} (a {a.shape}, ta={ta}), "
                         f"op(b) is {Kb}x{N} (b {b.shape}, tb={tb})")
    return M, N, Ka


def dropout_keep_from(p):
    """Dropout keeps element n where its 32 random bits (numpy_ops.dropout_hash of the seed's keys and n) >> 8,
    24 of them, are >= this: with probability 1 - p, to within 2**-24."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout: p must lie in [0, 1), got {p!r}")
    return math.ceil(p * 2**24)


def check_dropout(x, seed, out):
    """ValueError for an array too large for 32-bit element numbers, a seed outside [0, 2**64), or an out of
    another shape or dtype, or one that overlaps x without being x (in place)."""
    if x.size >= 2**32:
        raise ValueError(f"dropout: {x.size} elements; masks number theirs in 32 bits: drop the array in parts, "
                         "each with a seed of its own")
    if not 0 <= seed < 2**64:
        raise ValueError(f"dropout: seed {seed} is outside [0, 2**64)")
    if out.shape != x.shape or out.dtype != x.dtype:
        raise ValueError(f"dropout: out is {out.shape} {out.dtype}, x {x.shape} {x.dtype}: pass an out like x")
    if not _same(out, x) and np.may_share_memory(out, x):
        raise ValueError("dropout: out overlaps x without being x: pass x itself (in place) or a separate array")


def _same(a, b):
    """a and b are one array: the same first element and the same strides (an op's in-place form)."""
    return a.__array_interface__["data"][0] == b.__array_interface__["data"][0] and a.strides == b.strides


@functools.lru_cache(maxsize=64)
def future(T, Tk, start):
    """(T, Tk) bool, True where key j is in query i's future (j > start + i): made once per (T, Tk, start)."""
    mask = np.triu(np.ones((T, Tk), bool), k=start + 1)
    mask.flags.writeable = False
    return mask


class Ops:
    """The ops of a training step. numpy_ops.py is the specification of each but attention, which Ops composes
    here of the products and softmaxes (a backend may override it with a fused kernel). Every op checks its
    arguments here, once for all backends (shapes, ids in range, attention's offset), then calls the backend's
    own: a backend writes _matmul, _bmm and the _<op> of each op under "the other ops" below.
    Any array argument may be a strided view (but adamw's p, m, v); outputs are written in place (added into,
    where it says +=) and returned. Transposes are flags, not copies. Argument order: numpy's, inputs first and
    outputs last (out=); layers.py's functions take their outputs first. embedding_backward(dW, idx, dout) keeps
    np.add.at(dW, idx, dout)'s order."""
    name = "?"
    dtypes = frozenset()         # the dtypes a model runs on this backend (load and GPT check it)
    own_causal = False           # True: _bmm takes causal= and start= (native skips the zeros, numba zeroes the future)
    bf16 = False                 # matmul/bmm's bf16=None: the precision of the model that holds this Ops (with_bf16)

    def __init__(self):
        self._scratch = {}       # (slot, shape, dtype) -> array, see _tmp
        self._calls = {}         # op -> its Contiguous, see _contiguous

    def with_bf16(self, on=True):
        """This backend with its products (matmul, bmm, and attention's) in bf16 when on, else float32, unless a
        call says bf16= itself: itself if it already is, else a shallow copy that shares the kernels, the
        scratch and the thread pools. A model holds the one of its precision (GPT.ops)."""
        if bool(on) == self.bf16:
            return self
        twin = copy.copy(self)
        twin.bf16 = bool(on)
        return twin

    # ---- products: op(x) is x, or its last two axes swapped when the flag is set
    def matmul(self, a, b, ta=False, tb=False, out=None, acc=False, bf16=None):
        """op(a) (M, K) @ op(b) (K, N) -> out (M, N), 2-D; acc=True adds into out. bf16=True rounds every
        element of a and b to bfloat16 (numpy_ops.round_bf16) and sums the exact products in float32 (float32
        arrays only); None: this Ops' precision (with_bf16)."""
        M, N, _ = _check_product(a, b, ta, tb, out, acc, batched=False)
        if out is None:
            out = np.empty((M, N), np.result_type(a, b))
        return self._matmul(a, b, bool(ta), bool(tb), out, acc, self._precision(bf16, a, b, out))

    def bmm(self, a, b, ta=False, tb=False, out=None, acc=False, bf16=None, causal=None, start=0):
        """op(a) (..., M, K) @ op(b) (..., K, N) -> out (..., M, N) over equal leading dims; acc adds into out;
        bf16 as matmul's. causal names what in this product is attention's causal matrix, in which query i sees
        keys 0..start+i, so that a backend may skip its zeros: "out": the result (entries past the diagonal,
        j > start + i, are written 0; not with acc); "a": the stored a (the caller promises its zeros past the
        diagonal, and the result is the plain product)."""
        M, N, _ = _check_product(a, b, ta, tb, out, acc, batched=True)
        if causal not in (None, "a", "out") or (causal == "out" and acc) or start < 0:
            raise ValueError(f"bmm: causal={causal!r}, start={start}, acc={acc}: causal is None, 'a' or 'out' "
                             "(not with acc), start >= 0")
        if out is None:
            out = np.empty((*a.shape[:-2], M, N), np.result_type(a, b))
        bf16 = self._precision(bf16, a, b, out)
        if causal is not None and self.own_causal:            # the backend does it itself
            return self._bmm(a, b, bool(ta), bool(tb), out, acc, bf16, causal=causal, start=start)
        self._bmm(a, b, bool(ta), bool(tb), out, acc, bf16)
        if causal == "out":
            np.copyto(out, 0, where=future(M, N, start))
        return out

    # ---- a product with the op that reads its result, composed here; a backend may fuse them (native: each block
    #      of the result gets its GELU while it is still in cache, with the same bits)
    def matmul_gelu(self, a, b, bias, out, dgelu):
        """a (M, K) @ b (K, N) -> out = gelu(a b + bias), dgelu = gelu'(a b + bias), both (M, N); bias (N,) or
        None; the product in this Ops' precision. The MLP's first Linear with its GELU (layers.py)."""
        M, N, _ = _check_product(a, b, False, False, out, False, batched=False)
        check_shapes("matmul_gelu", ((M, N), out, dgelu), ((N,), bias))
        return self._matmul_gelu(a, b, bias, out, dgelu)

    def _matmul_gelu(self, a, b, bias, out, dgelu):
        self.matmul(a, b, out=out)                                    # z = a b, in out's memory
        return self.gelu(out, bias, out=out, dgelu=dgelu)             # out = gelu(z + bias), dgelu = gelu'(z + bias)

    def matmul_mul(self, a, b, scale, out, tb=False):
        """a (M, K) @ op(b) (K, N) -> out = (a op(b)) * scale, scale and out (M, N), apart from a and b; the product
        in this Ops' precision. A Linear's backward into the output of the MLP's activation, whose derivative its
        forward kept (matmul_gelu's dgelu): d loss / d its input, the activation's backward done as it is written."""
        M, N, _ = _check_product(a, b, False, tb, out, False, batched=False)
        check_shapes("matmul_mul", ((M, N), scale, out))
        _apart("matmul_mul", out, a, b, scale)
        return self._matmul_mul(a, b, scale, out, bool(tb))

    def _matmul_mul(self, a, b, scale, out, tb):
        self.matmul(a, b, tb=tb, out=out)                             # z = a op(b), in out's memory
        return np.multiply(out, scale, out=out)                       # out = z * scale (gelu_backward's bits)

    def matmul_add(self, a, b, bias, res, out, drop=None):
        """a (M, K) @ b (K, N) -> out = res + dropout(a b + bias), res and out (M, N), apart from each other and
        from a and b; bias (N,) or None; drop (p, seed), dropout's, or None: none; the product in this Ops'
        precision. A Linear and the residual add after it (the block's x + attn(ln_1(x)) and x + mlp(ln_2(x)))."""
        M, N, _ = _check_product(a, b, False, False, out, False, batched=False)
        check_shapes("matmul_add", ((M, N), res, out), ((N,), bias))
        _apart("matmul_add", out, a, b, res)
        if drop is not None:
            dropout_keep_from(drop[0])                                # p in [0, 1)
            check_dropout(out, drop[1], out)
        return self._matmul_add(a, b, bias, res, out, drop)

    def _matmul_add(self, a, b, bias, res, out, drop=None):
        self.matmul(a, b, out=out)                                    # z = a b, in out's memory
        if bias is not None:
            out += bias                                               #     + bias
        if drop is not None:
            self.dropout(out, *drop, out=out)                         # dropout(z + bias)
        return np.add(res, out, out=out)                              # out = res + dropout(z + bias)

    def _precision(self, bf16, *arrays):
        """A product's bf16: as the call says, else (None) this Ops' own; TypeError for bf16 on other than float32."""
        bf16 = self.bf16 if bf16 is None else bool(bf16)
        if bf16 and any(x.dtype != np.float32 for x in arrays):
            raise TypeError(f"bf16 products take float32 arrays, got {', '.join(str(x.dtype) for x in arrays)}: "
                            "bf16 is a float32 model's precision (float64 is for gradient tests)")
        return bf16

    def _matmul(self, a, b, ta, tb, out, acc, bf16):     # checked by matmul; out exists; returns out
        raise NotImplementedError

    def _bmm(self, a, b, ta, tb, out, acc, bf16, causal=None, start=0):
        """Checked by bmm; out exists; returns out. bmm passes causal and start only when own_causal."""
        raise NotImplementedError

    # ---- the other ops: each checks its arguments here, once for every backend (the C and numba kernels trust
    #      the shapes, ids and offsets they are given), then calls the backend's _<op> with the same arguments
    def layernorm(self, x, w, b, out, mean, rstd, eps=1e-5):
        """x (N, C) -> out (N, C) = (x - mean) / sqrt(var + eps) * w + b; writes mean, rstd (N,); b may be None."""
        N, C = _rows("layernorm", x)
        check_shapes("layernorm", (x.shape, out), ((C,), w, b), ((N,), mean, rstd))
        return self._layernorm(x, w, b, out, mean, rstd, eps)

    def layernorm_backward(self, dy, x, w, mean, rstd, dx, dw, db, acc=False):
        """dy, x (N, C) -> dx (N, C) written, or added into with acc (a pre-LN block's residual stream, whose
        gradient is x's other use); dx may be dy (not with acc), and must not overlap x; dw, db (C,) +=; db is
        None without a bias."""
        N, C = _rows("layernorm_backward", x)
        check_shapes("layernorm_backward", (x.shape, dy, dx), ((C,), w, dw, db), ((N,), mean, rstd))
        if ((acc or not _same(dx, dy)) and np.may_share_memory(dx, dy)) or np.may_share_memory(dx, x):
            raise ValueError("layernorm_backward: dx overlaps x, or dy without being it (or with acc): pass dy "
                             "itself (in place, without acc) or a separate array")
        return self._layernorm_backward(dy, x, w, mean, rstd, dx, dw, db, bool(acc))

    def gelu(self, x, b, out, dgelu):
        """x (..., H), b (H,) or None -> out = gelu(x + b) (tanh form; out may be x), dgelu = gelu'(x + b)."""
        check_shapes("gelu", (x.shape, out, dgelu), (x.shape[-1:], b))
        return self._gelu(x, b, out, dgelu)

    def gelu_backward(self, dout, dgelu, dx, db):
        """dout, dgelu (..., H) -> dx = dout * dgelu (dx may be dout); db (H,) += the column sums of dx, or None."""
        check_shapes("gelu_backward", (dout.shape, dgelu, dx), (dout.shape[-1:], db))
        return self._gelu_backward(dout, dgelu, dx, db)

    def causal_softmax(self, att, scale, start=0):
        """att (..., T, Tk) scores -> softmax(scale * scores) in place; query i sees keys 0..start+i (all of them
        once start + i >= Tk); the masked ones become exactly 0, whatever they held."""
        _check_start("causal_softmax", start)
        return self._causal_softmax(att, scale, start)

    def causal_softmax_backward(self, att, datt, scale, start=0):
        """att (..., T, Tk) probabilities; datt d(probabilities) -> d(scores) in place."""
        _check_start("causal_softmax_backward", start)
        check_shapes("causal_softmax_backward", (att.shape, datt))
        return self._causal_softmax_backward(att, datt, scale, start)

    # ---- causal self-attention of many heads at once: the products and softmax above, composed here; a backend
    #      may fuse them (native: mgk_attention_fwd/bwd, the same bits)
    def attention(self, q, k, v, att, y, scale, start=0, drop=None):
        """q (..., T, hs), k and v (..., Tk, hs) -> att (..., T, Tk), y (..., T, hs): att = causal_softmax of
        scale * q k^T (query i sees keys 0..start+i), y = att v. drop = (p, seed), when given, is attention
        dropout: attd = dropout(att, p, seed) (its mask numbered over att's elements) is what multiplies v."""
        self.bmm(q, k, tb=True, out=att, causal="out", start=start)   # s = q k^T, but past the diagonal (0 there)
        self.causal_softmax(att, scale, start)                        # att = softmax(scale s), causal
        if drop is not None:                                          # attd = att * mask, in scratch
            att = self.dropout(att, *drop, out=self._tmp("attd", att.shape, att.dtype))
        self.bmm(att, v, out=y, causal="a", start=start)              # y = att v
        return y

    def attention_backward(self, q, k, v, att, dy, dq, dk, dv, scale, drop=None):
        """dy (..., T, hs) -> dq, dk, dv (..., T, hs), written (not added into), from attention's forward with
        Tk = T, start 0: its inputs q, k, v, its probabilities att and its dropout (p, seed), whose mask the
        backward draws again."""
        datt = self._tmp("attention_backward", att.shape, att.dtype)   # (..., T, T): d att, then d scores
        attd = att if drop is None else self.dropout(att, *drop, out=self._tmp("attd", att.shape, att.dtype))
        self.bmm(attd, dy, ta=True, out=dv, causal="a")               # fwd: y = attd v -> dv = attd^T dy
        self.bmm(dy, v, tb=True, out=datt, causal="out")              #                    dattd = dy v^T, past: 0
        if drop is not None:
            self.dropout(datt, *drop, out=datt)                       # fwd: attd = att * mask
        self.causal_softmax_backward(att, datt, scale)                # fwd: att = softmax(scale s) -> ds, in place
        self.bmm(datt, k, out=dq, causal="a")                         # fwd: s = q k^T -> dq = ds k
        self.bmm(datt, q, ta=True, out=dk, causal="a")                #                   dk = ds^T q
        return dq, dk, dv

    def cross_entropy(self, logits, targets, lse):
        """logits (N, V), targets (N,) ints in [0, V) -> mean loss (a float); writes lse (N,), each row's
        log-sum-exp."""
        N, V = _rows("cross_entropy", logits)
        if N == 0:                                                  # a mean of nothing: nan on numpy, 0 in C
            raise ValueError("cross_entropy: logits has no rows; the mean loss needs at least one target")
        check_shapes("cross_entropy", ((N,), targets, lse))
        check_ids("cross_entropy", targets, V, "targets")
        return self._cross_entropy(logits, targets, lse)

    def cross_entropy_backward(self, logits, targets, lse, scale, dlogits):
        """logits (N, V), targets, lse (N,) -> dlogits (N, V) = (softmax(logits) - onehot(targets)) * scale."""
        N, V = _rows("cross_entropy_backward", logits)
        check_shapes("cross_entropy_backward", ((N,), targets, lse), (logits.shape, dlogits))
        check_ids("cross_entropy_backward", targets, V, "targets")
        return self._cross_entropy_backward(logits, targets, lse, scale, dlogits)

    def embedding_backward(self, dW, idx, dout):
        """dW (V, C), idx (N,) ints in [0, V), dout (N, C): dW[idx[n]] += dout[n], repeated ids summed (a
        scatter-add); returns dW."""
        V, C = _rows("embedding_backward", dW)
        check_shapes("embedding_backward", ((idx.size, C), dout))
        check_ids("embedding_backward", idx, V, "token ids")
        self._embedding_backward(dW, idx, dout)
        return dW

    def adamw(self, p, g, m, v, lr, b1, b2, eps, wd, bc1, bc2):
        """One in-place AdamW update of p, m, v (C-contiguous, same shape as g); bc1, bc2: bias corrections.
        Returns p."""
        check_shapes("adamw", (p.shape, g, m, v))
        if not (p.flags.c_contiguous and m.flags.c_contiguous and v.flags.c_contiguous):
            raise ValueError("adamw updates p, m and v in place: they must be C-contiguous arrays, not views")
        self._adamw(p, g, m, v, lr, b1, b2, eps, wd, bc1, bc2)
        return p

    def dropout(self, x, p, seed, out):
        """out = x * an inverted-dropout mask drawn from seed (an int in [0, 2**64)); x any shape, out x's (out
        may be x). Element n of x (in C order) is multiplied by 1 / (1 - p) where numpy_ops.dropout_hash keeps
        it (dropout_keep_from), by 0 otherwise. A counter-based draw: element n's mask value depends on (seed, n)
        alone, so every backend, thread count and chunking draws the same mask, and a backward draws it again
        from the seed: no mask is stored. x.size < 2**32."""
        dropout_keep_from(p)                                 # p in [0, 1)
        check_dropout(x, seed, out)
        return self._dropout(x, p, seed, out)

    # ---- knobs: not ops (a backend without the knob ignores it)
    def set_threads(self, n):
        """Threads of this backend's own pool (select and set_threads call it)."""

    def spin(self, us=None):
        """Let worker threads wait up to us microseconds on the CPU between back-to-back calls before they sleep
        (native only; None: the backend's default)."""

    # ---- for the backends: scratch kept per shape, and contiguous arrays for kernels that need them
    def _tmp(self, slot, shape, dtype):
        """A scratch array kept per (slot, shape, dtype): made on first use, then reused by every call."""
        key = (slot, shape, dtype)
        s = self._scratch.get(key)
        if s is None:
            s = self._scratch[key] = np.empty(shape, dtype)
        return s

    def _contiguous(self, op):
        """The Contiguous of op (see there), reset for a new kernel call; one per op, made once (it is cheaper)."""
        c = self._calls.get(op)
        if c is None:
            c = self._calls[op] = Contiguous(self, op)
        c.n, c.copies = 0, ()
        return c


class Contiguous:
    """The arrays of one kernel call, made C-contiguous for a kernel that walks contiguous rows:

        c = self._contiguous("layernorm")
        kernel(c.inp(x), w, b, c.out(y), ...)      # inp: read; out: written; inout: read and written
        c.back()                                    # copies each output written into scratch to its array

    Each of inp/out/inout returns its argument itself if it is C-contiguous (or None), else a scratch array
    kept per (op, argument position, shape, dtype) by the backend (Ops._tmp): a view costs a copy in (inp,
    inout) and/or a copy back (out, inout), and no allocation after the first call. Arguments are counted in
    call order, so two arguments of one call never share scratch, even when they are the same array."""
    __slots__ = ("ops", "op", "n", "copies")

    def __init__(self, ops, op):
        self.ops, self.op, self.n, self.copies = ops, op, 0, ()

    def inp(self, x):
        self.n += 1
        return x if x is None or x.flags.c_contiguous else self._scratch(x, True, False)

    def out(self, x):
        self.n += 1
        return x if x is None or x.flags.carray else self._scratch(x, False, True)     # carray: C order, writable

    def inout(self, x):
        self.n += 1
        return x if x is None or x.flags.carray else self._scratch(x, True, True)

    def _scratch(self, x, read, write):
        if write and not x.flags.writeable:
            raise ValueError(f"{self.ops.name} {self.op}: an output array is read-only (a broadcast view?); "
                             "pass a writable one")
        s = self.ops._tmp((self.op, self.n), x.shape, x.dtype)
        if read:
            np.copyto(s, x)
        if write:
            self.copies += ((s, x),)
        return s

    def back(self):
        for s, x in self.copies:
            np.copyto(x, s)


def _apart(what, out, *inputs):
    """ValueError if out shares memory with an input (a fused op reads them while it writes out)."""
    if any(np.may_share_memory(out, x) for x in inputs):
        raise ValueError(f"{what}: out overlaps an input; pass a separate array")


def _check_product(a, b, ta, tb, out, acc, batched):
    if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
        raise TypeError(f"matmul: a and b must be numpy arrays, got {type(a).__name__}, {type(b).__name__}")
    if batched:
        if a.ndim < 3 or b.ndim != a.ndim or a.shape[:-2] != b.shape[:-2]:
            raise ValueError(f"bmm: a and b need the same leading (batch) dims and ndim >= 3, got {a.shape}, {b.shape}")
    elif a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"matmul: a and b must be 2-D (use bmm for batches), got {a.shape}, {b.shape}")
    M, N, K = gemm_dims(a, b, ta, tb)
    if acc and out is None:
        raise ValueError("acc=True needs an out= array to add into")
    if out is not None:
        if out.shape != (*a.shape[:-2], M, N):
            raise ValueError(f"matmul: out has shape {out.shape}, expected {(*a.shape[:-2], M, N)}")
        if not out.flags.writeable:
            raise ValueError("matmul: out= is read-only (a broadcast view?); pass a writable array")
        if np.may_share_memory(out, a) or np.may_share_memory(out, b):
            raise ValueError("matmul: out= must not overlap the inputs")
    return M, N, K


def check_float32(*arrays, backend):
    """float32 or TypeError: the products of the fast backends and every native op (no silent casts)."""
    for x in arrays:
        if x is not None and x.dtype != np.float32:
            raise TypeError(f"{backend} backend: float32 arrays only, got {x.dtype}. Cast with .astype(np.float32), "
                            "or select the numpy backend (dtype-generic, e.g. float64 gradient tests)")


def check_shapes(op, *groups):
    """groups: (shape, array or None, ...); ValueError naming op for an array of another shape."""
    for want, *arrays in groups:
        for a in arrays:
            if a is not None and a.shape != want:
                raise ValueError(f"{op}: an array has shape {a.shape}, expected {want}")


def check_ids(op, ids, n, what):
    """ValueError unless ids is an array of integers, each in [0, n) (the kernels index rows with them)."""
    if not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(f"{op}: {what} must be integers, got {ids.dtype}")
    if ids.size and (ids.min() < 0 or ids.max() >= n):
        raise ValueError(f"{op}: {what} out of range: they must lie in [0, {n}), got {ids.min()} to {ids.max()}")


def _rows(op, x):
    """(rows, columns) of a 2-D x, or ValueError."""
    if x.ndim != 2:
        raise ValueError(f"{op}: expected a 2-D array (rows, columns), got shape {x.shape}")
    return x.shape


def _check_start(op, start):
    """The first query's position among the keys: start >= 0 (start + T may pass Tk: the last queries see all)."""
    if start < 0:
        raise ValueError(f"{op}: start must be >= 0, got {start}")

"""The native backend: every op in the C library native/mgk*.c (built as minigpt/_mgk*.so), through ctypes: the
products (mgk.c), the fused attention (mgk_attention.c), and LayerNorm, GELU, causal softmax, cross-entropy,
the embedding scatter-add, AdamW and dropout (mgk_ops.c), float32 only. It needs neither numba nor
BLAS. (AdamW and the scatter-add are memory-bound, and a ctypes call costs more than a numba one: the price of
one backend.)

The only module of the package that uses ctypes. Loads the library once and declares every signature it calls.
Transposes are flags. The products and the fused attention walk strided views in place (rows of contiguous floats,
up to two batch strides); the other ops take C-contiguous arrays, so a view goes through per-shape scratch
(Ops._contiguous), as does a view the products cannot walk. backend() raises BackendUnavailable with the reason and
the fix if the library is missing or fails to load. The library runs on any CPU: it picks its AVX-512 (+ AMX tiles,
or AVX512_BF16 where vdpbf16ps clearly outruns the fp32 FMAs: best_isa in native/mgk.c, for bf16 products),
AVX2+FMA or generic path by cpuid, and MINIGPT_ISA (one of ISAS) forces another one this CPU runs.
bf16 products (matmul(..., bf16=True)) run mgk_bgemm*: the operands are rounded to bf16 as they are packed (as
they are read, for at most 8 rows).
Attention's causal products (bmm(..., causal=...)) run mgk_gemm_causal, which skips the causal matrix's zeros on
its packed paths (mgk.h says which); attention itself (Ops.attention, attention_backward) runs fused, a head at a
time per thread, on the same products (mgk_attention_fwd/bwd, native/mgk_attention.c).
MINIGPT_NATIVE_LIB=/path/to/lib overrides the location.
"""
import ctypes
import functools
import glob
import importlib.machinery
import math
import os

import numpy as np

from . import BackendUnavailable
from .interface import Ops, check_dropout, check_float32, check_shapes, dropout_keep_from, gemm_dims

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # minigpt/
# the C library's error codes (mgk.h): what each means, and the exception it raises here (out of memory: MemoryError,
# which training turns into its one-line OutOfMemory)
_ERRORS = {-1: ("bad argument", ValueError), -2: ("out of memory", MemoryError),
           -3: ("could not start a worker thread", RuntimeError)}
_i, _ll = ctypes.c_int, ctypes.c_longlong
_ABI = 13                                                 # MGK_ABI in native/mgk.h
_CAUSAL = {"out": 1, "a": 2}                              # MGK_CAUSAL_OUT, MGK_CAUSAL_A in native/mgk.h
_ndf32 = np.ctypeslib.ndpointer(np.float32, flags="C_CONTIGUOUS")


class _f32(_ndf32):
    """ndpointer(float32, C_CONTIGUOUS) with a cheaper conversion: numpy's from_param goes through
    arr.ctypes and ctypes.cast (most of a small call's overhead); byref of a buffer view costs a fraction
    of that. Anything unusual (wrong dtype/layout, read-only, empty) takes numpy's path,
    which performs the same dtype and layout checks and raises the same errors; it lets a read-only array
    through, as inputs may be (the ops' outputs are arrays the layers and the Ops own)."""

    @classmethod
    def from_param(cls, obj):
        if type(obj) is np.ndarray and obj.dtype == np.float32 and obj.flags.c_contiguous and obj.size:
            try:
                return ctypes.byref(ctypes.c_char.from_buffer(obj))    # keeps obj alive for the call
            except (TypeError, ValueError):                           # read-only buffer
                pass
        return _ndf32.from_param(obj)


class _f32n(_f32):
    """_f32, or None for an optional array (NULL in C: no bias, no db)."""

    @classmethod
    def from_param(cls, obj):
        return None if obj is None else _f32.from_param(obj)


_ndi64 = np.ctypeslib.ndpointer(np.int64, flags="C_CONTIGUOUS")


class _i64(_ndi64):
    """ndpointer(int64, C_CONTIGUOUS) with _f32's cheaper conversion (token ids, targets)."""

    @classmethod
    def from_param(cls, obj):
        if type(obj) is np.ndarray and obj.dtype == np.int64 and obj.flags.c_contiguous and obj.size:
            try:
                return ctypes.byref(ctypes.c_char.from_buffer(obj))
            except (TypeError, ValueError):
                pass
        return _ndi64.from_param(obj)


def _find():
    """Path of the library: $MINIGPT_NATIVE_LIB, else minigpt/_mgk<EXT_SUFFIX> in the package (_HERE)."""
    path = os.environ.get("MINIGPT_NATIVE_LIB")
    if path:
        if not os.path.isfile(path):
            what = "is a directory" if os.path.isdir(path) else "does not exist"
            raise BackendUnavailable(f"native: MINIGPT_NATIVE_LIB={path} {what}. {_LIB_FIX}")
        return path
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        hits = glob.glob(os.path.join(_HERE, "_mgk" + suffix))
        if hits:
            return hits[0]
    raise BackendUnavailable("native: the compiled library minigpt/_mgk*.so is missing (the C build was skipped "
                             "or failed at install time; pip prints the reason as a warning). Fix: install gcc "
                             "and run `pip install -e .` again, or choose MINIGPT_BACKEND=numba or numpy")


_LIB_FIX = "Fix: unset MINIGPT_NATIVE_LIB, or point it at a built library (pip install -e . builds minigpt/_mgk*.so)"


def _rebuild():
    """The fix for a library that does not load or is of another version: the variable's, when it named it."""
    return _LIB_FIX if os.environ.get("MINIGPT_NATIVE_LIB") else "Fix: rebuild with `pip install -e .`"


@functools.cache
def _lib():
    path = _find()
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise BackendUnavailable(f"native: cannot load {path}: {e}. {_rebuild()}") from e
    abi = 1                                                           # a build from before mgk_abi
    if hasattr(lib, "mgk_abi"):
        lib.mgk_abi.argtypes, lib.mgk_abi.restype = [], _i
        abi = lib.mgk_abi()
    if abi != _ABI:
        raise BackendUnavailable(f"native: {path} is a build of another version of native/mgk.c (ABI {abi}, this "
                                 f"code needs {_ABI}). {_rebuild()}")
    _p = ctypes.c_void_p                                              # strided views: checked by _matrices
    lib.mgk_sgemm_batched.argtypes = [_i] * 7 + [_p, _i, _ll, _ll, _p, _i, _ll, _ll, ctypes.c_float, _p, _i, _ll, _ll]
    lib.mgk_sgemm_batched.restype = _i
    lib.mgk_sgemm.argtypes = [_i] * 5 + [_f32, _i, _f32, _i, ctypes.c_float, _f32, _i]
    lib.mgk_sgemm.restype = _i
    for f in ("mgk_sgemm_ref", "mgk_bgemm", "mgk_bgemm_ref"):          # bf16 operands, the same call
        getattr(lib, f).argtypes, getattr(lib, f).restype = lib.mgk_sgemm.argtypes, _i
    lib.mgk_bgemm_batched.argtypes = lib.mgk_sgemm_batched.argtypes
    lib.mgk_bgemm_batched.restype = _i
    lib.mgk_gemm_causal.argtypes, lib.mgk_gemm_causal.restype = [_i] * 3 + lib.mgk_sgemm_batched.argtypes, _i
    drop = [_i, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_float]    # dropout: on, seed, keep_from, 1 / (1 - p)
    lib.mgk_gemm_gelu.argtypes = [_i] * 4 + [_f32, _i, _f32, _i, _f32n, _f32, _i, _f32, _i]
    lib.mgk_gemm_gelu.restype = _i
    lib.mgk_gemm_mul.argtypes = [_i] * 6 + [_f32, _i, _f32, _i, _f32, _i, _f32, _i]
    lib.mgk_gemm_add.argtypes = [_i] * 4 + [_f32, _i, _f32, _i, _f32n, _f32, _i, _f32, _i] + drop
    lib.mgk_gemm_mul.restype = lib.mgk_gemm_add.restype = _i
    view = [_p, _i, _ll, _ll]                                         # a strided stack: _matrices
    lib.mgk_attention_fwd.argtypes = [_i] * 7 + [ctypes.c_float] + view * 5 + drop      # q, k, v, att, y, drop
    lib.mgk_attention_bwd.argtypes = [_i] * 5 + [ctypes.c_float] + view * 8 + drop      # ..., dv, drop
    lib.mgk_attention_fwd.restype = lib.mgk_attention_bwd.restype = _i
    lib.mgk_round_bf16.argtypes, lib.mgk_round_bf16.restype = [_ll, _f32, _f32], _i
    lib.mgk_isa_name.argtypes, lib.mgk_isa_name.restype = [_i], ctypes.c_char_p
    for f in ("mgk_cpu_isa", "mgk_isa", "mgk_get_num_threads"):
        getattr(lib, f).argtypes, getattr(lib, f).restype = [], _i
    lib.mgk_set_isa.argtypes, lib.mgk_set_isa.restype = [_i], _i
    lib.mgk_emulate_amx.argtypes, lib.mgk_emulate_amx.restype = [_i], _i
    lib.mgk_set_num_threads.argtypes, lib.mgk_set_num_threads.restype = [_i], _i
    lib.mgk_set_spin_us.argtypes, lib.mgk_set_spin_us.restype = [_i], _i
    for f in ("mgk_peak_gflops", "mgk_peak_bf16_gflops"):
        getattr(lib, f).argtypes, getattr(lib, f).restype = [_ll], ctypes.c_double
    _f, _d = ctypes.c_float, ctypes.c_double                          # the other ops (native/mgk_ops.h)
    ops = {"layernorm_fwd": [_ll, _i, _f32, _f32, _f32n, _d, _f32, _f32, _f32],
           "layernorm_bwd": [_ll, _i, _f32, _f32, _f32, _f32, _f32, _f32, _f32, _f32n, _i],
           "gelu_fwd": [_ll, _i, _f32, _f32n, _f32, _f32],
           "gelu_bwd": [_ll, _i, _f32, _f32, _f32, _f32n],
           "causal_softmax_fwd": [_ll, _i, _i, _i, _f, _f32],
           "causal_softmax_bwd": [_ll, _i, _i, _i, _f, _f32, _f32],
           "xent_fwd": [_ll, _i, _f32, _i64, _f32, ctypes.POINTER(_d)],
           "xent_bwd": [_ll, _i, _f32, _i64, _f32, _f, _f32],
           "adamw": [_ll, _f32, _f32, _f32, _f32] + [_d] * 7,
           "embedding_bwd": [_ll, _i, _i, _f32, _i64, _f32],
           "dropout": [_ll, ctypes.c_uint64, ctypes.c_uint32, _f, _f32, _f32]}
    for op, args in ops.items():
        for f in (getattr(lib, f"mgk_{op}"), getattr(lib, f"mgk_ref_{op}")):    # fast path, scalar reference
            f.argtypes, f.restype = args, _i
    lib.mgk_exp.argtypes, lib.mgk_exp.restype = [_ll, _f32, _f32], _i
    return lib


def _check(rc, what, a, b):
    if rc != 0:
        raise _error(rc, what, f" for {a.shape} x {b.shape}")


def _error(rc, what, detail=""):
    """The exception for a C call that returned rc (_ERRORS)."""
    meaning, kind = _ERRORS.get(rc, (str(rc), RuntimeError))
    return kind(f"native {what}: {meaning} (rc={rc}){detail}")


# ----------------------------------------------------------------------------
# the backend

class NativeOps(Ops):
    name = "native"
    dtypes = frozenset({np.dtype(np.float32)})

    def __init__(self, lib):
        super().__init__()
        self.lib = lib
        self.spin()

    # ---- products: the C code walks strided views in place (_matrices); others go through Ops._contiguous
    def _matmul(self, a, b, ta, tb, out, acc, bf16):               # a (M,K)|(K,M), b (K,N)|(N,K) -> (M,N)
        check_float32(a, b, out, backend="native")
        if not (a.flags.c_contiguous and b.flags.c_contiguous and out.flags.c_contiguous):
            self._bmm(a[None], b[None], ta, tb, out[None], acc, bf16)
            return out                                                 # out itself, not a view of it
        M, N, K = gemm_dims(a, b, ta, tb)                          # the common case, with the cheapest call
        gemm = self.lib.mgk_bgemm if bf16 else self.lib.mgk_sgemm  # bgemm rounds the operands (native/mgk.c)
        _check(gemm(ta, tb, M, N, K, a, a.shape[1], b, b.shape[1], 1.0 if acc else 0.0, out, N), "gemm", a, b)
        return out

    def _matmul_gelu(self, a, b, bias, out, dgelu):               # a (M, K) @ b (K, N) -> gelu into out (M, N)
        if not all(x.flags.c_contiguous for x in (a, b, out, dgelu) + (() if bias is None else (bias,))):
            return super()._matmul_gelu(a, b, bias, out, dgelu)    # views: the composition walks them
        check_float32(a, b, bias, out, dgelu, backend=self.name)
        (M, K), N = a.shape, b.shape[1]
        _outputs("matmul_gelu", (out, dgelu), (a, b) + (() if bias is None else (bias,)))
        rc = self.lib.mgk_gemm_gelu(self.bf16, M, N, K, a, K, b, N, bias, out, N, dgelu, N)
        _check(rc, "matmul_gelu", a, b)
        return out

    def _matmul_mul(self, a, b, scale, out, tb):                   # (a op(b)) * scale, each block as it is made
        if not all(x.flags.c_contiguous for x in (a, b, scale, out)):
            return super()._matmul_mul(a, b, scale, out, tb)
        check_float32(a, b, scale, out, backend=self.name)
        M, N, K = gemm_dims(a, b, False, tb)
        _outputs("matmul_mul", (out,), (a, b, scale))
        _check(self.lib.mgk_gemm_mul(self.bf16, 0, tb, M, N, K, a, K, b, b.shape[1], scale, N, out, N), "matmul_mul",
               a, b)
        return out

    def _matmul_add(self, a, b, bias, res, out, drop=None):        # res + drop(a b + bias), each block as it is made
        if not all(x.flags.c_contiguous for x in (a, b, res, out) + (() if bias is None else (bias,))):
            return super()._matmul_add(a, b, bias, res, out, drop)
        check_float32(a, b, bias, res, out, backend=self.name)
        (M, K), N = a.shape, b.shape[1]
        _outputs("matmul_add", (out,), (a, b, res) + (() if bias is None else (bias,)))
        p, seed = drop or (0.0, 0)
        rc = self.lib.mgk_gemm_add(self.bf16, M, N, K, a, K, b, N, bias, res, N, out, N, drop is not None, seed,
                                   dropout_keep_from(p), 1.0 / (1.0 - p))
        _check(rc, "matmul_add", a, b)
        return out

    own_causal = True                                              # mgk_gemm_causal zeroes the future itself

    def _bmm(self, a, b, ta, tb, out, acc, bf16, causal=None, start=0):   # a (..., M, K), b (..., K, N) -> (..., M, N)
        check_float32(a, b, out, backend="native")
        M, N, K = gemm_dims(a, b, ta, tb)
        c = self._contiguous("bmm")                                 # only for views _matrices cannot walk
        A, B = _matrices(a) or _matrices(c.inp(a)), _matrices(b) or _matrices(c.inp(b))
        C = _matrices(out) or _matrices(c.inout(out) if acc else c.out(out))
        L1, L2 = _lead(a.shape[:-2])
        args = (L1, L2, ta, tb, M, N, K, *A, *B, 1.0 if acc else 0.0, *C)
        if causal:
            rc = self.lib.mgk_gemm_causal(_CAUSAL[causal], start, bf16, *args)
        else:
            rc = (self.lib.mgk_bgemm_batched if bf16 else self.lib.mgk_sgemm_batched)(*args)
        _check(rc, "batched gemm", a, b)
        c.back()
        return out

    # ---- attention fused (mgk_attention_fwd/bwd: each thread runs whole heads, whose probabilities stay in its
    #      caches; the same bits as Ops' composition of the products and softmax here, dropout's included: its
    #      mask drawn a head at a time, forward and backward, never stored). What the fused kernels do not take
    #      runs the composition, which also raises the errors: views _matrices cannot walk, empty sizes, fewer
    #      heads than split evenly over the threads (_fused), and bad arguments
    def attention(self, q, k, v, att, y, scale, start=0, drop=None):
        views = [_matrices(x) for x in (q, k, v, att, y)] if _fused(self, q, k, start) else None
        if views is None or None in views:
            return super().attention(q, k, v, att, y, scale, start, drop)
        check_float32(q, k, v, att, y, backend=self.name)
        lead, (T, hs), Tk = q.shape[:-2], q.shape[-2:], k.shape[-2]
        check_shapes("native attention", ((*lead, Tk, hs), k, v), ((*lead, T, Tk), att), (q.shape, y))
        _outputs("attention", (att, y), (q, k, v))
        rc = self.lib.mgk_attention_fwd(self.bf16, *_lead(lead), T, Tk, hs, start, scale,
                                        *[f for x in views for f in x], *_drop_args(att, drop))
        _check(rc, "attention", q, k)
        return y

    def attention_backward(self, q, k, v, att, dy, dq, dk, dv, scale, drop=None):
        views = [_matrices(x) for x in (q, k, v, att, dy, dq, dk, dv)] if _fused(self, q, k) else None
        if views is None or None in views:
            return super().attention_backward(q, k, v, att, dy, dq, dk, dv, scale, drop)
        check_float32(q, k, v, att, dy, dq, dk, dv, backend=self.name)
        lead, (T, hs) = q.shape[:-2], q.shape[-2:]
        check_shapes("native attention_backward", (q.shape, k, v, dy, dq, dk, dv), ((*lead, T, T), att))
        _outputs("attention_backward", (dq, dk, dv), (q, k, v, att, dy))
        rc = self.lib.mgk_attention_bwd(self.bf16, *_lead(lead), T, hs, scale,
                                        *[f for x in views for f in x], *_drop_args(att, drop))
        _check(rc, "attention_backward", q, dy)
        return dq, dk, dv

    # ---- the other ops in C (native/mgk_ops.c), float32 only, on C-contiguous arrays: views go through
    #      Ops._contiguous. The C code trusts the shapes and ids; Ops checked them before calling these.
    @staticmethod
    def _done(rc, what, c):
        """Raise for a failed C call, else copy the results of scratch outputs back (Contiguous.back)."""
        if rc != 0:
            raise _error(rc, what)
        c.back()

    def _layernorm(self, x, w, b, out, mean, rstd, eps=1e-5):               # x (N, C) -> out (N, C)
        check_float32(x, w, b, out, mean, rstd, backend=self.name)
        N, C = x.shape
        c = self._contiguous("layernorm")
        rc = self.lib.mgk_layernorm_fwd(N, C, c.inp(x), c.inp(w), c.inp(b), eps, c.out(out), c.out(mean),
                                        c.out(rstd))
        self._done(rc, "layernorm", c)
        return out

    def _layernorm_backward(self, dy, x, w, mean, rstd, dx, dw, db, acc=False):   # dy, x (N, C) -> dx (+=)
        check_float32(dy, x, w, mean, rstd, dx, dw, db, backend=self.name)
        N, C = x.shape
        c = self._contiguous("layernorm_backward")
        rc = self.lib.mgk_layernorm_bwd(N, C, c.inp(dy), c.inp(x), c.inp(w), c.inp(mean), c.inp(rstd),
                                        c.inout(dx) if acc else c.out(dx), c.inout(dw), c.inout(db), int(acc))
        self._done(rc, "layernorm_backward", c)
        return dx

    def _gelu(self, x, b, out, dgelu):                                       # x (..., H): out = gelu(x + b)
        check_float32(x, b, out, dgelu, backend=self.name)
        H = x.shape[-1] if x.ndim else 1
        c = self._contiguous("gelu")                                        # x first: out may be x itself
        rc = self.lib.mgk_gelu_fwd(x.size // max(H, 1), H, c.inp(x), c.inp(b), c.out(out), c.out(dgelu))
        self._done(rc, "gelu", c)
        return out

    def _gelu_backward(self, dout, dgelu, dx, db):                           # dx = dout * dgelu; db (H,) +=
        check_float32(dout, dgelu, dx, db, backend=self.name)
        H = dout.shape[-1] if dout.ndim else 1
        c = self._contiguous("gelu_backward")                               # dout first: dx may be dout itself
        rc = self.lib.mgk_gelu_bwd(dout.size // max(H, 1), H, c.inp(dout), c.inp(dgelu), c.out(dx), c.inout(db))
        self._done(rc, "gelu_backward", c)
        return dx

    def _causal_softmax(self, att, scale, start=0):                          # (..., T, Tk), in place
        check_float32(att, backend=self.name)
        T, Tk = att.shape[-2:]
        c = self._contiguous("causal_softmax")
        rc = self.lib.mgk_causal_softmax_fwd(att.size // max(T * Tk, 1), T, Tk, start, scale, c.inout(att))
        self._done(rc, "causal_softmax (start >= 0)", c)
        return att

    def _causal_softmax_backward(self, att, datt, scale, start=0):           # d(probabilities) -> d(scores)
        check_float32(att, datt, backend=self.name)
        T, Tk = att.shape[-2:]
        c = self._contiguous("causal_softmax_backward")
        rc = self.lib.mgk_causal_softmax_bwd(att.size // max(T * Tk, 1), T, Tk, start, scale, c.inp(att),
                                             c.inout(datt))
        self._done(rc, "causal_softmax_backward (start >= 0)", c)
        return datt

    def _cross_entropy(self, logits, targets, lse):                          # logits (N, V) -> mean loss
        check_float32(logits, lse, backend=self.name)
        N, V = logits.shape
        t, total, c = np.ascontiguousarray(targets, np.int64), ctypes.c_double(), self._contiguous("cross_entropy")
        rc = self.lib.mgk_xent_fwd(N, V, c.inp(logits), t, c.out(lse), ctypes.byref(total))
        self._done(rc, "cross_entropy", c)
        return total.value / max(1, N)

    def _cross_entropy_backward(self, logits, targets, lse, scale, dlogits):  # (softmax - onehot) * scale
        check_float32(logits, lse, dlogits, backend=self.name)
        N, V = logits.shape
        t, c = np.ascontiguousarray(targets, np.int64), self._contiguous("cross_entropy_backward")
        rc = self.lib.mgk_xent_bwd(N, V, c.inp(logits), t, c.inp(lse), scale, c.out(dlogits))
        self._done(rc, "cross_entropy_backward", c)
        return dlogits

    def _embedding_backward(self, dW, idx, dout):                            # dW[idx[n]] += dout[n]
        check_float32(dW, dout, backend=self.name)
        V, C = dW.shape
        ids, c = np.ascontiguousarray(idx, np.int64).reshape(-1), self._contiguous("embedding_backward")
        rc = self.lib.mgk_embedding_bwd(idx.size, V, C, c.inout(dW), ids, c.inp(dout))
        self._done(rc, "embedding_backward (ids in [0, V))", c)

    def _adamw(self, p, g, m, v, lr, b1, b2, eps, wd, bc1, bc2):
        check_float32(p, g, m, v, backend=self.name)
        c = self._contiguous("adamw")
        rc = self.lib.mgk_adamw(p.size, p, c.inp(g), m, v, lr, b1, b2, eps, wd, bc1, bc2)
        self._done(rc, "adamw", c)

    def _dropout(self, x, p, seed, out):                                   # out = x * (0 or 1 / (1 - p))
        check_float32(x, out, backend=self.name)
        c = self._contiguous("dropout")
        rc = self.lib.mgk_dropout(x.size, seed, dropout_keep_from(p), 1.0 / (1.0 - p), c.inp(x), c.out(out))
        self._done(rc, "dropout", c)
        return out

    def set_threads(self, n):
        self.lib.mgk_set_num_threads(max(1, int(n)))

    SPIN_US = 100       # a training step's calls come back to back: waiting 100 us on the CPU before sleeping
                        # saves a wake-up per call and costs at most 100 us after the last one; with the workers
                        # awake, small ops split over the threads too (mgk_ops.c: PAR_SPIN_PS)

    def spin(self, us=None):
        self.lib.mgk_set_spin_us(self.SPIN_US if us is None else max(0, int(us)))

    def peak_gflops(self, iters=20_000_000, bf16=False):
        """fp32 FMA throughput of a register-only loop on the native threads (for reports); bf16: that of the
        bf16 products' instruction (vdpbf16ps on the avx512bf16 path, AMX tiles on amx, else the same FMAs)."""
        return (self.lib.mgk_peak_bf16_gflops if bf16 else self.lib.mgk_peak_gflops)(iters)


def _fused(ops, q, k, start=0):
    """Does the fused attention take these heads: batch dims, no empty size, a valid start, and items that split
    over the threads as the batched products split them (mgk.c's plan(): evenly, or at least 4 a thread)?"""
    items, nt = math.prod(q.shape[:-2]), ops.lib.mgk_get_num_threads()
    return (q.ndim >= 3 and min(q.shape) > 0 and k.shape[-2] >= start + q.shape[-2] and start >= 0
            and items >= nt and (items % nt == 0 or items >= 4 * nt))


def _drop_args(att, drop):
    """The fused attention's dropout arguments (on, seed, keep_from, 1 / (1 - p)) for drop = (p, seed) or None,
    checked as Ops.dropout checks them (its mask is numbered over att's elements)."""
    if drop is None:
        return 0, 0, 0, 1.0
    p, seed = drop
    check_dropout(att, seed, att)                          # the mask is att's: its size, and the seed
    return 1, seed, dropout_keep_from(p), 1.0 / (1.0 - p)


def _outputs(what, outputs, inputs):
    """ValueError for an output the fused kernels cannot write: read-only, or overlapping an input (stricter than
    the composition, whose bmm checks only each product's own operands). The outputs may be heads of one array
    (dq, dk, dv of dqkv): the caller keeps them apart."""
    for x in outputs:
        if not x.flags.writeable:
            raise ValueError(f"native {what}: an output array is read-only (a broadcast view?); pass a writable one")
        if any(np.may_share_memory(x, y) for y in inputs):
            raise ValueError(f"native {what}: an output overlaps an input; pass separate arrays")


def _lead(lead):
    """Leading (batch) dims -> (L1, L2), the two levels mgk_sgemm_batched walks (past two: contiguous only)."""
    return (lead[0], 1) if len(lead) == 1 else tuple(lead) if len(lead) == 2 else (math.prod(lead), 1)


def _matrices(x):
    """(pointer, row stride, outer stride, inner stride), in floats, of a stack of row-major float32 matrices
    whose rows are contiguous: a C-contiguous array, or a view with at most two batch dims such as one head's
    q, (B, nh, T, hs), inside a (B, T, 3, nh, hs) array. The strides are numpy's own for the view, so every
    item lies inside the array's buffer."""
    rows, cols, nb = x.shape[-2], x.shape[-1], x.ndim - 2
    if x.flags.c_contiguous:
        outer = x.shape[1] * rows * cols if nb == 2 else rows * cols
        return x.ctypes.data, cols, outer, rows * cols
    st = [s // 4 if n > 1 else 0 for s, n in zip(x.strides, x.shape)]   # floats; a size-1 axis is never stepped
    if nb > 2 or any(s % 4 for s in x.strides) or min(st) < 0 or (cols > 1 and st[-1] != 1) or (rows > 1 and st[-2] < cols):
        return None
    return x.ctypes.data, st[-2] if rows > 1 else cols, st[0] if nb else 0, st[1] if nb == 2 else 0


ISAS = ("generic", "avx2", "avx512", "avx512bf16", "amx")      # MGK_ISA_* in native/mgk.h, in order


@functools.cache
def backend():
    """The native backend on the fastest ISA path of this CPU, or the one $MINIGPT_ISA names (any the CPU runs:
    tests and reports run every path a machine has; read here only)."""
    lib = _lib()
    best, want = lib.mgk_cpu_isa(), os.environ.get("MINIGPT_ISA", "").strip().lower()
    if want:
        if want not in ISAS:
            raise BackendUnavailable(f"native: MINIGPT_ISA={want!r} is not one of {', '.join(ISAS)}; unset it or "
                                     "pick one of those")
        if ISAS.index(want) > best:
            raise BackendUnavailable(f"native: MINIGPT_ISA={want} but this CPU runs at most {ISAS[best]}; unset it "
                                     f"or choose a lower path")
        lib.mgk_set_isa(ISAS.index(want))
    return NativeOps(lib)


def isa():
    """The ISA path the native library runs now (one of ISAS)."""
    return ISAS[_lib().mgk_isa()]

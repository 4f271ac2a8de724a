"""numba backend: a blocked, parallel float32 GEMM, C[l] = op(A[l]) @ op(B[l]) + beta*C[l].

The only file that imports numba (kernels.py imports this module lazily). One compiled entry point serves
both matmul (L=1) and bmm, with ta/tb/beta as run-time arguments, so the test suite compiles it once
(cache=True keeps it across runs). Work is split into tasks (batch item x row block x column block) run
with prange; each task packs op(B) into a contiguous (KC, nb) panel and op(A) into (KC, 8) slivers, then
an 8-row tile loops over a contiguous run of columns so LLVM emits wide vector code. Not BLAS-fast: the
tile lives in L1, not in registers (numba has no vector type); see reports/kernels.md.
"""
import os
import sys

import numpy as np

from .kernels import BackendUnavailable, check_f32, gemm_dims

if "numba" not in sys.modules:
    # GNU OpenMP spin-waits by default and steals the cores numpy/native and other processes need
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
try:
    import numba
    from numba import njit, prange, types
    from numba.extending import intrinsic
    from llvmlite import ir
except ImportError as e:                   # reported by backend(), so "auto" can skip numba
    numba = None
    _IMPORT_ERROR = e

MR = 8        # rows per tile (the tile's 8 rows are 8 separate contiguous row buffers)
KC = 256      # depth of a packed block: a (KC, nb) op(B) panel stays in L2
NB = 256      # at most this many columns per task: the (8, nb) tile stays in L1

if numba is not None:
    @intrinsic
    def _fma(typingctx, a, b, c):
        """a*b + c rounded once (llvm.fma): not fast-math, the exact IEEE fused multiply-add."""
        def codegen(context, builder, sig, args):
            f32 = ir.FloatType()
            fn = builder.module.declare_intrinsic("llvm.fma", [f32], ir.FunctionType(f32, [f32, f32, f32]))
            return builder.call(fn, args)
        return types.float32(types.float32, types.float32, types.float32), codegen

    # ------------------------------------------------------------------------
    # packing: the transposes of ta/tb happen here, on the way into contiguous buffers

    @njit(cache=True, fastmath=False)
    def _pack_b(B, l, tb, k0, kc, n0, nw, Bp):             # Bp[k, j] = op(B)[k0+k, n0+j]   (kc, nw)
        if tb:
            for j in range(nw):
                for k in range(kc):
                    Bp[k, j] = B[l, n0 + j, k0 + k]
        else:
            for k in range(kc):
                for j in range(nw):
                    Bp[k, j] = B[l, k0 + k, n0 + j]

    @njit(cache=True, fastmath=False)
    def _pack_a(A, l, ta, i0, mr, k0, kc, Ap):              # Ap[k, r] = op(A)[i0+r, k0+k], 0 for r >= mr
        for k in range(kc):
            for r in range(mr, MR):
                Ap[k, r] = 0.0
        if ta:
            for k in range(kc):
                for r in range(mr):
                    Ap[k, r] = A[l, k0 + k, i0 + r]
        else:
            for r in range(mr):
                for k in range(kc):
                    Ap[k, r] = A[l, i0 + r, k0 + k]

    # ------------------------------------------------------------------------
    # the tile: c[r, :nw] = sum_k Ap[k, r] * Bp[k, :nw]. The j loop is innermost and contiguous, so it is
    # vectorised; two k steps per pass halve the loads/stores of c (the bottleneck), and each c element
    # still gets its products added one at a time in k order (fma(a1, b1, fma(a0, b0, c))).

    @njit(cache=True, fastmath=False)
    def _tile(Ap, Bp, kc, nw, c):
        for r in range(MR):
            for j in range(nw):
                c[r, j] = 0.0
        c0, c1, c2, c3, c4, c5, c6, c7 = c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]
        k = 0
        while k + 1 < kc:                                     # scalars first: the j loop then reads only b, d, c
            a0, a1, a2, a3, a4, a5, a6, a7 = Ap[k, 0], Ap[k, 1], Ap[k, 2], Ap[k, 3], Ap[k, 4], Ap[k, 5], Ap[k, 6], Ap[k, 7]
            e0, e1, e2, e3, e4, e5, e6, e7 = (Ap[k + 1, 0], Ap[k + 1, 1], Ap[k + 1, 2], Ap[k + 1, 3],
                                              Ap[k + 1, 4], Ap[k + 1, 5], Ap[k + 1, 6], Ap[k + 1, 7])
            b, d = Bp[k], Bp[k + 1]
            for j in range(nw):
                bj, dj = b[j], d[j]
                c0[j] = _fma(e0, dj, _fma(a0, bj, c0[j]))
                c1[j] = _fma(e1, dj, _fma(a1, bj, c1[j]))
                c2[j] = _fma(e2, dj, _fma(a2, bj, c2[j]))
                c3[j] = _fma(e3, dj, _fma(a3, bj, c3[j]))
                c4[j] = _fma(e4, dj, _fma(a4, bj, c4[j]))
                c5[j] = _fma(e5, dj, _fma(a5, bj, c5[j]))
                c6[j] = _fma(e6, dj, _fma(a6, bj, c6[j]))
                c7[j] = _fma(e7, dj, _fma(a7, bj, c7[j]))
            k += 2
        if k < kc:                                            # odd kc: the last k step
            a0, a1, a2, a3, a4, a5, a6, a7 = Ap[k, 0], Ap[k, 1], Ap[k, 2], Ap[k, 3], Ap[k, 4], Ap[k, 5], Ap[k, 6], Ap[k, 7]
            b = Bp[k]
            for j in range(nw):
                bj = b[j]
                c0[j] = _fma(a0, bj, c0[j]); c1[j] = _fma(a1, bj, c1[j])
                c2[j] = _fma(a2, bj, c2[j]); c3[j] = _fma(a3, bj, c3[j])
                c4[j] = _fma(a4, bj, c4[j]); c5[j] = _fma(a5, bj, c5[j])
                c6[j] = _fma(a6, bj, c6[j]); c7[j] = _fma(a7, bj, c7[j])

    # ------------------------------------------------------------------------
    # task t of the grid L x ceil(M/mb) x ceil(N/nb): C[l, m0:m1, n0:n1], looping k blocks > 8-row slivers

    @njit(cache=True, fastmath=False)
    def _task(A, B, C, t, ta, tb, beta, mb, nb):
        L, M, N = C.shape
        tm, tn = (M + mb - 1) // mb, (N + nb - 1) // nb
        l, im, jn = t // (tm * tn), (t // tn) % tm, t % tn
        m0, n0 = im * mb, jn * nb
        m1, n1 = min(M, m0 + mb), min(N, n0 + nb)
        Ap = np.empty((KC, MR), np.float32)                   # per-task buffers: nothing shared between threads
        Bp = np.empty((KC, nb), np.float32)
        c = np.empty((MR, nb), np.float32)
        K = A.shape[1] if ta else A.shape[2]
        nw = n1 - n0
        for k0 in range(0, max(K, 1), KC):
            kc = min(KC, K - k0)
            bk = beta if k0 == 0 else np.float32(1.0)        # later k blocks add to the first one's sum
            _pack_b(B, l, tb, k0, kc, n0, nw, Bp)
            for i0 in range(m0, m1, MR):
                mr = min(MR, m1 - i0)
                _pack_a(A, l, ta, i0, mr, k0, kc, Ap)
                _tile(Ap, Bp, kc, nw, c)
                for r in range(mr):
                    if bk == 0.0:                             # beta = 0 never reads C (it may hold NaN)
                        for j in range(nw):
                            C[l, i0 + r, n0 + j] = c[r, j]
                    else:
                        for j in range(nw):
                            C[l, i0 + r, n0 + j] = c[r, j] + bk * C[l, i0 + r, n0 + j]

    @njit(cache=True, fastmath=False, parallel=True)
    def _gemm(A, B, C, ta, tb, beta, mb, nb):
        """All tasks spread over the threads with prange (never np.dot inside a prange)."""
        L, M, N = C.shape
        ntask = L * ((M + mb - 1) // mb) * ((N + nb - 1) // nb)
        for t in prange(ntask):
            _task(A, B, C, t, ta, tb, beta, mb, nb)


# ----------------------------------------------------------------------------
# the backend object kernels.py talks to

def _blocks(L, M, N, nt):
    """Task sizes (mb rows, nb columns): whole items when the batch feeds every thread, else row blocks."""
    nb = -(-N // -(-N // NB))                                 # N split evenly into <= NB-wide blocks
    if L >= nt and (L % nt == 0 or L >= 4 * nt):
        return M, nb
    mb = -(-M // nt)
    return min(128, max(MR, -(-mb // MR) * MR)), nb


class NumbaBackend:
    name = "numba"

    def matmul(self, a, b, ta, tb, out, acc):                      # a (M,K)|(K,M), b (K,N)|(N,K) -> (M,N)
        return self.bmm(a, b, ta, tb, out, acc)

    def bmm(self, a, b, ta, tb, out, acc):                         # a (...,M,K), b (...,K,N) -> (...,M,N)
        check_f32(a, b, out, backend="numba")
        M, N, K = gemm_dims(a, b, ta, tb)
        lead = a.shape[:-2]
        if out is None:
            out = np.empty((*lead, M, N), np.float32)
        elif np.may_share_memory(out, a) or np.may_share_memory(out, b):
            raise ValueError("numba: out= must not overlap the inputs")
        L = int(np.prod(lead))
        if L and M and N:
            mb, nb = _blocks(L, M, N, numba.get_num_threads())
            _gemm(a.reshape(L, *a.shape[-2:]), b.reshape(L, *b.shape[-2:]), out.reshape(L, M, N),
                  ta, tb, np.float32(1.0 if acc else 0.0), mb, nb)
        return out

    def set_threads(self, n):
        numba.set_num_threads(max(1, min(int(n), numba.config.NUMBA_NUM_THREADS)))


_backend = None


def backend():
    """The numba backend, after a compile-and-compare smoke test (BackendUnavailable if anything fails)."""
    global _backend
    if _backend is None:
        if numba is None:
            raise BackendUnavailable(f"numba: cannot import numba ({_IMPORT_ERROR}). Fix: pip install numba")
        be = NumbaBackend()
        try:
            x = np.arange(15, dtype=np.float32).reshape(3, 5)
            got = be.matmul(x, x, False, True, None, False)
        except Exception as e:             # noqa: BLE001  (a numba/LLVM failure on this machine)
            raise BackendUnavailable(f"numba: the kernel failed to compile or run here ({e!r})") from e
        if not np.allclose(got, x @ x.T):
            raise BackendUnavailable("numba: the kernel gave wrong results on this machine")
        _backend = be
    return _backend

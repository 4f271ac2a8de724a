"""The numba backend's products: a blocked, parallel float32 GEMM, C[l] = op(A[l]) @ op(B[l]) + beta*C[l].

The first file of the numba backend to import numba (it sets numba's environment first). One compiled
entry point serves both matmul (L=1) and bmm, with ta/tb/beta as run-time arguments, so the test suite compiles it once
(cache=True keeps it across runs). Work is split into tasks (batch item x row block x column block) run
with prange; each task packs op(B) into a contiguous (KC, nb) panel and op(A) into (KC, 4) slivers, then
a 4-row tile on the stack loops over a contiguous run of columns so LLVM emits wide vector code. Not
BLAS-fast: the tile lives in L1, not in registers (numba has no vector type); see reports/kernels.md.
"""
import os
import sys

import numpy as np



def _configure_numba():
    """Environment numba reads once, at import: only applied if numba is not loaded yet and the user set nothing."""
    if "numba" in sys.modules:
        return
    # GNU OpenMP (numba's default threading layer here) spin-waits by default and steals the cores that
    # numpy, the native pool and other processes need; PASSIVE makes idle workers sleep.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # LLVM tunes AVX-512 CPUs to prefer 256-bit vectors; the tile below is store/FMA-bound and runs faster
    # with 512-bit ones. Same host features numba would use, minus that tuning flag.
    if "NUMBA_CPU_FEATURES" not in os.environ and "NUMBA_CPU_NAME" not in os.environ:
        try:
            import llvmlite.binding as llb
            features = llb.get_host_cpu_features().flatten()
        except Exception:                  # noqa: BLE001  (no llvmlite: the import below reports it)
            return
        if "+avx512f" in features.split(","):
            os.environ["NUMBA_CPU_FEATURES"] = features + ",-prefer-256-bit"


_configure_numba()
try:
    import numba
    from numba import njit, prange, types
    from numba.extending import intrinsic
    from llvmlite import ir
except ImportError:                        # numba_ops.backend() reports it, so "auto" can skip numba
    numba = None

MR = 4        # rows per tile (4 rows of C, each a contiguous run of columns)
KC = 256      # depth of a packed block: a (KC, nb) op(B) panel stays in L2
NB = 256      # at most this many columns per task: the (4, nb) stack tile (4 KB) stays in L1

if numba is not None:
    @intrinsic
    def _fma(typingctx, a, b, c):
        """a * b + c rounded once (llvm.fma, exact IEEE; not fast-math), in c's float type."""
        def codegen(context, builder, sig, args):
            t = context.get_value_type(sig.return_type)
            fn = builder.module.declare_intrinsic("llvm.fma", [t], ir.FunctionType(t, [t, t, t]))
            return builder.call(fn, args)
        return c(c, c, c), codegen

    @intrinsic
    def _stack_tile(typingctx):
        """Pointer to MR*NB float32 on the stack. LLVM knows an alloca aliases no argument, so the tile loop
        needs no run-time overlap checks (with heap arrays it checks every row pair before each j loop)."""
        def codegen(context, builder, sig, args):
            with builder.goto_entry_block():
                p = builder.alloca(ir.ArrayType(ir.FloatType(), MR * NB))
                p.align = 64
            return builder.bitcast(p, ir.FloatType().as_pointer())
        return types.CPointer(types.float32)(), codegen

    # ------------------------------------------------------------------------
    # packing: the transposes of ta/tb happen here, on the way into contiguous buffers. Loops index views
    # with 0-based range() variables only: then LLVM can drop numba's negative-index wraparound and emit
    # plain vector loads (an index like n0 + j turns a row copy into gathers).

    @njit(cache=True, fastmath=False)
    def _pack_b(Bv, tb, Bp):                    # Bv = op(B) block as stored, (kc, nw) or (nw, kc) if tb -> Bp (kc, nw)
        if tb:
            nw, kc = Bv.shape
            for k in range(kc):
                dst = Bp[k]
                for j in range(nw):
                    dst[j] = Bv[j, k]
        else:
            kc, nw = Bv.shape
            for k in range(kc):
                src, dst = Bv[k], Bp[k]
                for j in range(nw):
                    dst[j] = src[j]

    @njit(cache=True, fastmath=False)
    def _pack_a(Av, ta, Ap):                    # Av = op(A) sliver as stored, (mr, kc) or (kc, mr) if ta -> Ap (kc, 4)
        kc, mr = Av.shape if ta else Av.shape[::-1]
        for k in range(kc):
            dst = Ap[k]
            for r in range(MR):
                dst[r] = 0.0 if r >= mr else (Av[k, r] if ta else Av[r, k])

    # ------------------------------------------------------------------------
    # the tile: C[i0:i0+mr, n0:n0+nw] = Ap^T @ Bk + beta*C, summed in a (4, nw) tile on the stack and then
    # stored. The j loop is innermost and contiguous, so it is vectorised; the tile is in L1, not in
    # registers, so each pass does 4 k steps to load/store it a quarter as often. Each element still gets
    # its products added one at a time in k order: fma(a3, b3, fma(a2, b2, fma(a1, b1, fma(a0, b0, c)))).

    @njit(cache=True, fastmath=False)
    def _tile(Ap, Bk, kc, Cl, i0, mr, n0, nw, beta):      # Cl = C[l] (M, N), Ap (kc, 4), Bk (kc, >= nw)
        t = numba.carray(_stack_tile(), (MR, NB))
        c0, c1, c2, c3 = t[0], t[1], t[2], t[3]
        for j in range(nw):
            c0[j] = 0.0; c1[j] = 0.0; c2[j] = 0.0; c3[j] = 0.0
        k = 0
        while k + 3 < kc:                                     # scalars first: the j loop then reads only B and t
            a0, a1, a2, a3 = Ap[k, 0], Ap[k, 1], Ap[k, 2], Ap[k, 3]
            e0, e1, e2, e3 = Ap[k + 1, 0], Ap[k + 1, 1], Ap[k + 1, 2], Ap[k + 1, 3]
            f0, f1, f2, f3 = Ap[k + 2, 0], Ap[k + 2, 1], Ap[k + 2, 2], Ap[k + 2, 3]
            g0, g1, g2, g3 = Ap[k + 3, 0], Ap[k + 3, 1], Ap[k + 3, 2], Ap[k + 3, 3]
            b0, b1, b2, b3 = Bk[k], Bk[k + 1], Bk[k + 2], Bk[k + 3]
            for j in range(nw):
                x0, x1, x2, x3 = b0[j], b1[j], b2[j], b3[j]
                c0[j] = _fma(g0, x3, _fma(f0, x2, _fma(e0, x1, _fma(a0, x0, c0[j]))))
                c1[j] = _fma(g1, x3, _fma(f1, x2, _fma(e1, x1, _fma(a1, x0, c1[j]))))
                c2[j] = _fma(g2, x3, _fma(f2, x2, _fma(e2, x1, _fma(a2, x0, c2[j]))))
                c3[j] = _fma(g3, x3, _fma(f3, x2, _fma(e3, x1, _fma(a3, x0, c3[j]))))
            k += 4
        while k < kc:                                         # kc % 4 tail, one k step at a time
            a0, a1, a2, a3 = Ap[k, 0], Ap[k, 1], Ap[k, 2], Ap[k, 3]
            b0 = Bk[k]
            for j in range(nw):
                x0 = b0[j]
                c0[j] = _fma(a0, x0, c0[j]); c1[j] = _fma(a1, x0, c1[j])
                c2[j] = _fma(a2, x0, c2[j]); c3[j] = _fma(a3, x0, c3[j])
            k += 1
        for r in range(mr):
            dst, src = Cl[i0 + r, n0:n0 + nw], t[r]
            if beta == 0.0:                                   # beta = 0 never reads C (it may hold NaN)
                for j in range(nw):
                    dst[j] = src[j]
            else:
                for j in range(nw):
                    dst[j] = src[j] + beta * dst[j]

    # ------------------------------------------------------------------------
    # tasks first, first+step, ... of the grid L x ceil(M/mb) x ceil(N/nb); task = C[l, m0:m1, n0:n1]

    @njit(cache=True, fastmath=False)
    def _tasks(A, B, C, first, step, ta, tb, beta, mb, nb, Ap, Bflat):
        L, M, N = C.shape                                     # Ap (KC, MR), Bflat (KC * NB,): this chunk's own
        Bp = Bflat[:KC * nb].reshape((KC, nb))                # rows nb apart: the panel is compact in cache
        K = A.shape[1] if ta else A.shape[2]
        tm, tn = (M + mb - 1) // mb, (N + nb - 1) // nb
        for t in range(first, L * tm * tn, step):
            l, m0, n0 = t // (tm * tn), (t // tn) % tm * mb, t % tn * nb
            m1, n1 = min(M, m0 + mb), min(N, n0 + nb)
            for k0 in range(0, max(K, 1), KC):
                kc = min(KC, K - k0)
                bk = beta if k0 == 0 else np.float32(1.0)    # later k blocks add to the first one's sum
                if tb or n1 - n0 < N:
                    _pack_b(B[l, n0:n1, k0:k0 + kc] if tb else B[l, k0:k0 + kc, n0:n1], tb, Bp)
                    Bk = Bp
                else:                                         # full-width rows of B are contiguous already
                    Bk = B[l, k0:k0 + kc]
                for i0 in range(m0, m1, MR):
                    mr = min(MR, m1 - i0)
                    _pack_a(A[l, k0:k0 + kc, i0:i0 + mr] if ta else A[l, i0:i0 + mr, k0:k0 + kc], ta, Ap)
                    _tile(Ap, Bk, kc, C[l], i0, mr, n0, n1 - n0, bk)

    @njit(cache=True, fastmath=False, parallel=True)
    def _gemm(A, B, C, ta, tb, beta, mb, nb, nchunk, Ap, Bp):
        """nchunk chunks of tasks (one per thread) spread with prange (never np.dot inside a prange); chunk i
        packs into Ap[i], Bp[i]."""
        for i in prange(nchunk):
            _tasks(A, B, C, i, nchunk, ta, tb, beta, mb, nb, Ap[i], Bp[i])


# ----------------------------------------------------------------------------
# entry point (numba_ops.py): C-contiguous float32 stacks a (L, M, K)|(L, K, M), b, out (L, M, N)

def _blocks(L, M, N, nt):
    """Task sizes (mb rows, nb columns): whole items when the batch feeds every thread, else row blocks."""
    nb = -(-N // -(-N // NB))                                 # N split evenly into <= NB-wide blocks
    if L >= nt and (L % nt == 0 or L >= 4 * nt):
        return M, nb
    mb = -(-M // nt)                                          # one row block per thread: op(B) is packed nt times
    return max(MR, -(-mb // MR) * MR), nb


_panels = {}             # thread count -> packing panels (Ap, Bp), made once: a product allocates nothing


def gemm(a, b, out, ta, tb, acc, nt):
    """out[l] = op(a[l]) @ op(b[l]) (+ out[l] if acc) on nt numba threads."""
    L, M, N = out.shape
    if L and M and N:
        if numba.get_num_threads() != nt:
            numba.set_num_threads(nt)
        mb, nb = _blocks(L, M, N, nt)
        ntask = L * -(-M // mb) * -(-N // nb)
        if nt not in _panels:
            _panels[nt] = np.empty((nt, KC, MR), np.float32), np.empty((nt, KC * NB), np.float32)
        _gemm(a, b, out, ta, tb, np.float32(1.0 if acc else 0.0), mb, nb, min(nt, ntask), *_panels[nt])
    return out

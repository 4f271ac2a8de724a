"""Central finite differences in float64 (CS231n method) and the relative error the gradient tests use."""
import numpy as np


def num_grad(f, x, h=1e-5):
    """d f() / d x by central differences. f takes no arguments and reads x; x is perturbed in place."""
    assert x.flags.c_contiguous and x.dtype == np.float64, "gradient checks run on contiguous float64 arrays"
    g = np.zeros_like(x)
    xf, gf = x.reshape(-1), g.reshape(-1)                 # views
    for i in range(xf.size):
        old = xf[i]
        xf[i] = old + h
        fp = f()
        xf[i] = old - h
        fm = f()
        xf[i] = old
        gf[i] = (fp - fm) / (2 * h)
    return g


def rel_err(a, b):
    """Largest entry-wise difference relative to the scale of the two gradients (0 when both are 0)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    scale = np.abs(a).max(initial=0.0) + np.abs(b).max(initial=0.0)
    return float(np.abs(a - b).max(initial=0.0) / max(scale, 1e-30))


def check_module(m, x, dy, forward=None, reset=None, tol=1e-6):
    """Check dx and every parameter gradient of module m against finite differences of sum(forward(x) * dy).
    m is bound to x's (B, T) first. reset(), when given, is called before every forward (to replay the same
    dropout mask). Outputs live in the module's arrays until its next forward: each is used or copied first."""
    fwd = forward or m.forward
    if x.ndim == 3:
        m.bind(*x.shape[:2], x.dtype)

    def probe():
        if reset:
            reset()
        return float(np.sum(fwd(x) * dy))

    m.zero_grad()
    if reset:
        reset()
    fwd(x)
    dx = m.backward(dy.copy())                            # a copy: Block.backward updates its dy in place
    if dx is not None:
        dx = dx.copy()
        err = rel_err(dx, num_grad(probe, x))
        assert err < tol, f"{type(m).__name__} input gradient: rel err {err:.2e}"
    grads = {k: v.copy() for k, v in m.grads().items()}
    for name, p in m.params().items():
        err = rel_err(grads[name], num_grad(probe, p))
        assert err < tol, f"{type(m).__name__} parameter {name!r}: rel err {err:.2e}"
    return sorted(grads)

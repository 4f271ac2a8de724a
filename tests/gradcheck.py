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


# The gradient tests' bound on rel_err: a correct backward in float64 stays orders of magnitude below it on every
# machine the tests have met (the whole-model check is the largest), a wrong one gives 1e-3 and more.
GRAD_TOL = 1e-7


def rel_err(a, b):
    """Largest entry-wise difference relative to the scale of the two gradients (0 when both are 0)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    scale = np.abs(a).max(initial=0.0) + np.abs(b).max(initial=0.0)
    return float(np.abs(a - b).max(initial=0.0) / max(scale, 1e-30))


def check_layer(forward, backward, arrays, dy, tol=GRAD_TOL):
    """Check the analytic gradients of a layer against finite differences of sum(forward() * dy).
    forward() computes the output from `arrays` ({name: contiguous float64 array}, read in place, so perturbing
    one changes the next forward); backward(dy) runs after a forward and returns {name: gradient}. Outputs
    may live in the caller's buffers (the next forward overwrites them): the gradients are copied first."""
    forward()
    got = {k: np.array(v, copy=True) for k, v in backward(dy.copy()).items()}   # a copy: backwards may use dy
    probe = lambda: float(np.sum(forward() * dy))                               # as scratch
    for name, a in arrays.items():
        err = rel_err(got[name], num_grad(probe, a))
        assert err < tol, f"gradient of {name!r}: rel err {err:.2e}"
    return sorted(got)

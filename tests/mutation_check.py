"""Break one line per layer family on purpose and confirm the gradient test that guards it fails.
Run from the repository root: python tests/mutation_check.py (every row must say CAUGHT)."""
import os
import pathlib
import subprocess
import sys

M = [
 ("minigpt/layers.py", 'self.g["bias"] += dy2.sum(axis=0)', 'self.g["bias"] += 0.99 * dy2.sum(axis=0)', "tests/test_layers.py::test_linear_grad"),
 ("minigpt/_fused_numba.py", 'g[r, j] += dout[n, j]', 'g[r, j] = dout[n, j]', "tests/test_layers.py::test_embedding_grad"),
 ("minigpt/layers.py", 'self.g["weight"][start:start + T] += dout.sum(axis=0)', 'self.g["weight"][start:start + T] += dout[0]', "tests/test_layers.py::test_positional_grad"),
 ("minigpt/_fused_numba.py", 'dx[i, j] = ri * (a[j] - ma - (x[i, j] - mi) * ri * mc)', 'dx[i, j] = ri * (a[j] - (x[i, j] - mi) * ri * mc)', "tests/test_layers.py::test_layernorm_grad"),
 ("minigpt/_fused_numba.py", 'GELU_C * (1.0 + 3 * GELU_A * x * x)', 'GELU_C * (1.0 + GELU_A * x * x)', "tests/test_layers.py::test_activation_grad"),
 ("minigpt/layers.py", 'return dy if isinstance(mask, int) else dy * mask', 'return dy', "tests/test_layers.py::test_dropout_grad_uses_forward_mask"),
 ("minigpt/_fused_numba.py", 'r[j] = scale * a[j] * (r[j] - d)', 'r[j] = a[j] * (r[j] - d)', "tests/test_layers.py::test_attention_grad"),
 ("minigpt/layers.py", 'K.bmm(attd, dyh, ta=True, out=out[2])', 'K.bmm(att, dyh, ta=True, out=out[2])', "tests/test_layers.py::test_attention_grad"),
 ("minigpt/layers.py", 'dx += dout ', 'dx += 0 * dout ', "tests/test_layers.py::test_block_grad"),
 ("minigpt/layers.py", 'c["lse"], scale / N,', 'c["lse"], 1.0 / N,', "tests/test_layers.py::test_cross_entropy_grad"),
 ("minigpt/model.py", 'K.matmul(dlogits, x2, ta=True, out=self.wte.g["weight"], acc=True)', 'pass', "tests/test_model.py::test_gpt_grad_every_parameter"),
 ("minigpt/model.py", 'self.wte.backward(self.wpe.backward(self.drop.backward(dx)))', 'self.wpe.backward(self.drop.backward(dx))', "tests/test_model.py::test_gpt_grad_every_parameter"),
 ("minigpt/_fused_numba.py", 'db[j] += dx[i, j]', 'db[j] += 0.5 * dx[i, j]', "tests/test_layers.py::test_mlp_grad"),
 # the fused path's other kernels and the NumPy references are guarded by the kernel-vs-reference tests
 ("minigpt/_fused_numba.py", 'dv[j, d] = _fma(pj, g[i, d], dv[j, d])', 'dv[j, d] = _fma(dsj, g[i, d], dv[j, d])', "tests/test_fused.py::test_flash_attention_matches_reference"),
 ("minigpt/_fused_numba.py", 'p = p * r * r + r + F32(1.0)', 'p = p * r * r + r', "tests/test_fused.py::test_exp32_matches_numpy_over_the_whole_range"),
 ("minigpt/_fused_numba.py", 'm[i] = b1 * m[i] + c1 * gi', 'm[i] = b1 * m[i] + gi', "tests/test_fused.py::test_adamw_matches_reference"),
 ("minigpt/fused.py", 'return xc * rstd[:, None] * w + b, mean, rstd', 'return xc * rstd[:, None] * w, mean, rstd', "tests/test_fused.py::test_layernorm_matches_reference"),
 ("minigpt/fused.py", 'ds = p * (dp - (dy4 * y4).sum(-1, keepdims=True)) * scale', 'ds = p * dp * scale', "tests/test_fused.py::test_flash_attention_matches_reference"),
 ("minigpt/_fused_numba.py", 'q, m = qkv[b, t, h * hs:(h + 1) * hs], n + t + 1', 'q, m = qkv[b, t, h * hs:(h + 1) * hs], n + t', "tests/test_fused.py::test_cached_attention_matches_reference"),
]
for path, old, new, test in M:
    p = pathlib.Path(path); src = p.read_text()
    assert src.count(old) == 1, (path, old)
    p.write_text(src.replace(old, new))
    try:
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", test], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": "."})
        line = [l for l in r.stdout.splitlines() if l.startswith("E ") and ("rel err" in l or "Error" in l)][:1]
        print("CAUGHT" if r.returncode else "MISSED", test, "|", new[:60], "|", line[0][:120] if line else "")
    finally:
        p.write_text(src)

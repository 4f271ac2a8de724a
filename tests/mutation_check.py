"""Break one line per layer family on purpose and confirm the gradient test that guards it fails.
Run from the repository root: python tests/mutation_check.py (every row must say CAUGHT)."""
import os
import pathlib
import subprocess
import sys

M = [
 ("minigpt/layers.py", 'self.g["bias"] += dy2.sum(axis=0)', 'self.g["bias"] += 0.99 * dy2.sum(axis=0)', "tests/test_layers.py::test_linear_grad"),
 ("minigpt/layers.py", 'np.add.at(self.g["weight"], idx.reshape(-1), dout.reshape(-1, C))', 'self.g["weight"][idx.reshape(-1)] += dout.reshape(-1, C)', "tests/test_layers.py::test_embedding_grad"),
 ("minigpt/layers.py", 'self.g["weight"][start:start + T] += dout.sum(axis=0)', 'self.g["weight"][start:start + T] += dout[0]', "tests/test_layers.py::test_positional_grad"),
 ("minigpt/layers.py", 'return rstd * (dxhat - dxhat.mean(-1, keepdims=True) - ', 'return rstd * (dxhat - ', "tests/test_layers.py::test_layernorm_grad"),
 ("minigpt/layers.py", 'dtanh = _GELU_C * (1.0 + 3 * 0.044715 * x * x)', 'dtanh = _GELU_C * (1.0 + 0.044715 * x * x)', "tests/test_layers.py::test_activation_grad"),
 ("minigpt/layers.py", 'return dy if isinstance(mask, int) else dy * mask', 'return dy', "tests/test_layers.py::test_dropout_grad_uses_forward_mask"),
 ("minigpt/layers.py", 'ds *= 1.0 / math.sqrt(hs)                                      #', 'ds *= 1.0 #', "tests/test_layers.py::test_attention_grad"),
 ("minigpt/layers.py", 'dv = K.bmm(attd, dy, ta=True)', 'dv = K.bmm(att, dy, ta=True)', "tests/test_layers.py::test_attention_grad"),
 ("minigpt/layers.py", 'dx = dout + self.ln_2.backward(self.mlp.backward(dout))', 'dx = self.ln_2.backward(self.mlp.backward(dout))', "tests/test_layers.py::test_block_grad"),
 ("minigpt/layers.py", 'probs *= scale / N', 'probs *= 1.0 / N', "tests/test_layers.py::test_cross_entropy_grad"),
 ("minigpt/model.py", 'K.matmul(dlogits, x2, ta=True, out=self.wte.g["weight"], acc=True)', 'pass', "tests/test_model.py::test_gpt_grad_every_parameter"),
 ("minigpt/model.py", 'self.wte.backward(self.wpe.backward(self.drop.backward(dx)))', 'self.wpe.backward(self.drop.backward(dx))', "tests/test_model.py::test_gpt_grad_every_parameter"),
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

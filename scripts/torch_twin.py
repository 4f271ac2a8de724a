"""The same GPT in PyTorch, for reference only: gradient cross-checks (tests/test_torch_reference.py), the
PyTorch side of scripts/bench_train.py and scripts/bench_gpt2.py, and nanoGPT's training procedure
(train_like_nanogpt, for scripts/nanogpt_reference.py and scripts/speedrun.py). PyTorch is not a dependency, so
this file lives in scripts/, outside the package (`import minigpt` never imports torch); scripts import it as a
sibling module: `from torch_twin import TorchGPT`.

Weights are copied from a minigpt GPT (`TorchGPT.from_minigpt`); our Linear weights are (in, out), torch's
nn.Linear stores (out, in), hence the transposes. GELU is the tanh form, as ours; gelu="erf" gives nanoGPT's
exact nn.GELU() (train_like_nanogpt's default, so nanoGPT's runs in both its scripts use it).
"""
import math
import sys
import time

if __name__ == "__main__":                 # a module the scripts import, not a command: say so (torch may be absent)
    sys.exit(print(__doc__.strip()))

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, C, nh, bias, dropout=0.0):
        super().__init__()
        self.nh, self.dropout = nh, dropout
        self.c_attn = nn.Linear(C, 3 * C, bias=bias)
        self.c_proj = nn.Linear(C, C, bias=bias)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x):                                      # (B, T, C)
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (a.view(B, T, self.nh, C // self.nh).transpose(1, 2) for a in (q, k, v))   # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))


class Block(nn.Module):
    def __init__(self, C, nh, bias, gelu="tanh", dropout=0.0):
        super().__init__()
        self.gelu = "none" if gelu == "erf" else gelu                 # torch's name for the exact form
        self.ln_1, self.ln_2 = nn.LayerNorm(C, bias=bias), nn.LayerNorm(C, bias=bias)
        self.attn = Attention(C, nh, bias, dropout)
        self.c_fc, self.c_proj = nn.Linear(C, 4 * C, bias=bias), nn.Linear(4 * C, C, bias=bias)
        self.mlp_dropout = nn.Dropout(dropout)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp_dropout(self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate=self.gelu)))


class TorchGPT(nn.Module):
    def __init__(self, cfg, gelu="tanh"):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        # dropout where nanoGPT (and minigpt) put it: the embeddings, the probabilities, each block's two outputs
        self.drop = nn.Dropout(cfg.dropout)
        self.h = nn.ModuleList(Block(cfg.n_embd, cfg.n_head, cfg.bias, gelu, cfg.dropout) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.lm_head = None if cfg.tie_weights else nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        for n, p in self.named_parameters():                   # GPT-2 init (overwritten by from_minigpt)
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * cfg.n_layer) if n.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif n.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets=None):
        T = idx.shape[1]
        x = self.drop(self.wte(idx.long()) + self.wpe(torch.arange(T, device=idx.device)))
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        logits = x @ self.wte.weight.T if self.lm_head is None else self.lm_head(x)
        loss = None if targets is None else F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1).long())
        return logits, loss

    # ------------------------------------------------------------------------
    # name mapping: minigpt name -> (torch parameter, transpose?)

    def minigpt_names(self):
        out = {"wte.weight": (self.wte.weight, False), "wpe.weight": (self.wpe.weight, False)}
        for i, b in enumerate(self.h):
            mods = {"ln_1": b.ln_1, "attn.c_attn": b.attn.c_attn, "attn.c_proj": b.attn.c_proj,
                    "ln_2": b.ln_2, "mlp.c_fc": b.c_fc, "mlp.c_proj": b.c_proj}
            for name, m in mods.items():
                out[f"h.{i}.{name}.weight"] = (m.weight, isinstance(m, nn.Linear))
                if m.bias is not None:
                    out[f"h.{i}.{name}.bias"] = (m.bias, False)
        out["ln_f.weight"] = (self.ln_f.weight, False)
        if self.ln_f.bias is not None:
            out["ln_f.bias"] = (self.ln_f.bias, False)
        if self.lm_head is not None:
            out["lm_head.weight"] = (self.lm_head.weight, True)
        return out

    @classmethod
    def from_minigpt(cls, model, dtype=torch.float32):
        tm = cls(model.config).to(dtype)
        params = model.params()
        names = tm.minigpt_names()
        assert set(names) == set(params), set(names) ^ set(params)
        with torch.no_grad():
            for k, (p, transpose) in names.items():
                a = torch.from_numpy(params[k].copy()).to(dtype)
                p.copy_(a.T if transpose else a)
        return tm

    def grads_as_minigpt(self):
        """{minigpt name: numpy gradient in minigpt's layout}."""
        return {k: (p.grad.T if t else p.grad).detach().numpy() for k, (p, t) in self.minigpt_names().items()}


# ----------------------------------------------------------------------------
# nanoGPT's training procedure, for the distribution behind the quality bar

def train_like_nanogpt(seed, data, vocab_size, cfg, gelu="erf"):
    """Train a fresh TorchGPT on data (a minigpt Dataset) per cfg (a TrainConfig) the way nanoGPT's train.py
    does: torch.manual_seed(seed), torch's init, batches and eval batches from torch.randint on the one global
    generator, torch.optim.AdamW with the two decay groups, clip_grad_norm_, minigpt's get_lr (a pure function).
    Returns ([(iter, {"train": loss, "val": loss}, seconds since the loop began)] at every eval, the model).
    For scripts/nanogpt_reference.py and scripts/speedrun.py."""
    from minigpt.model import GPTConfig
    from minigpt.optim import get_lr
    torch.manual_seed(seed)
    mcfg = GPTConfig(vocab_size=vocab_size, **cfg.model_dict())
    model = TorchGPT(mcfg, gelu=gelu)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))
    splits = {k: torch.from_numpy(v.astype(np.int64)) for k, v in data.splits.items()}
    T = cfg.block_size

    def get_batch(split):                                       # nanoGPT's sampler, same global generator
        d = splits[split]
        ix = torch.randint(len(d) - T, (cfg.batch_size,))
        x = torch.stack([d[i:i + T] for i in ix])
        y = torch.stack([d[i + 1:i + 1 + T] for i in ix])
        return x, y

    @torch.no_grad()
    def estimate():
        model.eval()
        out = {s: float(np.mean([model(*get_batch(s))[1].item() for _ in range(cfg.eval_iters)]))
               for s in ("train", "val")}
        model.train()
        return out

    curve, t0 = [], time.perf_counter()
    for it in range(cfg.max_iters + 1):
        lr = get_lr(it, cfg.lr, cfg.min_lr, cfg.warmup_iters, cfg.lr_decay_iters, cfg.cooldown)
        for g in opt.param_groups:
            g["lr"] = lr
        if it % cfg.eval_interval == 0 or it == cfg.max_iters:
            elapsed = time.perf_counter() - t0
            curve.append((it, estimate(), elapsed))
            print(f"  seed {seed} iter {it}: train {curve[-1][1]['train']:.4f} val {curve[-1][1]['val']:.4f}",
                  flush=True)
        if it == cfg.max_iters:
            break
        x, y = get_batch("train")
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
    return curve, model

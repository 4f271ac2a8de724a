"""Checkpoints: one .npz holding params, the optimizer's state under its name ("adamw.m/<param>", "muon.momentum/
<param>": Optimizer.state()), step, every RNG state, configs and the tokenizer. Checkpoints of minigpt before
the optimizers named their state ("adam_m/", "adam_v/") still load.

save() writes a temporary file in the same directory, fsyncs it, and renames it into place (then fsyncs
the directory), so a crash at any moment leaves the previous checkpoint intact and loadable.
"""
import json
import os
import tempfile
import zipfile

import numpy as np

from .config import UserError

FORMAT = "minigpt-checkpoint-1"


def save(path, model, opt, meta):
    """meta: a JSON-able dict (iter, configs, rng states, tokenizer, ...)."""
    arrays = {f"param/{k}": v for k, v in model.params().items()}
    t, slots = opt.state()
    for slot, named in slots.items():
        arrays.update({f"{opt.name}.{slot}/{k}": v for k, v in named.items()})
    meta = {**meta, "format": FORMAT, "optimizer": opt.name, "opt_t": t}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".npz", dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)                          # mkstemp makes 0600: give the usual file mode
        os.replace(tmp, path)                                  # atomic on POSIX
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dfd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(dfd)                                          # make the rename itself durable
    finally:
        os.close(dfd)


def load(path):
    """-> (meta dict, params dict, optimizer state {"name", "t", "slots": {slot: {param: array}}}); a UserError
    for anything unusable."""
    if not os.path.exists(path):
        raise UserError(f"checkpoint {path!r} does not exist; check --out_dir, or start without --resume")
    try:
        with np.load(path, allow_pickle=False) as z:
            files = {k: z[k] for k in z.files}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, TypeError) as e:   # TypeError: a bare .npy
        raise UserError(f"{path!r} is not a readable checkpoint ({type(e).__name__}: {e}); it may be truncated "
                        "or another kind of file. Use another checkpoint (ckpt_best.npz / ckpt_last.npz)") from None
    try:
        meta = json.loads(files.pop("meta").tobytes().decode())
        assert meta.get("format") == FORMAT
    except (KeyError, ValueError, AssertionError):
        raise UserError(f"{path!r} is not a minigpt checkpoint (no {FORMAT} metadata)") from None
    params, slots = {}, {}
    for k, v in files.items():
        group, _, name = k.partition("/")
        if group == "param":
            params[name] = v
        else:                                                  # "<optimizer>.<slot>", or before: adam_m, adam_v
            slots.setdefault(group.partition(".")[2] or group, {})[name] = v
    if "optimizer" not in meta:
        return meta, params, _unnamed_state(meta, slots)
    return meta, params, {"name": meta["optimizer"], "t": meta["opt_t"], "slots": slots}


def _unnamed_state(meta, slots):
    """The state of a checkpoint written before optimizers named theirs: AdamW's m and v as adam_m, adam_v;
    Muon kept its momentum buffers in adam_m too, for the parameters that have no adam_v."""
    name = meta.get("train_config", {}).get("optimizer", "adamw")
    m, v = slots.get("adam_m", {}), slots.get("adam_v", {})
    if name == "muon":
        slots = {"momentum": {k: a for k, a in m.items() if k not in v},
                 "m": {k: a for k, a in m.items() if k in v}, "v": v}
    else:
        slots = {"m": m, "v": v}
    return {"name": name, "t": meta.get("adam_t", 0), "slots": slots}


def load_params(model, params, path="checkpoint"):
    """Copy params into the model's live arrays, checking names and shapes."""
    live = model.params()
    if set(live) != set(params):
        missing, extra = sorted(set(live) - set(params)), sorted(set(params) - set(live))
        raise UserError(f"{path}: parameters do not match the model (missing {missing[:4]}, unexpected "
                        f"{extra[:4]}); the checkpoint was made with another model config")
    for k, v in params.items():
        if live[k].shape != v.shape:
            raise UserError(f"{path}: parameter {k} has shape {v.shape} but the model expects "
                            f"{live[k].shape}; use the checkpoint's own config")
        live[k][...] = v

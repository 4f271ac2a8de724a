"""Checkpoints: one .npz holding params, the optimizer's state (AdamW moments; Muon's momentum buffers, and AdamW
moments for the rest), step, every RNG state, configs and the tokenizer.

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
    arrays.update({f"adam_m/{k}": v for k, v in opt.m.items()})
    arrays.update({f"adam_v/{k}": v for k, v in opt.v.items()})
    meta = {**meta, "format": FORMAT, "adam_t": opt.t}
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
    """-> (meta dict, params dict, adam_m dict, adam_v dict); a UserError for anything unusable."""
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
    groups = {"param": {}, "adam_m": {}, "adam_v": {}}
    for k, v in files.items():
        g, _, name = k.partition("/")
        groups[g][name] = v
    return meta, groups["param"], groups["adam_m"], groups["adam_v"]


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

"""Checkpoints: one .npz holding params, the optimizer's state under its name ("adamw.m/<param>", "muon.momentum/
<param>": Optimizer.state()), step, every RNG state, configs and the tokenizer. Checkpoints of minigpt before
the optimizers named their state ("adam_m/", "adam_v/") still load.

save() writes a temporary file (.tmp-*.npz) in the same directory, fsyncs it, and renames it into place (then
fsyncs the directory), so a crash at any moment leaves the previous checkpoint intact and loadable. The writer
holds a lock on its temporary until the rename: outdir.remove_stale() deletes the ones a killed writer left behind.
Where a run's checkpoints and snapshots go, and their names, is minigpt/outdir.py's.
"""
import json
import os
import tempfile
import zipfile

import numpy as np

from .errors import UserError
from .outdir import CKPT_FIX, PART, TMP_PREFIX, TMP_SUFFIX, fcntl, snapshot_fix

FORMAT = "minigpt-checkpoint-1"
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")                   # an .npz is a zip archive (the second: empty)


def save(path, model, opt, meta):
    """meta: a JSON-able dict (iter, configs, rng states, tokenizer, ...)."""
    arrays = {f"param/{k}": v for k, v in model.params().items()}
    t, slots = opt.state()
    for slot, named in slots.items():
        arrays.update({f"{opt.name}.{slot}/{k}": v for k, v in named.items()})
    meta = {**meta, "format": FORMAT, "optimizer": opt.name, "opt_t": t}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = _locked_temporary(d)
    try:
        with os.fdopen(fd, "wb") as f:                         # the lock is held until f closes, after the rename
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)                      # mkstemp makes 0600: give the usual file mode
            os.replace(tmp, path)                              # atomic on POSIX
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dfd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(dfd)                                          # make the rename itself durable
    finally:
        os.close(dfd)


def _locked_temporary(d):
    """-> (fd, path) of a new .tmp-*.npz in d, locked (flock) for this process. remove_stale() may take an
    unlocked one in the instant between mkstemp and flock: then it is unlinked, and we make another."""
    while True:
        fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, suffix=TMP_SUFFIX, dir=d)
        if fcntl is None:
            return fd, tmp
        fcntl.flock(fd, fcntl.LOCK_EX)                         # waits while outdir.remove_stale holds it
        if os.fstat(fd).st_nlink:                              # still named tmp: ours
            return fd, tmp
        os.close(fd)


def load(path, fix=None):
    """-> (meta dict, params dict, optimizer state {"name", "t", "slots": {slot: {param: array}}}); a UserError
    for anything unusable, ending in `fix`: what to do instead (default CKPT_FIX, or for a report snapshot its
    run's checkpoints; training's --resume passes its own)."""
    use = fix or CKPT_FIX
    if not os.path.exists(path):
        raise UserError(f"checkpoint {path!r} does not exist; {use}")
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise UserError(f"cannot read checkpoint {path!r} ({e.strerror}); {use}") from None
    if head not in _ZIP_MAGIC:                                 # before np.load, which would guess the file is a
        kind = "it is empty" if not head else "not an .npz archive"  # pickle and advise loading it "unsafely"
        raise UserError(f"{path!r} is not a minigpt checkpoint ({kind}); {use}")
    try:
        with np.load(path, allow_pickle=False) as z:
            files = {k: z[k] for k in z.files}
    except ValueError as e:                                    # a member holding Python objects: never ours
        if "pickle" not in str(e):
            raise UserError(f"{path!r} is not a readable checkpoint (ValueError: {e}); {use}") from None
        raise UserError(f"{path!r} is not a minigpt checkpoint (it holds Python objects); {use}") from None
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise UserError(f"{path!r} is not a readable checkpoint ({type(e).__name__}: {e}), it may be truncated; "
                        f"{use}") from None
    meta = _meta(files.pop("meta", None))
    if meta.get("format") != FORMAT:
        if _is_snapshot(meta, files):
            raise UserError(f"{path!r} is a report snapshot (float16 weights), not a checkpoint; "
                            f"{fix or snapshot_fix(path)}")
        raise UserError(f"{path!r} is not a minigpt checkpoint (no {FORMAT} metadata); {use}")
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


def _meta(array):
    """The JSON dict an .npz holds under "meta" (checkpoints and snapshots); {} if there is none."""
    try:
        meta = json.loads(array.tobytes().decode())
    except (AttributeError, ValueError):                       # no "meta", or not JSON text
        return {}
    return meta if isinstance(meta, dict) else {}


def _is_snapshot(meta, files):
    """save_snapshot's files: a meta with model_config and no format, and float16 parameters."""
    params = [a for k, a in files.items() if k.startswith("param/")]
    return "model_config" in meta and bool(params) and all(a.dtype == np.float16 for a in params)


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


# ----------------------------------------------------------------------------
# snapshots: the weights at a few points of a run, for the report (minigpt/report.py)

def save_snapshot(path, model, it, elapsed):
    """A snapshot at path (OutDir.snapshot(it)): the parameters in float16 (a sixth of a checkpoint with its AdamW
    moments) and {iter, elapsed, model_config}; written to a temporary name and renamed into place."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    arrays = {f"param/{k}": v.astype(np.float16) for k, v in model.params().items()}
    meta = {"iter": it, "elapsed": elapsed, "model_config": model.config.to_dict()}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    try:
        with open(path + PART, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())                                 # whole on disk before the rename, as save()
        os.replace(path + PART, path)
    except BaseException:
        if os.path.exists(path + PART):
            os.unlink(path + PART)
        raise
    return path


def load_snapshot(path):
    """-> (meta, {name: float32 array}) of a snapshot file; a UserError if it is not one."""
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(z["meta"].tobytes().decode())
            params = {k[6:]: z[k].astype(np.float32) for k in z.files if k.startswith("param/")}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError, TypeError) as e:
        raise UserError(f"{path!r} is not a readable snapshot ({type(e).__name__}: {e}); delete it") from None
    return meta, params

"""Whether a checkpoint's files are whole, checked before a training resumes from it: a file cut short (a copy
that stopped, a full disk) or changed by hand would otherwise fail deep inside the loading, with the loader's
traceback. Each check reads a file's index only (a zip's directory, a safetensors header, a DCP folder's
metadata), not its data: a few milliseconds for any size."""

import errno
import os
import pickle
import re
import shutil
import zipfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from safetensors import SafetensorError, safe_open

TORCH_FILES = (".ckpt", ".pt", ".bin", ".pkl")  # torch.save's (a zip archive): Lightning's, accelerate's
DCP_INDEX = ".metadata"  # a torch.distributed.checkpoint folder's: which file holds which bytes of each entry
LIGHTNING_META = "meta.pt"  # what Lightning's ModelParallelStrategy keeps beside a .ckpt folder's shards


def last_of_run_folder(path: Path, last: str) -> Path:
    """A run folder's last checkpoint, or its checkpoints folder's (ckpt_path= and load_trained take either), the one
    its link `last` (the engine's name for it) points to now: it moves on while that run trains. Any other path as it
    is."""
    link = next((folder / last for folder in (path / "checkpoints", path) if (folder / last).exists()), None)
    return link.resolve() if link else path


def damage(checkpoint: Path) -> str:
    """What is wrong with `checkpoint` (a file, or a folder of files), in a few words; "" if it looks whole."""
    files = [checkpoint] if checkpoint.is_file() else sorted(path for path in checkpoint.rglob("*") if path.is_file())
    for path in files:
        if problem := file_damage(path):
            return problem if path == checkpoint else f"{path.relative_to(checkpoint)}: {problem}"
    return missing_index(checkpoint) if checkpoint.is_dir() else ""


def missing_index(checkpoint: Path) -> str:
    """What a folder checkpoint lacks that its loader opens first (its loaders' tracebacks: DCP's "metadata is None",
    Lightning's FileNotFoundError): the DCP index of a folder of shards, a Lightning folder's meta.pt."""
    for folder in [checkpoint, *(path for path in checkpoint.rglob("*") if path.is_dir())]:
        shards = sum(1 for _ in folder.glob("*.distcp"))
        if shards and not (folder / DCP_INDEX).is_file():
            where = "" if folder == checkpoint else f"{folder.relative_to(checkpoint)}: "
            return f"{where}{shards} shard files but no {DCP_INDEX} (their index): cut short"
    if checkpoint.suffix == ".ckpt" and not (checkpoint / LIGHTNING_META).is_file():
        return f"no {LIGHTNING_META} (the training's state beside the shards): cut short"
    return ""


def file_damage(path: Path) -> str:
    if path.suffix == ".safetensors":
        try:
            with safe_open(str(path), "pt"):
                return ""
        except SafetensorError as error:
            return f"not a whole safetensors file ({error})"
    if path.suffix in TORCH_FILES:
        with path.open("rb") as file:
            start = file.read(2)
        if not start:  # (an EOFError's traceback, or, for accelerate's random states, a resume that skipped them)
            return "empty"
        # torch.save writes a zip archive, whose directory is at its end: a file cut short has none
        if b"PK".startswith(start):
            return "" if zipfile.is_zipfile(path) else "cut short (its zip directory is missing)"
        if not torch_save_start(start):
            return "not written by torch.save, which writes a zip archive (or, before torch 1.6, a pickle)"
        return ""
    if path.name == DCP_INDEX:
        return dcp_damage(path.parent)
    return ""


def looks_like_checkpoint(path: Path) -> bool:
    """Whether `path` is a checkpoint to suggest: a file torch.save wrote, or a folder of one (DCP's, accelerate's);
    not a link (`last`), nor one still being written (a hidden name: `.step-0000006.partial`)."""
    if path.is_symlink() or path.name.startswith("."):
        return False
    if path.is_file():
        return path.suffix in TORCH_FILES and written_by_torch(path)
    parts = {".safetensors", *TORCH_FILES}
    return path.is_dir() and any(part.name == DCP_INDEX or part.suffix in parts for part in path.iterdir())


def saved_checkpoint(run_dir: Path) -> bool:
    """Whether the training in `run_dir` has saved a checkpoint (either engine's: a .ckpt file, a folder of parts)."""
    folder = run_dir / "checkpoints"
    return folder.is_dir() and any(looks_like_checkpoint(path) for path in folder.iterdir())


def written_by_torch(path: Path) -> bool:
    """Whether the file `path` is one torch.save writes: a zip archive (a whole one, or one cut short), or the
    pickle of torch before 1.6 (or of _use_new_zipfile_serialization=False)."""
    with path.open("rb") as file:
        return torch_save_start(file.read(2))


def torch_save_start(start: bytes) -> bool:
    """Whether a file's first two bytes are those torch.save writes: a zip archive's, or a pickle's."""
    return start == b"PK" or start[:1] == b"\x80"


def pickled_keys_include(path: Path, key: str) -> bool | None:
    """Whether the object torch.save wrote to `path` (a zip archive) names `key`, read from its pickle alone (the
    tensors are other members of the archive): None where that cannot be told (an older format, a damaged file)."""
    try:
        with zipfile.ZipFile(path) as archive:
            pickles = [name for name in archive.namelist() if name.endswith("/data.pkl")]
            return bool(pickles) and key.encode() in archive.read(pickles[0])
    except (zipfile.BadZipFile, OSError):
        return None


def dcp_damage(folder: Path) -> str:
    """A DCP folder's files checked against its metadata: each must hold the bytes the metadata places in it."""
    try:
        stored = dcp.FileSystemReader(folder).read_metadata().storage_data
    except (pickle.UnpicklingError, EOFError, AttributeError, ValueError) as error:
        return f"unreadable ({type(error).__name__}: {error})"
    ends: dict[str, int] = {}
    for info in stored.values():
        ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
    for name, end in sorted(ends.items()):
        part = folder / name
        if not part.is_file():
            return f"names {name}, which is missing"
        if part.stat().st_size < end:
            return f"places {end} bytes in {name}, which has {part.stat().st_size}: cut short"
    return ""


def out_of_space(error: BaseException, run_dir: Path) -> bool:
    """Whether `error` (or one it came from) is a write that failed for want of space under `run_dir`: the system's
    ENOSPC or EDQUOT, or torch.save's own words for a short write ("unexpected pos", "file write failed") with the
    disk full. (A checkpoint cut short so is never `last`: the run continues from the one before.)"""
    seen = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        words = str(seen)
        if "No space left on device" in words:  # (safetensors' error says so, with no errno)
            return True
        if isinstance(seen, RuntimeError) and ("unexpected pos" in words or "file write failed" in words):
            try:
                return shutil.disk_usage(run_dir).free < 2**26  # (64 MiB: no other checkpoint would fit either)
            except OSError:
                return False
        seen = seen.__cause__ or seen.__context__
    return False


def permission_denied(error: BaseException, run_dir: Path) -> Path | None:
    """The file or folder that `error` (or one it came from) could not open for want of permission (another user's,
    a read-only mount), else None: Python's and fsspec's PermissionError name it; torch.save says "File X cannot be
    opened" and safetensors "PermissionDenied", naming no cause, so those count when X's folder (or the run folder)
    is not writable. (Root may write anywhere: a user's shared cluster account may not.)"""
    seen = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.EACCES, errno.EPERM, errno.EROFS) and seen.filename:
            return Path(seen.filename)  # (without one, not a file's: a signal or a port refused)
        opened = re.search(r"File (.+) cannot be opened", str(seen))
        folder = Path(opened.group(1)).parent if opened else None
        if folder and folder.is_dir() and not os.access(folder, os.W_OK):
            return Path(opened.group(1))
        if "PermissionDenied" in str(seen) and "serializ" in str(seen):  # (safetensors' save names no file)
            return run_dir
        seen = seen.__cause__ or seen.__context__
    return None


def saved_shapes(checkpoint: Path) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor `checkpoint` holds, by its key there, read from the files' indexes (a DCP folder's
    metadata, safetensors headers) or, for torch.save's files, memory-mapped (their tensors' bytes are not read).
    A torch file's nested dicts give dotted keys; Lightning's state_dict is read alone."""
    shapes: dict[str, tuple[int, ...]] = {}
    files = [checkpoint] if checkpoint.is_file() else sorted(path for path in checkpoint.rglob("*") if path.is_file())
    for path in files:
        if path.name == DCP_INDEX:
            for key, entry in dcp.FileSystemReader(path.parent).read_metadata().state_dict_metadata.items():
                if (size := getattr(entry, "size", None)) is not None:  # (a tensor's; bytes entries have none)
                    shapes[key] = tuple(size)
        elif path.suffix == ".safetensors":
            with safe_open(str(path), "pt") as tensors:
                shapes.update({key: tuple(tensors.get_slice(key).get_shape()) for key in tensors.keys()})
        elif path.suffix in TORCH_FILES and zipfile.is_zipfile(path):  # (.pkl: accelerate's custom objects)
            saved = torch.load(path, map_location="cpu", mmap=True, weights_only=False)
            if isinstance(saved, dict) and isinstance(saved.get("state_dict"), dict):  # Lightning's
                saved = saved["state_dict"]
            shapes.update(tensor_shapes(saved))
    return shapes


def tensor_shapes(saved: Any, prefix: str = "") -> dict[str, tuple[int, ...]]:
    if isinstance(saved, torch.Tensor):
        return {prefix.rstrip("."): tuple(saved.shape)}
    if isinstance(saved, dict):
        return {
            key: shape
            for name, value in saved.items()
            for key, shape in tensor_shapes(value, f"{prefix}{name}.").items()
        }
    return {}

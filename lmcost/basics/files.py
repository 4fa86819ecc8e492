"""Reading the user's YAML and JSON files into mappings, with one-line errors for every failure."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from lmcost.basics.errors import LmcostError


#: PyYAML's safe loader in C (libyaml, shipped in PyYAML's wheels) where present: it parses ~10x faster.
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _UniqueKeyLoader(SAFE_LOADER):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error
    (PyYAML keeps the last silently: a second ``attention:`` block would drop the first)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                raise LmcostError(f"line {key_node.start_mark.line + 1}", "a key is not a plain value",
                                  "write keys as names")
            if key in seen:
                raise LmcostError(str(key), f"given twice (line {key_node.start_mark.line + 1})",
                                  "keep one of the two")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _no_duplicate_json_keys(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise LmcostError(k, "given twice", "keep one of the two")
        out[k] = v
    return out


def read_mapping(path: Path) -> dict:
    """The top-level mapping of a YAML or JSON (by suffix) file.

    Raises: LmcostError if the file cannot be read, is not UTF-8, is malformed, repeats a key,
    or is not a mapping at the top level.
    """
    kind = "JSON" if path.suffix == ".json" else "YAML"
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise LmcostError(str(path), "not a UTF-8 text file", f"give a {kind} file") from None
    except OSError as e:
        raise LmcostError(str(path), f"cannot read ({e.strerror})", "check the path") from None
    try:
        if kind == "JSON":
            data = json.loads(text, object_pairs_hook=_no_duplicate_json_keys)
        else:
            data = yaml.load(text, Loader=_UniqueKeyLoader)
    except LmcostError as e:
        raise LmcostError(f"{path}: {e.field}", e.what, e.fix) from None
    except RecursionError:
        raise LmcostError(str(path), f"nested deeper than {MAX_DEPTH} levels", "flatten the file") from None
    except (yaml.YAMLError, json.JSONDecodeError) as e:  # JSONDecodeError is a ValueError: caught first
        mark = getattr(e, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark else (f" at line {e.lineno}" if hasattr(e, "lineno") else "")
        raise LmcostError(str(path), f"not valid {kind}{line}", "fix the syntax") from None
    except ValueError as e:  # an integer of thousands of digits (Python's int-from-string limit)
        raise LmcostError(str(path), f"holds a number lmcost cannot read ({str(e)[:60]})", "fix the value") from None
    if not isinstance(data, dict):
        raise LmcostError(str(path), "top level is not a mapping", "write `key: value` pairs at the top level")
    _check_shape(data, str(path))
    return data


#: Deepest nesting of mappings and lists a model or GPU file may have (real ones have 3 or 4 levels).
MAX_DEPTH = 32
#: Most values a file may hold once YAML aliases are expanded (real files: a few hundred); a few
#: aliases of aliases otherwise make a small file expand to billions (a "billion laughs" file).
MAX_VALUES = 100_000


def _check_shape(data, source: str) -> None:
    """Raises: LmcostError for nesting deeper than MAX_DEPTH, more than MAX_VALUES values with
    aliases expanded, or a structure that contains itself (a recursive YAML alias)."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()
    stack = [(data, 1, False)]
    while stack:  # iterative post-order walk: each shared (aliased) object is sized once
        obj, depth, done = stack.pop()
        if not isinstance(obj, (dict, list)):
            continue
        key = id(obj)
        children = list(obj.values()) if isinstance(obj, dict) else obj
        if done:
            open_.discard(key)
            sizes[key] = 1 + sum(sizes.get(id(c), 1) for c in children)
            if sizes[key] > MAX_VALUES:
                raise LmcostError(source, f"holds more than {MAX_VALUES:,} values once its aliases are expanded",
                                  "write the values out instead of aliasing aliases")
            continue
        if key in sizes:
            continue
        if key in open_:
            raise LmcostError(source, "a value contains itself (a recursive alias)", "remove the alias cycle")
        if depth > MAX_DEPTH:
            raise LmcostError(source, f"nested deeper than {MAX_DEPTH} levels", "flatten the file")
        open_.add(key)
        stack.append((obj, depth, True))
        stack.extend((c, depth + 1, False) for c in children)


def check_folder(path: Path, field: str, fix: str = "give a folder path") -> None:
    """Refuse, before any work, a folder that cannot be written: a file on the way to it or in its
    place, or one the system refuses (permissions, a read-only or virtual file system). The folder is
    made (empty) if it is missing.

    Raises: LmcostError naming ``field``.
    """
    import os
    import tempfile

    path = Path(path)
    for p in (path, *path.parents):
        if p.exists():
            if not p.is_dir():
                raise LmcostError(field, f"{p} is a file, not a folder", fix)
            break
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".lmcost-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise LmcostError(field, f"cannot write in {path} ({e.strerror})", fix) from None


#: Temporary files and folders of an atomic write are named ``.<target>.lmcost-<pid>-<random>``, beside
#: their target: a run that is killed leaves one, and the next run that writes the same target removes
#: every one whose process is gone.
TEMP_TAG = ".lmcost-"


def temp_prefix(target: Path) -> str:
    """The prefix of this process's temporary names for ``target`` (see TEMP_TAG)."""
    import os

    return f".{Path(target).name}{TEMP_TAG}{os.getpid()}-"


def remove_stale(target: Path) -> None:
    """Remove the temporary files and folders that killed runs left beside ``target`` (their process is
    gone; a live run's are left alone)."""
    import glob
    import shutil

    target = Path(target)
    try:
        leftovers = list(target.parent.glob(f".{glob.escape(target.name)}{TEMP_TAG}*"))
    except OSError:
        return
    for p in leftovers:
        pid = p.name[len(target.name) + 1 + len(TEMP_TAG):].split("-", 1)[0]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        try:
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        except OSError:
            pass  # another run is removing it too


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def make_folder(folder: Path, field: str) -> None:
    """Create ``folder`` and its parents if missing, as every command that writes does (one rule).

    Raises: LmcostError naming ``field`` if a file is in the way or the system refuses.
    """
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise LmcostError(field, f"{folder} is a file, not a folder", "give a path inside a folder") from None
    except OSError as e:
        raise LmcostError(field, f"cannot make the folder {folder} ({e.strerror})", "give a writable path") from None


def write_text(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same folder and ``os.replace``, so
    a failure never leaves a half-written file; leftovers of killed runs beside ``path`` are removed
    first (:func:`remove_stale`). Creates the folder if needed.

    Raises: LmcostError for a path that is a folder, under a file, or in a folder that refuses writes.
    """
    import os
    import tempfile

    path = Path(path)
    if path.is_dir() or not path.name:
        raise LmcostError(str(path), "is a folder", "give a file path")
    make_folder(path.parent, str(path))
    remove_stale(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=temp_prefix(path), suffix=".tmp")
    except OSError as e:
        raise LmcostError(str(path), f"cannot write there ({e.strerror})", "give a writable path") from None
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; these files are for reading
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def write_texts(folder: Path, texts: dict, field: str) -> None:
    """Write several files into ``folder`` as one step: every text is first staged beside its target
    (a temporary name in the same folder), then each is put in place with ``os.replace``. A failure
    while staging (a full disk, a name the file system refuses) removes what was staged and writes
    nothing.

    Raises: LmcostError naming ``field`` for a folder that refuses the files.
    """
    import os
    import tempfile

    folder = Path(folder)
    make_folder(folder, field)
    try:
        name_max = os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        name_max = 255
    for name in texts:  # a name the file system refuses is found before anything is put in place
        if len(os.fsencode(name)) > name_max:
            raise LmcostError(field, f"the name {name[:40]}... is longer than {folder} takes ({name_max} bytes)",
                              "give a shorter name")
    staged = []
    try:
        for name, text in texts.items():
            target = folder / name
            remove_stale(target)
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=temp_prefix(target)[:200], suffix=".tmp")
            staged.append((tmp, target))
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.chmod(tmp, 0o644)
        for tmp, target in staged:
            os.replace(tmp, target)
    except OSError as e:
        raise LmcostError(field, f"cannot write {folder} ({e.strerror})", "free space or give another folder") from None
    finally:
        for tmp, _ in staged:
            if os.path.exists(tmp):
                os.unlink(tmp)


def replace_folder(tmp: Path, out: Path) -> None:
    """Move the finished folder ``tmp`` to ``out``, replacing what is there, so that a reader sees the
    old folder or the new one, never a mix: the old one is first renamed aside under this process's
    temporary name, then removed. Safe against another run doing the same at the same moment (the
    later one wins)."""
    import errno
    import os
    import shutil

    for _ in range(100):
        try:
            os.rename(tmp, out)
            return
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.EISDIR):
                raise
        aside = out.with_name(f"{temp_prefix(out)}old-{os.urandom(4).hex()}")
        try:
            os.rename(out, aside)
        except FileNotFoundError:
            continue  # another run moved it first: try again
        shutil.rmtree(aside, ignore_errors=True)
    raise OSError(errno.EBUSY, f"{out} kept being replaced by other runs")

"""The one boundary through which lmcost reads and writes files, with one-line errors for every failure.

Reading (:func:`read_bytes`, :func:`read_text`, :func:`read_mapping`): every file the tool opens (model,
GPU and cluster YAML, Hugging Face config.json, fit tables, traces, the calibration cache) goes through
:func:`read_bytes`: the name's length is checked, anything but a regular file (a FIFO, a device, a socket,
a folder) is refused by kind before a byte is read, and the size is checked before reading and read at
most one byte past the limit. Writing (:func:`write_text`, :func:`write_file`, :func:`staged_folder`,
:func:`write_texts`): names are checked, every file or folder is staged under a temporary name beside its
target and swapped in as one, and a killed run's leftovers are restored or removed by the next run.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

import yaml

from lmcost.basics.errors import LmcostError


#: PyYAML's safe loader in C (libyaml, shipped in PyYAML's wheels) where present: it parses ~10x faster.
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

#: Linux's limits (``<linux/limits.h>``): bytes in one part of a path, and in a whole path with its NUL.
NAME_MAX, PATH_MAX = 255, 4096
#: Most bytes read from a model, GPU or cluster file (YAML or JSON; real ones are a few kB, the largest
#: Hugging Face config.json a few hundred kB).
MAX_MAPPING_BYTES = 4 * 2**20
#: Most bytes read from a Chrome trace (a profiled decoder's is tens of MB; Python holds about ten
#: times the file's size once parsed).
MAX_TRACE_BYTES = 2**30


def shown(path) -> str:
    """``path`` for a message: a name over 100 characters is cut in the middle."""
    s = str(path)
    return s if len(s) <= 100 else f"{s[:60]}...{s[-30:]} ({len(s)} characters)"


def name_problem(path) -> str | None:
    """Why no system call takes ``path`` as a name, or None: a part over NAME_MAX bytes, the whole over
    PATH_MAX, or a NUL byte (Python's ``os`` functions raise ValueError for it)."""
    raw = os.fsencode(path)
    if b"\0" in raw:
        return "holds a NUL character"
    longest = max(len(part) for part in raw.split(b"/"))
    if longest > NAME_MAX:
        return f"has a name of {longest} bytes, past the file system's {NAME_MAX}"
    if len(raw) >= PATH_MAX:
        return f"is {len(raw)} bytes long, past the system's {PATH_MAX - 1}"
    return None


def check_name(path, field: str | None = None, fix: str = "give a shorter path") -> None:
    """Refuse a name no system call takes (:func:`name_problem`), before it reaches one (each would
    raise ``OSError: File name too long``). Raises: LmcostError naming ``field`` (default: the path)."""
    why = name_problem(path)
    if why is not None:
        raise LmcostError(field or shown(path), f"{shown(path)} {why}" if field else why, fix)


def present(path) -> bool:
    """True if something other than a folder is at ``path`` (a file, or a FIFO or device the reader then
    refuses by name); False for nothing there or a name no system call takes. Never raises."""
    if name_problem(path) is not None:
        return False
    try:
        return not stat.S_ISDIR(os.stat(path).st_mode)
    except OSError:
        return False


def no_file(path, fix: str) -> LmcostError:
    """The error for ``path`` where no file is: its name too long for any system call, a folder, a loop
    of symbolic links (ELOOP: ``os.stat`` follows it no further), another reason ``stat`` gives, or
    nothing there (for the caller to raise)."""
    why = name_problem(path)
    if why is None:
        try:
            why = "is a folder, not a file" if stat.S_ISDIR(os.stat(path).st_mode) else None
        except (FileNotFoundError, NotADirectoryError):
            pass
        except OSError as e:
            why = ("is a loop of symbolic links (ELOOP)" if e.errno == errno.ELOOP
                   else f"cannot be read ({e.strerror or e})")
    return LmcostError(shown(path), why or "no such file", fix)


def _kind(mode: int) -> str | None:
    """What a file of ``mode`` is when it is not a regular file, or None."""
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return None if stat.S_ISREG(mode) else "not a regular file"


def read_bytes(path, limit: int, noun: str = "file") -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them: the one door every reader uses.

    The name is checked first (:func:`check_name`); the file is refused by kind (a FIFO, whose open would
    wait for a writer; a device such as /dev/zero, which never ends; a socket or a folder) from ``stat``
    before it is opened, and again from ``fstat`` on the descriptor, opened without blocking, so a FIFO put
    in its place meanwhile is refused too. Its size is checked before reading, and at most ``limit + 1``
    bytes are read (a file that grows while read is caught).
    Raises: LmcostError naming the path: no such file, a name too long, not a regular file (saying what
    it is), over ``limit`` bytes, or unreadable (permissions).
    """
    where, fix = shown(path), f"give the path of a {noun}"  # noun: "YAML file", "Chrome trace (JSON)", ...
    check_name(path, None, fix)

    def refuse(st) -> None:
        kind = _kind(st.st_mode)
        if kind is not None:
            raise LmcostError(where, f"is {kind}, not a file", f"give a {noun}")
        if st.st_size > limit:
            raise LmcostError(where, f"{st.st_size / 1e6:,.1f} MB is more than lmcost reads from a {noun} "
                                     f"({limit / 1e6:,.0f} MB)", f"give a {noun} under that size")

    try:
        refuse(os.stat(path))
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
    except (FileNotFoundError, NotADirectoryError):
        raise LmcostError(where, "no such file", f"check the path; {fix}") from None
    except OSError as e:
        raise LmcostError(where, f"cannot read ({e.strerror or e})", f"check the path; {fix}") from None
    try:
        refuse(os.fstat(fd))
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(2**24, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as e:
        raise LmcostError(where, f"cannot read ({e.strerror or e})", f"check the path; {fix}") from None
    finally:
        os.close(fd)
    if size > limit:
        raise LmcostError(where, f"grew past {limit / 1e6:,.0f} MB while read", f"give a {noun} that is not being written")
    return b"".join(chunks)


def read_text(path, limit: int, noun: str = "file") -> str:
    """The text of the UTF-8 file ``path`` (:func:`read_bytes`), a leading byte-order mark dropped (as
    spreadsheets and Windows editors write it).

    Raises: LmcostError as :func:`read_bytes`, and for text that is not UTF-8 (naming a UTF-16 or
    UTF-32 byte-order mark when there is one).
    """
    data = read_bytes(path, limit, noun)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        pass
    for bom, code in ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"), (b"\xff\xfe", "UTF-16"),
                      (b"\xfe\xff", "UTF-16")):
        try:
            if data.startswith(bom) and data.decode(code.lower()):
                raise LmcostError(shown(path), f"is {code} (it starts with a {code} byte-order mark)", "save it as UTF-8")
        except UnicodeDecodeError:
            pass
    raise LmcostError(shown(path), "not a UTF-8 text file", f"give a {noun}")


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


def read_mapping(path: Path | str) -> dict:
    """The top-level mapping of a YAML or JSON (by suffix) file, read through :func:`read_text` (a
    regular file of at most MAX_MAPPING_BYTES; a UTF-8 byte-order mark is dropped).

    Raises: LmcostError if the file cannot be read (as :func:`read_bytes`), is not UTF-8, is malformed,
    repeats a key, is not a mapping at the top level, or is too deep or holds too many values
    (:func:`_check_shape`).
    """
    kind = "JSON" if Path(path).suffix == ".json" else "YAML"
    text = read_text(path, MAX_MAPPING_BYTES, f"{kind} file")
    path = shown(path)
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
    """Raises: LmcostError for nesting deeper than MAX_DEPTH, more than MAX_VALUES values (named an
    alias bomb only where aliases made it so), or a structure that contains itself (a recursive alias)."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()
    shared = False  # an object met twice: the file uses aliases
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
            if sizes[key] > MAX_VALUES and shared:
                raise LmcostError(source, f"holds more than {MAX_VALUES:,} values once its aliases are expanded",
                                  "write the values out instead of aliasing aliases")
            if sizes[key] > MAX_VALUES:
                raise LmcostError(source, f"holds more than {MAX_VALUES:,} keys and values (a model, GPU or "
                                          "cluster file has hundreds)", "give the model's or GPU's own file")
            continue
        if key in sizes:
            shared = True
            continue
        if key in open_:
            raise LmcostError(source, "a value contains itself (a recursive alias)", "remove the alias cycle")
        if depth > MAX_DEPTH:
            raise LmcostError(source, f"nested deeper than {MAX_DEPTH} levels", "flatten the file")
        open_.add(key)
        stack.append((obj, depth, True))
        stack.extend((c, depth + 1, False) for c in children)


def check_folder(path: Path, field: str, fix: str = "give a folder path") -> None:
    """Refuse, before any work, a folder that cannot be written: a name too long, a file on the way to
    it or in its place, or one the system refuses (permissions, a read-only or virtual file system). The
    folder is made (empty) if it is missing.

    Raises: LmcostError naming ``field``.
    """
    import tempfile

    path = Path(path)
    check_name(path, field)
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
        raise LmcostError(field, f"cannot write in {path} ({e.strerror or e})", fix) from None


def check_component(name: str, field: str, what: str = "name") -> None:
    """Refuse a name read from inside a file (a GPU's ``name:``) that would not be one plain file name
    in the output folder: empty, hidden, ``..``, a path separator or NUL, or over NAME_MAX bytes.

    Raises: LmcostError naming ``field``."""
    bad = (not name or name.startswith(".") or any(c in name for c in "/\\\0")
           or len(os.fsencode(name)) > NAME_MAX)
    if bad:
        raise LmcostError(field, f"the {what} {shown(name)!r} cannot name a file in the output folder",
                          "give it a plain name: letters, digits, '-', '_' and '.', not starting with '.'")


def file_part(text: str) -> str:
    """``text`` read from inside a file (a model's ``name:``) as a safe part of a file name: every
    character but letters, digits and ``.+-_`` made ``_``, no leading dot, at most 100 characters (so a
    name such as ``../../x`` or ``a/b`` stays inside the folder written to)."""
    import re

    return re.sub(r"[^A-Za-z0-9.+_-]", "_", text).lstrip(".")[:100] or "_"


#: Temporary files and folders of a write are named ``.<target>.lmcost-<pid>-<rest>`` beside their
#: target (the target's name cut to 100 bytes): a run that is killed leaves one, and the next run that
#: writes the same target restores or removes every one whose process is gone (:func:`remove_stale`).
#: A staged folder is renamed ``...-new-<random>`` once whole; an old folder moved aside is ``...-old-<random>``.
TEMP_TAG = ".lmcost-"


def _stem(target: Path) -> str:
    return os.fsencode(Path(target).name)[:100].decode("utf-8", "ignore")


def temp_prefix(target: Path) -> str:
    """The prefix of this process's temporary names for ``target`` (see TEMP_TAG)."""
    return f".{_stem(target)}{TEMP_TAG}{os.getpid()}-"


def remove_stale(target: Path) -> None:
    """Tidy what killed runs left beside ``target`` (their process is gone; a live run's are left alone).

    If ``target`` is missing, a run was killed while swapping a folder in (:func:`swap_folder` without an
    atomic exchange): its finished new folder, else the old one it moved aside, is renamed back to
    ``target``, never removed. Every other leftover is removed."""
    import glob
    import shutil

    target = Path(target)
    try:
        leftovers = sorted(target.parent.glob(f".{glob.escape(_stem(target))}{TEMP_TAG}*"))
    except OSError:
        return
    dead = []
    for p in leftovers:
        pid, _, rest = p.name[len(_stem(target)) + 1 + len(TEMP_TAG):].partition("-")
        if pid.isdigit() and not _alive(int(pid)):
            dead.append((rest, p))
    if not os.path.lexists(target):
        for kind in ("new-", "old-"):
            whole = [p for rest, p in dead if rest.startswith(kind) and p.is_dir() and not p.is_symlink()]
            if whole and _rename_quietly(whole[0], target):
                dead = [(r, p) for r, p in dead if p != whole[0]]
                break
    for _, p in dead:
        try:
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        except OSError:
            pass  # another run is removing it too


def _rename_quietly(src: Path, dst: Path) -> bool:
    try:
        os.rename(src, dst)
        return True
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def make_folder(folder: Path, field: str) -> None:
    """Create ``folder`` and its parents if missing, as every command that writes does (one rule).

    Raises: LmcostError naming ``field`` for a name too long, a file in the way, or a system refusal.
    """
    check_name(folder, field)
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise LmcostError(field, f"{shown(folder)} is a file, not a folder", "give a path inside a folder") from None
    except OSError as e:
        raise LmcostError(field, f"cannot make the folder {shown(folder)} ({e.strerror or e})", "give a writable path") from None


def write_file(path: Path, write, field: str | None = None, suffix: str = ".tmp") -> Path:
    """Write the file ``path`` by calling ``write(temporary path)``, then ``os.replace`` it into place, so
    a failure or a kill never leaves a half-written file; leftovers of killed runs beside ``path`` are
    removed first (:func:`remove_stale`). Creates the folder if needed.

    Raises: LmcostError naming ``field`` (default: the path) for a name too long, a path that is a
    folder or under a file, or a folder that refuses writes.
    """
    import tempfile

    path, field = Path(path), field or shown(path)
    check_name(path, field)
    if not path.name or os.path.isdir(path):
        raise LmcostError(field, f"{shown(path)} is a folder", "give a file path")
    make_folder(path.parent, field)
    remove_stale(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=temp_prefix(path), suffix=suffix)
        os.close(fd)
    except OSError as e:
        raise LmcostError(field, f"cannot write there ({e.strerror or e})", "give a writable path") from None
    try:
        write(tmp)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; these files are for reading
        os.replace(tmp, path)
    except OSError as e:
        raise LmcostError(field, f"cannot write {shown(path)} ({e.strerror or e})", "free space or give another path") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def write_text(path: Path, text: str, field: str | None = None) -> Path:
    """Write ``text`` (UTF-8) to ``path`` as one step (:func:`write_file`). Raises: as write_file."""
    return write_file(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"), field)


class staged_folder:
    """``with staged_folder(out, field) as tmp:`` yields an empty folder beside ``out`` to write into; when
    the block ends without an error the folder replaces ``out`` whole (:func:`swap_folder`), else it is
    removed and ``out`` is as it was. Leftovers of killed runs are restored or removed first
    (:func:`remove_stale`).

    Raises: LmcostError naming ``field`` for a name too long, a parent that cannot be made or written,
    or a write that fails (a full disk)."""

    def __init__(self, out: Path, field: str):
        self.out, self.field = Path(out), field

    def __enter__(self) -> Path:
        import tempfile

        out = self.out
        check_name(out, self.field)
        make_folder(out.parent, self.field)
        remove_stale(out)
        try:
            self.tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(out), dir=out.parent))
            self.tmp.chmod(0o755)  # mkdtemp makes it private; an output is for reading
        except OSError as e:
            raise LmcostError(self.field, f"cannot write in {shown(out.parent)} ({e.strerror or e})", "give a writable folder") from None
        return self.tmp

    def __exit__(self, kind, value, tb) -> None:
        import shutil

        try:
            if kind is None:
                ready = self.tmp.with_name(f"{temp_prefix(self.out)}new-{os.urandom(4).hex()}")
                os.rename(self.tmp, ready)  # whole now: the next run restores it if this one is killed
                self.tmp = ready
                swap_folder(ready, self.out)
            elif isinstance(value, OSError):
                raise value
        except OSError as e:
            raise LmcostError(self.field, f"cannot write {shown(self.out)} ({e.strerror or e})",
                              "free space or give another folder") from None
        finally:
            if os.path.isdir(self.tmp) and (kind is not None or os.path.isdir(self.out)):
                shutil.rmtree(self.tmp, ignore_errors=True)  # after an exchange it holds the old folder


def write_texts(folder: Path, texts: dict, field: str) -> None:
    """Write ``texts`` ({file name: text}) as the whole of ``folder``, replacing what was there as one
    (:class:`staged_folder`): a kill leaves the old set or the new one, never a mix, and no file of an
    earlier set stays beside the new one. Every name is checked first (:func:`check_component`).

    Raises: LmcostError naming ``field`` for a name that is not one plain file name, or a folder that
    refuses the files."""
    for name in texts:
        check_component(name, field, "file name")
    with staged_folder(folder, field) as tmp:
        for name, text in texts.items():
            (tmp / name).write_text(text, encoding="utf-8")
            os.chmod(tmp / name, 0o644)


#: Linux's renameat2 flag that swaps two names in one step (Linux 3.15, glibc 2.28), and AT_FDCWD.
RENAME_EXCHANGE, AT_FDCWD = 2, -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap the names ``a`` and ``b`` atomically (Linux ``renameat2(RENAME_EXCHANGE)`` through ctypes).
    Returns False where the system or the file system lacks it, or ``b`` is gone. Raises: OSError."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    if fn(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOENT):
        return False
    raise OSError(err, os.strerror(err), str(b))


def swap_folder(new: Path, out: Path) -> None:
    """Put the finished folder ``new`` at ``out``, replacing what is there, so that ``out`` always holds
    the old folder or the new one, never a mix and never nothing: by one atomic exchange where Linux has
    it (``new`` then holds the old folder, for the caller to remove), else by renaming the old one aside,
    the new one in, and removing the old (a kill between the two renames leaves both, under temporary
    names that the next run restores: :func:`remove_stale`). Safe against another run doing the same at
    the same moment (the later one wins). Raises: OSError."""
    import shutil

    for _ in range(100):
        if not os.path.lexists(out):
            try:
                os.rename(new, out)
                return
            except OSError as e:
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.EISDIR):
                    raise
                continue  # another run put its folder there first
        if _exchange(new, out):
            return
        aside = out.with_name(f"{temp_prefix(out)}old-{os.urandom(4).hex()}")
        try:
            os.rename(out, aside)
        except FileNotFoundError:
            continue  # another run moved it first: try again
        try:
            os.rename(new, out)
        except OSError:
            _rename_quietly(aside, out)  # put the old one back (unless another run's is there)
            continue
        shutil.rmtree(aside, ignore_errors=True)
        return
    raise OSError(errno.EBUSY, f"{out} kept being replaced by other runs")

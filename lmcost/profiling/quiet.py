"""torch.profiler's start and stop lines (``USDT:... profiler_start``), kept off the user's terminal."""

from __future__ import annotations

import os
import sys
import tempfile
from contextlib import contextmanager


@contextmanager
def without_profiler_lines():
    """Run the body with the process's file descriptor 2 sent to a temporary file, then pass on every
    line written there except torch's ``USDT:`` profiler markers. Python's own ``sys.stderr`` (progress
    bars, notes) keeps going to the terminal meanwhile. Nothing is lost: other C-level lines (warnings,
    errors) reach stderr when the body ends, or raises."""
    fd2 = 2  # where C++ code (torch's profiler) writes, whatever Python's sys.stderr is
    sys.stderr.flush()
    saved = os.dup(fd2)
    py_err = sys.stderr
    with tempfile.TemporaryFile() as tmp:
        sys.stderr = os.fdopen(os.dup(saved), "w", buffering=1, encoding=getattr(py_err, "encoding", None) or "utf-8",
                               errors="replace")
        os.dup2(tmp.fileno(), fd2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, fd2)
            os.close(saved)
            sys.stderr.close()
            sys.stderr = py_err
            tmp.seek(0)
            for line in tmp.read().decode(errors="replace").splitlines(keepends=True):
                if not line.startswith("USDT:"):
                    py_err.write(line)
            py_err.flush()

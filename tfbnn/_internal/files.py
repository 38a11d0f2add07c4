"""Ground-level file helpers: atomic writes, JSON/CSV records, output folders, tables.

Every file tfbnn writes as the result of a run (a model, a history, a report) goes
through :func:`atomic_write`: the content is written to a temporary file in the
target's folder and moved into place with ``os.replace`` only when it is complete,
so a crash or a failed run never leaves a half-written file and never replaces a
good one. Temporary files carry the marker ``.tfbnn-tmp`` and the writer's process
id; a temporary file whose process is gone (a run killed while saving) is removed
the next time anything is written to the same target.

A run that writes several files stages them in a hidden folder beside its output
folder (:func:`make_staging_folder`, ``.<name>.tfbnn-tmp.<pid>``) and publishes them
when it succeeded. The folder goes away when the run fails or is interrupted
(``KeyboardInterrupt`` through the caller's ``finally``, ``SIGTERM`` through a handler
that removes the process's staging folders before the signal takes its default
effect); one left by a process that could not clean up (``SIGKILL``, a power cut) is
removed by the next run writing to the same output folder.

This module imports nothing from TensorFlow or Keras (only :func:`save_model` uses
the model it is given), so every layer of the package may use it.
"""

import contextlib
import csv
import glob
import json
import math
import os
import shutil
import signal
import tempfile
import threading
import uuid

from tfbnn._internal.errors import RunError

__all__ = [
    "atomic_write",
    "write_text",
    "write_json",
    "write_csv",
    "read_json",
    "save_model",
    "make_staging_folder",
    "remove_staging_folder",
    "prepare_output_dir",
    "check_target",
    "format_table",
    "markdown_table",
    "plain",
    "TMP_MARKER",
]

#: Part of the name of every temporary file (``.<name>.tfbnn-tmp.<pid>.<random><ext>``).
TMP_MARKER = ".tfbnn-tmp"


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def _remove_stale_temporaries(path):
    """Removes temporary files of ``path`` left by processes that no longer run."""
    folder, base = os.path.split(os.path.abspath(path))
    for tmp in glob.glob(os.path.join(glob.escape(folder), f".{glob.escape(base)}{TMP_MARKER}.*")):
        try:
            pid = int(os.path.basename(tmp)[len(base) + len(TMP_MARKER) + 2:].split(".", 1)[0])
        except ValueError:
            continue
        if pid != os.getpid() and not _pid_alive(pid):
            _remove(tmp)


def _remove(path):
    """Removes the file or folder ``path`` if it is there; quietly."""
    with contextlib.suppress(OSError):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.remove(path)


#: The staging folders of this process not yet removed (what the SIGTERM handler removes).
_staging_folders = set()
#: Staging folder -> the parent folders :func:`make_staging_folder` made for it (deepest first).
_made_parents = {}


def _remove_staging_on_sigterm(signum, frame):
    """SIGTERM: removes this process's staging folders, then lets the signal kill the process as by default."""
    for folder in list(_staging_folders):
        _remove(folder)
    _staging_folders.clear()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _install_sigterm_cleanup():
    """Installs the handler in the main thread, only where SIGTERM still has its default effect (a handler of
    the program's own stays untouched)."""
    if threading.current_thread() is not threading.main_thread():
        return
    with contextlib.suppress(ValueError, OSError):
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _remove_staging_on_sigterm)


def make_staging_folder(output_dir):
    """Creates (empty) and returns the hidden staging folder ``.<name>.tfbnn-tmp.<pid>`` beside ``output_dir``.

    Staging folders that processes no longer running left beside ``output_dir`` are
    removed first. The folder is removed by :func:`remove_staging_folder` (call it in a
    ``finally``, which also runs on ``KeyboardInterrupt``) or, if the process receives
    ``SIGTERM`` first, by a handler installed here (main thread, default SIGTERM
    disposition only) before the process ends as SIGTERM would end it.

    Example:
        >>> import os, tempfile
        >>> from tfbnn._internal import files
        >>> out = os.path.join(tempfile.mkdtemp(), "run")
        >>> stage = files.make_staging_folder(out)
        >>> os.path.basename(stage) == f".run{files.TMP_MARKER}.{os.getpid()}"
        True
        >>> files.remove_staging_folder(stage); os.path.exists(stage)
        False
    """
    folder, base = os.path.split(os.path.abspath(output_dir))
    _remove_stale_temporaries(os.path.join(folder, base))
    stage = os.path.join(folder, f".{base}{TMP_MARKER}.{os.getpid()}")
    _remove(stage)
    _made_parents[stage] = _missing_ancestors(folder)[0]
    os.makedirs(stage)
    _staging_folders.add(stage)
    _install_sigterm_cleanup()
    return stage


def remove_staging_folder(stage):
    """Removes a folder made by :func:`make_staging_folder` (and forgets it), and the parent folders it made
    that are still empty: a failed run leaves no folder behind."""
    _staging_folders.discard(stage)
    _remove(stage)
    for parent in _made_parents.pop(stage, ()):  # from the deepest up
        with contextlib.suppress(OSError):
            os.rmdir(parent)


@contextlib.contextmanager
def atomic_write(path):
    """Yields a temporary path next to ``path``; moves it onto ``path`` when the block succeeds.

    The temporary name keeps ``path``'s extension (Keras decides the format from it).
    If the block raises, the temporary file is removed and ``path`` is untouched.

    Example:
        >>> import os, tempfile, keras
        >>> from tfbnn._internal.files import atomic_write
        >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        >>> path = os.path.join(tempfile.mkdtemp(), "model.keras")   # the folder must exist
        >>> with atomic_write(path) as tmp:
        ...     model.save(tmp)
        >>> os.listdir(os.path.dirname(path))               # no temporary file left behind
        ['model.keras']
    """
    path = os.fspath(path)
    _remove_stale_temporaries(path)
    folder, base = os.path.split(os.path.abspath(path))
    ext = os.path.splitext(base)[1]
    tmp = os.path.join(folder, f".{base}{TMP_MARKER}.{os.getpid()}.{uuid.uuid4().hex[:8]}{ext}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        _remove(tmp)


def plain(value):
    """``value`` as a strict-JSON / CSV-friendly Python object, recursively: NumPy scalars and
    arrays become Python numbers and lists, tuples lists, non-finite floats the strings
    ``"nan"``, ``"inf"``, ``"-inf"``; finite floats keep every digit."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "tolist") and getattr(value, "ndim", 0) > 0:  # NumPy arrays
        return plain(value.tolist())
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # NumPy scalars
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def write_text(path, text):
    """Writes ``text`` to ``path`` atomically; returns ``path``."""
    with atomic_write(path) as tmp:
        with open(tmp, "w") as f:
            f.write(text)
    return path


def write_json(path, obj, indent=1):
    """Writes ``obj`` as strict JSON, atomically (:func:`plain` values); returns ``path``."""
    return write_text(path, json.dumps(plain(obj), indent=indent, allow_nan=False) + "\n")


def read_json(path):
    """The JSON object in ``path``."""
    with open(path) as f:
        return json.load(f)


def write_csv(path, rows, columns=None):
    """Writes a list of flat dicts as CSV, atomically; returns ``path``.

    Columns: ``columns`` first (if given), then the other keys in first-seen order.
    Missing values are empty cells.
    """
    columns = list(columns or [])
    for row in rows:
        columns += [k for k in row if k not in columns]
    with atomic_write(path) as tmp:
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            for row in rows:
                writer.writerow({k: "" if row.get(k) is None else plain(row.get(k)) for k in columns})
    return path


def save_model(model, path):
    """Saves a Keras ``model`` to ``path`` (``.keras``) atomically; returns ``path``.

    Raises:
        RunError: the file could not be written (the message says why and that an
            existing ``path`` was left untouched).
    """
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with atomic_write(path) as tmp:
            model.save(tmp)
    except OSError as e:
        kept = f"; {path} was left untouched" if os.path.exists(path) else ""
        raise RunError(f"could not save the model to {path}: {e}{kept}") from e
    return path


def _missing_ancestors(folder):
    """The folders of ``folder``'s path that do not exist yet, from ``folder`` up; and the first existing one."""
    missing = []
    folder = os.path.abspath(folder)
    while not os.path.exists(folder):
        missing.append(folder)
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    return missing, folder


def check_target(filepath, argument="filepath", create=True):
    """``filepath`` (a str) once its folder exists, or could be made, and is writable: a bad target fails
    before any work, with ``argument`` named.

    With ``create`` the folder is made; without, nothing is left behind (the write test runs in the
    nearest existing folder), so that a run failing later leaves no empty folder.

    Raises:
        ValueError: "Expected `argument` in a folder that exists or can be created ..." or "... in a
            writable folder ...", naming ``argument`` and ``filepath``.
    """
    filepath = os.fspath(filepath)
    folder = os.path.dirname(os.path.abspath(filepath))
    missing, existing = _missing_ancestors(folder)
    try:
        if not os.path.isdir(existing):
            raise FileExistsError(f"{existing!r} is a file")
        if create:
            os.makedirs(folder, exist_ok=True)
    except OSError as e:
        reason = "a file is in the way" if isinstance(e, FileExistsError) else e.strerror
        raise ValueError(f"Expected `{argument}` in a folder that exists or can be created; {folder!r} cannot be "
                         f"created ({reason}). Received: {argument}={filepath!r}") from None
    probe_in = folder if create or not missing else existing
    try:  # a real try: permissions alone do not tell (root, read-only mounts, /proc)
        os.rmdir(tempfile.mkdtemp(dir=probe_in, prefix=".tfbnn-probe-"))
    except OSError as e:
        if missing and not create:
            raise ValueError(f"Expected `{argument}` in a folder that exists or can be created; {folder!r} cannot be "
                             f"created ({e.strerror}). Received: {argument}={filepath!r}") from None
        raise ValueError(f"Expected `{argument}` in a writable folder; {folder!r} is not writable ({e.strerror}). "
                         f"Received: {argument}={filepath!r}") from None
    return filepath


def prepare_output_dir(path, argument="output_dir"):
    """Creates the folder ``path`` (and parents); returns it.

    Fails early, before any training, when the folder cannot be made or written.

    Raises:
        ValueError: naming ``argument`` (e.g. ``"--output-dir"``) and ``path``.
    """
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise ValueError(f"cannot create the output folder {path!r}: {e.strerror}. Received: {argument}={path}") from None
    if not os.access(path, os.W_OK):
        raise ValueError(f"the output folder {path!r} is not writable. Received: {argument}={path}")
    return path


def format_table(title, sections):
    """Plain aligned text.

    ``sections`` is a list of row lists; a row is ``(label, value, ...)``. Labels
    share one width across sections, values are right-aligned per section, and
    sections are separated by a blank line.
    """
    sections = [[tuple(str(c) for c in row) for row in rows] for rows in sections if rows]
    label_width = max(len(row[0]) for rows in sections for row in rows)
    lines = [title, "-" * len(title)]
    for k, rows in enumerate(sections):
        if k:
            lines.append("")
        ncol = max(len(row) for row in rows)
        widths = [max((len(row[i]) for row in rows if len(row) > i), default=0) for i in range(ncol)]
        for row in rows:
            cells = [row[0].ljust(label_width)] + [c.rjust(widths[i]) for i, c in enumerate(row[1:], 1)]
            lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def markdown_table(header, rows):
    """A GitHub-flavoured Markdown table: a header row, a separator, one line per row.

    Cells are written with ``str`` (format numbers before); a ``|`` inside a cell is
    escaped (``\\|``) so that it stays in its cell.

    Args:
        header: sequence of column names.
        rows: sequence of rows, each a sequence of ``len(header)`` cells.

    Returns:
        The table as a string ending in a newline.

    Raises:
        ValueError: an empty header, or a row whose length differs from the header's.

    Example:
        >>> print(markdown_table(["width", "test error"], [[400, "1.36%"], [1200, "1.32%"]]))
        | width | test error |
        |---|---|
        | 400 | 1.36% |
        | 1200 | 1.32% |
        <BLANKLINE>
    """
    header = [str(h) for h in header]
    if not header:
        raise ValueError("Expected at least one column. Received: header=[]")
    rows = [list(row) for row in rows]
    for i, row in enumerate(rows):
        if len(row) != len(header):
            raise ValueError(f"Expected rows of {len(header)} cells (the header's). Received: rows[{i}]={row!r}")

    def line(cells):
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(header), "|" + "---|" * len(header), *map(line, rows)]) + "\n"

"""Provides the default locations of the suite's offline mini datasets and user caches, and the
one way every command tries its output paths and opens its input files before any work."""

import contextlib
import os
import stat
import uuid

from mlperf_tf.errors import DataError, UserError

DATA_ENV = "MLPERF_TF_DATA"


def data_root() -> str:
    """The folder for generated datasets: `$MLPERF_TF_DATA`, default `~/.cache/mlperf_tf`."""
    return os.environ.get(DATA_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "mlperf_tf")


def user_flops_cache() -> str:
    """The user's FLOPs cache (plug-in benchmarks): `<data_root>/flops.json`, outside the package."""
    return os.path.join(data_root(), "flops.json")


def mini_data_dir(benchmark_name: str) -> str:
    """Where the `mini` preset of `benchmark_name` keeps its offline data by default."""
    return os.path.join(data_root(), f"{benchmark_name}-mini")


# ---- trying paths before any work ----------------------------------------------------------------
# As root (most containers and CI), `os.access` and permission bits say yes to everything, and
# `/proc/x` or `/sys/x` pass a "folder exists and is writable" test, then fail at the write. So a
# path is judged by trying it: create its folders, write a test file, remove what was created.


_PROBE = ".mlperf_tf_write_test_"


def _reason(error: OSError) -> str:
    where = error.filename
    if where and _PROBE in os.path.basename(str(where)):
        where = os.path.dirname(str(where))  # the folder, not the name of the test file
    where = f" ({where})" if where else ""
    return f"{error.strerror or error}{where}"


def _make_folders(folder: str) -> list[str]:
    """Creates `folder` and its missing parents; returns those created, outermost first."""
    missing = []
    probe = os.path.abspath(folder)
    while not os.path.lexists(probe):
        missing.append(probe)
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    created = []
    try:
        for path in reversed(missing):
            os.mkdir(path)
            created.append(path)
    except OSError:
        _remove_folders(created)
        raise
    return created


def _remove_folders(created: list[str]) -> None:
    for path in reversed(created):
        try:
            os.rmdir(path)
        except OSError:
            pass  # something else wrote into it meanwhile: leave it


@contextlib.contextmanager
def _trial_folders(folder: str, failure: str):
    """Creates `folder` and its missing parents for the body, and removes those it created
    afterwards, however the body ends: a tried path leaves no trace.

    Raises:
      UserError: `failure: <reason>` when a folder cannot be created.
    """
    try:
        created = _make_folders(folder)
    except OSError as e:
        raise UserError(f"{failure}: {_reason(e)}") from None
    try:
        yield
    finally:
        _remove_folders(created)


def _write_probe(folder: str) -> None:
    """Writes and removes a uniquely named file in `folder` (raises OSError if it cannot)."""
    probe = os.path.join(folder, f"{_PROBE}{os.getpid()}_{uuid.uuid4().hex[:8]}")
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, b"\0")
    finally:
        os.close(fd)
        try:
            os.remove(probe)
        except FileNotFoundError:
            pass


def try_output_dir(path: str, flag: str) -> None:
    """Proves that `path` can be a folder the command writes into: tried, not inspected.

    Creates the folder (and its parents), writes and removes a test file in it, then removes the
    folders it created, so the tree is as it was.

    Args:
      path: the folder.
      flag: the flag that named it, e.g. `--out` (it leads the error message).

    Raises:
      UserError: any `OSError` on the way (a file where a folder is needed, /proc, /sys, a
        read-only or full file system), as one line naming the flag, the path and the reason.
    """
    if not path:
        raise UserError(f"{flag}: no folder given")
    if os.path.lexists(path) and not os.path.isdir(path):
        raise UserError(f"{flag}={path!r} is a file, not a folder")
    with _trial_folders(path, f"{flag}={path!r}: cannot create the folder"):
        try:
            _write_probe(path)
        except OSError as e:
            raise UserError(f"{flag}={path!r}: cannot write in the folder: {_reason(e)}") from None


def try_output_file(path: str, flag: str) -> None:
    """Proves that the file `path` can be written: tried, not inspected.

    Creates its folder, writes and removes a sibling test file there, and opens an existing
    `path` for appending without writing (its content and times stay as they were); then removes
    the folders it created.

    Raises:
      UserError: `path` is a folder or a special file (a FIFO, a device), or any `OSError` on the
        way, as one line naming the flag, the path and the reason.
    """
    if not path:
        raise UserError(f"{flag}: no file given")
    if path.endswith(("/", os.sep)) or os.path.isdir(path):
        raise UserError(f"{flag}={path!r} is a folder; name a file")
    if os.path.lexists(path):
        try:
            info = os.stat(path)
        except OSError as e:
            raise UserError(f"{flag}={path!r}: cannot write: {_reason(e)}") from None
        if not stat.S_ISREG(info.st_mode):
            raise UserError(f"{flag}={path!r} is not a regular file (a FIFO, device or socket)")
    folder = os.path.dirname(os.path.abspath(path))
    with _trial_folders(folder, f"{flag}={path!r}: cannot create its folder"):
        try:
            _write_probe(folder)
            if os.path.exists(path):
                os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC))
        except OSError as e:
            raise UserError(f"{flag}={path!r}: cannot write: {_reason(e)}") from None


@contextlib.contextmanager
def _input_errors(path: str, flag: str, wrong_kind: type[OSError], wrong_kind_says: str):
    """Turns an `OSError` of reaching the input `path` into one `DataError` line naming `flag`:
    missing, of the wrong kind (`wrong_kind`, e.g. `IsADirectoryError` where a file is needed:
    the line says `wrong_kind_says`), or unreadable (the reason)."""
    try:
        yield
    except FileNotFoundError:
        raise DataError(f"{flag}={path!r} does not exist") from None
    except wrong_kind:
        raise DataError(f"{flag}={path!r} {wrong_kind_says}") from None
    except OSError as e:
        raise DataError(f"{flag}={path!r} cannot be read: {_reason(e)}") from None


def open_input(path: str, flag: str, *, binary: bool = False, encoding: str = "utf-8"):
    """Opens the regular file `path` for reading, or raises one line naming `flag`.

    The file is opened first and judged on what was opened (`fstat`), so a file that vanishes
    between a check and the open cannot slip through; a FIFO is opened without blocking and
    refused, as are devices (`/dev/zero` would never end) and folders.

    Raises:
      UserError: no path given.
      DataError (a UserError): missing, unreadable, a folder, or not a regular file.
    """
    if not path:
        raise UserError(f"{flag}: no file given")
    with _input_errors(path, flag, IsADirectoryError, "is a folder; name a file"):
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise DataError(f"{flag}={path!r} is a folder; name a file")
        if not stat.S_ISREG(mode):
            raise DataError(f"{flag}={path!r} is not a regular file (a FIFO, device or socket)")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    if binary:
        return os.fdopen(fd, "rb")
    return os.fdopen(fd, "r", encoding=encoding)


def read_input(path: str, flag: str, *, binary: bool = False, encoding: str = "utf-8"):
    """The whole content of the regular file `path` (see `open_input`).

    Raises:
      UserError / DataError: as `open_input`, or (DataError) a read that fails midway (the file vanished from a network
        file system, an I/O error) or text that is not `encoding`.
    """
    with open_input(path, flag, binary=binary, encoding=encoding) as f:
        try:
            return f.read()
        except OSError as e:
            raise DataError(f"{flag}={path!r} cannot be read: {_reason(e)}") from None
        except UnicodeDecodeError as e:
            raise DataError(f"{flag}={path!r} is not {encoding} text ({e.reason})") from None


def check_input_dir(path: str, flag: str) -> None:
    """Raises one line naming `flag` (a DataError: the input is missing or unreadable; a
    UserError for no path) unless `path` is a folder whose entries can be listed.

    Listing is tried (`os.scandir`), not inferred from permission bits.
    """
    if not path:
        raise UserError(f"{flag}: no folder given")
    with (
        _input_errors(path, flag, NotADirectoryError, "is not a folder"),
        os.scandir(path) as entries,
    ):
        next(entries, None)

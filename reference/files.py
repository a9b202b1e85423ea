"""Reading and writing a user's files: every failure is one line naming the file, what is wrong
and what was expected.

The loaders of each kind of file (configs and golden files here in reference/, traces, hardware
and measured summaries in sim/) read through these, so a missing file, a folder, an empty or
truncated file, a wrong encoding, JSON of the wrong shape or NaN/inf values all end in a
`FileError`, never a traceback. Output paths are checked with `check_output` before the work.
"""

from __future__ import annotations

import json
import math
import os
import zipfile
from pathlib import Path

import numpy as np


class FileError(ValueError):
    """A file that cannot be read as the kind of file expected (or written where asked)."""

    def __init__(self, path, problem: str, expected: str):
        self.path, self.problem, self.expected = str(path), problem, expected
        super().__init__(f"file {str(path)!r}: {problem}; expected {expected}")


def _existing(path, expected: str) -> Path:
    path = Path(path)
    if path.is_dir():
        raise FileError(path, "is a folder", expected)
    if not path.is_file():
        raise FileError(path, "does not exist", expected)
    return path


def read_bytes(path, expected: str) -> bytes:
    """The bytes of an existing, non-empty file."""
    path = _existing(path, expected)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise FileError(path, f"cannot be read ({e.strerror or e})", expected) from e
    if not data:
        raise FileError(path, "is empty", expected)
    return data


def read_text(path, expected: str) -> str:
    """The UTF-8 text of an existing, non-empty file."""
    data = read_bytes(path, expected)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FileError(path, f"is not UTF-8 text (byte {e.start})", expected) from e


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def parse_json(path, text: str, expected: str, kind: type | tuple = dict):
    """`text` of `path` as JSON whose top level is `kind` (NaN and Infinity refused)."""
    try:
        doc = json.loads(text, parse_constant=_no_constant)
    except ValueError as e:  # json.JSONDecodeError is one
        raise FileError(path, f"is not well-formed JSON ({e})", expected) from e
    if not isinstance(doc, kind):
        raise FileError(path, f"holds a JSON {_json_kind(doc)} at the top", expected)
    return doc


def read_json(path, expected: str, kind: type | tuple = dict):
    """An existing JSON file whose top level is `kind` (an object by default)."""
    return parse_json(path, read_text(path, expected), expected, kind)


def _json_kind(doc) -> str:
    return {dict: "object", list: "list", str: "string", bool: "true/false", type(None): "null"}.get(
        type(doc), "number")


def load_npz(path, expected: str, required: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
    """Every array of an existing `.npz` (no pickled objects), holding at least `required`."""
    path = _existing(path, expected)
    if path.stat().st_size == 0:
        raise FileError(path, "is empty", expected)
    try:
        f = np.load(path, allow_pickle=False)
        if not isinstance(f, np.lib.npyio.NpzFile):
            raise FileError(path, "is a single .npy array, not an .npz archive", expected)
        with f:
            data = {k: f[k] for k in f.files}
    except FileError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as e:
        raise FileError(path, f"is not a readable .npz archive ({type(e).__name__}: {e})", expected) from e
    missing = [k for k in required if k not in data]
    if missing:
        raise FileError(path, f"lacks the array(s) {', '.join(missing)}", expected)
    return data


def json_of_array(path, data: dict, key: str, expected: str, kind: type | tuple = dict):
    """The JSON text stored as the 0-d string array `key` of an .npz, parsed."""
    value = data[key]
    if value.ndim != 0 or value.dtype.kind != "U":
        raise FileError(path, f"holds '{key}' as a {value.dtype} array of shape {value.shape}, not JSON text",
                        expected)
    try:
        doc = json.loads(str(value), parse_constant=_no_constant)
    except ValueError as e:
        raise FileError(path, f"holds '{key}' that is not well-formed JSON ({e})", expected) from e
    if not isinstance(doc, kind):
        raise FileError(path, f"holds '{key}' as a JSON {_json_kind(doc)}", expected)
    return doc


def json_text(doc, **kwargs) -> str:
    """`doc` as JSON text these loaders read back: a NaN or infinity (a kernel's error against an
    output it left garbage, say) written as null, not as a bare token JSON does not allow."""
    return json.dumps(_finite_or_null(doc), allow_nan=False, **kwargs)


def _finite_or_null(doc):
    if isinstance(doc, float):
        return doc if math.isfinite(doc) else None
    if isinstance(doc, dict):
        return {k: _finite_or_null(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [_finite_or_null(v) for v in doc]
    return doc


def finite(path, name: str, values, expected: str) -> None:
    """Refuse NaN or inf in `values` (an array or a number) of `path`."""
    a = np.asarray(values)
    if a.dtype.kind in "fc" and not np.isfinite(a).all():
        bad = int((~np.isfinite(a)).sum())
        raise FileError(path, f"holds {bad} NaN or infinite value(s) in '{name}'", expected)


def finite_number(value) -> bool:
    """A real, finite number (a bool is not one)."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def check_output(path, suffixes: tuple[str, ...] = ()) -> Path:
    """Refuse, before any work, an output path that cannot be written: a folder, a wrong suffix,
    a missing or read-only folder to write it in."""
    path = Path(path)
    expected = "a file path" + (f" ending in {' or '.join(suffixes)}" if suffixes else "") + \
        " in an existing, writable folder"
    if suffixes and not path.name.endswith(suffixes):
        raise FileError(path, "has the wrong suffix", expected)
    if path.is_dir():
        raise FileError(path, "is a folder", expected)
    folder = path.parent
    if not folder.is_dir():
        raise FileError(path, f"is in folder {str(folder)!r}, which does not exist", expected)
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise FileError(path, "cannot be written (no permission)", expected)
    return path

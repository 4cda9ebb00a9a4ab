"""The package installs offline and its code is Python 3.9's.

No daemon is needed: ``pip install ./clients/python`` into a fresh virtual
environment with no package index (the build backend is the package's own,
standard library only), and every source file parses with Python 3.9's
grammar.
"""

from __future__ import annotations

import ast
import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
import zipfile
from typing import List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "_build"))

import esf_build  # noqa: E402


def sources() -> List[str]:
    out = []
    for d in ("esf", "examples", "tests", "_build"):
        for n in sorted(os.listdir(os.path.join(ROOT, d))):
            if n.endswith(".py"):
                out.append(os.path.join(ROOT, d, n))
    return out


def pip_version() -> Tuple[int, ...]:
    """This interpreter's pip version, () without one."""
    r = subprocess.run([sys.executable, "-m", "pip", "--version"], stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL, timeout=120)
    m = re.match(r"pip (\d+)\.(\d+)", r.stdout.decode())
    return (int(m.group(1)), int(m.group(2))) if r.returncode == 0 and m else ()


class TestPackaging(unittest.TestCase):
    def tmpdir(self) -> str:
        d = tempfile.mkdtemp(prefix="esf-py-pkg-")
        self.addCleanup(shutil.rmtree, d, True)
        return d

    def test_python39_grammar(self) -> None:
        files = sources()
        self.assertGreater(len(files), 8)
        for p in files:
            with open(p, encoding="utf-8") as f:
                src = f.read()
            with self.subTest(file=os.path.relpath(p, ROOT)):
                ast.parse(src, p, feature_version=(3, 9))

    def test_wheel_holds_the_package_and_a_valid_record(self) -> None:
        d = self.tmpdir()
        name = esf_build.build_wheel(d)
        self.assertEqual(name, "esf-0.1.0-py3-none-any.whl")
        with zipfile.ZipFile(os.path.join(d, name)) as z:
            names = set(z.namelist())
            for want in ("esf/__init__.py", "esf/client.py", "esf/py.typed",
                         "esf-0.1.0.dist-info/METADATA", "esf-0.1.0.dist-info/WHEEL"):
                self.assertIn(want, names)
            record = z.read("esf-0.1.0.dist-info/RECORD").decode().splitlines()
            listed = set()
            for line in record:
                path, digest, size = line.rsplit(",", 2)
                listed.add(path)
                if path.endswith("/RECORD"):
                    continue
                data = z.read(path)
                h = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                self.assertEqual((digest, int(size)), ("sha256=" + h, len(data)), path)
            self.assertEqual(listed, names)
            meta = z.read("esf-0.1.0.dist-info/METADATA").decode()
            self.assertIn("Requires-Python: >=3.9", meta)
        sd = esf_build.build_sdist(d)
        self.assertEqual(sd, "esf-0.1.0.tar.gz")

    def test_pip_install_offline(self) -> None:
        venv = os.path.join(self.tmpdir(), "venv")
        py = os.path.join(venv, "bin", "python")
        env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
                   PIP_NO_CACHE_DIR="1")
        env.pop("PIP_FIND_LINKS", None)
        env.pop("PYTHONPATH", None)
        # This interpreter's pip installs into the environment (--python,
        # pip 22.3 and later), or else the environment gets a pip of its
        # own (slower: ensurepip).
        own_pip = pip_version() < (22, 3)
        r = subprocess.run([sys.executable, "-m", "venv", *([] if own_pip else ["--without-pip"]), venv],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout.decode())
        pip = [py, "-m", "pip"] if own_pip else [sys.executable, "-m", "pip", "--python", py]
        r = subprocess.run([*pip, "install", "--no-index", ROOT], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, env=env, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout.decode())
        # From elsewhere, so that the source tree is not what is imported.
        r = subprocess.run([py, "-c", "import esf, os; print(esf.__version__); "
                                      "print(os.path.isfile(os.path.join(os.path.dirname(esf.__file__), 'py.typed'))); "
                                      "print(esf.__file__)"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                           cwd=self.tmpdir(), timeout=60)
        out = r.stdout.decode().split()
        self.assertEqual(r.returncode, 0, r.stdout.decode())
        self.assertEqual(out[:2], ["0.1.0", "True"])
        self.assertTrue(out[2].startswith(venv), out[2])


if __name__ == "__main__":
    unittest.main()

"""The esf client against a real esfd (with runc).

Run from clients/python with ESF_SOCKET naming a running daemon:

    ESF_SOCKET=/var/lib/esf/esfd.sock python3 -m unittest discover -s tests -v

make test runs them through e2e/python_test.go (TestPython_Client), which
starts esfd on a fresh state dir with --max-attempts and a TLS network
listener, and sets ESF_TEST_MAX_ATTEMPTS, ESF_TEST_HOST, ESF_TEST_TOKEN_FILE
and ESF_TEST_CACERT for the tests of the quota and of https. Without
ESF_SOCKET everything is skipped (unless ESF_TEST_REQUIRE is set: then that
fails). The tests share the daemon and run one at a time; each one releases
its attempts, so the quota is free at its start.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import unittest
from typing import Callable, Dict, List, Optional, Tuple
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import esf  # noqa: E402
from esf import errors as esf_errors  # noqa: E402

SOCKET = os.environ.get("ESF_SOCKET", "")
MAX_ATTEMPTS = int(os.environ.get("ESF_TEST_MAX_ATTEMPTS", "0") or 0)
HOST = os.environ.get("ESF_TEST_HOST", "")
TOKEN_FILE = os.environ.get("ESF_TEST_TOKEN_FILE", "")
CACERT = os.environ.get("ESF_TEST_CACERT", "")
REQUIRE = os.environ.get("ESF_TEST_REQUIRE", "") != ""
BUSYBOX = shutil.which("busybox") or "/bin/busybox"
TRACE = re.compile(r"^[0-9a-f]{32}$")
NO_SUCH_NODE = "node_" + "0" * 26


def need(cond: bool, why: str) -> None:
    if not cond:
        if REQUIRE:
            raise AssertionError(f"required by ESF_TEST_REQUIRE: {why}")
        raise unittest.SkipTest(why)


def wait_until(what: str, cond: Callable[[], bool], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def image_tar(extra: Optional[Dict[str, bytes]] = None) -> bytes:
    """A root with a static busybox and its applets under /bin (and the
    files of extra; executable when named *.wasm)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for d in ("bin", "etc", "tmp", "work"):
            ti = tarfile.TarInfo(d)
            ti.type, ti.mode = tarfile.DIRTYPE, 0o755
            tf.addfile(ti)
        with open(BUSYBOX, "rb") as f:
            data = f.read()
        ti = tarfile.TarInfo("bin/busybox")
        ti.size, ti.mode = len(data), 0o755
        tf.addfile(ti, io.BytesIO(data))
        for applet in ("sh", "cat", "echo", "sleep", "ps", "tr", "wc", "head", "true", "stty"):
            ti = tarfile.TarInfo("bin/" + applet)
            ti.type, ti.linkname = tarfile.SYMTYPE, "busybox"
            tf.addfile(ti)
        for name, content in (extra or {}).items():
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode = len(content), 0o755 if name.endswith(".wasm") else 0o644
            tf.addfile(ti, io.BytesIO(content))
    return buf.getvalue()


def _uleb(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _vec(*items: bytes) -> bytes:
    return _uleb(len(items)) + b"".join(items)


def _name(s: str) -> bytes:
    return _uleb(len(s)) + s.encode()


def _section(sid: int, content: bytes) -> bytes:
    return bytes([sid]) + _uleb(len(content)) + content


def exit_module(code: int) -> bytes:
    """A WASI command that calls proc_exit(code) at once (0 <= code < 64),
    as wasi/wasitest.ExitModule."""
    body = b"\x00" + b"\x41" + bytes([code]) + b"\x10\x00" + b"\x0b"
    return (b"\x00asm\x01\x00\x00\x00"
            + _section(1, _vec(b"\x60\x01\x7f\x00", b"\x60\x00\x00"))
            + _section(2, _vec(_name("wasi_snapshot_preview1") + _name("proc_exit") + b"\x00\x00"))
            + _section(3, _vec(b"\x01"))
            + _section(5, _vec(b"\x00\x01"))
            + _section(7, _vec(_name("_start") + b"\x00\x01", _name("memory") + b"\x02\x00"))
            + _section(10, _vec(_uleb(len(body)) + body)))


class DaemonTest(unittest.TestCase):
    c: esf.Client

    @classmethod
    def setUpClass(cls) -> None:
        need(SOCKET != "", "ESF_SOCKET names no daemon")
        cls.c = esf.Client(socket=SOCKET)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.c.close()

    def tmpdir(self) -> str:
        d = tempfile.mkdtemp(prefix="esf-py-")
        self.addCleanup(shutil.rmtree, d, True)
        return d

    def tree_dir(self, files: Dict[str, str]) -> str:
        d = self.tmpdir()
        for name, content in files.items():
            p = os.path.join(d, name)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w") as f:
                f.write(content)
        return d

    def group(self, files: Optional[Dict[str, str]] = None) -> esf.CreateGroupResult:
        return self.c.create_group(self.tree_dir(files or {"README": "hello\n"}))

    def sealed_child(self, parent: esf.Node, files: Dict[str, str], **suspend: object) -> esf.Node:
        """A child of parent with files written into its attempt's root (executor none)."""
        kid = self.c.fork(parent)[0]
        with self.c.activate(kid) as a:
            for name, content in files.items():
                with open(os.path.join(a.root, name), "w") as f:
                    f.write(content)
            return a.suspend(**suspend)


class TestDaemon(DaemonTest):
    def test_status_fsck_gc(self) -> None:
        self.group()
        st = self.c.status()
        self.assertIsInstance(st, esf.Status)
        self.assertGreater(st.objects, 0)
        self.assertTrue(st.state_dir)
        fs = self.c.fsck()
        self.assertEqual(fs.bad, [])
        self.assertGreater(fs.checked, 0)
        rep = self.c.gc(dry_run=True)
        self.assertTrue(rep.dry_run)
        self.assertGreater(rep.examined, 0)
        self.assertFalse(self.c.gc().dry_run)
        with self.assertRaises(ValueError):
            self.c.gc(remote=True, remote_grace=0)
        if st.remote is None:
            # Without a remote store the remote forms are refused by esfd.
            with self.assertRaises(esf.FailedPrecondition):
                self.c.gc(remote=True, dry_run=True)
        else:
            self.assertIsInstance(st.remote, esf.RemoteStatus)
            self.assertTrue(st.remote.location)
            self.assertIn(st.remote.durability, ("sync", "async"))
            rfs = self.c.fsck(remote=True)
            self.assertEqual((rfs.bad, rfs.missing), ([], []))
            rep = self.c.gc(remote=True, remote_grace=3600, dry_run=True)
            self.assertIsInstance(rep.remote, esf.RemoteCollectReport)


    def test_workers(self) -> None:
        ws = self.c.workers()
        self.assertIsInstance(ws, esf.Workers)
        self.assertFalse(ws.fenced)
        [w] = ws.workers  # a daemon without a shared graph is its only worker
        self.assertTrue(w.id)
        self.assertTrue(w.self_)
        self.assertEqual(w.capacity, MAX_ATTEMPTS)
        g = self.group()
        with self.c.activate(self.c.fork(g.node)[0], worker=w.id) as a:
            self.assertEqual(a.state, "active")
            self.assertGreaterEqual(self.c.workers().workers[0].live, 1)


class TestGraph(DaemonTest):
    def test_create_group_from_dir_tar_and_root(self) -> None:
        src = self.tree_dir({"a.txt": "A\n"})
        g = self.c.create_group(src, logical_state={"step": 0},
                                policy={"budget": 3})
        self.assertTrue(g.group.group_id.startswith("grp_"))
        self.assertEqual(g.group.generation, 1)
        self.assertEqual(g.group.canonical_node_id, g.node.node_id)
        self.assertEqual(g.group.policy, {"budget": 3})
        self.assertEqual(g.node.status, "sealed")
        self.assertEqual(g.node.logical_state, {"step": 0})
        self.assertEqual(g.node.provenance.op, "create_group")
        self.assertEqual(len(g.node.root_id), 64)
        view = self.c.group(g.group)
        self.assertIsInstance(view, esf.GroupView)
        self.assertEqual((view.nodes, view.generation), (1, 1))

        imp = self.c.import_source(src)  # stored already: nothing new
        self.assertEqual((imp.root_id, imp.files, imp.new_objects, imp.skipped), (g.node.root_id, 1, 0, []))
        rel = self.c.create_group(os.path.relpath(self.tree_dir({"a.txt": "A\n"})))
        self.assertTrue(os.path.isabs(rel.node.provenance.source))
        same = self.c.create_group(root_id=g.node.root_id)
        self.assertEqual(same.node.root_id, g.node.root_id)
        self.assertNotEqual(same.group.group_id, g.group.group_id)

        fromtar = self.c.create_group(tar=image_tar({"work/task": b"42\n"}))
        out = io.BytesIO()
        self.c.export(fromtar.node, out, "tar")
        with tarfile.open(fileobj=io.BytesIO(out.getvalue())) as tf:
            f = tf.extractfile("./work/task")
            self.assertIsNotNone(f)
            assert f is not None
            self.assertEqual(f.read(), b"42\n")
        with self.assertRaises(esf.InvalidArgument):
            self.c.create_group()
        # A tar streamed from a path and from a file: the same root.
        tar_path = os.path.join(self.tmpdir(), "img.tar")
        with open(tar_path, "wb") as w:
            w.write(image_tar({"work/task": b"42\n"}))
        by_path = self.c.import_tar(tar_path)
        with open(tar_path, "rb") as r:
            self.assertEqual(self.c.import_tar(r).root_id, by_path.root_id)
        self.assertEqual(by_path.root_id, fromtar.node.root_id)
        with self.assertRaises(esf.InvalidArgument):
            self.c.import_tar(os.path.join(self.tmpdir(), "missing.tar"))

    def test_group_name(self) -> None:
        name = f"py-named-{time.time_ns()}"
        g = self.c.create_group(self.tree_dir({"n": "1\n"}), name=name)
        self.assertEqual(g.group.name, name)
        self.assertEqual(self.c.group(g.group).name, name)
        self.assertEqual(self.c.tree(g.group).group.name, name)
        self.assertEqual(self.group().group.name, "")
        with self.assertRaises(esf.Conflict):  # names are unique in the graph
            self.c.create_group(root_id=g.node.root_id, name=name)
        with self.assertRaises(esf.InvalidArgument):
            self.c.create_group(root_id=g.node.root_id, name="no spaces")

    def test_fork_inspect_tree_prune(self) -> None:
        g = self.group()
        kids = self.c.fork(g.node, n=3, logical_state={"phase": "explore"})
        self.assertEqual(len(kids), 3)
        for k in kids:
            self.assertEqual((k.status, k.parents, k.root_id), ("draft", [g.node.node_id], g.node.root_id))
            self.assertEqual(k.logical_state, {"phase": "explore"})
        with self.c.activate(kids[0]) as a:
            with open(os.path.join(a.root, "f"), "w") as f:
                f.write("x")
            grand = a.suspend()
        self.assertEqual(grand.node_id, kids[0].node_id)  # a draft seals in place
        gk = self.c.fork(grand, n=1)[0]
        view = self.c.node(gk)
        self.assertIsInstance(view, esf.NodeView)
        self.assertEqual(view.ancestry, [kids[0].node_id, g.node.node_id])
        self.assertEqual(self.c.node(g.node).children, [k.node_id for k in kids])
        insp = self.c.inspect(g.group.group_id)
        self.assertEqual(insp.kind, "group")
        assert insp.group is not None
        self.assertEqual(insp.group.nodes, 5)

        tree = self.c.tree(g.group)
        self.assertEqual(len(tree.nodes), 5)
        root = tree.root
        self.assertEqual(root.node.node_id, g.node.node_id)
        self.assertEqual([c.node.node_id for c in root.children], [k.node_id for k in kids])
        self.assertEqual([c.node.node_id for c in root.children[0].children], [gk.node_id])
        self.assertEqual(len(list(root.walk())), 5)

        self.assertEqual(sorted(self.c.prune(kids[0])), sorted([kids[0].node_id, gk.node_id]))
        self.assertEqual(self.c.node(gk).status, "pruned")
        with self.assertRaises(esf.FailedPrecondition):
            self.c.prune(g.node)  # the root and canonical node
        with self.assertRaises(esf.FailedPrecondition):
            self.c.fork(kids[1])  # a draft
        with self.assertRaises(esf.InvalidArgument):
            self.c.fork(g.node, n=10001)

    def test_promote_with_expected_generation(self) -> None:
        g = self.group()
        a = self.sealed_child(g.node, {"a": "1"})
        b = self.sealed_child(g.node, {"b": "2"})
        g2 = self.c.promote(g.group, a, expected_generation=1)
        self.assertEqual((g2.generation, g2.canonical_node_id), (2, a.node_id))
        with self.assertRaises(esf.StaleGeneration) as cm:
            self.c.promote(g.group, b, expected_generation=1)
        self.assertEqual(cm.exception.code, "stale_generation")
        self.assertEqual(cm.exception.status, 409)
        self.assertEqual(self.c.group(g.group).canonical_node_id, a.node_id)

    def test_evaluate_backprop_and_evidence(self) -> None:
        g = self.group()
        k1 = self.sealed_child(g.node, {"one": "1"})
        k2 = self.sealed_child(k1, {"two": "2"})
        log = b"test log: 3 passed at %d\n" % time.time_ns()
        ev = self.c.put_evidence(log)
        self.assertEqual((len(ev.id), ev.size), (64, len(log)))
        self.assertTrue(ev.new)
        self.assertFalse(self.c.put_evidence(log).new)
        e = self.c.evaluate(k2, "tests@1", 0.75, verdict="pass", evidence=[ev.id], backprop=True)
        self.assertEqual((e.evaluator, e.evaluator_version, e.reward, e.backprop), ("tests", "1", 0.75, True))
        self.assertEqual(e.evidence, [ev.id])
        self.c.evaluate(k1, "tests@1", 0.25, backprop=True)
        self.c.evaluate(k2, "lint@1", 1.0)  # no backprop: statistics unchanged
        tree = self.c.tree(g.group)
        stats = {n.node_id: (n.visits, n.value) for n in tree.nodes}
        self.assertEqual(stats[k2.node_id], (1, 0.75))
        self.assertEqual(stats[k1.node_id], (2, 1.0))
        self.assertEqual(stats[g.node.node_id], (2, 1.0))
        self.assertEqual(tree.rewards[k2.node_id], 1.0)  # the newest evaluation
        self.assertEqual(len(self.c.node(k2).evaluations), 2)
        term = self.c.evaluate(k2, "tests@2", 1.0, terminal=True)
        self.assertTrue(term.terminal)
        self.assertEqual(self.c.node(k2).status, "terminal")
        with self.assertRaises(esf.InvalidArgument):
            self.c.evaluate(k1, "no-version", 1.0)

    def test_merge_and_conflict_paths(self) -> None:
        g = self.group({"base.txt": "base\n"})
        a = self.sealed_child(g.node, {"a.txt": "A\n"})
        b = self.sealed_child(g.node, {"b.txt": "B\n"})
        m = self.c.merge([a, b], logical_state={"merged": True})
        self.assertEqual(sorted(m.node.parents), sorted([a.node_id, b.node_id]))
        self.assertEqual(m.node.status, "sealed")
        self.assertEqual(m.base, g.node.node_id)  # the lowest common ancestor
        d = self.c.diff(g.node, m.node)
        self.assertEqual(sorted(c.path for c in d.changes if c.kind == "added"), ["a.txt", "b.txt"])
        m2 = self.c.merge([a, b], promote=True, expected_generation=1)
        assert m2.group is not None
        self.assertEqual(m2.group.generation, 2)

        x = self.sealed_child(g.node, {"base.txt": "x\n"})
        y = self.sealed_child(g.node, {"base.txt": "y\n"})
        with self.assertRaises(esf.Conflict) as cm:
            self.c.merge([x, y])
        self.assertEqual(cm.exception.paths, ["base.txt"])
        self.assertEqual(cm.exception.code, "conflict")

    def test_export_drops_privileged(self) -> None:
        need(os.geteuid() == 0, "a setuid file in the tree needs root")
        src = self.tree_dir({"tool": "#!/bin/sh\n", "plain": "x\n"})
        os.chmod(os.path.join(src, "tool"), 0o4755)
        g = self.c.create_group(src)
        out = os.path.join(self.tmpdir(), "out")
        r = self.c.export(g.node, out)
        self.assertEqual(r.dropped, esf.Dropped(setid=1, paths=["tool"]))
        self.assertEqual(os.stat(os.path.join(out, "tool")).st_mode & 0o7777, 0o755)
        for preserve, want in ((False, 0o755), (True, 0o4755)):
            buf = io.BytesIO()
            t = self.c.export(g.node, buf, "tar", preserve_privileged=preserve)
            self.assertEqual(t.dropped, esf.Dropped() if preserve else esf.Dropped(setid=1, paths=["tool"]))
            with tarfile.open(fileobj=io.BytesIO(buf.getvalue())) as tf:
                self.assertEqual(tf.getmember("./tool").mode, want)
        with self.assertRaises(esf.InvalidArgument):
            self.c.export(g.node, io.BytesIO(), "patch", base=g.node, preserve_privileged=True)

    def test_diff_export_and_provenance(self) -> None:
        g = self.group({"keep.txt": "keep\n", "old.txt": "old\n"})
        kid = self.c.fork(g.node)[0]
        with self.c.activate(kid) as a:
            with open(os.path.join(a.root, "new.txt"), "w") as f:
                f.write("new\n")
            os.remove(os.path.join(a.root, "old.txt"))
            node = a.suspend()
        self.c.evaluate(node, "review@1", 1.0, verdict="ok")
        d = self.c.diff(g.node, node)
        self.assertEqual({(c.path, c.kind) for c in d.changes if c.path},
                         {("new.txt", "added"), ("old.txt", "deleted")})
        self.assertEqual((d.a, d.b), (g.node.root_id, node.root_id))

        out = os.path.join(self.tmpdir(), "out")
        r = self.c.export(node, out)
        self.assertEqual(r.format, "dir")
        self.assertEqual(sorted(os.listdir(out)), ["keep.txt", "new.txt"])
        self.assertTrue(os.path.exists(r.provenance))
        self.assertEqual(r.record.node_id, node.node_id)
        self.assertEqual(r.record.ancestry, [g.node.node_id])
        self.assertEqual(r.record.parents, [g.node.node_id])
        self.assertGreaterEqual(r.record.version, 1)
        assert r.record.origin is not None and r.record.attempt is not None
        self.assertEqual(r.record.origin.op, "seal")
        self.assertEqual(r.record.attempt.attempt_id, a.attempt_id)
        self.assertEqual([e.evaluator for e in r.record.evaluations], ["review"])
        rep = self.c.verify_provenance(r.record)
        self.assertTrue(rep.valid, rep.problems)
        with open(r.provenance, "rb") as f:
            self.assertTrue(self.c.verify_provenance(f.read()).valid)
        forged = dict(r.record.raw)
        forged["node_id"] = kid.node_id if kid.node_id != node.node_id else g.node.node_id
        bad = self.c.verify_provenance(forged)
        self.assertFalse(bad.valid)
        self.assertTrue(bad.problems)

        tar_path = os.path.join(self.tmpdir(), "node.tar")
        t = self.c.export(node, tar_path, "tar")
        self.assertEqual(t.root_id, node.root_id)
        with tarfile.open(tar_path) as tf:
            self.assertIn("./new.txt", tf.getnames())
        self.assertEqual(t.record.export.get("format"), "tar")
        self.assertTrue(self.c.verify_provenance(t.record).valid)
        with open(tar_path + ".provenance.json") as f:
            self.assertEqual(json.load(f)["mac"], t.record.mac)

        buf = io.BytesIO()
        p = self.c.export(node, buf, "patch", base=g.node)
        patch = buf.getvalue().decode()
        self.assertIn("new.txt", patch)
        self.assertIn("old.txt", patch)
        self.assertEqual(p.record.export.get("base"), g.node.node_id)
        self.assertEqual(p.bytes, len(buf.getvalue()))
        with self.assertRaises(esf.NotFound):
            self.c.export(NO_SUCH_NODE, io.BytesIO(), "tar")

    def test_mount_read_only(self) -> None:
        g = self.group({"seen.txt": "through the mount\n"})
        d = self.tmpdir()
        m = self.c.mount(g.node, d)
        try:
            self.assertEqual(m.root_id, g.node.root_id)
            with open(os.path.join(d, "seen.txt")) as f:
                self.assertEqual(f.read(), "through the mount\n")
        finally:
            self.c.umount(d)
        self.assertEqual(os.listdir(d), [])

        rw = self.c.mount(g.node, d, rw=True)
        assert rw.attempt is not None
        with open(os.path.join(d, "written.txt"), "w") as f:
            f.write("through an rw mount\n")
        node = self.c.suspend(rw.attempt, keep_running=True).node
        self.c.umount(d)  # releases the attempt
        self.assertEqual(self.c.attempt(rw.attempt.attempt_id).state, "released")
        self.assertIn("written.txt", [c.path for c in self.c.diff(g.node, node).changes])


class TestAttempts(DaemonTest):
    def test_context_manager_releases_unless_sealed(self) -> None:
        g = self.group()
        kid = self.c.fork(g.node)[0]
        with self.c.activate(kid, ttl_ms=60000) as a:
            self.assertEqual(a.state, "active")
            self.assertTrue(a.attempt_id.startswith("att_"))
            assert a.lease is not None
            self.assertEqual(a.lease.ttl_ms, 60000)
            with open(os.path.join(a.root, "scratch"), "w") as f:
                f.write("dropped")
        self.assertEqual(a.state, "released")
        self.assertEqual(self.c.attempt(a.attempt_id).state, "released")
        self.assertEqual(self.c.node(kid).status, "draft")  # nothing sealed

        with self.c.activate(kid) as b:
            node = b.suspend()
            self.assertEqual((b.state, b.result_node_id), ("released", node.node_id))
        self.assertEqual(node.status, "sealed")
        self.assertEqual(self.c.node(kid).attempts, [a.attempt_id, b.attempt_id])

        # An exception inside the block still releases.
        with self.assertRaises(RuntimeError):
            with self.c.activate(node) as c:
                raise RuntimeError("the rollout failed")
        self.assertEqual(self.c.attempt(c.attempt_id).state, "released")

    def test_labels_kept_with_the_attempt_and_its_provenance(self) -> None:
        g = self.group()
        kid = self.c.fork(g.node)[0]
        labels = {"rollout": "17", "policy": "uniform@1"}
        with self.c.activate(kid, labels=labels) as a:
            self.assertEqual(a.labels, labels)
            self.assertEqual(self.c.attempt(a).labels, labels)
            node = a.suspend()
        r = self.c.export(node, os.path.join(self.tmpdir(), "out"))
        assert r.record.attempt is not None
        self.assertEqual(r.record.attempt.labels, labels)
        self.assertTrue(self.c.verify_provenance(r.record).valid)
        with self.assertRaises(esf.InvalidArgument):
            self.c.activate(kid, labels={"": "empty key"})

    def test_suspend_keep_running_renew_retry(self) -> None:
        g = self.group()
        kid = self.c.fork(g.node)[0]
        with self.c.activate(kid) as a:
            with open(os.path.join(a.root, "step"), "w") as f:
                f.write("1")
            first = a.suspend(keep_running=True, logical_state={"step": 1})
            self.assertEqual(a.state, "active")
            self.assertEqual((first.node_id, first.logical_state), (kid.node_id, {"step": 1}))
            with open(os.path.join(a.root, "step"), "w") as f:
                f.write("2")
            second = a.suspend(keep_running=True, logical_state={"step": 2})
            self.assertEqual(second.parents, [first.node_id])
            self.assertEqual(second.provenance.op, "seal")
            assert a.lease is not None
            before = a.lease
            renewed = a.renew(ttl_ms=120000)
            self.assertEqual((renewed.lease_id, renewed.ttl_ms), (before.lease_id, 120000))
            with self.assertRaises(esf.StaleGeneration):
                self.c.renew(before.lease_id, before.token + 1)
            with self.assertRaises(esf.StaleGeneration):
                self.c.suspend(a, token=before.token + 1)
        self.assertEqual(a.state, "released")
        with self.c.retry(a) as r:
            self.assertEqual((r.retry_of, r.node_id, r.state), (a.attempt_id, kid.node_id, "active"))
        with self.c.activate(kid) as live:
            with self.assertRaises(esf.FailedPrecondition):
                self.c.retry(live)  # only an ended attempt is retried


class TestErrors(DaemonTest):
    def test_one_class_per_code(self) -> None:
        want = {"invalid_argument": esf.InvalidArgument, "unauthenticated": esf.Unauthenticated,
                "not_found": esf.NotFound, "conflict": esf.Conflict,
                "stale_generation": esf.StaleGeneration, "failed_precondition": esf.FailedPrecondition,
                "quota_exceeded": esf.QuotaExceeded, "internal": esf.Internal, "corrupt": esf.Corrupt,
                "unsupported": esf.Unsupported, "unavailable": esf.Unavailable,
                "deadline_exceeded": esf.DeadlineExceeded}
        for code, cls in want.items():
            e = esf_errors.make_error(code, "m", trace_id="t")
            self.assertIs(type(e), cls)
            self.assertIsInstance(e, esf.Error)
            self.assertEqual((e.code, e.message, e.trace_id), (code, "m", "t"))
        e = esf_errors.make_error("brand_new", "m")
        self.assertEqual((type(e), e.code), (esf.Error, "brand_new"))

    def test_errors_from_the_daemon(self) -> None:
        with self.assertRaises(esf.NotFound) as nf:
            self.c.inspect(NO_SUCH_NODE)
        self.assertRegex(nf.exception.trace_id, TRACE)
        self.assertEqual(nf.exception.status, 404)
        self.assertIn(NO_SUCH_NODE, nf.exception.message)
        with self.assertRaises(esf.InvalidArgument):
            self.c.inspect("bogus")
        with self.assertRaises(esf.Unsupported):
            self.c.activate(self.group().node, "vmware")
        gone = esf.Client(socket=os.path.join(self.tmpdir(), "no.sock"), retries=1, backoff=0.001)
        with self.assertRaises(esf.Unavailable) as un:
            gone.status()
        self.assertRegex(un.exception.trace_id, TRACE)
        self.assertEqual(un.exception.status, 0)


class TestCorrupt(DaemonTest):
    def test_corrupt_content_is_refused(self) -> None:
        g = self.group()
        content = ("precious %d\n" % time.time_ns()).encode() * 100
        node = self.sealed_child(g.node, {"precious.txt": content.decode()})
        [change] = [c for c in self.c.diff(g.node, node).changes if c.path == "precious.txt"]
        assert change.new is not None
        blob = str(change.new["id"])
        path = os.path.join(self.c.status().state_dir, "cas", "objects", blob[:2], blob[2:])
        with open(path, "rb") as f:
            good = f.read()
        mode = os.stat(path).st_mode & 0o777

        def restore() -> None:
            os.chmod(path, 0o644)
            with open(path, "wb") as w:
                w.write(good)
            os.chmod(path, mode)
        self.addCleanup(restore)
        bad = bytearray(good)
        bad[len(bad) // 3] ^= 0x20
        os.chmod(path, 0o644)
        with open(path, "wb") as w:
            w.write(bytes(bad))

        self.assertEqual(self.c.fsck().bad, [blob])
        with self.assertRaises(esf.Corrupt) as cm:
            self.c.export(node, io.BytesIO(), "tar")
        self.assertEqual(cm.exception.code, "corrupt")
        self.assertRegex(cm.exception.trace_id, TRACE)
        out = os.path.join(self.tmpdir(), "node.tar")
        with self.assertRaises(esf.Corrupt):
            self.c.export(node, out, "tar")
        self.assertFalse(os.path.exists(out))  # no truncated tar left behind


class DroppingProxy:
    """A unix-socket proxy in front of esfd that can lose replies: it
    forwards a request, waits until the daemon answers, and then closes the
    client's connection without passing the answer on."""

    def __init__(self, upstream: str, path: str) -> None:
        self.upstream = upstream
        self.path = path
        self.drops = 0
        self.hold = False  # swallow replies and keep the connection open
        self.requests = 0
        self.sent: List[bytearray] = []  # what each connection sent up
        self.lock = threading.Lock()
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(path)
        self.srv.listen(16)
        self.conns: List[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.srv.close()
        with self.lock:
            for s in self.conns:
                try:
                    s.close()
                except OSError:
                    pass

    def cut(self) -> None:
        """Break every connection open now (the daemon stays up)."""
        with self.lock:
            conns, self.conns = self.conns, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.srv.accept()
            except OSError:
                return
            u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            u.connect(self.upstream)
            with self.lock:
                self.conns += [c, u]
            threading.Thread(target=self._up, args=(c, u), daemon=True).start()
            threading.Thread(target=self._down, args=(c, u), daemon=True).start()

    def _up(self, c: socket.socket, u: socket.socket) -> None:
        sent = bytearray()
        with self.lock:
            self.sent.append(sent)
        try:
            while True:
                b = c.recv(65536)
                if not b:
                    break
                with self.lock:
                    self.requests += b.count(b" HTTP/1.1\r\n")
                    sent += b
                u.sendall(b)
        except OSError:
            pass
        finally:
            try:
                u.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def _down(self, c: socket.socket, u: socket.socket) -> None:
        try:
            while True:
                b = u.recv(65536)
                if not b:
                    break
                with self.lock:
                    drop = self.drops > 0
                    if drop:
                        self.drops -= 1
                if drop:
                    break
                if not self.hold:
                    c.sendall(b)
        except OSError:
            pass
        finally:
            # shutdown, not only close: the other pump is blocked reading
            # these sockets, and a close alone would not end the connection.
            for s in (c, u):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()


class TestIdempotency(DaemonTest):
    def test_callers_key_replays_the_first_result(self) -> None:
        g = self.group()
        key = f"py-test-{time.time_ns()}"
        first = self.c.fork(g.node, n=2, idempotency_key=key)
        again = self.c.fork(g.node, n=2, idempotency_key=key)
        self.assertEqual([n.node_id for n in again], [n.node_id for n in first])
        self.assertEqual(len(self.c.tree(g.group).nodes), 3)
        self.assertEqual(first[0].provenance.idempotency_key, key)
        with self.assertRaises(esf.Conflict):
            self.c.fork(g.node, n=3, idempotency_key=key)  # another request, same key
        made = self.c.fork(g.node)[0]
        self.assertTrue(made.provenance.idempotency_key.startswith("py-"))
        self.assertNotEqual(made.provenance.idempotency_key, key)

    def test_every_mutation_sends_a_key(self) -> None:
        """Every POST the client makes carries an Idempotency-Key it made up
        ("py-...") or was given; the daemon would make one up ("api-...")
        for a request without, and the event log shows the key of each."""
        proxy = DroppingProxy(SOCKET, os.path.join(self.tmpdir(), "proxy.sock"))
        self.addCleanup(proxy.close)
        pc = esf.Client(socket=proxy.path)
        self.addCleanup(pc.close)
        img = pc.create_group(tar=image_tar(), policy={"p": 1})
        g = pc.create_group(self.tree_dir({"k": "0\n"}), name=f"py-keys-{time.time_ns()}")
        kids = pc.fork(g.node, n=4)
        with pc.activate(kids[0]) as a1:
            a_node = a1.suspend()
        with pc.activate(kids[1]) as a2:
            with open(os.path.join(a2.root, "b"), "w") as f:
                f.write("2")
            b_node = a2.suspend()
        ev = pc.put_evidence(b"evidence %d" % time.time_ns())
        pc.evaluate(a_node, "keys@1", 1.0, evidence=[ev.id], backprop=True)
        m = pc.merge([a_node, b_node])
        pc.promote(g.group, m.node, expected_generation=1)
        with pc.activate(kids[2]) as att:
            att.renew(ttl_ms=60000)
            att.suspend(keep_running=True)
        pc.retry(att).release()
        d = self.tmpdir()
        pc.mount(m.node, d, rw=True)
        pc.umount(d)
        pc.prune(kids[3])
        with pc.activate(pc.fork(img.node)[0], "runc") as r:
            r.exec(["/bin/true"], check=True)
            r.exec(["/bin/cat"], stdin=b"in", check=True)
        pc.export(m.node, os.path.join(self.tmpdir(), "out"))
        pc.import_source(self.tree_dir({"i": "1\n"}))
        pc.fsck()
        pc.gc(dry_run=True)
        pc.verify_provenance(b"{}")

        with proxy.lock:
            sent = b"".join(bytes(x) for x in proxy.sent)
        heads: List[Tuple[bytes, bytes]] = re.findall(rb"POST (/v1/[^ ?]*)[^ ]* HTTP/1\.1\r\n(.*?)\r\n\r\n", sent, re.S)
        posted = {p.decode() for p, _ in heads}
        for want in ("/v1/groups", "/v1/import", "/v1/fork", "/v1/activate", "/v1/suspend", "/v1/release",
                     "/v1/retry", "/v1/renew", "/v1/evaluate", "/v1/evidence", "/v1/merge", "/v1/promote",
                     "/v1/prune", "/v1/mount", "/v1/umount", "/v1/exec", "/v1/export-node", "/v1/fsck",
                     "/v1/gc", "/v1/verify-provenance"):
            self.assertIn(want, posted)
        for path, head in heads:
            keys = re.findall(rb"^Idempotency-Key: (\S+)\r?$", head, re.M)
            if path == b"/v1/verify-provenance":
                continue  # a check, not a mutation
            self.assertEqual(len(keys), 1, path)
            self.assertTrue(keys[0].startswith(b"py-"), (path, keys))
        events = list(self.c.events(group=g.group.group_id))
        self.assertEqual({e.idempotency_key[:3] for e in events}, {"py-"})

    def test_lost_reply_is_retried_and_applied_once(self) -> None:
        g = self.group()
        kid = self.sealed_child(g.node, {"r": "1"})
        proxy = DroppingProxy(SOCKET, os.path.join(self.tmpdir(), "proxy.sock"))
        self.addCleanup(proxy.close)
        pc = esf.Client(socket=proxy.path, backoff=0.01)
        self.addCleanup(pc.close)

        proxy.drops = 1
        ev = pc.evaluate(kid, "replay@1", 0.5, backprop=True)
        self.assertEqual(proxy.drops, 0)
        self.assertEqual(proxy.requests, 2)  # the lost one and its retry
        view = self.c.node(kid)
        self.assertEqual((view.visits, view.value), (1, 0.5))
        self.assertEqual([e.evaluation_id for e in view.evaluations], [ev.evaluation_id])
        self.assertEqual(self.c.node(g.node).visits, 1)

        proxy.drops = 1
        kids = pc.fork(kid, n=3)
        self.assertEqual(len(kids), 3)
        self.assertEqual(len(self.c.node(kid).children), 3)

        # A reply that never comes: the client's timeout, not retried (the
        # daemon may still be at work).
        slow = esf.Client(socket=proxy.path, timeout=0.5)
        self.addCleanup(slow.close)
        proxy.hold, before = True, proxy.requests
        with self.assertRaises(esf.DeadlineExceeded) as cm:
            slow.fork(kid, n=1, idempotency_key="py-held-" + kid.node_id)
        proxy.hold = False
        self.assertIn("py-held-", cm.exception.message)
        self.assertEqual(proxy.requests, before + 1)
        wait_until("the held fork to be done", lambda: len(self.c.node(kid).children) == 4)

        # Without retries the caller gets unavailable, and the work was done
        # all the same: what a retry with the same key is for.
        once = esf.Client(socket=proxy.path, retries=0)
        self.addCleanup(once.close)
        proxy.drops = 1
        with self.assertRaises(esf.Unavailable):
            once.fork(kid, n=1, idempotency_key="py-lost-" + kid.node_id)
        self.assertEqual(len(self.c.node(kid).children), 5)
        replay = self.c.fork(kid, n=1, idempotency_key="py-lost-" + kid.node_id)
        self.assertIn(replay[0].node_id, self.c.node(kid).children)
        self.assertEqual(len(self.c.node(kid).children), 5)


class RuncTest(DaemonTest):
    img: esf.CreateGroupResult

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        need(os.path.exists(BUSYBOX), "no static busybox for the container image")
        cls.img = cls.c.create_group(tar=image_tar())

    def runc_attempt(self) -> esf.Attempt:
        kid = self.c.fork(self.img.node)[0]
        a = self.c.activate(kid, "runc")
        self.addCleanup(a.__exit__, None, None, None)
        return a


class TestExec(RuncTest):
    def test_exec_output_and_exit(self) -> None:
        a = self.runc_attempt()
        r = a.exec(["/bin/sh", "-c", "echo out $X; echo err >&2; exit 3"], env=["X=42"])
        self.assertEqual((r.exit_code, r.stdout, r.stderr), (3, b"out 42\n", b"err\n"))
        self.assertFalse(r.ok)
        with self.assertRaises(esf.ExecFailed) as cm:
            a.exec(["/bin/sh", "-c", "exit 5"], check=True)
        self.assertEqual(cm.exception.result.exit_code, 5)
        self.assertEqual(a.exec(["/bin/sh", "-c", "kill -9 $$"]).exit_code, 137)
        a.exec(["/bin/sh", "-c", "echo made > /work/made"], check=True)
        with open(os.path.join(a.root, "work", "made")) as f:
            self.assertEqual(f.read(), "made\n")
        with self.assertRaises(esf.DeadlineExceeded):
            a.exec(["/bin/sleep", "30"], timeout_ms=300)
        with self.assertRaises(esf.NotFound):
            self.c.exec("att_" + "0" * 26, ["/bin/true"])

    def test_limits_memory_disk_and_capabilities(self) -> None:
        kid = self.c.fork(self.img.node)[0]
        with self.c.activate(kid, "runc", memory_bytes=32 << 20, disk_bytes=4 << 20) as a:
            r = a.exec(["/bin/busybox", "dd", "if=/dev/zero", "of=/dev/null", "bs=256M", "count=1"])
            self.assertEqual((r.exit_code, r.oom_killed), (137, True))
            self.assertFalse(a.exec(["/bin/sh", "-c", "kill -9 $$"]).oom_killed)
            r = a.exec(["/bin/busybox", "dd", "if=/dev/zero", "of=/work/big", "bs=1M", "count=32"])
            self.assertNotEqual(r.exit_code, 0)
            self.assertRegex(r.stderr.decode(), "quota|space")
        # The container runs in a user namespace, where no capability
        # makes device nodes: read the effective set instead.
        def cap_mknod(a: esf.Attempt) -> bool:
            status = a.exec(["/bin/cat", "/proc/self/status"], check=True).stdout.decode()
            [eff] = [ln.split()[1] for ln in status.splitlines() if ln.startswith("CapEff:")]
            return bool(int(eff, 16) & (1 << 27))  # CAP_MKNOD
        with self.c.activate(kid, "runc") as a:
            self.assertFalse(cap_mknod(a))  # dropped by default
        with self.c.activate(kid, "runc", cap_add=["CAP_MKNOD"]) as a:
            self.assertTrue(cap_mknod(a))
        with self.assertRaises(esf.InvalidArgument):
            self.c.activate(kid, "runc", cap_add=["CAP_SYS_ADMIN"])

    def test_wasi_module_from_the_root_and_the_store(self) -> None:
        g = self.c.create_group(tar=image_tar({"exit7.wasm": exit_module(7)}))
        stored = self.c.put_evidence(exit_module(9))
        with self.c.activate(self.c.fork(g.node)[0], "wasi") as a:
            self.assertEqual(a.executor, "wasi")
            self.assertEqual(a.exec(["/exit7.wasm"]).exit_code, 7)
            r = a.exec(["prog"], module=stored.id, memory_limit_pages=16)
            self.assertEqual(r.exit_code, 9)
            with self.assertRaises(esf.InvalidArgument):
                a.exec(["prog"], module="not-an-id")

    def test_exec_stream_with_stdin(self) -> None:
        a = self.runc_attempt()
        with a.exec_stream(["/bin/sh", "-c", "while read -r l; do echo got $l; done; echo bye >&2"],
                           stdin=True) as s:
            it = iter(s)
            for word in ("one", "two"):
                s.write(word.encode() + b"\n")
                line = b""
                while not line.endswith(b"\n"):  # the answer comes while stdin is open
                    c = next(it)
                    self.assertEqual(c.stream, "stdout")
                    line += c.data
                self.assertEqual(line, b"got " + word.encode() + b"\n")
            s.close_stdin()
            rest = list(it)
            self.assertEqual(rest, [esf.Chunk("stderr", b"bye\n")])
            self.assertEqual(s.result, esf.ExecResult(0, s.result.ms if s.result else 0))

        # More stdin than the window: the client waits for acknowledgements.
        blob = os.urandom(esf.STDIN_WINDOW * 3 + 12345)
        r = a.exec(["/bin/cat"], stdin=blob)
        self.assertEqual((r.exit_code, len(r.stdout)), (0, len(blob)))
        self.assertEqual(r.stdout, blob)
        r = a.exec(["/bin/wc", "-c"], stdin=io.BytesIO(blob))
        self.assertEqual(int(r.stdout), len(blob))
        r = a.exec(["/bin/wc", "-l"], stdin=(b"line\n" for _ in range(1000)))
        self.assertEqual(int(r.stdout), 1000)

    def test_exec_with_a_terminal(self) -> None:
        a = self.runc_attempt()
        with a.exec_stream(["/bin/sh", "-c", "stty size; read l; echo got $l"], tty=True, rows=30, cols=100,
                           stdin=True) as s:
            s.write(b"typed\n")
            out = b"".join(c.data for c in s if c.stream == "stdout")
        self.assertIn(b"30 100", out)
        self.assertIn(b"got typed", out)
        assert s.result is not None
        self.assertEqual(s.result.exit_code, 0)

    def test_leaving_a_stream_kills_the_command(self) -> None:
        a = self.runc_attempt()
        s = a.exec_stream(["/bin/sh", "-c", "echo up; exec sleep 600"])
        first = next(iter(s))
        self.assertEqual(first, esf.Chunk("stdout", b"up\n"))
        s.close()
        wait_until("the command to be gone",
                   lambda: b"sleep 600" not in a.exec(["/bin/ps", "-o", "args"]).stdout)


class TestEvents(DaemonTest):
    def test_listing_and_follow(self) -> None:
        g = self.group()
        listed = list(self.c.events(group=g.group.group_id))
        self.assertEqual([e.type for e in listed], ["group.created", "node.created"])
        self.assertTrue(all(isinstance(e, esf.Event) for e in listed))
        self.assertEqual(listed[1].node_id, g.node.node_id)
        self.assertRegex(listed[0].trace_id, TRACE)
        last = listed[-1].seq
        with self.c.events(group=g.group.group_id, after=last, follow=True) as evs:
            kid = self.c.fork(g.node, n=1)[0]
            ev = next(evs)
            self.assertEqual((ev.type, ev.node_id), ("node.forked", kid.node_id))
            self.assertGreater(ev.seq, last)
            self.assertTrue(ev.idempotency_key.startswith("py-"))
            with self.c.activate(kid):
                pass
            types = []
            while "lease.released" not in types:
                types.append(next(evs).type)
            self.assertIn("attempt.created", types)
            self.assertIn("lease.acquired", types)
        only = list(self.c.events(group=g.group.group_id, types=["node.*"]))
        self.assertEqual([e.type for e in only], ["node.created", "node.forked"])

    def test_follow_resumes_after_a_broken_connection(self) -> None:
        g = self.group()
        proxy = DroppingProxy(SOCKET, os.path.join(self.tmpdir(), "proxy.sock"))
        self.addCleanup(proxy.close)
        pc = esf.Client(socket=proxy.path, backoff=0.01)
        self.addCleanup(pc.close)
        seen: List[esf.Event] = []
        with pc.events(group=g.group.group_id, types=["node.*"], follow=True) as evs:
            seen.append(next(evs))  # node.created
            a = self.c.fork(g.node)[0]
            seen.append(next(evs))
            proxy.cut()  # the stream breaks; the next read resumes after the last seq
            b = self.c.fork(g.node)[0]
            seen.append(next(evs))
        self.assertEqual([(e.type, e.node_id) for e in seen],
                         [("node.created", g.node.node_id), ("node.forked", a.node_id),
                          ("node.forked", b.node_id)])
        self.assertEqual(proxy.requests, 2)


class TestQuota(RuncTest):
    def test_queued_and_no_queue(self) -> None:
        need(MAX_ATTEMPTS > 0, "ESF_TEST_MAX_ATTEMPTS: the daemon runs without a quota")
        held = []
        for _ in range(MAX_ATTEMPTS):
            held.append(self.c.activate(self.c.fork(self.img.node)[0]))
            self.addCleanup(held[-1].__exit__, None, None, None)
        with self.assertRaises(esf.QuotaExceeded):
            self.c.activate(self.c.fork(self.img.node)[0], "runc", no_queue=True)
        q = self.runc_attempt()
        self.assertEqual(q.state, "queued")
        with self.assertRaises(esf.FailedPrecondition):
            q.exec(["/bin/true"])
        held[0].release()
        q.wait_active(timeout=120)
        self.assertEqual(q.state, "active")
        # At once after the start: the container is there.
        self.assertEqual(q.exec(["/bin/echo", "dequeued"]).stdout, b"dequeued\n")


class TestNetwork(DaemonTest):
    def test_https_with_a_token(self) -> None:
        need(HOST != "" and TOKEN_FILE != "" and CACERT != "", "ESF_TEST_HOST: no network listener")
        with esf.Client(host=HOST, token_file=TOKEN_FILE, ca_file=CACERT) as rc:
            self.assertEqual(rc.status().state_dir, self.c.status().state_dir)
            g = rc.create_group(tar=image_tar())
            kid = rc.fork(g.node, n=2)[0]
            with rc.activate(kid, "runc") as a:
                r = a.exec(["/bin/cat"], stdin=b"over tls\n" * 50000)
                self.assertEqual(len(r.stdout), 9 * 50000)
                node = a.suspend()
            self.assertEqual(node.status, "sealed")
            evs = list(rc.events(group=g.group.group_id, types=["group.*"]))
            self.assertEqual([e.type for e in evs], ["group.created"])
        env = {"ESF_HOST": HOST, "ESF_TOKEN_FILE": TOKEN_FILE, "ESF_CACERT": CACERT}
        with mock.patch.dict(os.environ, env):
            with esf.Client() as ec:
                self.assertEqual(ec.where, HOST.split("://", 1)[1])
                ec.status()
        bad = os.path.join(self.tmpdir(), "token")
        with open(bad, "w") as f:
            f.write("not-the-token-0123456789\n")
        # A daemon whose certificate the client does not trust: no retries.
        untrusting = esf.Client(host=HOST, token_file=TOKEN_FILE, ssl_context=ssl.create_default_context())
        with self.assertRaises(esf.Unavailable) as un:
            untrusting.status()
        self.assertIn("certificate", un.exception.message)
        with esf.Client(host=HOST, token_file=bad, ca_file=CACERT) as wrong:
            with self.assertRaises(esf.Unauthenticated) as cm:
                wrong.status()
            self.assertEqual(cm.exception.status, 401)


class TestReadme(DaemonTest):
    def test_quick_start_runs_as_written(self) -> None:
        """README.md's quick start, with a project of our own for its
        /srv/project: a root with a shell and a make whose test passes."""
        need(os.path.exists(BUSYBOX), "no static busybox for the project's root")
        with open(os.path.join(HERE, "..", "README.md"), encoding="utf-8") as f:
            readme = f.read()
        m = re.search(r"## Quick start\n\n```python\n(.*?)```", readme, re.S)
        assert m is not None, "README.md: no quick start"
        code = m.group(1)
        self.assertIn('"/srv/project"', code)
        project = self.tmpdir()
        os.makedirs(os.path.join(project, "bin"))
        shutil.copy(BUSYBOX, os.path.join(project, "bin", "busybox"))
        os.symlink("busybox", os.path.join(project, "bin", "sh"))
        with open(os.path.join(project, "bin", "make"), "w") as f:
            f.write("#!/bin/sh\n[ \"$1\" = test ] && echo tests passed > /tests.log\n")
        os.chmod(os.path.join(project, "bin", "make"), 0o755)
        ns: Dict[str, object] = {}
        with mock.patch.dict(os.environ, {"ESF_SOCKET": SOCKET, "ESF_HOST": ""}):
            exec(compile(code.replace('"/srv/project"', repr(project)), "README.md", "exec"), ns)
        c, r, node, tree = ns["c"], ns["r"], ns["node"], ns["tree"]
        assert isinstance(c, esf.Client) and isinstance(r, esf.ExecResult)
        assert isinstance(node, esf.Node) and isinstance(tree, esf.Tree)
        self.addCleanup(c.close)
        self.assertTrue(r.ok, r.stderr)
        self.assertEqual(node.logical_state, {"step": 1})
        self.assertEqual(tree.group.canonical_node_id, node.node_id)
        self.assertEqual(tree.group.generation, 2)
        self.assertEqual((tree.root.node.visits, tree.root.children[0].reward), (1, 1.0))
        self.assertIn("tests.log", [c.path for c in self.c.diff(tree.root.node, node).changes])


class TestExamples(DaemonTest):
    def run_example(self, *args: str) -> str:
        need(os.path.exists(BUSYBOX), "no static busybox for the examples' image")
        p = subprocess.run([sys.executable, os.path.join(HERE, "..", "examples", args[0]), *args[1:]],
                           env=dict(os.environ, ESF_SOCKET=SOCKET, ESF_HOST=""), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=600)
        out = p.stdout.decode()
        self.assertEqual(p.returncode, 0, out)
        return out

    def test_mcts_solves_its_puzzle(self) -> None:
        out = self.run_example("mcts.py", "--secret", "2013", "--budget", "40")
        self.assertRegex(out, r"solved '2013' in \d+ expansions")

    def test_rl_fanout_stays_under_its_quota(self) -> None:
        need(MAX_ATTEMPTS > 0, "ESF_TEST_MAX_ATTEMPTS: the daemon runs without a quota")
        out = self.run_example("rl_fanout.py", "--quota", str(MAX_ATTEMPTS),
                               "--rollouts", str(MAX_ATTEMPTS * 2 + 1))
        self.assertRegex(out, r"peak live attempts \d+ \(quota %d\)" % MAX_ATTEMPTS)
        self.assertIn("is canonical", out)


if __name__ == "__main__":
    unittest.main()

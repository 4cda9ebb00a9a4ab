#!/usr/bin/env python3
"""RL fan-out: N rollouts from one pinned root under the daemon's quota.

From one root (the environment image, pinned as the group's root node), N
rollouts run at once, each in its own runc sandbox forked from the root. The
daemon runs at most --max-attempts attempts at a time: the activations past
it are queued, and start first-in first-out as rollouts finish. Every rollout
acts (writes its answer and trajectory into its workspace), is scored by the
image's own scorer, sealed, and evaluated with its reward. The best rollout
is promoted with the generation read before the fan-out (compare-and-swap:
a promote that lost a race would be StaleGeneration); the losers are pruned
and their content collected.

The program checks what it claims against the daemon's event log: never more
than --quota attempts live at once, some activations queued, the best one
canonical, every loser pruned and its content gone.

    esfd --max-attempts 3 &
    ESF_SOCKET=/var/lib/esf/esfd.sock python3 rl_fanout.py --quota 3 [--rollouts 8]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import io
import os
import random
import shutil
import sys
import tarfile
from dataclasses import dataclass
from typing import Dict, List, Optional, Set

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import esf  # noqa: E402


def check(ok: object, what: object) -> None:
    """What the program claims, checked (an assert would vanish under
    python -O)."""
    if not ok:
        raise SystemExit(f"check failed: {what}")

TARGET = 42
EVALUATOR = "distance-score@1"

SCORE = r"""#!/bin/sh
# The environment's reward: 100 minus the distance of /work/answer to the target.
a=$(cat /work/answer)
d=$((a - $(cat /etc/env/target)))
[ "$d" -lt 0 ] && d=$((0 - d))
echo $((100 - d))
"""


def image_tar(busybox: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        def add(name: str, data: bytes, mode: int = 0o644) -> None:
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode = len(data), mode
            tf.addfile(ti, io.BytesIO(data))

        for d in ("bin", "etc", "etc/env", "work", "tmp"):
            ti = tarfile.TarInfo(d)
            ti.type, ti.mode = tarfile.DIRTYPE, 0o755
            tf.addfile(ti)
        with open(busybox, "rb") as f:
            add("bin/busybox", f.read(), 0o755)
        for applet in ("sh", "cat", "echo", "seq"):
            ti = tarfile.TarInfo("bin/" + applet)
            ti.type, ti.linkname = tarfile.SYMTYPE, "busybox"
            tf.addfile(ti)
        add("bin/score", SCORE.encode(), 0o755)
        add("etc/env/target", b"%d\n" % TARGET)
    return buf.getvalue()


@dataclass
class Rollout:
    index: int
    guess: int
    node: esf.Node
    reward: float


class Fanout:
    def __init__(self, c: esf.Client, root: esf.Node, seed: int) -> None:
        self.c = c
        self.root = root
        self.seed = seed

    def rollout(self, i: int, child: esf.Node) -> Rollout:
        rng = random.Random(self.seed * 1000 + i)
        guess = rng.randint(0, 100)
        # wait: a queued activation returns once the daemon starts it.
        with self.c.activate(child, "runc", wait=True, pids=64) as a:
            r = a.exec(["/bin/sh", "-c",
                        f"echo {guess} > /work/answer; seq {i} {i + 20} > /work/trajectory-{i}; /bin/score"],
                       check=True)
            reward = float(r.stdout.decode().strip())
            node = a.suspend(logical_state={"rollout": i, "seed": self.seed * 1000 + i, "guess": guess})
        self.c.evaluate(node, EVALUATOR, reward, verdict=f"guess {guess}")
        return Rollout(i, guess, node, reward)


def live_peak(c: esf.Client, group_id: str, after: int) -> tuple[int, int]:
    """From the event log: the most attempts of the group live at once (active
    or quiescing), and how many activations were queued."""
    live: Set[str] = set()
    peak = queued = 0
    for ev in c.events(group=group_id, types=["attempt.*"], after=after):
        data = ev.data if isinstance(ev.data, dict) else {}
        if ev.type == "attempt.created" and data.get("queued") is True:
            queued += 1
        if ev.type == "attempt.state":
            if data.get("to") in ("active", "quiescing"):
                live.add(ev.attempt_id)
            else:
                live.discard(ev.attempt_id)
            peak = max(peak, len(live))
    return peak, queued


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rollouts", type=int, default=8)
    ap.add_argument("--quota", type=int, default=3, help="the daemon's --max-attempts")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--busybox", default=shutil.which("busybox") or "/bin/busybox")
    args = ap.parse_args(argv)

    with esf.Client() as c:
        # The pinned policy/root pair: the root is the image, the policy is
        # recorded on the group; a rollout's seed makes it reproducible.
        g = c.create_group(tar=image_tar(args.busybox),
                           policy={"policy": "uniform-guess@1", "seed": args.seed, "rollouts": args.rollouts})
        group_id, root = g.group.group_id, g.node
        print(f"group {group_id}, pinned root {root.node_id} ({root.root_id[:12]})")
        generation = c.group(group_id).generation
        children = c.fork(root, n=args.rollouts, logical_state={"phase": "rollout"})

        f = Fanout(c, root, args.seed)
        with concurrent.futures.ThreadPoolExecutor(max_workers=args.rollouts) as pool:
            results = list(pool.map(f.rollout, range(args.rollouts), children))
        for r in sorted(results, key=lambda r: -r.reward):
            print(f"rollout {r.index}: guess {r.guess:3d} reward {r.reward:5.1f}  {r.node.node_id}")

        best = max(results, key=lambda r: r.reward)
        promoted = c.promote(group_id, best.node, expected_generation=generation)
        print(f"promoted rollout {best.index} at generation {promoted.generation}")
        # The compare-and-swap: the generation read before moved on.
        try:
            c.promote(group_id, results[0].node, expected_generation=generation)
            raise AssertionError("a promote with a stale generation succeeded")
        except esf.StaleGeneration as e:
            print(f"stale promote refused: {e.code}")

        losers = [r for r in results if r is not best]
        pruned: List[str] = []
        for r in losers:
            pruned += c.prune(r.node)
        report = c.gc()
        print(f"pruned {len(pruned)} losers; gc deleted {report.deleted} objects, "
              f"{report.bytes_reclaimed} bytes")

        # Check the outcome against the daemon's records (what this program
        # could count itself would race with the daemon's dequeueing).
        peak, queued = live_peak(c, group_id, 0)
        print(f"peak live attempts {peak} (quota {args.quota}), queued activations {queued}")
        check(peak <= args.quota, f"{peak} attempts live at once, quota {args.quota}")
        if args.rollouts > args.quota:
            check(queued > 0, "no activation was queued")
        tree = c.tree(group_id)
        check(tree.group.canonical_node_id == best.node.node_id, "the best rollout is canonical")
        check(tree.group.generation == generation + 1, "one promote: the generation grew by one")
        check(tree.rewards[best.node.node_id] == max(r.reward for r in results), "the promoted reward is the best")
        status: Dict[str, str] = {n.node_id: n.status for n in tree.nodes}
        check(sorted(pruned) == sorted(r.node.node_id for r in losers), "prune reported the losers")
        check(all(status[r.node.node_id] == "pruned" for r in losers), "every loser is pruned")
        check(status[root.node_id] == "sealed", "the pinned root is still sealed")
        # The losers' own content is gone from the store; the best one's is whole.
        check(report.deleted >= len(losers), "gc deleted the losers' content")
        if c.status().remote is None:
            for r in losers:
                try:
                    c.export(r.node.root_id, io.BytesIO(), "tar")
                    raise AssertionError(f"the root of pruned rollout {r.index} is still stored")
                except (esf.NotFound, esf.Corrupt):
                    pass
        else:
            # With content on S3 (esfd --cas-remote) the local gc empties
            # only the cache, and the bucket is collected apart; a dead
            # object in a pack stays readable until its pack falls below
            # half live and is rewritten, so gone is not promised there.
            rep = c.gc(remote=True, remote_grace=1)
            print(f"bucket collected: {rep.remote}")
        out = io.BytesIO()
        c.export(best.node, out, "tar")
        with tarfile.open(fileobj=io.BytesIO(out.getvalue())) as tf:
            ans = tf.extractfile("./work/answer")
            check(ans is not None and int(ans.read()) == best.guess, "the canonical root holds the best answer")
        print(f"best rollout {best.index} (guess {best.guess}, reward {best.reward}) is canonical")
    return 0


if __name__ == "__main__":
    sys.exit(main())

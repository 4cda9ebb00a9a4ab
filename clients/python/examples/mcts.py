#!/usr/bin/env python3
"""UCT tree search where every node's state is files in a sandbox.

The puzzle: a combination lock. The workspace image holds a checker,
/bin/check, that knows the secret combination (in /etc/puzzle) and says how
many leading digits of /work/moves are right. The search never reads the
secret: it only sees rewards.

Each iteration of the search:
  select  walk from the root by UCT over the visits and values esfd keeps
          for every node (evaluate with backprop updates them);
  expand  fork a child of the selected node, activate it in runc and run the
          move there: the command appends one digit to /work/moves, so the
          child's files are its parent's plus one move;
  reward  run /bin/check in the same container; the reward is the fraction of
          the combination it confirms; seal the child (suspend);
  backup  evaluate the child with backprop: esfd adds one visit and the
          reward to the child and to every ancestor.

It stops when the checker says solved (that evaluation is terminal), prints
the best path, promotes the solution (compare-and-swap on the group's
generation), prunes every subtree off its path and collects their content,
and exits 0 only if it solved the lock within its budget. No sandbox outlives
its expansion: the tree is durable, the attempts are not.

    ESF_SOCKET=/var/lib/esf/esfd.sock python3 mcts.py [--secret 2013] [--budget 40]
"""

from __future__ import annotations

import argparse
import io
import math
import os
import shutil
import sys
import tarfile
from typing import Dict, List, Optional, Tuple

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import esf  # noqa: E402


def check(ok: object, what: object) -> None:
    """What the program claims, checked (an assert would vanish under
    python -O)."""
    if not ok:
        raise SystemExit(f"check failed: {what}")

DIGITS = "0123"
EVALUATOR = "lock-check@1"

CHECK = r"""#!/bin/sh
# Prints "<right> <length>": how many leading digits of /work/moves match the
# secret, and the secret's length. Exits 0.
secret=$(cat /etc/puzzle/secret)
moves=$(cat /work/moves 2>/dev/null | tr -d '\n')
i=0
while [ "$i" -lt "${#moves}" ] && [ "$i" -lt "${#secret}" ] && \
      [ "${secret:$i:1}" = "${moves:$i:1}" ]; do
	i=$((i+1))
done
if [ "${#moves}" -gt "${#secret}" ]; then i=0; fi
echo "$i ${#secret}"
"""


def image_tar(secret: str, busybox: str) -> bytes:
    """The workspace: a static busybox, the checker, the secret, an empty /work."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        def add(name: str, data: bytes, mode: int = 0o644) -> None:
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode = len(data), mode
            tf.addfile(ti, io.BytesIO(data))

        def mkdir(name: str) -> None:
            ti = tarfile.TarInfo(name)
            ti.type, ti.mode = tarfile.DIRTYPE, 0o755
            tf.addfile(ti)

        for d in ("bin", "etc", "etc/puzzle", "work", "tmp"):
            mkdir(d)
        with open(busybox, "rb") as f:
            add("bin/busybox", f.read(), 0o755)
        for applet in ("sh", "cat", "tr", "echo"):
            ti = tarfile.TarInfo("bin/" + applet)
            ti.type, ti.linkname = tarfile.SYMTYPE, "busybox"
            tf.addfile(ti)
        add("bin/check", CHECK.encode(), 0o755)
        add("etc/puzzle/secret", secret.encode() + b"\n", 0o600)
    return buf.getvalue()


class Search:
    def __init__(self, c: esf.Client, group: esf.Group, uct_c: float = 0.2) -> None:
        self.c = c
        self.group = group
        self.uct_c = uct_c
        self.moves: Dict[str, str] = {}  # node id -> its moves so far
        self.solved: Optional[str] = None
        self.expansions = 0
        self.length = 0  # of the combination, from the checker

    def select(self, tree: esf.Tree) -> esf.TreeNode:
        """Walk down by UCT while every move of a node has been tried."""
        t = tree.root
        while True:
            kids = [k for k in t.children if k.node.status in ("sealed", "terminal")]
            depth = len(self.moves[t.node.node_id])
            if len(kids) < len(DIGITS) or depth >= self.length:
                return t
            parent_visits = max(t.node.visits, 1)

            def uct(k: esf.TreeNode) -> float:
                if k.node.visits == 0:
                    return math.inf
                return k.node.mean_value + self.uct_c * math.sqrt(math.log(parent_visits) / k.node.visits)

            # A node that cannot be extended (full depth, not solved) is a
            # dead end: it keeps its statistics but is not chosen again.
            open_kids = [k for k in kids if len(self.moves[k.node.node_id]) < self.length]
            if not open_kids:
                return t
            t = max(open_kids, key=uct)

    def expand(self, leaf: esf.TreeNode) -> Tuple[esf.Node, float, bool]:
        tried = {self.moves[k.node.node_id][-1] for k in leaf.children if k.node.node_id in self.moves}
        move = next(d for d in DIGITS if d not in tried)
        path = self.moves[leaf.node.node_id] + move
        child = self.c.fork(leaf.node, logical_state={"moves": path})[0]
        with self.c.activate(child, "runc") as a:
            r = a.exec(["/bin/sh", "-c", f"echo {move} >> /work/moves && /bin/check"], check=True)
            right, length = (int(x) for x in r.stdout.split())
            sealed = a.suspend(logical_state={"moves": path})
        self.moves[sealed.node_id] = path
        self.expansions += 1
        reward = right / length
        solved = right == length and len(path) == length
        self.c.evaluate(sealed, EVALUATOR, reward, verdict="solved" if solved else f"{right}/{length}",
                        terminal=solved, backprop=True)
        return sealed, reward, solved

    def run(self, budget: int) -> Optional[str]:
        root = self.c.node(self.group.root_node_id)
        self.moves[root.node_id] = ""
        # The lock's length is the checker's second number: ask it once, on
        # a throwaway attempt of the root (released, never sealed).
        with self.c.activate(root, "runc") as a:
            self.length = int(a.exec(["/bin/check"], check=True).stdout.split()[1])
        while self.expansions < budget and self.solved is None:
            tree = self.c.tree(self.group)
            leaf = self.select(tree)
            if len(self.moves[leaf.node.node_id]) >= self.length or \
                    len(leaf.children) >= len(DIGITS):
                raise RuntimeError("search space exhausted without a solution")
            node, reward, solved = self.expand(leaf)
            print(f"expansion {self.expansions:2d}: {self.moves[node.node_id]:<6} reward {reward:.2f}")
            if solved:
                self.solved = node.node_id
        return self.solved

    def best_path(self) -> List[esf.Node]:
        """From the root to the solution (its ancestry, as esfd records
        it); unsolved, the child with the most visits at every level."""
        tree = self.c.tree(self.group)
        if self.solved is not None:
            ids = list(reversed(self.c.node(self.solved).ancestry)) + [self.solved]
            return [tree.node(i) for i in ids]
        t = tree.root
        path = [t.node]
        while t.children:
            t = max(t.children, key=lambda k: (k.node.visits, k.node.mean_value))
            path.append(t.node)
        return path


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--secret", default="2013", help="the combination (digits 0-3)")
    ap.add_argument("--budget", type=int, default=40, help="most expansions (each one a runc attempt)")
    ap.add_argument("--busybox", default=shutil.which("busybox") or "/bin/busybox")
    args = ap.parse_args(argv)
    if not args.secret or any(d not in DIGITS for d in args.secret):
        ap.error("the secret is digits 0-3")

    with esf.Client() as c:
        g = c.create_group(tar=image_tar(args.secret, args.busybox), logical_state={"moves": ""})
        print(f"group {g.group.group_id}, root {g.node.node_id}")
        s = Search(c, g.group)
        solved = s.run(args.budget)
        path = s.best_path()
        print("best path:")
        for n in path:
            print(f"  {n.node_id}  moves={s.moves.get(n.node_id, '?')!r:<8} visits={n.visits:<3} "
                  f"value={n.value:.2f}")
        # What the search claims, checked against the daemon's records.
        if solved is None:
            raise SystemExit(f"check failed: not solved within {args.budget} expansions")
        check(s.moves[solved] == args.secret, (s.moves[solved], args.secret))
        view = c.node(solved)
        check(view.status == "terminal", view.status)
        check(view.evaluations and view.evaluations[-1].reward == 1.0, "the solution's reward is 1")
        root = c.node(g.node.node_id)
        # Every expansion was evaluated once with backprop: the root saw
        # them all.
        check(root.visits == s.expansions, (root.visits, s.expansions))
        check([n.node_id for n in path][:1] == [root.node_id], "the best path starts at the root")
        check([s.moves[n.node_id] for n in path] == [args.secret[:i] for i in range(len(args.secret) + 1)],
              "the best path spells the secret")

        # Keep what matters: the solution becomes canonical (compare-and-
        # swap on the generation read now), and every subtree off its path
        # is pruned, so that a collection can reclaim its content.
        gen = c.group(g.group).generation
        c.promote(g.group, solved, expected_generation=gen)
        on_path = {n.node_id for n in path}
        pruned: List[str] = []
        for n in path:
            for kid in c.node(n.node_id).children:
                if kid not in on_path:
                    pruned += c.prune(kid)
        report = c.gc()
        tree = c.tree(g.group)
        check(tree.group.canonical_node_id == solved and tree.group.generation == gen + 1,
              "the solution is canonical at the next generation")
        check({n.node_id for n in tree.nodes if n.status != "pruned"} == on_path, "only the best path is left")
        check(len(pruned) == len(tree.nodes) - len(on_path), "prune reported every node off the path")
        print(f"promoted the solution; pruned {len(pruned)} nodes off its path, gc deleted "
              f"{report.deleted} objects")
        print(f"solved {args.secret!r} in {s.expansions} expansions (budget {args.budget})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

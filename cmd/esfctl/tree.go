package main

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"

	v1 "github.com/esf-dev/esf/api/v1"
)

// Rendering of `esfctl tree`. A node appears once, under its first parent
// (a merge lists its other parents on its line); children in creation
// order. The walk is iterative: a chain of a million seals must not
// exhaust the stack.

// shortIDs maps each node id to the shortest tail of its suffix, at least 8
// characters, that no other node of the tree shares. Ids end in random
// digits (see journal.IDGen in the daemon), so 8 almost always suffice.
func shortIDs(nodes []v1.Node) map[string]string {
	n := 8
	for ; ; n++ {
		seen := make(map[string]bool, len(nodes))
		unique, longest := true, 0
		for _, nd := range nodes {
			s := tail(nd.NodeID, n)
			longest = max(longest, len(s))
			if seen[s] {
				unique = false
				break
			}
			seen[s] = true
		}
		if unique || n > longest {
			break
		}
	}
	out := make(map[string]string, len(nodes))
	for _, nd := range nodes {
		out[nd.NodeID] = tail(nd.NodeID, n)
	}
	return out
}

func tail(id string, n int) string {
	_, suffix, ok := strings.Cut(id, "_")
	if !ok {
		suffix = id
	}
	if len(suffix) > n {
		suffix = suffix[len(suffix)-n:]
	}
	return suffix
}

// nodeLabel is what a node shows: short id (canonical marked *), status,
// the newest reward and MCTS statistics when it has them.
func nodeLabel(tv *v1.TreeResponse, n *v1.Node, short map[string]string) string {
	var b strings.Builder
	if n.NodeID == tv.Group.CanonicalNodeID {
		b.WriteByte('*')
	}
	b.WriteString(short[n.NodeID])
	b.WriteString("  ")
	b.WriteString(string(n.Status))
	if r, ok := tv.Rewards[n.NodeID]; ok {
		b.WriteString("  reward=" + strconv.FormatFloat(r, 'g', 6, 64))
	}
	if n.Visits > 0 {
		fmt.Fprintf(&b, "  visits=%d value=%s", n.Visits, strconv.FormatFloat(n.Value, 'g', 6, 64))
	}
	if len(n.Parents) > 1 {
		ps := make([]string, len(n.Parents))
		for i, p := range n.Parents {
			ps[i] = short[p]
			if ps[i] == "" {
				ps[i] = p
			}
		}
		b.WriteString("  parents=" + strings.Join(ps, ","))
	}
	return b.String()
}

// children indexes the tree by first parent; nodes whose first parent is
// not in the tree are roots (normally just the group's root node).
func children(tv *v1.TreeResponse) (map[string][]int, []int) {
	in := make(map[string]bool, len(tv.Nodes))
	for _, n := range tv.Nodes {
		in[n.NodeID] = true
	}
	kids := map[string][]int{}
	var roots []int
	for i, n := range tv.Nodes {
		if len(n.Parents) == 0 || !in[n.Parents[0]] {
			roots = append(roots, i)
			continue
		}
		kids[n.Parents[0]] = append(kids[n.Parents[0]], i)
	}
	return kids, roots
}

// maxTreeIndent bounds the indentation: nodes deeper than this are drawn
// at that depth with their real depth noted, so a long chain of seals
// prints in linear, not quadratic, space.
const maxTreeIndent = 32

func renderTree(w io.Writer, tv *v1.TreeResponse) error {
	bw := bufio.NewWriter(w)
	short := shortIDs(tv.Nodes)
	fmt.Fprintf(bw, "%s  generation %d  canonical %s  (%d nodes)\n", tv.Group.GroupID, tv.Group.Generation,
		tv.Group.CanonicalNodeID, len(tv.Nodes))
	kids, roots := children(tv)
	type frame struct {
		i      int
		prefix string // drawn before this node's connector
		last   bool
		depth  int
	}
	var stack []frame
	for k := len(roots) - 1; k >= 0; k-- {
		stack = append(stack, frame{roots[k], "", k == len(roots)-1, 0})
	}
	for len(stack) > 0 {
		f := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		n := &tv.Nodes[f.i]
		conn, cont := "├── ", "│   "
		if f.last {
			conn, cont = "└── ", "    "
		}
		label := nodeLabel(tv, n, short)
		if f.depth >= maxTreeIndent {
			label += fmt.Sprintf("  (depth %d)", f.depth)
		}
		fmt.Fprintf(bw, "%s%s%s\n", f.prefix, conn, label)
		prefix := f.prefix
		if f.depth < maxTreeIndent {
			prefix += cont
		}
		ks := kids[n.NodeID]
		for k := len(ks) - 1; k >= 0; k-- {
			stack = append(stack, frame{ks[k], prefix, k == len(ks)-1, f.depth + 1})
		}
	}
	fmt.Fprintln(bw, "* canonical")
	return bw.Flush()
}

// renderDot writes the graph for Graphviz: every parent edge (merges
// included), drafts dashed, pruned grey, terminal nodes doubled, the
// canonical node bold.
func renderDot(w io.Writer, tv *v1.TreeResponse) error {
	bw := bufio.NewWriter(w)
	short := shortIDs(tv.Nodes)
	fmt.Fprintf(bw, "digraph %s {\n", strconv.Quote(tv.Group.GroupID))
	fmt.Fprintf(bw, "  label=%s;\n", strconv.Quote(fmt.Sprintf("%s generation %d", tv.Group.GroupID, tv.Group.Generation)))
	fmt.Fprintln(bw, `  node [shape=box, fontname="monospace"];`)
	for i := range tv.Nodes {
		n := &tv.Nodes[i]
		var attrs []string
		attrs = append(attrs, "label="+strconv.Quote(strings.ReplaceAll(nodeLabel(tv, n, short), "  ", "\n")))
		switch n.Status {
		case v1.NodeDraft:
			attrs = append(attrs, "style=dashed")
		case v1.NodePruned:
			attrs = append(attrs, "color=grey", "fontcolor=grey")
		case v1.NodeTerminal:
			attrs = append(attrs, "peripheries=2")
		}
		if n.NodeID == tv.Group.CanonicalNodeID {
			attrs = append(attrs, "penwidth=3")
		}
		fmt.Fprintf(bw, "  %s [%s];\n", strconv.Quote(n.NodeID), strings.Join(attrs, ", "))
	}
	for _, n := range tv.Nodes {
		for _, p := range n.Parents {
			fmt.Fprintf(bw, "  %s -> %s;\n", strconv.Quote(p), strconv.Quote(n.NodeID))
		}
	}
	fmt.Fprintln(bw, "}")
	return bw.Flush()
}

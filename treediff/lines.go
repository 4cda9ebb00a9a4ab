package treediff

import (
	"bytes"
)

// edit is one line of a line-level edit script: kept (' '), deleted ('-')
// or inserted ('+'). a and b index the line in the old and new text.
type edit struct {
	op   byte
	a, b int
}

// maxEditDistance bounds the Myers search. Its memory grows with the square
// of the edit distance, so beyond this the middle of the two texts is
// replaced wholesale: still a correct patch, just not a minimal one.
const maxEditDistance = 1000

// splitLines cuts text after every '\n'; a last line without one is kept.
func splitLines(text []byte) [][]byte {
	var lines [][]byte
	for len(text) > 0 {
		i := bytes.IndexByte(text, '\n')
		if i < 0 {
			lines = append(lines, text)
			break
		}
		lines = append(lines, text[:i+1])
		text = text[i+1:]
	}
	return lines
}

// lineEdits returns an edit script turning a into b: shortest (Myers) when
// the distance is at most maxEditDistance, correct always.
func lineEdits(a, b [][]byte) []edit {
	// Compare small integers, not lines.
	ids := map[string]int{}
	num := func(ls [][]byte) []int {
		out := make([]int, len(ls))
		for i, l := range ls {
			id, ok := ids[string(l)]
			if !ok {
				id = len(ids)
				ids[string(l)] = id
			}
			out[i] = id
		}
		return out
	}
	x, y := num(a), num(b)
	pre := 0
	for pre < len(x) && pre < len(y) && x[pre] == y[pre] {
		pre++
	}
	suf := 0
	for suf < len(x)-pre && suf < len(y)-pre && x[len(x)-1-suf] == y[len(y)-1-suf] {
		suf++
	}
	var out []edit
	for i := 0; i < pre; i++ {
		out = append(out, edit{' ', i, i})
	}
	mid, ok := myers(x[pre:len(x)-suf], y[pre:len(y)-suf], maxEditDistance)
	if !ok {
		mid = mid[:0]
		for i := pre; i < len(x)-suf; i++ {
			mid = append(mid, edit{'-', i - pre, 0})
		}
		for j := pre; j < len(y)-suf; j++ {
			mid = append(mid, edit{'+', 0, j - pre})
		}
	}
	for _, e := range mid {
		out = append(out, edit{e.op, e.a + pre, e.b + pre})
	}
	for i := 0; i < suf; i++ {
		out = append(out, edit{' ', len(x) - suf + i, len(y) - suf + i})
	}
	return out
}

// myers is the O(ND) greedy algorithm, keeping one frontier per edit
// distance for the backtrack. It gives up (false) past maxD.
func myers(a, b []int, maxD int) ([]edit, bool) {
	n, m := len(a), len(b)
	var trace [][]int // trace[d][k+d] = furthest x on diagonal k
	found := false
	for d := 0; d <= maxD && !found; d++ {
		v := make([]int, 2*d+1)
		for k := -d; k <= d; k += 2 {
			var x int
			switch {
			case d == 0:
				x = 0
			case k == -d || (k != d && trace[d-1][k-1+d-1] < trace[d-1][k+1+d-1]):
				x = trace[d-1][k+1+d-1] // down: insertion
			default:
				x = trace[d-1][k-1+d-1] + 1 // right: deletion
			}
			y := x - k
			for x < n && y < m && a[x] == b[y] {
				x++
				y++
			}
			v[k+d] = x
			if x >= n && y >= m {
				found = true
				break
			}
		}
		trace = append(trace, v)
	}
	if !found {
		return nil, false
	}
	var rev []edit
	x, y := n, m
	for d := len(trace) - 1; d > 0; d-- {
		prev := trace[d-1]
		k := x - y
		var pk int
		if k == -d || (k != d && prev[k-1+d-1] < prev[k+1+d-1]) {
			pk = k + 1
		} else {
			pk = k - 1
		}
		px := prev[pk+d-1]
		py := px - pk
		// One move from (px, py) to (mx, my), then a snake of equal lines.
		mx, my := px+1, py
		if pk == k+1 {
			mx, my = px, py+1
		}
		for x > mx && y > my {
			x--
			y--
			rev = append(rev, edit{' ', x, y})
		}
		if pk == k+1 {
			rev = append(rev, edit{'+', px, py})
		} else {
			rev = append(rev, edit{'-', px, py})
		}
		x, y = px, py
	}
	for x > 0 && y > 0 {
		x--
		y--
		rev = append(rev, edit{' ', x, y})
	}
	out := make([]edit, len(rev))
	for i, e := range rev {
		out[len(rev)-1-i] = e
	}
	return out, true
}

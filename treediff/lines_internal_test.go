package treediff

import (
	"bufio"
	"bytes"
	"strings"
	"testing"
)

// lcs is the textbook dynamic program, the reference for minimality.
func lcs(a, b [][]byte) int {
	dp := make([][]int, len(a)+1)
	for i := range dp {
		dp[i] = make([]int, len(b)+1)
	}
	for i := len(a) - 1; i >= 0; i-- {
		for j := len(b) - 1; j >= 0; j-- {
			if bytes.Equal(a[i], b[j]) {
				dp[i][j] = dp[i+1][j+1] + 1
			} else {
				dp[i][j] = max(dp[i+1][j], dp[i][j+1])
			}
		}
	}
	return dp[0][0]
}

// checkEdits verifies that es turns a into b, visiting every line of each
// once and in order, and returns how many lines it keeps.
func checkEdits(t *testing.T, a, b [][]byte, es []edit) int {
	t.Helper()
	i, j, kept := 0, 0, 0
	for _, e := range es {
		switch e.op {
		case ' ':
			if e.a != i || e.b != j || !bytes.Equal(a[i], b[j]) {
				t.Fatalf("keep %+v at a%d b%d", e, i, j)
			}
			i, j, kept = i+1, j+1, kept+1
		case '-':
			if e.a != i {
				t.Fatalf("delete %+v at a%d", e, i)
			}
			i++
		case '+':
			if e.b != j {
				t.Fatalf("insert %+v at b%d", e, j)
			}
			j++
		default:
			t.Fatalf("op %q", e.op)
		}
	}
	if i != len(a) || j != len(b) {
		t.Fatalf("script ends at a%d b%d of %d, %d", i, j, len(a), len(b))
	}
	return kept
}

func FuzzLineEdits(f *testing.F) {
	f.Add("a\nb\nc\n", "a\nc\n")
	f.Add("", "x")
	f.Add("x\ny", "")
	f.Add("1\n2\n3\n4\n5\n", "5\n4\n3\n2\n1\n")
	f.Add("same\n", "same\n")
	f.Fuzz(func(t *testing.T, x, y string) {
		a, b := splitLines([]byte(x)), splitLines([]byte(y))
		if strings.Join(toStrings(a), "") != x {
			t.Fatalf("splitLines loses bytes")
		}
		es := lineEdits(a, b)
		kept := checkEdits(t, a, b, es)
		if len(a) <= 60 && len(b) <= 60 {
			if want := lcs(a, b); kept != want {
				t.Fatalf("kept %d lines, the longest common subsequence has %d", kept, want)
			}
		}
		// Hunks render without trouble and count what they hold.
		var buf bytes.Buffer
		w := bufio.NewWriter(&buf)
		writeHunks(w, a, b)
		w.Flush()
		if x == y && buf.Len() != 0 {
			t.Fatalf("equal texts gave hunks:\n%s", buf.String())
		}
	})
}

func toStrings(ls [][]byte) []string {
	out := make([]string, len(ls))
	for i, l := range ls {
		out[i] = string(l)
	}
	return out
}

// TestLineEditsFallback forces the distance bound and checks the script is
// still correct.
func TestLineEditsFallback(t *testing.T) {
	var a, b []string
	for i := range 3000 {
		a = append(a, "a"+strings.Repeat("x", i%7)+"\n")
		b = append(b, "b"+strings.Repeat("y", i%5)+"\n")
	}
	la, lb := splitLines([]byte(strings.Join(a, ""))), splitLines([]byte(strings.Join(b, "")))
	checkEdits(t, la, lb, lineEdits(la, lb))
}

func TestQuotePath(t *testing.T) {
	for in, want := range map[string]string{
		"plain":       "a/plain",
		"sp ace":      "a/sp ace",
		"qu\"ote":     `"a/qu\"ote"`,
		"back\\":      `"a/back\\"`,
		"tab\tnl\n":   `"a/tab\tnl\n"`,
		"é":           `"a/\303\251"`,
		"del\x7f\x01": `"a/del\177\001"`,
	} {
		if got := quotePath("a/", in); got != want {
			t.Errorf("quotePath(%q) = %s, want %s", in, got, want)
		}
	}
}

func TestBase85Lines(t *testing.T) {
	// Values from git's own encoder: 52 zero bytes make a full line of
	// 'z' length and "00000" groups; one 0xff byte pads to 0xff000000.
	var buf bytes.Buffer
	w := bufio.NewWriter(&buf)
	l := &base85Lines{w: w}
	l.Write(make([]byte, 52))
	l.Write([]byte{0xff})
	l.flush()
	w.Flush()
	want := "z" + strings.Repeat("00000", 13) + "\n"
	got := buf.String()
	if !strings.HasPrefix(got, want) {
		t.Fatalf("full line: %q", got)
	}
	rest := got[len(want):]
	if len(rest) != 7 || rest[0] != 'A' || rest[6] != '\n' {
		t.Fatalf("one-byte line: %q", rest)
	}
	if v := decode85(rest[1:6]); v != 0xff000000 {
		t.Errorf("last group decodes to %#x", v)
	}
}

func decode85(s string) uint32 {
	var v uint32
	for i := 0; i < len(s); i++ {
		v = v*85 + uint32(strings.IndexByte(base85Alphabet, s[i]))
	}
	return v
}

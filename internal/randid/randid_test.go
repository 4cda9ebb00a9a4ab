package randid

import (
	"regexp"
	"testing"
)

func TestHex(t *testing.T) {
	re := regexp.MustCompile(`^[0-9a-f]+$`)
	seen := map[string]bool{}
	for _, n := range []int{1, 8, 16} {
		for range 100 {
			s := Hex(n)
			if len(s) != 2*n || !re.MatchString(s) {
				t.Fatalf("Hex(%d) = %q", n, s)
			}
			if n >= 8 && seen[s] {
				t.Fatalf("Hex(%d) repeated %q", n, s)
			}
			seen[s] = true
		}
	}
}

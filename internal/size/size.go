package size

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Parse reads a size like 512M, 2G, 512MiB or 1073741824 (K, M, G and
// T are powers of 1024, optionally followed by i, B or iB); empty is 0.
func Parse(s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	digits := strings.TrimRight(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
	unit := strings.ToUpper(s[len(digits):])
	shift := -1
	for i, u := range []string{"", "K", "M", "G", "T"} {
		for _, form := range []string{u, u + "I", u + "B", u + "IB"} {
			if unit == form && form != "I" && form != "IB" {
				shift = 10 * i
			}
		}
	}
	n, err := strconv.ParseInt(digits, 10, 64)
	if shift < 0 || err != nil || n < 0 || n > math.MaxInt64>>shift {
		return 0, fmt.Errorf("size %q: want a number of bytes with an optional K, M, G or T suffix", s)
	}
	return n << shift, nil
}

package wire

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strings"

	"github.com/esf-dev/esf/errdefs"
)

// MinTokenLen is the shortest token accepted: a token is a secret, not a
// password, and should be 32 or more random characters.
const MinTokenLen = 16

// ParseTokens reads a token file's content.
func ParseTokens(b []byte) ([]string, error) {
	var toks []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 4096), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if len(line) < MinTokenLen {
			return nil, fmt.Errorf("token on line %d: %d characters, want at least %d: %w", n, len(line), MinTokenLen, errdefs.ErrInvalidArgument)
		}
		for _, c := range []byte(line) {
			if c < 0x21 || c > 0x7e {
				return nil, fmt.Errorf("token on line %d: want visible ASCII only: %w", n, errdefs.ErrInvalidArgument)
			}
		}
		toks = append(toks, line)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read tokens: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	return toks, nil
}

// ReadTokenFile reads the first token of a token file (a client's).
func ReadTokenFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	toks, err := ParseTokens(b)
	if err != nil {
		return "", fmt.Errorf("token file %s: %w", path, err)
	}
	if len(toks) == 0 {
		return "", fmt.Errorf("token file %s holds no token: %w", path, errdefs.ErrInvalidArgument)
	}
	return toks[0], nil
}

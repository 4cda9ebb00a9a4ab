package e2bfake

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// Helpers for the tests of this fake, its adapters and its dialects
// (cubefake), which live in other modules and so cannot share test files.

// RequireJail skips a test that runs commands unless JailAvailable: an
// unjailed command sees host paths, not the sandbox's files, so what it
// would prove is not what the test means.
func RequireJail(t testing.TB) {
	t.Helper()
	if !JailAvailable() {
		t.Skip("the fake needs root on Linux (mount namespaces, chroot, nsenter) to run commands where the file API puts files")
	}
}

// Do sends one request with the headers whose values are not empty and
// returns the status, the headers and the body without surrounding
// space, for tests that check the wire.
func Do(t testing.TB, method, url, body string, header map[string]string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		if v != "" {
			req.Header.Set(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, strings.TrimSpace(string(b))
}

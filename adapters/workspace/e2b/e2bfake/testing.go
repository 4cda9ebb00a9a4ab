package e2bfake

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/esf-dev/esf/internal/testenv"
)

// Helpers for the tests of this fake, its adapters and its dialects
// (cubefake), which live in other modules and so cannot share test files.

// RequireJail skips a test that runs commands unless JailAvailable: an
// unjailed command sees host paths, not the sandbox's files, so what it
// would prove is not what the test means. Under ESF_TEST_REQUIRE (CI) a
// missing jail fails the test instead (internal/testenv).
func RequireJail(t testing.TB) {
	t.Helper()
	if JailAvailable() {
		return
	}
	testenv.Require(t, "root", "cmd:nsenter")
	const why = "the fake needs root on Linux (mount namespaces, chroot, nsenter) to run commands where the file API puts files"
	if testenv.Required("root") {
		t.Fatal(why)
	}
	t.Skip(why)
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

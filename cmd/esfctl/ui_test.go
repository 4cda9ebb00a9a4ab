package main

import (
	"path/filepath"
	"testing"

	"github.com/esf-dev/esf/errdefs"
)

// esfctl ui refuses what it cannot serve safely or usefully before it
// prints a URL: an address off loopback, a daemon it cannot reach. (The
// view itself is tested in ui/ and, in a browser, by e2e TestUI_Browser.)
func TestUIRefuses(t *testing.T) {
	sock := daemon(t)
	for _, tt := range []struct {
		name   string
		socket string
		args   []string
		status int
		code   errdefs.Code
	}{
		{"all interfaces", sock, []string{"-o", "json", "ui", "--addr", "0.0.0.0:0"}, 2, errdefs.CodeInvalidArgument},
		{"a LAN address", sock, []string{"-o", "json", "ui", "--addr", "192.168.1.2:8080"}, 2, errdefs.CodeInvalidArgument},
		{"no port", sock, []string{"-o", "json", "ui", "--addr", "127.0.0.1"}, 2, errdefs.CodeInvalidArgument},
		{"daemon down", filepath.Join(t.TempDir(), "none.sock"), []string{"-o", "json", "ui"}, 11, errdefs.CodeUnavailable},
	} {
		r := esfctl(t, tt.socket, nil, tt.args...)
		if r.status != tt.status || r.stdout != "" {
			t.Errorf("%s: exit %d stdout %q, want exit %d and no URL", tt.name, r.status, r.stdout, tt.status)
			continue
		}
		if e := jsonError(t, r); e.Code != tt.code {
			t.Errorf("%s: code %s, want %s", tt.name, e.Code, tt.code)
		}
	}
}

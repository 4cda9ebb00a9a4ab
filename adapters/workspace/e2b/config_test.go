package e2b_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/esf-dev/esf/adapters/workspace/e2b"
)

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  e2b.Config
		bad  string
	}{
		{"zero", e2b.Config{}, ""},
		{"api url", e2b.Config{APIURL: "ftp://x"}, "APIURL"},
		{"sandbox url", e2b.Config{SandboxURL: "nohost"}, "SandboxURL"},
		{"scheme", e2b.Config{EnvdScheme: "ws"}, "EnvdScheme"},
		{"home", e2b.Config{Home: "rel"}, "Home"},
		{"port", e2b.Config{ProxyPort: 70000}, "port"},
		{"timeout", e2b.Config{Timeout: -time.Second}, "negative"},
		{"client timeout", e2b.Config{HTTPClient: &http.Client{Timeout: time.Second}}, "HTTPClient.Timeout"},
	} {
		err := tc.cfg.Validate()
		if tc.bad == "" && err != nil || tc.bad != "" && (err == nil || !strings.Contains(err.Error(), tc.bad)) {
			t.Errorf("%s: Validate = %v, want mention of %q", tc.name, err, tc.bad)
		}
		if _, nerr := e2b.New(tc.cfg); (nerr == nil) != (err == nil) {
			t.Errorf("%s: New disagrees with Validate: %v", tc.name, nerr)
		}
	}
}

func TestConfigFromEnv(t *testing.T) {
	t.Setenv("E2B_API_KEY", "e2b_abc")
	t.Setenv("E2B_DOMAIN", "example.dev")
	t.Setenv("E2B_API_URL", "")
	t.Setenv("E2B_SANDBOX_URL", "")
	t.Setenv("E2B_DEBUG", "true")
	c := e2b.ConfigFromEnv()
	if c.APIKey != "e2b_abc" || c.Domain != "example.dev" || c.APIURL != "http://localhost:3000" || c.SandboxURL != "http://localhost:49983" {
		t.Errorf("ConfigFromEnv = %+v", c)
	}
}

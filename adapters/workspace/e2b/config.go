package e2b

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/esf-dev/esf/adapters/workspace/e2b/envd"
)

// Config is everything the adapter needs that is not part of
// workspace.Spec: credentials, endpoints, the sandbox user and defaults.
// The zero value of every field but APIKey has a sensible default.
type Config struct {
	// APIKey authenticates the control plane (E2B_API_KEY).
	APIKey string
	// BearerAuth sends APIKey as "Authorization: Bearer" instead of
	// "X-API-Key" (what CubeSandbox's SDK does).
	BearerAuth bool
	// Domain is the service domain (E2B_DOMAIN), default "e2b.app": the
	// API lives at https://api.<Domain> and a sandbox's envd at
	// <EnvdPort>-<id>.<Domain>, unless the control plane names another
	// domain for the sandbox.
	Domain string
	// APIURL overrides the control-plane URL (E2B_API_URL).
	APIURL string

	// SandboxURL, when set, receives all envd traffic, routed by the
	// E2b-Sandbox-Id and E2b-Sandbox-Port headers (E2B_SANDBOX_URL).
	SandboxURL string
	// EnvdScheme is "https" (default) or "http".
	EnvdScheme string
	// EnvdPort is envd's port inside the sandbox, default 49983.
	EnvdPort int
	// ProxyPort is the port of the sandbox host; 0 is the scheme's default.
	ProxyPort int
	// ProxyAddr, when set, is the host:port envd requests dial while the
	// Host header still names <EnvdPort>-<id>.<domain> (CubeSandbox's
	// CUBE_PROXY_NODE_IP).
	ProxyAddr string
	// TrafficTokenHeaders are the header names a sandbox's traffic access
	// token travels under, when it has one. Default
	// ["e2b-traffic-access-token"].
	TrafficTokenHeaders []string

	// User runs commands and owns files, default "user".
	User string
	// Home is User's home directory: the base of "~" and of relative paths
	// when Spec.WorkDir is "". Default "/root" for root, else "/home/<User>".
	Home string
	// Template is used when Spec.Image is "", default "base".
	Template string
	// Timeout is the sandbox's lifetime when Spec.Timeout is zero, default
	// five minutes (the SDKs' default; the service's own is 15 s).
	Timeout time.Duration

	// HTTPClient carries every request; nil means a client without an
	// overall timeout. Its Timeout must be zero: command streams and
	// transfers last as long as their context.
	HTTPClient *http.Client
	// MaxRetries is how often an idempotent control-plane call is repeated
	// after 429 Too Many Requests, default 3; negative disables retries.
	MaxRetries int
	// MaxRetryWait is the longest wait honoured between retries, default
	// 10 s; a longer Retry-After fails at once with workspace.ErrPolicy.
	MaxRetryWait time.Duration
	// PollInterval paces state polling around pause and resume, default
	// 250 ms.
	PollInterval time.Duration
	// CleanupTimeout bounds the cleanup Create runs after its context
	// ended, default 30 s.
	CleanupTimeout time.Duration
	// Keepalive asks envd for keepalive events on quiet commands, default
	// 50 s as the SDKs do; negative disables.
	Keepalive time.Duration
	// Name labels errors (workspace.ProviderError.Provider), default "e2b".
	Name string
	// UserAgent is sent on every request, default "esf-workspace-e2b".
	UserAgent string
}

// ConfigFromEnv reads the variables the E2B SDKs read: E2B_API_KEY,
// E2B_DOMAIN, E2B_API_URL, E2B_SANDBOX_URL and E2B_DEBUG (which points both
// planes at localhost).
func ConfigFromEnv() Config {
	c := Config{
		APIKey:     os.Getenv("E2B_API_KEY"),
		Domain:     os.Getenv("E2B_DOMAIN"),
		APIURL:     os.Getenv("E2B_API_URL"),
		SandboxURL: os.Getenv("E2B_SANDBOX_URL"),
	}
	if os.Getenv("E2B_DEBUG") == "true" {
		if c.APIURL == "" {
			c.APIURL = "http://localhost:3000"
		}
		if c.SandboxURL == "" {
			c.SandboxURL = fmt.Sprintf("http://localhost:%d", envd.DefaultPort)
		}
	}
	return c
}

func (c Config) withDefaults() Config {
	if c.Domain == "" {
		c.Domain = "e2b.app"
	}
	if c.APIURL == "" {
		c.APIURL = "https://api." + c.Domain
	}
	if c.EnvdScheme == "" {
		c.EnvdScheme = "https"
	}
	if c.EnvdPort == 0 {
		c.EnvdPort = envd.DefaultPort
	}
	if c.TrafficTokenHeaders == nil {
		c.TrafficTokenHeaders = []string{envd.TrafficTokenE2B}
	}
	if c.User == "" {
		c.User = "user"
	}
	if c.Home == "" {
		c.Home = "/home/" + c.User
		if c.User == "root" {
			c.Home = "/root"
		}
	}
	if c.Template == "" {
		c.Template = "base"
	}
	if c.Timeout == 0 {
		c.Timeout = 5 * time.Minute
	}
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{}
	}
	if c.MaxRetries == 0 {
		c.MaxRetries = 3
	}
	if c.MaxRetries < 0 {
		c.MaxRetries = 0
	}
	if c.MaxRetryWait == 0 {
		c.MaxRetryWait = 10 * time.Second
	}
	if c.PollInterval == 0 {
		c.PollInterval = 250 * time.Millisecond
	}
	if c.CleanupTimeout == 0 {
		c.CleanupTimeout = 30 * time.Second
	}
	if c.Keepalive == 0 {
		c.Keepalive = 50 * time.Second
	}
	if c.Name == "" {
		c.Name = "e2b"
	}
	if c.UserAgent == "" {
		c.UserAgent = "esf-workspace-e2b"
	}
	return c
}

// Validate reports a configuration the adapter cannot use.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	for name, u := range map[string]string{"APIURL": c.APIURL, "SandboxURL": c.SandboxURL} {
		if u == "" {
			continue
		}
		pu, err := url.Parse(u)
		if err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
			errs = append(errs, fmt.Errorf("%s %q is not an http(s) URL", name, u))
		}
	}
	if c.EnvdScheme != "http" && c.EnvdScheme != "https" {
		errs = append(errs, fmt.Errorf("EnvdScheme %q is not http or https", c.EnvdScheme))
	}
	if c.EnvdPort < 0 || c.EnvdPort > 65535 || c.ProxyPort < 0 || c.ProxyPort > 65535 {
		errs = append(errs, errors.New("port out of range"))
	}
	if c.Home == "" || c.Home[0] != '/' {
		errs = append(errs, fmt.Errorf("Home %q is not absolute", c.Home))
	}
	if c.Timeout < 0 || c.MaxRetryWait < 0 || c.PollInterval < 0 || c.CleanupTimeout < 0 {
		errs = append(errs, errors.New("negative duration"))
	}
	if c.HTTPClient.Timeout != 0 {
		errs = append(errs, errors.New("HTTPClient.Timeout must be zero; contexts bound each call"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("e2b config: %w", err)
	}
	return nil
}

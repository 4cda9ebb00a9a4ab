package cubesandbox

import (
	"errors"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/esf-dev/esf/adapters/workspace/e2b"
	"github.com/esf-dev/esf/adapters/workspace/e2b/envd"
)

// Config is a CubeSandbox deployment and the caller's credentials. Field
// names follow the Cube SDK's configuration; ConfigFromEnv reads its
// variables.
type Config struct {
	// APIURL is CubeAPI's base URL (CUBE_API_URL, else E2B_API_URL),
	// default http://127.0.0.1:3000. Routes are served at the root and
	// under /cubeapi/v1; either base works.
	APIURL string
	// APIKey is sent as "Authorization: Bearer" (CUBE_API_KEY, else
	// E2B_API_KEY). CubeAPI enforces it only when an auth callback is
	// configured, so it may be empty.
	APIKey string
	// Template is the template used when Spec.Image is ""
	// (CUBE_TEMPLATE_ID). CubeSandbox has no default template.
	Template string
	// SandboxDomain is the data-plane domain (CUBE_SANDBOX_DOMAIN),
	// default "cube.app": envd is <49983>-<id>.<SandboxDomain>.
	SandboxDomain string
	// ProxyScheme is "http" or "https" (CUBE_PROXY_SCHEME), default http,
	// or https when ProxyPort is 443.
	ProxyScheme string
	// ProxyPort is CubeProxy's port (CUBE_PROXY_PORT_HTTP), default 80.
	ProxyPort int
	// ProxyNodeIP, when set, is dialled for data-plane requests (an IP,
	// or IP:port) while the Host header keeps the sandbox's virtual host
	// (CUBE_PROXY_NODE_IP).
	ProxyNodeIP string
	// User runs commands and owns files, default "root" (the Cube SDK's
	// default); Home defaults to /root.
	User, Home string
	// Timeout is the sandbox lifetime when Spec.Timeout is zero
	// (CUBE_TIMEOUT in seconds), default 300 s.
	Timeout time.Duration

	// HTTPClient, MaxRetries, MaxRetryWait, PollInterval and
	// CleanupTimeout mean what they mean in e2b.Config.
	HTTPClient     *http.Client
	MaxRetries     int
	MaxRetryWait   time.Duration
	PollInterval   time.Duration
	CleanupTimeout time.Duration
}

// ConfigFromEnv reads the Cube SDK's variables, falling back to the E2B
// names for the URL and key as the Cube SDK does.
func ConfigFromEnv() Config {
	c := Config{
		APIURL:        firstEnv("CUBE_API_URL", "E2B_API_URL"),
		APIKey:        firstEnv("CUBE_API_KEY", "E2B_API_KEY"),
		Template:      os.Getenv("CUBE_TEMPLATE_ID"),
		SandboxDomain: os.Getenv("CUBE_SANDBOX_DOMAIN"),
		ProxyScheme:   os.Getenv("CUBE_PROXY_SCHEME"),
		ProxyNodeIP:   os.Getenv("CUBE_PROXY_NODE_IP"),
	}
	if v, err := strconv.Atoi(os.Getenv("CUBE_PROXY_PORT_HTTP")); err == nil {
		c.ProxyPort = v
	}
	if v, err := strconv.Atoi(os.Getenv("CUBE_TIMEOUT")); err == nil && v > 0 {
		c.Timeout = time.Duration(v) * time.Second
	}
	return c
}

func firstEnv(names ...string) string {
	for _, n := range names {
		if v := os.Getenv(n); v != "" {
			return v
		}
	}
	return ""
}

// E2B translates c into the E2B adapter's configuration: the whole
// difference between the two services, as far as the adapter depends on
// it, is what this function sets.
func (c Config) E2B() (e2b.Config, error) {
	if c.Template == "" {
		return e2b.Config{}, errors.New("cubesandbox config: Template is required (CUBE_TEMPLATE_ID); CubeSandbox has no default template")
	}
	if c.APIURL == "" {
		c.APIURL = "http://127.0.0.1:3000"
	}
	if c.SandboxDomain == "" {
		c.SandboxDomain = "cube.app"
	}
	if c.ProxyPort == 0 {
		c.ProxyPort = 80
	}
	if c.ProxyScheme == "" {
		c.ProxyScheme = "http"
		if c.ProxyPort == 443 {
			c.ProxyScheme = "https"
		}
	}
	if c.User == "" {
		c.User = "root"
	}
	if c.Timeout == 0 {
		c.Timeout = 300 * time.Second
	}
	out := e2b.Config{
		Name:       "cubesandbox",
		UserAgent:  "esf-workspace-cubesandbox",
		APIURL:     c.APIURL,
		APIKey:     c.APIKey,
		BearerAuth: true,
		Domain:     c.SandboxDomain,
		EnvdScheme: c.ProxyScheme,
		EnvdPort:   envd.DefaultPort,
		// CubeProxy's tokens travel under both names (newer SDKs send
		// both; the proxy reads the cube- one).
		TrafficTokenHeaders: []string{envd.TrafficTokenE2B, envd.TrafficTokenCube},
		User:                c.User,
		Home:                c.Home,
		Template:            c.Template,
		Timeout:             c.Timeout,
		HTTPClient:          c.HTTPClient,
		MaxRetries:          c.MaxRetries,
		MaxRetryWait:        c.MaxRetryWait,
		PollInterval:        c.PollInterval,
		CleanupTimeout:      c.CleanupTimeout,
	}
	if (c.ProxyScheme == "http" && c.ProxyPort != 80) || (c.ProxyScheme == "https" && c.ProxyPort != 443) {
		out.ProxyPort = c.ProxyPort
	}
	if c.ProxyNodeIP != "" {
		addr := c.ProxyNodeIP
		if _, _, err := net.SplitHostPort(addr); err != nil {
			addr = net.JoinHostPort(addr, strconv.Itoa(c.ProxyPort))
		}
		out.ProxyAddr = addr
	}
	return out, out.Validate()
}

// New returns a workspace.Provider for CubeSandbox: the E2B adapter under
// the configuration E2B returns (see the package doc for why a profile
// suffices).
func New(c Config) (*e2b.Provider, error) {
	cfg, err := c.E2B()
	if err != nil {
		return nil, err
	}
	return e2b.New(cfg)
}

package opensandbox

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Defaults the zero Config gets. The resource limits and entrypoint are the
// provider's Go SDK defaults; the TTL is its DefaultTimeoutSeconds.
const (
	DefaultExecdPort      = 44772
	DefaultTimeout        = 10 * time.Minute
	DefaultReadyTimeout   = 2 * time.Minute
	DefaultPollInterval   = 100 * time.Millisecond
	DefaultMaxPoll        = 2 * time.Second
	DefaultMaxRetries     = 3
	DefaultMaxRetryWait   = 30 * time.Second
	DefaultCleanupTimeout = 30 * time.Second
	// MinTimeout is the lifecycle API's floor for a sandbox TTL.
	MinTimeout = 60 * time.Second
)

// Config is everything about OpenSandbox the workspace contract leaves out:
// where the server is, who we are, how execd is reached, what a sandbox is
// provisioned with, and how patient the adapter is. Only BaseURL is required.
type Config struct {
	// BaseURL is the lifecycle server's root, e.g. "http://localhost:8080".
	// The adapter talks to BaseURL + "/v1" (a trailing "/v1" is accepted).
	BaseURL string
	// APIKey is sent as OPEN-SANDBOX-API-KEY on every lifecycle call. Empty
	// sends nothing (servers without configured keys do not check).
	APIKey string
	// HTTPClient carries every call. It must not set Client.Timeout: command
	// streams and transfers last as long as their context allows. Nil means
	// a client of its own with the default transport.
	HTTPClient *http.Client

	// UseServerProxy asks for execd through the lifecycle server
	// (use_server_proxy=true) instead of the runtime's direct endpoint.
	UseServerProxy bool
	// ExecdPort is execd's port inside the sandbox; 0 means 44772.
	ExecdPort int
	// ExecdScheme is used when the resolved endpoint has no scheme; "" means
	// BaseURL's scheme.
	ExecdScheme string
	// ExecdAccessToken is sent as X-EXECD-ACCESS-TOKEN when the endpoint
	// lookup returned no such header. With UseServerProxy and no token the
	// API key is sent instead, as the provider's SDK does.
	ExecdAccessToken string

	// Image is provisioned when Spec.Image is "" (OpenSandbox has no default
	// image of its own). One of the two must be set.
	Image string
	// Entrypoint keeps the sandbox alive; nil means ["tail","-f","/dev/null"].
	Entrypoint []string
	// ResourceLimits is sent verbatim (e.g. {"cpu":"1","memory":"2Gi"});
	// nil means those SDK defaults.
	ResourceLimits map[string]string
	// DefaultTimeout is the sandbox TTL when Spec.Timeout is 0; 0 means ten
	// minutes, negative means none (manual cleanup, runtime permitting).
	// TTLs under a minute are raised to one (the API's minimum).
	DefaultTimeout time.Duration
	// Metadata is stored on every sandbox this provider creates, and
	// Sessions lists only sandboxes that carry all of it: the tenancy and
	// ownership tag. Keys and values must be Kubernetes label-safe.
	Metadata map[string]string
	// Home is the sandbox user's home directory ("~" and the default working
	// directory). "" means asking execd once per session (it expands "~").
	Home string

	// ReadyTimeout bounds Create's wait for the sandbox to run and execd to
	// answer, and Attach's wait for a Pending sandbox; 0 means two minutes.
	ReadyTimeout time.Duration
	// PollInterval is the first delay when polling for a state change; it
	// grows by half each time up to MaxPollInterval. 0 means 100ms and 2s.
	PollInterval, MaxPollInterval time.Duration
	// MaxRetries bounds retries of refused calls (429 on any call whose body
	// can be replayed; 502/503/504 on idempotent ones); 0 means 3, negative
	// means none.
	MaxRetries int
	// MaxRetryWait caps a single wait between retries. A Retry-After longer
	// than this, or than the context allows, is not waited for: the call
	// fails at once with workspace.ErrPolicy and the hint. 0 means 30s.
	MaxRetryWait time.Duration
	// CleanupTimeout bounds the work done on a fresh context after the
	// caller's ended: deleting a half-created sandbox, interrupting a
	// cancelled command. 0 means 30s.
	CleanupTimeout time.Duration
}

// withDefaults validates c and fills its zero fields.
func (c Config) withDefaults() (Config, *url.URL, error) {
	if c.BaseURL == "" {
		return c, nil, errors.New("opensandbox: Config.BaseURL is required")
	}
	u, err := url.Parse(strings.TrimRight(c.BaseURL, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return c, nil, fmt.Errorf("opensandbox: Config.BaseURL %q is not an http(s) URL", c.BaseURL)
	}
	u.Path = strings.TrimSuffix(strings.TrimRight(u.Path, "/"), "/v1") + "/v1"
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{}
	}
	if c.ExecdPort == 0 {
		c.ExecdPort = DefaultExecdPort
	}
	if c.ExecdPort < 1 || c.ExecdPort > 65535 {
		return c, nil, fmt.Errorf("opensandbox: Config.ExecdPort %d out of range", c.ExecdPort)
	}
	if c.ExecdScheme == "" {
		c.ExecdScheme = u.Scheme
	}
	if c.Entrypoint == nil {
		c.Entrypoint = []string{"tail", "-f", "/dev/null"}
	}
	if c.ResourceLimits == nil {
		c.ResourceLimits = map[string]string{"cpu": "1", "memory": "2Gi"}
	}
	if c.DefaultTimeout == 0 {
		c.DefaultTimeout = DefaultTimeout
	}
	if c.Home != "" && !strings.HasPrefix(c.Home, "/") {
		return c, nil, fmt.Errorf("opensandbox: Config.Home %q is not absolute", c.Home)
	}
	for k := range c.Metadata {
		if strings.HasPrefix(k, reservedPrefix) {
			return c, nil, fmt.Errorf("opensandbox: Config.Metadata key %q uses the adapter's reserved prefix %q", k, reservedPrefix)
		}
	}
	if c.ReadyTimeout == 0 {
		c.ReadyTimeout = DefaultReadyTimeout
	}
	if c.PollInterval <= 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.MaxPollInterval <= 0 {
		c.MaxPollInterval = DefaultMaxPoll
	}
	if c.MaxPollInterval < c.PollInterval {
		c.MaxPollInterval = c.PollInterval
	}
	if c.MaxRetries == 0 {
		c.MaxRetries = DefaultMaxRetries
	}
	if c.MaxRetries < 0 {
		c.MaxRetries = 0
	}
	if c.MaxRetryWait <= 0 {
		c.MaxRetryWait = DefaultMaxRetryWait
	}
	if c.CleanupTimeout <= 0 {
		c.CleanupTimeout = DefaultCleanupTimeout
	}
	return c, u, nil
}

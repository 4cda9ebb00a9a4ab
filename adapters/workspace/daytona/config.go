package daytona

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"time"
)

// DefaultAPIURL is Daytona Cloud's API.
const DefaultAPIURL = "https://app.daytona.io/api"

// ImageKind says how workspace.Spec.Image is read.
type ImageKind int

const (
	// ImageSnapshot: Spec.Image names a Daytona snapshot (id or name), sent
	// as CreateSandbox.snapshot. "" means the organisation's default.
	ImageSnapshot ImageKind = iota
	// ImageOCI: Spec.Image is an OCI image reference that Daytona builds on
	// create, sent as buildInfo.dockerfileContent "FROM <image>" (what the
	// SDKs do for an image string).
	ImageOCI
)

// Config is everything Daytona-specific: credentials, tenancy, endpoint and
// policy. None of it reaches workspace.Spec.
type Config struct {
	// APIKey authenticates as Authorization: Bearer <key>. Either APIKey or
	// JWTToken with OrganizationID is required.
	APIKey string
	// JWTToken with OrganizationID (sent as X-Daytona-Organization-ID)
	// authenticates a user session instead of an API key.
	JWTToken, OrganizationID string
	// APIURL is the API base; default DefaultAPIURL. Toolbox URLs come from
	// each sandbox's toolboxProxyUrl.
	APIURL string
	// Target is the region sandboxes are created in; "" is the default.
	Target string
	// ImageKind says whether Spec.Image is a snapshot (default) or an OCI
	// image.
	ImageKind ImageKind
	// Labels are added to every sandbox created and scope Sessions: only
	// sandboxes carrying all of them are listed. Nil lists every sandbox the
	// credentials can see. They are not reported as session Metadata.
	Labels map[string]string
	// AutoStopMinutes overrides Daytona's idle auto-stop (15 minutes by
	// default); negative disables it. A stopped sandbox reads as paused.
	AutoStopMinutes int
	// HTTPClient carries every request; default a client with no timeout
	// (contexts bound each call).
	HTTPClient *http.Client
	// PollInterval and PollMax bound the backoff between polls of an
	// asynchronous state change or of a running command; defaults 25ms and
	// 500ms.
	PollInterval, PollMax time.Duration
	// MaxRetries is how often a rate-limited (429) request with a
	// replayable body is retried after its Retry-After; 0 means 3, negative
	// means never.
	MaxRetries int
	// MaxRetryWait is the longest Retry-After honoured; a longer one ends
	// the call at once with ErrPolicy. Default 30s.
	MaxRetryWait time.Duration
	// CleanupTimeout bounds the cleanup done on a fresh context after the
	// caller's ended (deleting a half-created sandbox, a command's process
	// session). Default 60s.
	CleanupTimeout time.Duration
	// MaxStdin bounds sandbox.Spec.Stdin, which is read completely before
	// the command starts (Daytona has no stdin stream that can be closed).
	// Default 8 MiB.
	MaxStdin int
}

// ConfigFromEnv reads the variables the Daytona SDKs read: DAYTONA_API_KEY,
// DAYTONA_JWT_TOKEN, DAYTONA_ORGANIZATION_ID, DAYTONA_API_URL (or the legacy
// DAYTONA_SERVER_URL) and DAYTONA_TARGET.
func ConfigFromEnv() Config {
	c := Config{
		APIKey:         os.Getenv("DAYTONA_API_KEY"),
		JWTToken:       os.Getenv("DAYTONA_JWT_TOKEN"),
		OrganizationID: os.Getenv("DAYTONA_ORGANIZATION_ID"),
		APIURL:         os.Getenv("DAYTONA_API_URL"),
		Target:         os.Getenv("DAYTONA_TARGET"),
	}
	if c.APIURL == "" {
		c.APIURL = os.Getenv("DAYTONA_SERVER_URL")
	}
	return c
}

func (c *Config) setDefaults() {
	if c.APIURL == "" {
		c.APIURL = DefaultAPIURL
	}
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{}
	}
	if c.PollInterval <= 0 {
		c.PollInterval = 25 * time.Millisecond
	}
	if c.PollMax <= 0 {
		c.PollMax = 500 * time.Millisecond
	}
	if c.PollMax < c.PollInterval {
		c.PollMax = c.PollInterval
	}
	switch {
	case c.MaxRetries == 0:
		c.MaxRetries = 3
	case c.MaxRetries < 0:
		c.MaxRetries = 0
	}
	if c.MaxRetryWait <= 0 {
		c.MaxRetryWait = 30 * time.Second
	}
	if c.CleanupTimeout <= 0 {
		c.CleanupTimeout = 60 * time.Second
	}
	if c.MaxStdin <= 0 {
		c.MaxStdin = 8 << 20
	}
}

// Validate reports a configuration that cannot work.
func (c *Config) Validate() error {
	switch {
	case c.APIKey == "" && c.JWTToken == "":
		return errors.New("daytona: config needs APIKey or JWTToken")
	case c.APIKey == "" && c.OrganizationID == "":
		return errors.New("daytona: JWTToken needs OrganizationID")
	case c.ImageKind != ImageSnapshot && c.ImageKind != ImageOCI:
		return fmt.Errorf("daytona: unknown ImageKind %d", c.ImageKind)
	}
	if c.APIURL != "" {
		u, err := url.Parse(c.APIURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("daytona: APIURL %q is not an http(s) URL", c.APIURL)
		}
	}
	for k := range c.Labels {
		if isInternalLabel(k) {
			return fmt.Errorf("daytona: label %q uses the reserved prefix %q", k, labelPrefix)
		}
	}
	return nil
}

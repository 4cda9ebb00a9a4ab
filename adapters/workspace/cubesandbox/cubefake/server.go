package cubefake

import (
	"time"

	"github.com/esf-dev/esf/adapters/workspace/e2b/e2bfake"
	"github.com/esf-dev/esf/adapters/workspace/e2b/envd"
)

// Dialect is what CubeAPI and CubeProxy do differently from E2B.
var Dialect = e2bfake.Dialect{
	Prefix:             "/cubeapi/v1",
	BearerAuth:         true,
	HostRouting:        true,
	TrafficTokenHeader: envd.TrafficTokenCube,
	AsyncPause:         true,
	ConnectOK:          true,
	ListAll:            true,
	NoRetryAfter:       true,
	LooseTimeouts:      true,
	DefaultTimeout:     300 * time.Second,
	SecureByDefault:    true,
}

// Options shapes a Server.
type Options struct {
	// APIKey, when set, must arrive as a Bearer token or X-API-Key.
	APIKey string
	// Domain is CubeProxy's sandbox domain, default "cube.app".
	Domain string
	// EnvdVersion is reported for every sandbox, default "0.6.13".
	EnvdVersion string
	// Templates, when set, are the only template ids create accepts.
	Templates []string
	// Dir holds one directory per sandbox; default a temporary directory.
	Dir string
	// CreateDelay is how long create takes after the sandbox exists.
	CreateDelay time.Duration
	// PauseDelay is how long a sandbox stays "pausing" after pause
	// answered 204; ResumeDelay how long connect takes to resume.
	PauseDelay, ResumeDelay time.Duration
	// TrafficToken gives sandboxes a traffic token that CubeProxy then
	// requires in cube-traffic-access-token.
	TrafficToken bool
}

// Server is an offline CubeSandbox: e2bfake's Server speaking Dialect.
type Server struct {
	*e2bfake.Server
}

// New starts a Server; Close stops it.
func New(opts Options) (*Server, error) {
	if opts.Domain == "" {
		opts.Domain = "cube.app"
	}
	s, err := e2bfake.New(e2bfake.Options{
		APIKey:       opts.APIKey,
		Domain:       opts.Domain,
		EnvdVersion:  opts.EnvdVersion,
		User:         "root",
		Dir:          opts.Dir,
		CreateDelay:  opts.CreateDelay,
		PauseDelay:   opts.PauseDelay,
		ResumeDelay:  opts.ResumeDelay,
		TrafficToken: opts.TrafficToken,
		Templates:    opts.Templates,
		Dialect:      Dialect,
	})
	if err != nil {
		return nil, err
	}
	return &Server{s}, nil
}

// RateLimit makes the next n control-plane requests answer 429 (CubeAPI's
// limiter sends no Retry-After).
func (s *Server) RateLimit(n int) { s.Server.RateLimit(n, 0) }

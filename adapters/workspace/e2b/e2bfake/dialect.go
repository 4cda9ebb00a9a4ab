package e2bfake

import "time"

// Dialect is what a service that speaks E2B's API does differently from
// E2B. The zero value is E2B; CubeSandbox's fake is one Dialect (see
// cubefake), so the registry, state machine and proxy exist once.
type Dialect struct {
	// Prefix, when set, serves every control-plane route under it as well
	// as at the root (CubeAPI's "/cubeapi/v1"). Calls counts both under
	// the unprefixed pattern.
	Prefix string
	// BearerAuth accepts the API key as "Authorization: Bearer" besides
	// X-API-Key.
	BearerAuth bool
	// HostRouting reaches envd by the "<port>-<id>.<domain>" Host alone,
	// as CubeProxy does; E2B's edge also honours E2b-Sandbox-Id.
	HostRouting bool
	// TrafficTokenHeader is where the proxy wants the traffic token,
	// default envd.TrafficTokenE2B.
	TrafficTokenHeader string
	// AsyncPause answers pause 204 at once; the sandbox reads "pausing"
	// until PauseDelay has passed. E2B's pause returns when it is done.
	AsyncPause bool
	// ConnectOK makes connect answer 200 even when it resumed (E2B: 201),
	// and the deprecated resume route an alias of connect.
	ConnectOK bool
	// ListAll makes both list routes ignore filters and pages and answer
	// every sandbox in any state.
	ListAll bool
	// NoRetryAfter sends 429s without Retry-After or RateLimit-* headers,
	// whatever RateLimit was told.
	NoRetryAfter bool
	// LooseTimeouts: a negative timeout means the sandbox never expires,
	// connect's timeout is optional and only extends, and nothing bounds
	// a timeout (E2B: 0..24 h, required on connect).
	LooseTimeouts bool
	// DefaultTimeout is a sandbox's lifetime when create names none,
	// default 15 s.
	DefaultTimeout time.Duration
	// SecureByDefault gives a sandbox an envd access token unless create
	// says "secure": false (E2B: only when it says true).
	SecureByDefault bool
}

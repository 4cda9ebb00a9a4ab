// Package e2bfake is an offline E2B for tests: the control-plane REST API
// and the edge proxy in one httptest server (Server), in front of one fake
// envd per sandbox (Envd).
//
// Services that copy E2B's API differ from it in small, listed ways; a
// Dialect names them (auth header, route prefix, connect and pause
// answers, list filtering, 429 headers, timeout rules, envd routing and
// the traffic-token header), so one registry, state machine and proxy
// serve them all. CubeSandbox's fake (cubefake) is Server with its
// Dialect; it runs E2B's envd unchanged, as Cube does. Error texts are
// E2B's in every dialect: clients classify by status.
//
// It behaves like the service where the adapter depends on it, as read
// from E2B's API spec and envd's source (PROTOCOLS.md §1): status codes
// and JSON error bodies ({"code":<int>,"message":...} on the control plane
// and /files, Connect's {"code":"not_found",...} on RPCs, end-of-stream
// frames for streaming errors); synchronous pause that answers 409 to
// lifecycle calls while it runs; connect 200 vs 201; the proxy's 502 for a
// missing or paused sandbox; access-token and traffic-token checks; 429
// with Retry-After on demand (RateLimit); expiry at the sandbox's
// timeout; paging with X-Next-Token. Envd's processes outlive a closed
// stream and are killed by Connect-Timeout-Ms, as on the real envd.
//
// Commands really run. Each sandbox is a host directory; with root on
// Linux, commands run chrooted into it inside a private mount namespace
// (see Envd), so they see the same files as the RPCs. Count and Processes
// expose what a leak check needs: live sandboxes and running processes.
//
// Not modelled: PTYs, WatchDir, process List/Connect/StreamInput, upload
// signatures, gzip transfer encoding, templates, snapshots, networks,
// metrics; processes do not survive a pause (E2B keeps them in the memory
// snapshot).
//
// Concurrency: Server and Envd are safe for concurrent use; Close waits
// for every process and holder it started.
package e2bfake

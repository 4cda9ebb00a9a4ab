// Package cubefake is an offline CubeSandbox: e2bfake's Server speaking
// CubeAPI's and CubeProxy's Dialect, so the control plane, the proxy and
// envd are not faked twice (CubeSandbox ships E2B's envd unchanged).
//
// What differs from E2B, as read from CubeAPI and the Cube SDK: Bearer
// auth (X-API-Key also accepted), enforced only when an API key is
// configured; every route also under /cubeapi/v1; connect answers 200 even
// when it resumed, and resume is connect; pause answers 204 at once and
// the sandbox reads "pausing" until the snapshot is done; 429 without
// Retry-After; list endpoints that ignore filters and pages; a default
// lifetime of 300 s, -1 meaning never, connect's timeout optional; secure
// (an envd access token) unless create says otherwise; envd reached only
// by Host "<port>-<id>.<domain>", with the traffic token (when enabled)
// required in cube-traffic-access-token; user root.
//
// The state name "pausing" is this fake's assumption; CubeAPI's state
// strings other than running and paused were not visible in the sources.
//
// Concurrency: a Server is safe for concurrent use; Close stops pending
// transitions, kills every process and removes the sandboxes' files.
package cubefake

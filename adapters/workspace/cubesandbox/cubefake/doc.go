// Package cubefake is an offline CubeSandbox: CubeAPI's control plane and
// CubeProxy's virtual-host routing in one httptest server, in front of
// e2bfake's envd (CubeSandbox ships E2B's envd unchanged, so the data
// plane is not faked twice).
//
// Where it differs from e2bfake, it follows CubeAPI and the Cube SDK as
// read from their sources: Bearer auth (X-API-Key also accepted), enforced
// only when an API key is configured; every route also under /cubeapi/v1;
// connect answers 200 even when it resumed; pause answers 204 at once and
// the sandbox reads "pausing" until the snapshot is done; 429 without
// Retry-After; list endpoints that ignore filters and pages; envd reached
// only by Host "<port>-<id>.<domain>", with the traffic token (when
// enabled) required in cube-traffic-access-token; user root.
//
// The state name "pausing" is this fake's assumption; CubeAPI's state
// strings other than running and paused were not visible in the sources.
//
// Concurrency: a Server is safe for concurrent use; Close stops pending
// transitions, kills every process and removes the sandboxes' files.
package cubefake

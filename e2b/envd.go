package e2b

import (
	"context"
	"encoding/base64"
	"net/http"
	"strings"

	"github.com/esf-dev/esf/e2b/envdwire"
)

// envd: every sandbox's envd is served on the front door's one port, the
// sandbox named by E2b-Sandbox-Id (the SDKs send it with every envd call
// when pointed at one URL) and its access token checked on every call but
// /health.

func (s *Server) routeEnvd() {
	m := s.envd
	m.Handle("POST "+envdwire.ProcStart, serverStream(s.processStart))
	m.Handle("POST "+envdwire.ProcConnect, serverStream(s.processConnect))
	m.Handle("POST "+envdwire.ProcList, unary(s.processList))
	m.Handle("POST "+envdwire.ProcSendInput, unary(s.processSendInput))
	m.Handle("POST "+envdwire.ProcCloseStdin, unary(s.processCloseStdin))
	m.Handle("POST "+envdwire.ProcSendSignal, unary(s.processSendSignal))
	m.Handle("POST "+envdwire.ProcUpdate, unary(s.processUpdate))
	m.Handle("POST "+envdwire.FsStat, unary(s.fsStat))
	m.Handle("POST "+envdwire.FsListDir, unary(s.fsListDir))
	m.Handle("POST "+envdwire.FsMakeDir, unary(s.fsMakeDir))
	m.Handle("POST "+envdwire.FsMove, unary(s.fsMove))
	m.Handle("POST "+envdwire.FsRemove, unary(s.fsRemove))
	m.Handle("POST "+envdwire.FsWatch, serverStream(s.fsWatchDir))
	m.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeRPCError(w, rpcErr(codeUnimplemented, "%s %s is not served", r.Method, r.URL.Path))
	})
}

type envdKey struct{}

// envdCtx is what serveEnvd found out about a call.
type envdCtx struct {
	sb   *sandbox
	user string
}

// serveEnvd finds the sandbox and checks the access token, then serves
// the call.
func (s *Server) serveEnvd(w http.ResponseWriter, r *http.Request) {
	r, _ = s.traced(w, r)
	id := r.Header.Get(envdwire.HeaderSandboxID)
	if r.URL.Path == "/health" && r.Method == http.MethodGet {
		s.envd.ServeHTTP(w, r)
		return
	}
	if r.URL.Path == "/files" && (r.Method == http.MethodGet || r.Method == http.MethodPost) {
		s.serveFiles(w, r)
		return
	}
	if id == "" {
		writeEnvdError(w, http.StatusBadRequest, "missing "+envdwire.HeaderSandboxID+" header")
		return
	}
	sb, err := s.lookup(r.Context(), id)
	if err != nil {
		// What E2B's edge proxy answers for a sandbox that is gone.
		writeGone(w, id)
		return
	}
	if !s.tokenOK(sb, r.Header.Get(envdwire.HeaderAccessToken)) {
		writeEnvdError(w, http.StatusUnauthorized,
			"unauthorized access, please provide a valid access token or method signing if supported")
		return
	}
	user, ok := basicUser(r.Header.Get("Authorization"))
	if !ok {
		writeEnvdError(w, http.StatusUnauthorized, "invalid authorization header")
		return
	}
	if user == "" {
		user = "user"
	}
	if user != "user" && user != "root" {
		writeEnvdError(w, http.StatusUnauthorized, "invalid username: '"+user+"': esf sandboxes know the users user and root")
		return
	}
	r = r.WithContext(context.WithValue(r.Context(), envdKey{}, &envdCtx{sb: sb, user: user}))
	s.envd.ServeHTTP(w, r)
}

// envdCall returns the sandbox and user of an envd call.
func (s *Server) envdCall(r *http.Request) (*sandbox, string, error) {
	c, ok := r.Context().Value(envdKey{}).(*envdCtx)
	if !ok {
		return nil, "", rpcErr(codeInternal, "no sandbox")
	}
	return c.sb, c.user, nil
}

// basicUser reads the user of Authorization: Basic base64("user:").
func basicUser(h string) (string, bool) {
	if h == "" {
		return "", true
	}
	raw, ok := strings.CutPrefix(h, "Basic ")
	if !ok {
		return "", false
	}
	b, err := base64.StdEncoding.DecodeString(raw)
	if err != nil {
		return "", false
	}
	u, _, _ := strings.Cut(string(b), ":")
	return u, true
}

// writeEnvdError writes envd's plain HTTP error body.
func writeEnvdError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, envdwire.HTTPErrorBody{Code: status, Message: msg})
}

func quote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, c := range s {
		if c == '"' || c == '\\' || c < 0x20 {
			continue
		}
		b.WriteRune(c)
	}
	b.WriteByte('"')
	return b.String()
}

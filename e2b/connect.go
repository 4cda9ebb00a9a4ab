package e2b

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
)

// The Connect protocol as envd's clients speak it, JSON codec only:
//
//   - unary: POST with an application/json body; the reply is 200 and
//     the JSON message, or a non-2xx status and {"code","message"} with
//     the Connect code name;
//   - server streaming: POST application/connect+json whose body is one
//     envelope (flag byte, 4-byte big-endian length, JSON); the reply is
//     200 and a series of envelopes, the last of flag 0x02 holding {} or
//     {"error":{"code","message"}}. A stream that fails before its first
//     message still answers 200 and carries the error in that last
//     envelope, as the protocol says.

// rpcError is a Connect error: a code name and a message.
type rpcError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *rpcError) Error() string { return e.Code + ": " + e.Message }

// Connect codes used here.
const (
	codeInvalidArgument    = "invalid_argument"
	codeNotFound           = "not_found"
	codeAlreadyExists      = "already_exists"
	codeFailedPrecondition = "failed_precondition"
	codeUnauthenticated    = "unauthenticated"
	codePermissionDenied   = "permission_denied"
	codeDeadlineExceeded   = "deadline_exceeded"
	codeResourceExhausted  = "resource_exhausted"
	codeUnimplemented      = "unimplemented"
	codeInternal           = "internal"
	codeUnavailable        = "unavailable"
	codeCanceled           = "canceled"
)

// rpcStatus is the HTTP status of a unary error, from the Connect spec.
var rpcStatus = map[string]int{
	codeCanceled: 499, codeInvalidArgument: 400, codeDeadlineExceeded: 504, codeNotFound: 404,
	codeAlreadyExists: 409, codePermissionDenied: 403, codeResourceExhausted: 429,
	codeFailedPrecondition: 400, codeUnimplemented: 501, codeInternal: 500, codeUnavailable: 503,
	codeUnauthenticated: 401,
}

func rpcErr(code, format string, args ...any) *rpcError {
	return &rpcError{Code: code, Message: fmt.Sprintf(format, args...)}
}

// asRPC turns any error into a Connect error (internal unless it is one).
func asRPC(err error) *rpcError {
	var re *rpcError
	if errors.As(err, &re) {
		return re
	}
	return &rpcError{Code: codeInternal, Message: err.Error()}
}

// maxRPCBody bounds a request message (SendInput carries stdin).
const maxRPCBody = 16 << 20

// unary serves one unary method: decode the JSON body into a new Req,
// call h, write its answer.
func unary[Req, Resp any](h func(r *http.Request, req *Req) (*Resp, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req Req
		if err := decodeUnary(r, &req); err != nil {
			writeRPCError(w, err)
			return
		}
		resp, err := h(r, &req)
		if err != nil {
			writeRPCError(w, asRPC(err))
			return
		}
		b, err := json.Marshal(resp)
		if err != nil {
			writeRPCError(w, asRPC(err))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(b)
	}
}

func decodeUnary(r *http.Request, v any) *rpcError {
	if ct := mediaType(r.Header.Get("Content-Type")); ct != "application/json" && ct != "" {
		return rpcErr(codeUnimplemented, "content type %q: this server speaks application/json only", ct)
	}
	if enc := r.Header.Get("Content-Encoding"); enc != "" && enc != "identity" {
		return rpcErr(codeUnimplemented, "content encoding %q is not supported", enc)
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, maxRPCBody+1))
	if err != nil {
		return rpcErr(codeInvalidArgument, "read request: %v", err)
	}
	if len(b) > maxRPCBody {
		return rpcErr(codeResourceExhausted, "request of more than %d bytes", maxRPCBody)
	}
	if len(b) == 0 {
		return nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		return rpcErr(codeInvalidArgument, "decode request: %v", err)
	}
	return nil
}

func writeRPCError(w http.ResponseWriter, e *rpcError) {
	status, ok := rpcStatus[e.Code]
	if !ok {
		status = 500
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(e)
}

func mediaType(ct string) string {
	ct, _, _ = strings.Cut(ct, ";")
	return strings.ToLower(strings.TrimSpace(ct))
}

// stream is the writing side of one server-streaming response.
type stream struct {
	mu    sync.Mutex
	w     http.ResponseWriter
	rc    *http.ResponseController
	err   error // sticky: the client is gone
	ended bool
}

// serverStream serves a server-streaming method: decode the request
// envelope into a new Req and call h with a stream to send messages on;
// the end envelope carries h's error.
func serverStream[Req any](h func(r *http.Request, req *Req, s *stream) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s := &stream{w: w, rc: http.NewResponseController(w)}
		w.Header().Set("Content-Type", "application/connect+json")
		var req Req
		if err := decodeEnvelope(r, &req); err != nil {
			s.end(err)
			return
		}
		s.end(h(r, &req, s))
	}
}

func decodeEnvelope(r *http.Request, v any) error {
	if ct := mediaType(r.Header.Get("Content-Type")); ct != "application/connect+json" {
		return rpcErr(codeUnimplemented, "content type %q: streams speak application/connect+json only", ct)
	}
	if enc := r.Header.Get("Connect-Content-Encoding"); enc != "" && enc != "identity" {
		return rpcErr(codeUnimplemented, "content encoding %q is not supported", enc)
	}
	var hdr [5]byte
	if _, err := io.ReadFull(r.Body, hdr[:]); err != nil {
		return rpcErr(codeInvalidArgument, "read request envelope: %v", err)
	}
	if hdr[0]&1 != 0 {
		return rpcErr(codeUnimplemented, "compressed request envelope")
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > maxRPCBody {
		return rpcErr(codeResourceExhausted, "request of %d bytes", n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r.Body, b); err != nil {
		return rpcErr(codeInvalidArgument, "read request: %v", err)
	}
	if len(b) == 0 {
		return nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		return rpcErr(codeInvalidArgument, "decode request: %v", err)
	}
	return nil
}

// send writes one message envelope and flushes it.
func (s *stream) send(msg any) error {
	b, err := json.Marshal(msg)
	if err != nil {
		return err
	}
	return s.write(0, b)
}

func (s *stream) write(flag byte, b []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	if s.ended {
		return errors.New("stream ended")
	}
	var hdr [5]byte
	hdr[0] = flag
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(b)))
	if _, err := s.w.Write(append(hdr[:], b...)); err != nil {
		s.err = err
		return err
	}
	if err := s.rc.Flush(); err != nil {
		s.err = err
		return err
	}
	return nil
}

// end writes the end-of-stream envelope with err (nil: success).
func (s *stream) end(err error) {
	body := []byte("{}")
	if err != nil {
		body, _ = json.Marshal(struct {
			Error *rpcError `json:"error"`
		}{asRPC(err)})
	}
	s.write(2, body)
	s.mu.Lock()
	s.ended = true
	s.mu.Unlock()
}

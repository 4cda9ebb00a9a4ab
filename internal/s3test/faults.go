package s3test

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// FaultKind is what the proxy does to one request.
type FaultKind int

const (
	// Pass forwards the request and the response untouched.
	Pass FaultKind = iota
	// Status answers with Fault.Status (500, 503) without forwarding.
	Status
	// Reset drops the connection (TCP RST) before any response.
	Reset
	// ResetUpload reads half of the request body, then drops the
	// connection: the upstream never sees a complete request.
	ResetUpload
	// Truncate forwards, then sends only the first half of the response
	// body and drops the connection.
	Truncate
	// Flip forwards and flips one bit in the middle of the response body.
	Flip
	// Slow forwards and sends the response body in small pieces with
	// Fault.Delay between them.
	Slow
)

// Fault is the decision for one request.
type Fault struct {
	Kind   FaultKind
	Status int
	Delay  time.Duration
}

// Proxy is a fault-injecting reverse proxy in front of a server: every
// request goes through Decide, which the test sets. It keeps the Host
// header the client signed, so SigV4 signatures stay valid upstream.
type Proxy struct {
	// Endpoint is the proxy's URL.
	Endpoint string
	upstream string
	srv      *http.Server
	ln       net.Listener
	decide   atomic.Pointer[func(*http.Request) Fault]
	client   *http.Client

	mu     sync.Mutex
	counts map[FaultKind]int
}

// StartProxy starts a proxy in front of s, passing everything until Set.
// It stops when t ends.
func StartProxy(t testing.TB, s *Server) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{Endpoint: "http://" + ln.Addr().String(), upstream: s.Endpoint, ln: ln,
		client: &http.Client{Transport: &http.Transport{DisableCompression: true}}, counts: map[FaultKind]int{}}
	p.srv = &http.Server{Handler: p}
	go p.srv.Serve(ln)
	t.Cleanup(func() {
		p.srv.Close()
		p.client.CloseIdleConnections()
	})
	return p
}

// Set installs the fault decision (nil: pass everything).
func (p *Proxy) Set(decide func(*http.Request) Fault) {
	if decide == nil {
		p.decide.Store(nil)
		return
	}
	p.decide.Store(&decide)
}

// Count is how many requests got fault kind k.
func (p *Proxy) Count(k FaultKind) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.counts[k]
}

func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f := Fault{}
	if d := p.decide.Load(); d != nil {
		f = (*d)(r)
	}
	p.mu.Lock()
	p.counts[f.Kind]++
	p.mu.Unlock()
	switch f.Kind {
	case Status:
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(f.Status)
		return
	case Reset:
		reset(w)
		return
	case ResetUpload:
		if r.ContentLength > 1 {
			io.CopyN(io.Discard, r.Body, r.ContentLength/2)
		}
		reset(w)
		return
	}
	out, err := http.NewRequestWithContext(r.Context(), r.Method, p.upstream+r.URL.RequestURI(), r.Body)
	if err != nil {
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	out.Header = r.Header.Clone()
	out.Host = r.Host
	out.ContentLength = r.ContentLength
	resp, err := p.client.Do(out)
	if err != nil {
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	switch f.Kind {
	case Truncate, Flip:
		body, _ := io.ReadAll(resp.Body)
		if len(body) == 0 {
			w.WriteHeader(resp.StatusCode)
			return
		}
		if f.Kind == Flip {
			body = bytes.Clone(body)
			body[len(body)/2] ^= 0x10
			w.WriteHeader(resp.StatusCode)
			w.Write(body)
			return
		}
		w.WriteHeader(resp.StatusCode)
		w.Write(body[:len(body)/2])
		if fl, ok := w.(http.Flusher); ok {
			fl.Flush()
		}
		reset(w)
	case Slow:
		w.WriteHeader(resp.StatusCode)
		buf := make([]byte, 4096)
		for {
			n, err := resp.Body.Read(buf)
			if n > 0 {
				w.Write(buf[:n])
				if fl, ok := w.(http.Flusher); ok {
					fl.Flush()
				}
				time.Sleep(f.Delay)
			}
			if err != nil {
				return
			}
		}
	default:
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, resp.Body)
	}
}

// reset closes the client's connection with a TCP RST.
func reset(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic("s3test: response writer cannot be hijacked")
	}
	conn, _, err := hj.Hijack()
	if err != nil {
		return
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	conn.Close()
}

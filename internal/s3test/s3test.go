// Package s3test starts a real S3 server (versitygw with its posix backend)
// on loopback for tests and benchmarks, from the pinned binary that
// scripts/versitygw.sh installs ($ESF_VERSITYGW; make test sets it). Start
// calls testenv.Require(t, "s3") first, so CI fails without it.
//
// The server is a child process serving a temporary directory with test
// credentials; Stop (registered with t.Cleanup by Start) kills it and
// removes the directory. Buckets are directories under Server.Dir, objects
// files under them, so a test can damage an object in place (Path).
package s3test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/esf-dev/esf/internal/proctest"
	"github.com/esf-dev/esf/internal/testenv"
)

// Test credentials and region of every server.
const (
	AccessKey = "esf-test-access"
	SecretKey = "esf-test-secret-key"
	Region    = "us-east-1"
)

// Server is a running versitygw.
type Server struct {
	// Endpoint is the server's URL, http://127.0.0.1:PORT.
	Endpoint string
	// Dir is the posix backend's root: one directory per bucket.
	Dir string

	top  string
	proc proctest.Proc
}

// Start starts a server for t and stops it when t ends. It skips or fails
// t (testenv) when no versitygw binary is configured.
func Start(t testing.TB) *Server {
	t.Helper()
	testenv.Require(t, "s3")
	s, err := StartServer()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// StartServer is Start outside a test (a TestMain, a benchmark): the caller
// stops it.
func StartServer() (*Server, error) {
	bin, err := testenv.VersityGWBinary()
	if err != nil {
		return nil, err
	}
	top, err := os.MkdirTemp("", "s3test")
	if err != nil {
		return nil, err
	}
	s := &Server{top: top, Dir: filepath.Join(top, "data")}
	s.proc.LogFile = filepath.Join(top, "versitygw.log")
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		os.RemoveAll(top)
		return nil, err
	}
	// A free port: a clash with another process in the moment between is
	// retried.
	for attempt := 0; ; attempt++ {
		port, err := freePort()
		if err != nil {
			s.Stop()
			return nil, err
		}
		s.Endpoint = fmt.Sprintf("http://127.0.0.1:%d", port)
		s.proc.Args = []string{bin, "--port", fmt.Sprintf("127.0.0.1:%d", port), "posix", s.Dir}
		s.proc.Env = append(os.Environ(), "ROOT_ACCESS_KEY="+AccessKey, "ROOT_SECRET_KEY="+SecretKey)
		if err = s.run(); err == nil {
			if err = s.waitReady(60 * time.Second); err == nil {
				return s, nil
			}
		}
		s.proc.Kill()
		if attempt == 3 || !strings.Contains(s.Log(), "address already in use") {
			s.Stop()
			return nil, err
		}
	}
}

func (s *Server) run() error {
	if err := s.proc.Start(); err != nil {
		return fmt.Errorf("s3test: %w", err)
	}
	return nil
}

// waitReady waits until this server, and no other, answers on its port.
// An answer alone does not say whose it is: when two servers start at once
// and their free ports collide, the second one's process is still starting
// (to fail with "address already in use") while the first one answers on
// the port it will never get. So the server must also show a bucket that
// only its own directory holds.
func (s *Server) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	c := &http.Client{Timeout: 2 * time.Second}
	probe := filepath.Base(s.top) // s3testNNN: a valid bucket name, unique to this server
	if err := os.Mkdir(filepath.Join(s.Dir, probe), 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("s3test: %w", err)
	}
	defer os.Remove(filepath.Join(s.Dir, probe))
	var last error
	for time.Now().Before(deadline) {
		if !s.Running() {
			return fmt.Errorf("s3test: versitygw exited:\n%s", s.proc.Tail())
		}
		resp, err := c.Get(s.Endpoint + "/")
		if err == nil {
			resp.Body.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err = s.Client().HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String(probe)})
			cancel()
			if err == nil {
				return nil
			}
			err = fmt.Errorf("the server on the port does not show this server's directory (another server's port?): %w", err)
		}
		last = err
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("s3test: versitygw not ready after %v: %v\n%s", timeout, last, s.proc.Tail())
}

// Running reports whether the server process runs.
func (s *Server) Running() bool { return s.proc.Running() }

// Kill ends the server with SIGKILL and waits for it (the data stays:
// Restart serves it again on the same port).
func (s *Server) Kill() { s.proc.Kill() }

// Restart starts a killed server again on its data and port.
func (s *Server) Restart() error {
	if s.Running() {
		return errors.New("s3test: server is running")
	}
	if err := s.run(); err != nil {
		return err
	}
	return s.waitReady(60 * time.Second)
}

// Stop kills the server and removes its directory.
func (s *Server) Stop() {
	s.proc.Kill()
	os.RemoveAll(s.top)
}

// Log is what the server wrote so far.
func (s *Server) Log() string { return s.proc.Log() }

// Client returns an S3 client of the server with the test credentials,
// configured for path-style addressing like any third-party server.
func (s *Server) Client() *s3.Client {
	return s3.New(s3.Options{
		BaseEndpoint:               aws.String(s.Endpoint),
		Region:                     Region,
		Credentials:                credentials.NewStaticCredentialsProvider(AccessKey, SecretKey, ""),
		UsePathStyle:               true,
		RequestChecksumCalculation: aws.RequestChecksumCalculationWhenRequired,
		ResponseChecksumValidation: aws.ResponseChecksumValidationWhenRequired,
	})
}

// Bucket creates a bucket with a name unique to this server and returns
// it.
func (s *Server) Bucket(t testing.TB) string {
	t.Helper()
	name, err := s.NewBucket(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return name
}

var bucketSeq struct {
	mu sync.Mutex
	n  int
}

// NewBucket is Bucket outside a test.
func (s *Server) NewBucket(ctx context.Context) (string, error) {
	bucketSeq.mu.Lock()
	bucketSeq.n++
	name := fmt.Sprintf("esf-test-%d", bucketSeq.n)
	bucketSeq.mu.Unlock()
	if _, err := s.Client().CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(name)}); err != nil {
		return "", fmt.Errorf("s3test: create bucket %s: %w", name, err)
	}
	return name, nil
}

// Path is the file under Dir that holds key in bucket (the posix backend
// stores each object as a file).
func (s *Server) Path(bucket, key string) string {
	return filepath.Join(s.Dir, bucket, filepath.FromSlash(key))
}

// Env is the environment an esfd child needs to reach the server with the
// test credentials (the standard AWS variables).
func (s *Server) Env() []string {
	return []string{"AWS_ACCESS_KEY_ID=" + AccessKey, "AWS_SECRET_ACCESS_KEY=" + SecretKey, "AWS_REGION=" + Region}
}

// URL is the esfd --cas-remote value for bucket and prefix.
func (s *Server) URL(bucket, prefix string) string {
	return fmt.Sprintf("s3://%s/%s?endpoint=%s&region=%s", bucket, prefix, s.Endpoint, Region)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

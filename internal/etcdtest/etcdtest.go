// Package etcdtest starts real etcd clusters (1 or 3 members) on loopback
// for tests and benchmarks, from the pinned server binary that
// scripts/etcd.sh builds ($ESF_ETCD; make test sets it). Tests call
// testenv.Require(t, "etcd") first (Start does), so CI fails without it.
//
// Each member is a child process with its data under a temporary directory;
// Stop (registered with t.Cleanup by Start) kills them and removes it.
// Members can be killed (SIGKILL) and restarted on the same data, for the
// fault tests; Leader finds the current leader.
package etcdtest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/esf-dev/esf/internal/proctest"
	"github.com/esf-dev/esf/internal/testcert"
	"github.com/esf-dev/esf/internal/testenv"
)

// Options shape a cluster.
type Options struct {
	// Members is 1 or 3 (default 1).
	Members int
	// NoFsync runs etcd with --unsafe-no-fsync: no durability against a
	// machine crash (a process kill loses nothing either way, the page
	// cache survives it), for tests that only need the semantics.
	NoFsync bool
	// Dir holds the members' data; default a new temporary directory,
	// removed by Stop.
	Dir string
	// TLS serves clients over TLS with certificates of a throwaway CA
	// (Cluster.CAFile; Cluster.Client is a client certificate it signed).
	TLS bool
}

// Cluster is a running etcd cluster.
type Cluster struct {
	Members []*Member
	// CAFile and ClientCert are set with Options.TLS: the CA of the members'
	// certificates, and a client certificate it signed.
	CAFile     string
	ClientCert testcert.Pair
	dir        string
	ownDir     bool
	mu         sync.Mutex
}

// Member is one etcd process.
type Member struct {
	Name      string
	ClientURL string
	PeerURL   string
	proc      proctest.Proc
}

// Start starts a cluster for t and stops it when t ends. It skips or fails
// t (testenv) when no etcd binary is configured.
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	testenv.Require(t, "etcd")
	c, err := StartCluster(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	return c
}

// StartCluster is Start outside a test (a TestMain, a benchmark): the
// caller stops it.
func StartCluster(opts Options) (*Cluster, error) {
	bin, err := testenv.EtcdBinary()
	if err != nil {
		return nil, err
	}
	if opts.Members == 0 {
		opts.Members = 1
	}
	if opts.Members != 1 && opts.Members != 3 {
		return nil, fmt.Errorf("etcdtest: %d members: want 1 or 3", opts.Members)
	}
	c := &Cluster{dir: opts.Dir}
	if c.dir != "" {
		if err := os.MkdirAll(c.dir, 0o700); err != nil {
			return nil, err
		}
	} else {
		if c.dir, err = os.MkdirTemp("", "etcdtest"); err != nil {
			return nil, err
		}
		c.ownDir = true
	}
	// Ports: ask the kernel for free ones; a clash with another process in
	// the moment between is retried as a whole.
	for attempt := 0; ; attempt++ {
		err = c.start(bin, opts)
		if err == nil {
			return c, nil
		}
		c.killAll()
		if attempt == 3 || !strings.Contains(err.Error(), "address already in use") {
			c.Stop()
			return nil, err
		}
	}
}

func (c *Cluster) start(bin string, opts Options) error {
	c.Members = nil
	ports, err := freePorts(2 * opts.Members)
	if err != nil {
		return err
	}
	token := fmt.Sprintf("esf-%d-%d", os.Getpid(), time.Now().UnixNano())
	scheme := "http"
	var server testcert.Pair
	if opts.TLS {
		ca, err := testcert.NewCA(c.dir)
		if err != nil {
			return err
		}
		if server, err = ca.Issue("member", "127.0.0.1"); err != nil {
			return err
		}
		if c.ClientCert, err = ca.Issue("client", "127.0.0.1"); err != nil {
			return err
		}
		c.CAFile, scheme = ca.CertFile, "https"
	}
	var initial []string
	for i := range opts.Members {
		m := &Member{
			Name:      fmt.Sprintf("m%d", i),
			ClientURL: fmt.Sprintf("%s://127.0.0.1:%d", scheme, ports[2*i]),
			PeerURL:   fmt.Sprintf("http://127.0.0.1:%d", ports[2*i+1]),
		}
		c.Members = append(c.Members, m)
		initial = append(initial, m.Name+"="+m.PeerURL)
	}
	for _, m := range c.Members {
		data := filepath.Join(c.dir, m.Name)
		if err := os.RemoveAll(data); err != nil {
			return err
		}
		m.proc.LogFile = filepath.Join(c.dir, m.Name+".log")
		m.proc.Args = []string{bin,
			"--name", m.Name, "--data-dir", data,
			"--listen-client-urls", m.ClientURL, "--advertise-client-urls", m.ClientURL,
			"--listen-peer-urls", m.PeerURL, "--initial-advertise-peer-urls", m.PeerURL,
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
			"--initial-cluster-token", token, "--log-level", "warn",
		}
		if opts.NoFsync {
			m.proc.Args = append(m.proc.Args, "--unsafe-no-fsync")
		}
		if opts.TLS {
			m.proc.Args = append(m.proc.Args, "--cert-file", server.CertFile, "--key-file", server.KeyFile, "--trusted-ca-file", c.CAFile)
		}
		if err := m.run(); err != nil {
			return err
		}
	}
	return c.WaitReady(60 * time.Second)
}

func (m *Member) run() error {
	if err := m.proc.Start(); err != nil {
		return fmt.Errorf("etcdtest: %s: %w", m.Name, err)
	}
	return nil
}

// Log is what the member wrote so far.
func (m *Member) Log() string { return m.proc.Log() }

// Running reports whether the member's process runs.
func (m *Member) Running() bool { return m.proc.Running() }

// Kill ends the member with SIGKILL and waits for it.
func (m *Member) Kill() { m.proc.Kill() }

// Restart starts a killed member again on its data.
func (m *Member) Restart() error {
	if m.Running() {
		return fmt.Errorf("etcdtest: %s is running", m.Name)
	}
	args := append([]string(nil), m.proc.Args...)
	for i := range args {
		if args[i] == "new" && i > 0 && args[i-1] == "--initial-cluster-state" {
			args[i] = "existing"
		}
	}
	m.proc.Args = args
	return m.run()
}

// Endpoints are the members' client URLs.
func (c *Cluster) Endpoints() []string {
	var eps []string
	for _, m := range c.Members {
		eps = append(eps, m.ClientURL)
	}
	return eps
}

// URL is the esfd --journal value for the cluster and prefix.
func (c *Cluster) URL(prefix string) string {
	var hosts []string
	scheme := "etcd://"
	for _, m := range c.Members {
		h, secure := strings.CutPrefix(m.ClientURL, "https://")
		if secure {
			scheme = "etcds://"
		}
		hosts = append(hosts, strings.TrimPrefix(h, "http://"))
	}
	return scheme + strings.Join(hosts, ",") + "/" + prefix
}

// Client returns a client of the cluster, closed when t ends.
func (c *Cluster) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	cli, err := c.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// NewClient returns a client of the cluster; the caller closes it.
func (c *Cluster) NewClient() (*clientv3.Client, error) {
	return c.newClient(c.Endpoints(), 10*time.Second)
}

func (c *Cluster) newClient(eps []string, timeout time.Duration) (*clientv3.Client, error) {
	cfg := clientv3.Config{Endpoints: eps, DialTimeout: timeout, Logger: zap.NewNop()}
	if c.CAFile != "" {
		tc, err := c.TLSConfig()
		if err != nil {
			return nil, err
		}
		cfg.TLS = tc
	}
	return clientv3.New(cfg)
}

// TLSConfig is a client TLS configuration for a TLS cluster: its CA, and
// the client certificate.
func (c *Cluster) TLSConfig() (*tls.Config, error) {
	pem, err := os.ReadFile(c.CAFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	cert, err := tls.LoadX509KeyPair(c.ClientCert.CertFile, c.ClientCert.KeyFile)
	if err != nil {
		return nil, err
	}
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}, nil
}

// WaitReady waits until every running member answers and the cluster has
// a leader.
func (c *Cluster) WaitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		for _, m := range c.Members {
			if m.proc.Exited() {
				return fmt.Errorf("etcdtest: %s exited:\n%s", m.Name, m.proc.Tail())
			}
		}
		if _, last = c.Leader(); last == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	var logs []string
	for _, m := range c.Members {
		logs = append(logs, m.Name+":\n"+m.proc.Tail())
	}
	return fmt.Errorf("etcdtest: cluster not ready after %v: %v\n%s", timeout, last, strings.Join(logs, "\n"))
}

// Leader returns the index of the member that leads, asking the running
// members.
func (c *Cluster) Leader() (int, error) {
	var eps []string
	for _, m := range c.Members {
		if m.Running() {
			eps = append(eps, m.ClientURL)
		}
	}
	if len(eps) == 0 {
		return -1, errors.New("etcdtest: no member runs")
	}
	cli, err := c.newClient(eps, 2*time.Second)
	if err != nil {
		return -1, err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, ep := range eps {
		st, err := cli.Status(ctx, ep)
		if err != nil {
			return -1, err
		}
		if st.Leader == 0 {
			return -1, errors.New("etcdtest: no leader yet")
		}
		if st.Leader == st.Header.MemberId {
			for i, m := range c.Members {
				if m.ClientURL == ep {
					return i, nil
				}
			}
		}
	}
	return -1, errors.New("etcdtest: the leader is not a running member")
}

// Stop kills every member and removes the data if Start made its directory.
func (c *Cluster) Stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.killAll()
	if c.ownDir {
		os.RemoveAll(c.dir)
	}
}

func (c *Cluster) killAll() {
	for _, m := range c.Members {
		m.Kill()
	}
}

func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

package etcd

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/esf-dev/esf/journal"
)

// Config is how an operator names a journal on etcd (esfd --journal and
// its --etcd-* flags): a URL and the files that hold its secrets.
type Config struct {
	// URL is etcd://HOST[:PORT][,HOST[:PORT]...]/PREFIX, or etcds:// for
	// TLS. The port defaults to 2379; PREFIX is the cluster prefix every
	// key lives under.
	URL string
	// CAFile verifies the members' certificates (default: the system's
	// roots); CertFile and KeyFile are a client certificate. Any of them
	// needs etcds://.
	CAFile, CertFile, KeyFile string
	// User and PasswordFile authenticate to a cluster with auth enabled;
	// the file holds the password (a trailing newline is dropped).
	User, PasswordFile string
}

// IsURL reports whether s names an etcd journal.
func IsURL(s string) bool {
	return strings.HasPrefix(s, "etcd://") || strings.HasPrefix(s, "etcds://")
}

// Options turns c into Options (endpoints, prefix, TLS, credentials),
// reading the files it names.
func (c Config) Options() (Options, error) {
	var o Options
	secure := strings.HasPrefix(c.URL, "etcds://")
	rest, ok := strings.CutPrefix(c.URL, "etcd://")
	if secure {
		rest, ok = strings.CutPrefix(c.URL, "etcds://")
	}
	bad := func(format string, args ...any) (Options, error) {
		return Options{}, fmt.Errorf("journal %q: "+format+": %w", append([]any{c.URL}, append(args, journal.ErrInvalidArgument)...)...)
	}
	if !ok {
		return bad("want etcd://HOST:PORT[,HOST:PORT...]/PREFIX or etcds://...")
	}
	hosts, prefix, _ := strings.Cut(rest, "/")
	if strings.ContainsAny(prefix, "?#") || strings.Contains(hosts, "@") {
		return bad("no query, fragment or credentials in the URL (use --etcd-user and --etcd-password-file)")
	}
	if _, err := newKeys(prefix); err != nil {
		return bad("want a key prefix after the hosts, e.g. /esf")
	}
	o.Prefix = prefix
	scheme := "http://"
	if secure {
		scheme = "https://"
	}
	for _, h := range strings.Split(hosts, ",") {
		if h == "" {
			return bad("empty host")
		}
		if _, _, err := net.SplitHostPort(h); err != nil {
			h = net.JoinHostPort(strings.Trim(h, "[]"), "2379")
			if _, _, err := net.SplitHostPort(h); err != nil {
				return bad("host %q", h)
			}
		}
		o.Endpoints = append(o.Endpoints, scheme+h)
	}
	if !secure && (c.CAFile != "" || c.CertFile != "" || c.KeyFile != "") {
		return bad("TLS files given for a plain etcd:// URL (use etcds://)")
	}
	if secure {
		cfg, err := tlsConfig(c.CAFile, c.CertFile, c.KeyFile)
		if err != nil {
			return Options{}, fmt.Errorf("journal %q: %w", c.URL, err)
		}
		o.TLS = cfg
	}
	if (c.User == "") != (c.PasswordFile == "") {
		return bad("give both a user and a password file, or neither")
	}
	if c.User != "" {
		b, err := os.ReadFile(c.PasswordFile)
		if err != nil {
			return Options{}, fmt.Errorf("journal password: %w", err)
		}
		o.Username, o.Password = c.User, strings.TrimRight(string(b), "\r\n")
	}
	return o, nil
}

func tlsConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("CA file: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA file %s: no PEM certificate: %w", caFile, journal.ErrInvalidArgument)
		}
	}
	if (certFile == "") != (keyFile == "") {
		return nil, fmt.Errorf("give both a client certificate and its key, or neither: %w", journal.ErrInvalidArgument)
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/esf-dev/esf/api"
	"github.com/esf-dev/esf/e2b"
	"github.com/esf-dev/esf/executor"
	"github.com/esf-dev/esf/fabric"
)

// e2bFlags configure the E2B-compatible front door (package e2b).
func e2bFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{
			Name: "e2b-addr",
			Usage: "serve E2B's control plane and envd protocol at HOST:PORT (e.g. 127.0.0.1:3000), for the unmodified " +
				"E2B SDKs (docs/e2b.md); off when empty; needs --e2b-keys",
			Sources: cli.EnvVars("ESF_E2B_ADDR"),
		},
		&cli.StringFlag{
			Name:    "e2b-keys",
			Usage:   "file of the API keys (X-API-KEY) the E2B front door accepts: one per line (e2b_<hex>), # comments; re-read when it changes",
			Sources: cli.EnvVars("ESF_E2B_KEYS"),
		},
		&cli.StringFlag{
			Name:    "e2b-tls-cert",
			Usage:   "certificate (PEM) of --e2b-addr, with --e2b-tls-key; re-read when it changes",
			Sources: cli.EnvVars("ESF_E2B_TLS_CERT"),
		},
		&cli.StringFlag{
			Name:    "e2b-tls-key",
			Usage:   "the --e2b-tls-cert certificate's private key (PEM)",
			Sources: cli.EnvVars("ESF_E2B_TLS_KEY"),
		},
		&cli.StringFlag{
			Name:    "e2b-domain",
			Usage:   "the domain E2B replies name for the sandboxes (the SDKs' getHost builds PORT-ID.DOMAIN from it); empty: none",
			Sources: cli.EnvVars("ESF_E2B_DOMAIN"),
		},
	}
}

// serveE2B starts the front door if --e2b-addr is set. stop ends it: the
// listener closes, requests get grace to finish, commands are killed.
func serveE2B(cmd *cli.Command, f *fabric.Fabric, limits executor.Limits, rootUID uint32, log *slog.Logger) (stop func(), err error) {
	addr := cmd.String("e2b-addr")
	cert, key, keys := cmd.String("e2b-tls-cert"), cmd.String("e2b-tls-key"), cmd.String("e2b-keys")
	if addr == "" {
		if cert != "" || key != "" || keys != "" {
			return nil, fmt.Errorf("--e2b-keys, --e2b-tls-cert and --e2b-tls-key configure --e2b-addr, which is not given")
		}
		return func() {}, nil
	}
	if keys == "" {
		return nil, fmt.Errorf("--e2b-addr needs --e2b-keys (the API keys it accepts)")
	}
	if (cert == "") != (key == "") {
		return nil, fmt.Errorf("--e2b-tls-cert and --e2b-tls-key go together")
	}
	toks, err := api.LoadTokens(keys, log)
	if err != nil {
		return nil, fmt.Errorf("--e2b-keys: %w", err)
	}
	var tlsCfg *tls.Config
	if cert != "" {
		if tlsCfg, err = api.ServerTLS(cert, key); err != nil {
			return nil, fmt.Errorf("--e2b-tls-cert: %w", err)
		}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--e2b-addr: %w", err)
	}
	if tlsCfg != nil {
		ln = tls.NewListener(ln, tlsCfg)
	}
	memMB := int(limits.MemoryBytes >> 20)
	srv := e2b.New(f, e2b.Options{Keys: toks, Logger: log.With("front", "e2b"), Domain: cmd.String("e2b-domain"),
		CPUCount: max(int(limits.CPUs+0.999), 1), MemoryMB: memMB, RootUID: rootUID})
	// The sandboxes of before a restart (docs/e2b.md, State): what cannot
	// be restored is logged, the rest is served.
	rctx, rcancel := context.WithTimeout(context.Background(), time.Minute)
	if err := srv.Restore(rctx); err != nil {
		log.Warn("e2b front door: restore its sandboxes", "err", err)
	}
	rcancel()
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("e2b front door", "err", err)
		}
	}()
	log.Info("e2b front door listening", "addr", ln.Addr().String(), "tls", tlsCfg != nil)
	if host, _, _ := net.SplitHostPort(addr); tlsCfg == nil && !isLoopback(host) {
		log.Warn("the E2B front door serves plain HTTP beyond loopback: API keys and access tokens cross the network in clear (--e2b-tls-cert)",
			"addr", addr)
	}
	grace := cmd.Duration("shutdown-grace")
	return func() {
		// Commands first: their streams then end, and shutdown need not
		// wait the grace period for them.
		srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), grace)
		defer cancel()
		if hs.Shutdown(ctx) != nil {
			hs.Close()
		}
		<-done
	}, nil
}

// isLoopback reports whether host names only this machine.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

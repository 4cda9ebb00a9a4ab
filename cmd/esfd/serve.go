package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/esf-dev/esf/api"
	"github.com/esf-dev/esf/delta"
	"github.com/esf-dev/esf/executor"
	"github.com/esf-dev/esf/executor/runc"
	"github.com/esf-dev/esf/fabric"
	"github.com/esf-dev/esf/internal/size"
	"github.com/esf-dev/esf/journal"
	journaletcd "github.com/esf-dev/esf/journal/etcd"
	"github.com/esf-dev/esf/metrics"
	"github.com/esf-dev/esf/wasi"
)

const defaultState = "/var/lib/esf"

func stateFlag() cli.Flag {
	return &cli.StringFlag{
		Name:    "state",
		Usage:   "state directory (object store, journal, mounts)",
		Value:   defaultState,
		Sources: cli.EnvVars("ESF_STATE"),
	}
}

func logLevelFlag() cli.Flag {
	return &cli.StringFlag{
		Name:    "log-level",
		Usage:   "debug, info, warn or error",
		Value:   "info",
		Sources: cli.EnvVars("ESF_LOG_LEVEL"),
	}
}

// journalFlags choose the state plane; serve and stop-all take them.
func journalFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{
			Name: "journal",
			Usage: "the state plane: empty for the embedded pebble journal under the state dir, or " +
				"etcd://HOST:PORT[,HOST:PORT...]/PREFIX (etcds:// for TLS) for a journal on an etcd cluster",
			Sources: cli.EnvVars("ESF_JOURNAL"),
		},
		&cli.StringFlag{
			Name:    "etcd-ca",
			Usage:   "CA certificate (PEM) that verifies the etcd members (etcds://; default: the system's roots)",
			Sources: cli.EnvVars("ESF_ETCD_CA"),
		},
		&cli.StringFlag{
			Name:    "etcd-cert",
			Usage:   "client certificate (PEM) for etcd (etcds://), with --etcd-key",
			Sources: cli.EnvVars("ESF_ETCD_CERT"),
		},
		&cli.StringFlag{
			Name:    "etcd-key",
			Usage:   "the client certificate's key (PEM)",
			Sources: cli.EnvVars("ESF_ETCD_KEY"),
		},
		&cli.StringFlag{
			Name:    "etcd-user",
			Usage:   "etcd user, for a cluster with auth enabled (with --etcd-password-file)",
			Sources: cli.EnvVars("ESF_ETCD_USER"),
		},
		&cli.StringFlag{
			Name:    "etcd-password-file",
			Usage:   "file holding the etcd user's password",
			Sources: cli.EnvVars("ESF_ETCD_PASSWORD_FILE"),
		},
		&cli.StringFlag{
			Name: "worker",
			Usage: "this worker's id on an etcd journal (default: the host name); one process per id, " +
				"a restarted worker on the same --state takes its id back at once, another waits for its previous holder's lease to end",
			Sources: cli.EnvVars("ESF_WORKER"),
		},
		&cli.DurationFlag{
			Name: "worker-ttl",
			Usage: "the TTL of the worker's etcd lease: a worker silent that long is fenced (its commits refused, " +
				"its sandboxes stopped) and the others fail its attempts",
			Value:   10 * time.Second,
			Sources: cli.EnvVars("ESF_WORKER_TTL"),
		},
		&cli.StringFlag{
			Name:    "peer-cacert",
			Usage:   "CA certificate (PEM) that verifies the other workers' --listen certificates (default: the system's roots)",
			Sources: cli.EnvVars("ESF_PEER_CACERT"),
		},
		&cli.StringFlag{
			Name: "advertise",
			Usage: "the API address other workers and clients reach this worker at (https://HOST:PORT); " +
				"default derived from --listen",
			Sources: cli.EnvVars("ESF_ADVERTISE"),
		},
	}
}

// registerWorker makes the daemon a worker of the graph on an etcd
// journal: it registers under a lease of --worker-ttl, with state, the
// identity of its state dir's lock (taking the id back at once from a
// previous process of the same state dir, which is dead since the lock is
// ours; waiting for any other holder of the id to be gone). Nil on a
// pebble journal.
func registerWorker(ctx context.Context, cmd *cli.Command, s journal.Store, capacity int, state string, log *slog.Logger) (*fabric.Cluster, error) {
	es, ok := s.(*journaletcd.Store)
	if !ok {
		return nil, nil
	}
	id := cmd.String("worker")
	if id == "" {
		id, _ = os.Hostname()
	}
	addr := cmd.String("advertise")
	if l := cmd.String("listen"); addr == "" && l != "" {
		scheme := "https://"
		if cmd.String("tls-cert") == "" {
			scheme = "http://"
		}
		addr = scheme + strings.TrimPrefix(l, "tcp://")
	}
	ttl := cmd.Duration("worker-ttl")
	reg, err := es.Register(ctx, journaletcd.Worker{ID: id, Addr: addr, Capacity: capacity, State: state}, ttl)
	if err != nil {
		return nil, err
	}
	log.Info("registered as a worker", "worker", id, "addr", addr, "ttl", ttl)
	return &fabric.Cluster{Store: es, Registration: reg, Interval: max(ttl/4, 100*time.Millisecond)}, nil
}

func serveFlags() []cli.Flag {
	flags := []cli.Flag{
		stateFlag(),
		&cli.StringFlag{
			Name:    "socket",
			Usage:   "unix socket of the API (default: <state>/esfd.sock)",
			Sources: cli.EnvVars("ESF_SOCKET"),
		},
		&cli.StringFlag{
			Name: "listen",
			Usage: "also serve the API on the network at tcp://HOST:PORT; needs --tokens, and TLS " +
				"(--tls-cert, --tls-key) unless HOST is loopback",
			Sources: cli.EnvVars("ESF_LISTEN"),
		},
		&cli.StringFlag{
			Name:    "tls-cert",
			Usage:   "certificate (PEM, with its chain) of the --listen address; re-read when it changes",
			Sources: cli.EnvVars("ESF_TLS_CERT"),
		},
		&cli.StringFlag{
			Name:    "tls-key",
			Usage:   "the certificate's private key (PEM)",
			Sources: cli.EnvVars("ESF_TLS_KEY"),
		},
		&cli.StringFlag{
			Name: "tokens",
			Usage: "file of the bearer tokens --listen accepts: one per line (16+ characters), # comments; " +
				"re-read when it changes",
			Sources: cli.EnvVars("ESF_TOKENS"),
		},
		&cli.BoolFlag{
			Name: "insecure-listen",
			Usage: "allow --listen without --tokens, or on a non-loopback address without TLS: " +
				"anyone who reaches the port then drives esfd (which runs as root)",
		},
		logLevelFlag(),
	}
	flags = append(flags, journalFlags()...)
	flags = append(flags, remoteFlags()...)
	flags = append(flags, e2bFlags()...)
	return append(flags,
		&cli.DurationFlag{
			Name:  "shutdown-grace",
			Usage: "how long in-flight requests may run after SIGTERM",
			Value: 30 * time.Second,
		},
		&cli.IntFlag{
			Name:  "max-attempts",
			Usage: "live attempts this daemon runs at once; more are queued FIFO (0: unbounded)",
		},
		&cli.StringFlag{
			Name:  "max-memory",
			Usage: "total memory live attempts may reserve, e.g. 8G (empty: unbounded)",
		},
		&cli.StringFlag{
			Name:  "default-memory",
			Usage: "memory limit of a runc attempt that names none (--memory), and what it reserves against --max-memory (0: unlimited)",
			Value: "1G",
		},
		&cli.Int64Flag{
			Name:  "default-pids",
			Usage: "processes and threads a runc attempt may have when it names no --pids (0: unlimited)",
			Value: 1024,
		},
		&cli.Float64Flag{
			Name:  "default-cpus",
			Usage: "CPU time per wall second of a runc attempt that names no --cpus (0: unlimited)",
			Value: 1,
		},
		&cli.StringFlag{
			Name:  "default-disk",
			Usage: "disk limit of an attempt's delta (bytes and, through metadata, files) when its activation sets none, e.g. 10G; deltas then live in a btrfs pool under the state dir (0: no limits)",
			Value: "10G",
		},
		&cli.StringFlag{
			Name:  "wasi-memory",
			Usage: "total linear memory all running WASI modules may hold in esfd, e.g. 2G; a run takes its memory limit (at most all of it) and waits until that fits (0: unbounded)",
			Value: "2G",
		},
		&cli.StringFlag{
			Name:  "metrics-addr",
			Usage: "serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9464); off when empty",
		},
		&cli.StringFlag{
			Name: "userns-range",
			Usage: "START:COUNT host ids that runc containers run as (their root is START), " +
				"like an /etc/subuid entry; give each daemon on a host its own range; off runs containers as host root",
			Value: defaultUserNSRange,
		},
		&cli.IntFlag{
			Name: "runc-pool",
			Usage: "runc containers kept started for activations to adopt (a warm start); " +
				"they count against --max-attempts with the live attempts (0: none, the default while the pool is new)",
			Value: 0,
		},
		&cli.StringFlag{
			Name:  "init",
			Usage: "the static container init (default: esf-init beside esfd); runc attempts are refused without it",
		},
	)
}

// leaseReapInterval is how often the daemon fails attempts whose lease
// expired. A lease's TTL is its promise; a second of slack is well within it.
const leaseReapInterval = time.Second

// keyExpiryInterval is how often the daemon deletes the results of made-up
// idempotency keys past fabric.Options.GeneratedKeyTTL.
const keyExpiryInterval = time.Minute

// corruptReportInterval is how often the daemon turns what the projection
// recorded of corrupt blobs into cas.corrupt events (a stat and, rarely, a
// read of a small file).
const corruptReportInterval = time.Second

func serve(ctx context.Context, cmd *cli.Command) error {
	if cmd.Args().Len() > 0 {
		return fmt.Errorf("unexpected arguments %q (see esfd --help)", cmd.Args().Slice())
	}
	level := cmd.String("log-level")
	log, err := newLogger(level)
	if err != nil {
		return err
	}
	routeContainerdLog(log)
	state, err := filepath.Abs(cmd.String("state"))
	if err != nil {
		return err
	}
	socket := cmd.String("socket")
	if socket == "" {
		socket = filepath.Join(state, "esfd.sock")
	}
	projection, err := projectionCommand(state, level, cmd.String("cas-remote"))
	if err != nil {
		return err
	}

	maxMem, err := size.Parse(cmd.String("max-memory"))
	if err != nil {
		return err
	}
	limits, err := defaultLimits(cmd)
	if err != nil {
		return err
	}
	userns, err := parseUserNSRange(cmd.String("userns-range"))
	if err != nil {
		return err
	}
	var idmap *delta.IDMap
	if userns.Count > 0 {
		if idmap, err = delta.NewIDMap(userns.Start, userns.Count); err != nil {
			return fmt.Errorf("--userns-range: %w", err)
		}
		defer idmap.Close()
	}
	ex, err := runcExecutor(state, cmd.String("init"), userns, log)
	if err != nil {
		log.Warn("runc attempts disabled", "reason", err)
	}
	defaultDisk, err := size.Parse(cmd.String("default-disk"))
	if err != nil {
		return fmt.Errorf("--default-disk: %w", err)
	}
	wasiMem, err := size.Parse(cmd.String("wasi-memory"))
	if err != nil {
		return fmt.Errorf("--wasi-memory: %w", err)
	}
	wrt, err := wasi.New(ctx, wasi.Options{CacheDir: filepath.Join(state, "wasm-cache"), Logger: log, MemoryBudget: uint64(wasiMem)})
	if err != nil {
		return err
	}
	defer wrt.Close(context.WithoutCancel(ctx))
	opts := fabric.Options{StateDir: state, Logger: log, ProjectionCommand: projection,
		MaxLiveAttempts: int(cmd.Int("max-attempts")), MaxMemoryBytes: maxMem, WASI: wrt, IDMap: idmap, DefaultLimits: limits,
		DefaultDiskBytes: defaultDisk}
	if ex != nil {
		opts.Executor = ex
	}
	remote, err := openRemote(ctx, cmd, state, log)
	if err != nil {
		return err
	}
	if remote != nil {
		opts.Remote = remote
		opts.RemoteAsync = cmd.String("remote-durability") == "async"
		if opts.CacheSize, err = size.Parse(cmd.String("cache-size")); err != nil {
			return fmt.Errorf("--cache-size: %w", err)
		}
	} else if cmd.String("cache-size") != "" {
		return fmt.Errorf("--cache-size bounds the cache in front of --cas-remote, which is not given")
	}
	if opts.JournalStore, err = openJournal(ctx, cmd, log); err != nil {
		return err
	}
	// The state dir's lock, held from before the worker registers: it is
	// what lets a restarted esfd take its registration back at once.
	if opts.StateLock, err = fabric.LockState(state); err != nil {
		if opts.JournalStore != nil {
			opts.JournalStore.Close()
		}
		return err
	}
	if opts.Cluster, err = registerWorker(ctx, cmd, opts.JournalStore, opts.MaxLiveAttempts, opts.StateLock.ID(), log); err != nil {
		opts.StateLock.Close()
		opts.JournalStore.Close()
		return err
	}
	f, err := fabric.Open(ctx, opts)
	if err != nil {
		if opts.Cluster != nil {
			opts.Cluster.Registration.Close()
		}
		if opts.JournalStore != nil {
			opts.JournalStore.Close()
		}
		return err
	}
	defer f.Close()
	if ex != nil {
		// After Open: the quota has given the pool its room by now.
		ex.SetPoolSize(int(cmd.Int("runc-pool")))
		// Deferred after f.Close, so it runs before it: the idle
		// containers go before the fabric unmounts its projection, which
		// a container's mount namespace could otherwise hold on to (an
		// activation meanwhile starts cold).
		defer func() {
			if err := ex.ClosePool(context.WithoutCancel(ctx)); err != nil {
				log.Warn("runc pool", "err", err)
			}
		}()
	}
	if opts.Cluster != nil {
		// Runs before f.Close: leaving revokes the lease, so the other
		// workers fail this one's live attempts at once (on a shared
		// graph, attempts do not outlive their worker's registration).
		defer opts.Cluster.Registration.Close()
	}
	// Adopt the attempts a previous daemon left (their mounts and the
	// projection server outlive it), before any request can touch them.
	// An attempt that cannot be recovered is failed by Recover itself;
	// what it reports is logged, never fatal: the rest of the graph is fine.
	if err := f.Recover(ctx); err != nil {
		log.Error("recovery incomplete", "err", err)
	}
	ln, err := api.Listen(socket)
	if err != nil {
		return err
	}
	lns := []net.Listener{ln}
	if addr := cmd.String("listen"); addr != "" {
		nl, err := listenNetwork(addr, cmd, log)
		if err != nil {
			ln.Close()
			return err
		}
		lns = append(lns, nl)
		log.Info("listening", "addr", addr, "tls", cmd.String("tls-cert") != "", "tokens", cmd.String("tokens") != "")
	} else if cmd.String("tls-cert") != "" || cmd.String("tls-key") != "" || cmd.String("tokens") != "" {
		ln.Close()
		return fmt.Errorf("--tls-cert, --tls-key and --tokens secure --listen, which is not given")
	}

	reapCtx, stopReaper := context.WithCancel(context.WithoutCancel(ctx))
	var reaper sync.WaitGroup
	// Attempts whose lease expired fail; the results of made-up
	// idempotency keys past their retention are deleted.
	reaper.Go(func() {
		every(reapCtx, leaseReapInterval, log, slog.LevelInfo, "expire leases", "attempts_failed", f.ExpireLeases)
	})
	// Blobs the projection found corrupt become cas.corrupt events.
	reaper.Go(func() {
		every(reapCtx, corruptReportInterval, log, slog.LevelWarn, "report corrupt blobs", "events", f.ReportCorrupt)
	})
	reaper.Go(func() {
		every(reapCtx, keyExpiryInterval, log, slog.LevelDebug, "expire idempotency keys", "deleted", f.ExpireIdempotencyKeys)
	})
	// Runs before f.Close (deferred earlier): the reaper never outlives the
	// fabric it uses.
	defer func() {
		stopReaper()
		reaper.Wait()
	}()

	log.Info("listening", "socket", socket, "state_dir", f.StateDir(), "version", fabric.Version, "pid", os.Getpid())
	sopts := api.ServerOptions{Logger: log}
	if addr := cmd.String("metrics-addr"); addr != "" {
		m := metrics.New(f)
		sopts.Observe = m.Observe
		stop, err := serveMetrics(addr, m, log)
		if err != nil {
			return err
		}
		defer stop()
	}
	if opts.Cluster != nil {
		if sopts.Forward, err = forwardOptions(cmd); err != nil {
			return err
		}
	}
	stopE2B, err := serveE2B(cmd, f, limits, userns.Start, log)
	if err != nil {
		return err
	}
	defer stopE2B()
	srv := api.NewServer(f, sopts)
	if err := srv.ServeAll(ctx, cmd.Duration("shutdown-grace"), lns...); err != nil {
		return err
	}
	// Close leaves the projection server and live attempts' mounts running
	// for the next daemon to adopt; `esfd stop-all` tears them down.
	log.Info("stopped")
	return nil
}

// forwardOptions configure how this worker reaches the others: their
// certificates verified against --peer-cacert (else the system's roots),
// and the first token of --tokens for calls that came with none.
func forwardOptions(cmd *cli.Command) (*api.ForwardOptions, error) {
	fo := &api.ForwardOptions{}
	if f := cmd.String("tokens"); f != "" {
		tok, err := api.ReadTokenFile(f)
		if err != nil {
			return nil, err
		}
		fo.Token = tok
	}
	if ca := cmd.String("peer-cacert"); ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--peer-cacert %s: no certificate", ca)
		}
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		fo.Transport = tr
	}
	return fo, nil
}

// listenNetwork opens the --listen listener with its TLS and tokens.
func listenNetwork(addr string, cmd *cli.Command, log *slog.Logger) (net.Listener, error) {
	var opts api.NetworkOptions
	opts.Insecure = cmd.Bool("insecure-listen")
	cert, key := cmd.String("tls-cert"), cmd.String("tls-key")
	if (cert == "") != (key == "") {
		return nil, fmt.Errorf("--tls-cert and --tls-key go together")
	}
	if cert != "" {
		cfg, err := api.ServerTLS(cert, key)
		if err != nil {
			return nil, err
		}
		opts.TLS = cfg
	}
	if f := cmd.String("tokens"); f != "" {
		t, err := api.LoadTokens(f, log)
		if err != nil {
			return nil, err
		}
		opts.Tokens = t
	}
	if opts.Insecure && (opts.Tokens == nil || opts.TLS == nil) {
		log.Warn("the network API is not fully secured (--insecure-listen)", "addr", addr, "tls", opts.TLS != nil, "tokens", opts.Tokens != nil)
	}
	return api.ListenTCP(addr, opts)
}

// openJournal opens the journal --journal names, or returns nil for the
// embedded default (fabric opens pebble in the state dir).
func openJournal(ctx context.Context, cmd *cli.Command, log *slog.Logger) (journal.Store, error) {
	u := cmd.String("journal")
	if u == "" || u == "pebble" {
		return nil, nil
	}
	if !journaletcd.IsURL(u) {
		return nil, fmt.Errorf("--journal %q: want empty (pebble) or etcd://HOST:PORT/PREFIX", u)
	}
	o, err := journaletcd.Config{URL: u, CAFile: cmd.String("etcd-ca"), CertFile: cmd.String("etcd-cert"),
		KeyFile: cmd.String("etcd-key"), User: cmd.String("etcd-user"), PasswordFile: cmd.String("etcd-password-file")}.Options()
	if err != nil {
		return nil, err
	}
	o.Logger = log
	s, err := journaletcd.Open(ctx, o)
	if err != nil {
		return nil, err
	}
	log.Info("journal on etcd", "endpoints", o.Endpoints, "prefix", s.Prefix())
	return s, nil
}

// projectionCommand runs this same binary as the projection server.
// With a remote content store it gets --cas-remote too: it fetches what
// the projection reads into the shared cache.
func projectionCommand(state, level, remote string) ([]string, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find own executable for the projection server: %w", err)
	}
	args := []string{exe, "fuse-server", "--state", state, "--log-level", level}
	if remote != "" {
		args = append(args, "--cas-remote", remote)
	}
	return args, nil
}

// every runs task (named what) every interval until ctx ends, and logs
// what it did (the count n under key, at level, when n > 0) and its errors.
func every(ctx context.Context, interval time.Duration, log *slog.Logger, level slog.Level, what, key string,
	task func(context.Context) (int, error)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := task(ctx)
		if n > 0 {
			log.Log(ctx, level, what, key, n)
		}
		if err != nil && ctx.Err() == nil {
			log.Error(what, "err", err)
		}
	}
}

// runcExecutor builds the runc executor, or says why there is none.
func runcExecutor(state, initPath string, userns runc.IDRange, log *slog.Logger) (*runc.Executor, error) {
	if initPath == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, err
		}
		initPath = filepath.Join(filepath.Dir(exe), "esf-init")
	}
	if _, err := os.Stat(initPath); err != nil {
		return nil, fmt.Errorf("container init %s: %w (make build puts esf-init beside esfd)", initPath, err)
	}
	if _, err := exec.LookPath("runc"); err != nil {
		return nil, fmt.Errorf("runc not found: %w", err)
	}
	return runc.New(runc.Options{StateDir: filepath.Join(state, "executor"), Init: initPath, UserNS: userns, Logger: log})
}

// defaultLimits reads --default-memory, --default-pids and --default-cpus.
func defaultLimits(cmd *cli.Command) (executor.Limits, error) {
	mem, err := size.Parse(cmd.String("default-memory"))
	if err != nil {
		return executor.Limits{}, fmt.Errorf("--default-memory: %w", err)
	}
	l := executor.Limits{MemoryBytes: mem, Pids: cmd.Int64("default-pids"), CPUs: cmd.Float64("default-cpus")}
	if err := l.Validate(); err != nil {
		return executor.Limits{}, fmt.Errorf("--default-memory, --default-pids, --default-cpus: %w", err)
	}
	return l, nil
}

// defaultUserNSRange is --userns-range's default: 65536 ids from 2^30,
// clear of the ids distributions hand out (/etc/subuid ranges start at
// 100000 and grow by 65536 per user).
const defaultUserNSRange = "1073741824:65536"

// parseUserNSRange reads --userns-range: START:COUNT, or off.
func parseUserNSRange(s string) (runc.IDRange, error) {
	if s == "off" {
		return runc.IDRange{}, nil
	}
	a, b, ok := strings.Cut(s, ":")
	start, err1 := strconv.ParseUint(a, 10, 32)
	count, err2 := strconv.ParseUint(b, 10, 32)
	if !ok || err1 != nil || err2 != nil || start == 0 || count == 0 || start+count > 1<<32-1 {
		return runc.IDRange{}, fmt.Errorf("--userns-range %q: want START:COUNT of host ids above 0, or off", s)
	}
	return runc.IDRange{Start: uint32(start), Count: uint32(count)}, nil
}

// serveMetrics serves m at addr until the returned stop is called.
func serveMetrics(addr string, m *metrics.Metrics, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m.Handler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && err != http.ErrServerClosed {
			log.Error("metrics server", "err", err)
		}
	}()
	log.Info("metrics", "addr", ln.Addr().String())
	return func() {
		srv.Close()
		<-done
	}, nil
}

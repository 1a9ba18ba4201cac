package main

// What the Paxos and Raft paths share around their replica: the client
// server, the admin endpoint, and the wait for a signal and the bounded
// shutdown.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"

	"synod/kv/proto"
	"synod/kv/server"
	"synod/tenants"
)

// Admin endpoint limits. The admin port answers anyone who can reach it
// (401 without the token), so what an unauthenticated sender can hold
// there is bounded: an outside tester's requests that announced a body
// and never sent it were answered 401 and then held open for good (the
// server waits for the body it would discard before reusing the
// connection), and 20,000 of them took every file descriptor of the
// process: the client and RESP listeners stopped, and on the leader
// Pebble could not open an sstable and the node exited.
const (
	adminReadHeaderTimeout = 5 * time.Second
	// adminReadTimeout bounds reading a whole request, body included.
	adminReadTimeout = 10 * time.Second
	// adminIdleTimeout closes a kept-alive connection idle this long.
	adminIdleTimeout = 60 * time.Second
	// adminConnsMax bounds the admin connections open at once; at the
	// cap a new one takes the place of the oldest that has not carried
	// the token (cappedListener). Operators' scrapers and kvctl need a
	// handful.
	adminConnsMax = 64
	// adminShutdownTimeout bounds the admin server's part of a shutdown.
	adminShutdownTimeout = time.Second
)

// shutdownTimeout bounds a graceful shutdown; past it the process exits.
const shutdownTimeout = 10 * time.Second

// logTimeFormat is the log lines' "time": RFC 3339 in milliseconds, so
// that a stall, a leader change and a client's timeout a few milliseconds
// apart can be put in order (whole seconds, zerolog's default, cannot).
const logTimeFormat = "2006-01-02T15:04:05.000Z07:00"

// newLogger is the node's logger at cfg.LogLevel on stderr.
func newLogger(cfg *Config) zerolog.Logger { return newLoggerTo(os.Stderr, cfg) }

// newLoggerTo is newLogger writing to w. It sets zerolog's time format,
// which is process-wide.
func newLoggerTo(w io.Writer, cfg *Config) zerolog.Logger {
	zerolog.TimeFieldFormat = logTimeFormat
	level, _ := zerolog.ParseLevel(cfg.LogLevel)
	return zerolog.New(w).Level(level).With().Timestamp().Uint64("node", cfg.NodeID).Logger()
}

// newPromRegistry is a Prometheus registry with the Go and process
// collectors.
func newPromRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// debugMux serves /metrics from reg; each path adds its /status (and more)
// to it, and adminHandler (config_admin.go) /debug/pprof/ when [admin]
// pprof is on, and the token check.
func debugMux(reg *prometheus.Registry) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return mux
}

// serveClients serves srv on ln in a goroutine of its own, logging why it
// stopped unless srv was closed.
func serveClients(srv *server.Server, ln net.Listener, log zerolog.Logger) {
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, server.ErrServerClosed) {
			log.Error().Err(err).Msg("client server stopped")
		}
	}()
}

// listenAdmin serves h on addr in a goroutine of its own; an empty addr
// serves nothing (nil server, nil error).
func listenAdmin(addr string, h http.Handler) (*http.Server, error) {
	if addr == "" {
		return nil, nil
	}
	aln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	admin := newAdminServer(h)
	go admin.Serve(newCappedListener(aln, adminConnsMax))
	return admin, nil
}

// newAdminServer is the admin endpoint's http.Server with its limits.
func newAdminServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: adminReadHeaderTimeout, ReadTimeout: adminReadTimeout, IdleTimeout: adminIdleTimeout,
		ConnContext: withAdminConn}
}

// awaitStop blocks until SIGTERM/SIGINT (nil) or an error on fatal (that
// error, logged with fatalMsg).
func awaitStop(log zerolog.Logger, fatal <-chan error, fatalMsg string) error {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case s := <-sig:
		log.Info().Str("signal", s.String()).Msg("shutting down")
		return nil
	case err := <-fatal:
		log.Error().Err(err).Msg(fatalMsg)
		return err
	}
}

// shutdown closes srv and admin (when not nil) first, so no request is
// taken any more, then runs closeRest; it gives up after shutdownTimeout.
func shutdown(log zerolog.Logger, srv *server.Server, admin *http.Server, closeRest func()) error {
	done := make(chan struct{})
	go func() {
		srv.Close()
		if admin != nil {
			ctx, cancel := context.WithTimeout(context.Background(), adminShutdownTimeout)
			admin.Shutdown(ctx)
			cancel()
		}
		closeRest()
		close(done)
	}()
	select {
	case <-done:
		log.Info().Msg("stopped")
		return nil
	case <-time.After(shutdownTimeout):
		return fmt.Errorf("shutdown took longer than %v", shutdownTimeout)
	}
}

// shaperAdmitter adapts tenants.Shaper to server.Admitter.
type shaperAdmitter struct{ s *tenants.Shaper }

func (a shaperAdmitter) Admit(id tenants.ID, op proto.Opcode, frameBytes int) (bool, time.Duration) {
	return a.s.Admit(id, uint8(op), frameBytes)
}

package main

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/rs/zerolog"
)

// AdminConfig is the [admin] table: how the admin endpoint (admin_listen:
// /metrics, /status, /debug/faults, /debug/pprof/) is secured.
//
//   - token (or token_file): every request except GET /healthz must carry
//     "Authorization: Bearer <token>", else 401. An admin_listen that is
//     not a loopback address (127.0.0.0/8, ::1, localhost) requires one:
//     the config is refused without it.
//   - pprof: serve /debug/pprof/ (off by default: profiles, heap dumps and
//     the command line are for an operator who asks for them).
//
// /debug/faults is served only with fault_injection = true, and then also
// needs the token when one is set.
type AdminConfig struct {
	// Token is the bearer token (adminTokenBytesMin..adminTokenBytesMax
	// printable ASCII bytes, no spaces). Generate one with
	// `openssl rand -hex 32`.
	Token string `toml:"token"`
	// TokenFile reads the token from a file instead (surrounding white
	// space trimmed), so the config can be shared without it.
	TokenFile string `toml:"token_file"`
	// PProf serves /debug/pprof/ (default off).
	PProf bool `toml:"pprof"`

	// token is the resolved token (from Token or TokenFile), set by
	// validateAdmin.
	token string
}

// Limits of the [admin] table.
const (
	adminTokenBytesMin = 16
	adminTokenBytesMax = 256
	adminTokenFileMax  = 4 << 10
	// adminLivenessPath answers without the token: it tells a prober that
	// the process serves HTTP and nothing else.
	adminLivenessPath = "/healthz"
	adminRealm        = `Bearer realm="synod admin"`
)

// validateAdmin checks [admin] against admin_listen and resolves the token.
func (c *Config) validateAdmin() error {
	a := &c.Admin
	if a.Token != "" && a.TokenFile != "" {
		return errors.New("admin: set token or token_file, not both")
	}
	tok, key := a.Token, "admin.token"
	if a.TokenFile != "" {
		key = "admin.token_file"
		st, err := os.Stat(a.TokenFile)
		if err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
		if st.Size() > adminTokenFileMax {
			return fmt.Errorf("%s: %d bytes, at most %d", key, st.Size(), adminTokenFileMax)
		}
		b, err := os.ReadFile(a.TokenFile)
		if err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
		tok = strings.TrimSpace(string(b))
		if tok == "" {
			return fmt.Errorf("%s: %s holds no token", key, a.TokenFile)
		}
	}
	if tok != "" {
		if len(tok) < adminTokenBytesMin || len(tok) > adminTokenBytesMax {
			return fmt.Errorf("%s: %d bytes, want %d..%d", key, len(tok), adminTokenBytesMin, adminTokenBytesMax)
		}
		for i := 0; i < len(tok); i++ {
			if tok[i] <= ' ' || tok[i] > '~' {
				return fmt.Errorf("%s: byte %d is not printable ASCII (spaces and control bytes cannot travel in an Authorization header)", key, i)
			}
		}
	}
	a.token = tok
	if c.AdminListen != "" && tok == "" && !loopbackAddr(c.AdminListen) {
		return fmt.Errorf("admin.token: admin_listen %q is not a loopback address, so the admin endpoint needs a token "+
			"(set admin.token or admin.token_file, e.g. `openssl rand -hex 32`): without one anyone who reaches it "+
			"could read profiles and, with fault_injection, partition this node", c.AdminListen)
	}
	return nil
}

// loopbackAddr reports whether host:port binds loopback only. An empty or
// wildcard host binds every interface; a name other than localhost may
// resolve to anything.
func loopbackAddr(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// adminHandler is the admin endpoint: mux (plus /debug/pprof/ when pprof
// is on) behind the token check, and the liveness path. It logs how the
// endpoint is secured.
func (c *Config) adminHandler(mux *http.ServeMux, log zerolog.Logger) http.Handler {
	a := &c.Admin
	if a.PProf {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	if c.AdminListen != "" {
		ev := log.Info()
		if a.token == "" {
			ev = log.Warn() // loopback only (validateAdmin), but any local user can reach it
		}
		ev.Str("admin", c.AdminListen).Bool("token", a.token != "").Bool("pprof", a.PProf).Bool("fault_injection", c.FaultInjection).
			Msg("admin endpoint")
	}
	return newAdminAuth(a.token, mux)
}

// adminAuth requires the bearer token (when one is set) on every path but
// the liveness path.
type adminAuth struct {
	sum  [sha256.Size]byte // SHA-256 of the token
	on   bool              // a token is configured
	next http.Handler
}

func newAdminAuth(token string, next http.Handler) *adminAuth {
	return &adminAuth{sum: sha256.Sum256([]byte(token)), on: token != "", next: next}
}

func (h *adminAuth) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == adminLivenessPath && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Write([]byte("ok\n"))
		return
	}
	if h.on && !h.authorized(r) {
		// Closed right after the answer: the server would otherwise
		// read the body this request announced, before answering and
		// again before closing, so a stranger's request that never
		// sends it held its connection for adminReadTimeout, and its
		// place at adminConnsMax. Reads past now fail, so nothing
		// more is read from it.
		w.Header().Set("Connection", "close")
		http.NewResponseController(w).SetReadDeadline(time.Now())
		w.Header().Set("WWW-Authenticate", adminRealm)
		http.Error(w, "unauthorized: this admin endpoint needs Authorization: Bearer <admin.token>", http.StatusUnauthorized)
		return
	}
	proveAdminConn(r.Context()) // capped_listener.go: it keeps its place
	h.next.ServeHTTP(w, r)
}

// authorized compares the presented token with the configured one in
// constant time: both are hashed first, so neither the content nor the
// length of the configured token shows in the timing.
func (h *adminAuth) authorized(r *http.Request) bool {
	const scheme = "Bearer "
	v := r.Header.Get("Authorization")
	if len(v) <= len(scheme) || !strings.EqualFold(v[:len(scheme)], scheme) {
		return false
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(v[len(scheme):])))
	return subtle.ConstantTimeCompare(got[:], h.sum[:]) == 1
}

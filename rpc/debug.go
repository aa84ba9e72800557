package rpc

import (
	"errors"
	"net/http"
	"net/http/pprof"

	"connectrpc.com/connect"

	"github.com/gpuplane/gpuplane/internal/bearer"
)

// debugHandler serves Go's profiles (net/http/pprof) under /debug/pprof/:
// `go tool pprof http://HOST:7410/debug/pprof/profile?seconds=30`. With ACLs
// on, only an admin token (or a node) may read them, as Consul restricts its
// debug endpoints: a profile shows what the process does and holds.
func debugHandler(acl bool, b Backend, agentToken string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	if !acl {
		return mux
	}
	return requireAccess(b, agentToken, AccessAdmin, "/debug/pprof", mux)
}

// metricsHandler serves the node's Prometheus series at /metrics. With ACLs
// on it wants a token of any role (read is enough; Prometheus sends it as
// `authorization: {credentials: TOKEN}` in its scrape config): the series
// name tenants, models and what each was served.
func metricsHandler(acl bool, b Backend, agentToken string, h http.Handler) http.Handler {
	if !acl {
		return h
	}
	return requireAccess(b, agentToken, AccessRead, "/metrics", h)
}

// requireAccess serves next only to a caller whose token (or node
// certificate) has need: 401 without a known token, 403 with one below
// need, each with a message that says what is missing.
func requireAccess(b Backend, agentToken string, need Access, what string, next http.Handler) http.Handler {
	auth := NewAuthInterceptor(b, agentToken).(*authInterceptor)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, err := auth.identify(r.Context(), r.Header)
		if err == nil && p.access < need {
			err = connect.NewError(connect.CodePermissionDenied, errors.New(callerName(p)+" has role "+roleOf(p)+": "+what+" needs "+needs(need)))
		}
		if err != nil {
			status := http.StatusUnauthorized
			switch connect.CodeOf(err) {
			case connect.CodePermissionDenied:
				status = http.StatusForbidden
			case connect.CodeUnauthenticated:
				w.Header().Set("WWW-Authenticate", `Bearer realm="gpuplane"`)
			default:
				// The token table could not be read (no leader, say).
				status = http.StatusServiceUnavailable
			}
			var ce *connect.Error
			msg := err.Error()
			if errors.As(err, &ce) {
				msg = ce.Message()
			}
			if _, ok := bearer.Token(r.Header.Get("Authorization")); !ok && status == http.StatusUnauthorized {
				// The API's own message names the CLI's flags; this is
				// read by a browser, curl or Prometheus.
				msg = "this agent runs with ACLs on: " + what + " needs a token of " + needs(need) + " or above, sent as 'Authorization: Bearer TOKEN'"
			}
			http.Error(w, msg, status)
			return
		}
		next.ServeHTTP(w, r)
	})
}

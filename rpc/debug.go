package rpc

import (
	"bytes"
	"errors"
	"net/http"
	"net/http/pprof"
	"strings"

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
// name tenants, models and what each was served, so a read token bound to
// a tenant gets only the series of its own tenant (and those of none).
func metricsHandler(acl bool, b Backend, agentToken string, h http.Handler) http.Handler {
	if !acl {
		return h
	}
	return requireAccessAs(b, agentToken, AccessRead, "/metrics", func(p principal, w http.ResponseWriter, r *http.Request) {
		if !p.tenantScoped() {
			h.ServeHTTP(w, r)
			return
		}
		// A token bound to a tenant sees the series of no other tenant.
		serveTenantSeries(h, p.tenant, w, r)
	})
}

// serveTenantSeries serves h's series (in Prometheus' text format) without
// those labelled with a tenant other than tenant.
func serveTenantSeries(h http.Handler, tenant string, w http.ResponseWriter, r *http.Request) {
	r = r.Clone(r.Context())
	r.Header.Del("Accept")
	r.Header.Del("Accept-Encoding")
	rec := &bufferedResponse{header: http.Header{}, status: http.StatusOK}
	h.ServeHTTP(rec, r)
	for k, v := range rec.header {
		if k != "Content-Length" && k != "Content-Encoding" {
			w.Header()[k] = v
		}
	}
	w.WriteHeader(rec.status)
	own := []byte(`tenant="` + escapeLabel(tenant) + `"`)
	for line := range bytes.Lines(rec.body.Bytes()) {
		if v := tenantLabel(line); v != nil && !bytes.Equal(v, own) {
			continue
		}
		_, _ = w.Write(line)
	}
}

// escapeLabel escapes a label value as the text format does.
func escapeLabel(v string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(v)
}

// tenantLabel is the tenant="…" pair of a sample line's labels (escaped as
// written), nil if it has none.
func tenantLabel(line []byte) []byte {
	if len(line) == 0 || line[0] == '#' {
		return nil
	}
	open := bytes.IndexByte(line, '{')
	if open < 0 {
		return nil
	}
	i := open + 1
	for i < len(line) && line[i] != '}' {
		start := i
		eq := bytes.IndexByte(line[i:], '=')
		if eq < 0 || i+eq+1 >= len(line) || line[i+eq+1] != '"' {
			return nil
		}
		name := bytes.TrimSpace(line[i : i+eq])
		j := i + eq + 2
		for j < len(line) && line[j] != '"' {
			if line[j] == '\\' {
				j++
			}
			j++
		}
		if j >= len(line) {
			return nil
		}
		if string(name) == "tenant" {
			return bytes.TrimSpace(line[start : j+1])
		}
		i = j + 1
		for i < len(line) && (line[i] == ',' || line[i] == ' ') {
			i++
		}
	}
	return nil
}

// bufferedResponse holds an answer to filter before it is sent.
type bufferedResponse struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (b *bufferedResponse) Header() http.Header         { return b.header }
func (b *bufferedResponse) WriteHeader(status int)      { b.status = status }
func (b *bufferedResponse) Write(p []byte) (int, error) { return b.body.Write(p) }

// requireAccess serves next only to a caller whose token (or node
// certificate) has need: 401 without a known token, 403 with one below
// need, each with a message that says what is missing.
func requireAccess(b Backend, agentToken string, need Access, what string, next http.Handler) http.Handler {
	return requireAccessAs(b, agentToken, need, what, func(_ principal, w http.ResponseWriter, r *http.Request) { next.ServeHTTP(w, r) })
}

// requireAccessAs is requireAccess, next given the caller.
func requireAccessAs(b Backend, agentToken string, need Access, what string, next func(principal, http.ResponseWriter, *http.Request)) http.Handler {
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
		next(p, w, r)
	})
}

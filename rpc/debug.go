package rpc

import (
	"errors"
	"net/http"
	"net/http/pprof"

	"connectrpc.com/connect"
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
	auth := NewAuthInterceptor(b, agentToken).(*authInterceptor)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, err := auth.identify(r.Context(), r.Header)
		if err == nil && p.access < AccessAdmin {
			err = connect.NewError(connect.CodePermissionDenied, errors.New(callerName(p)+" has role "+roleOf(p)+": /debug/pprof needs the admin role"))
		}
		if err != nil {
			status := http.StatusUnauthorized
			if connect.CodeOf(err) == connect.CodePermissionDenied {
				status = http.StatusForbidden
			}
			var ce *connect.Error
			msg := err.Error()
			if errors.As(err, &ce) {
				msg = ce.Message()
			}
			http.Error(w, msg, status)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

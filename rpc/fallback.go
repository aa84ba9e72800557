package rpc

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"
)

// Connect and gRPC clients read errors in their protocol's form; the
// responses here put into that form what the mux and connect otherwise
// answer as bare HTTP (a 404 page, a 415 with no body).

// writeRPCError answers r with code and msg: as a gRPC status for gRPC
// and gRPC-Web requests (HTTP 200, the status in the headers: a
// trailers-only response), else as Connect error JSON with httpStatus.
func writeRPCError(w http.ResponseWriter, r *http.Request, code connect.Code, httpStatus int, msg string) {
	ct := r.Header.Get("Content-Type")
	if strings.HasPrefix(ct, "application/grpc") {
		w.Header().Set("Content-Type", ct)
		w.Header().Set("Grpc-Status", fmt.Sprint(uint32(code)))
		w.Header().Set("Grpc-Message", grpcPercentEncode(msg))
		w.WriteHeader(http.StatusOK)
		return
	}
	body, _ := json.Marshal(map[string]string{"code": code.String(), "message": msg})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(httpStatus)
	_, _ = w.Write(body)
}

// grpcPercentEncode encodes a grpc-message as the gRPC spec asks: bytes
// outside printable ASCII, and '%', percent-encoded.
func grpcPercentEncode(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c > 0x7e || c == '%' {
			fmt.Fprintf(&b, "%%%02X", c)
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// unknownProcedure answers what no service serves: a POST or an RPC-shaped
// path (/package.Service/Method) is an unknown service or method, answered
// as unimplemented with the 404 routers give (and Connect clients read as
// unimplemented too); anything else (a browser's GET) is a plain 404.
func unknownProcedure(w http.ResponseWriter, r *http.Request) {
	service, method, ok := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
	rpcShaped := ok && strings.Contains(service, ".") && method != "" && !strings.Contains(method, "/")
	if r.Method != http.MethodPost && !rpcShaped {
		http.NotFound(w, r)
		return
	}
	writeRPCError(w, r, connect.CodeUnimplemented, http.StatusNotFound, fmt.Sprintf("%s is not a procedure this server serves: unknown service or method", r.URL.Path))
}

// wrapService wraps a service's handler so that its bare refusals (415 for
// a content type connect does not speak, 405 for an HTTP method, 404 for an
// unknown method) carry an error in the RPC's protocol, and so that a
// request body must arrive within bodyTimeout (see bodyDeadline).
func wrapService(bodyTimeout time.Duration) func(string, http.Handler) (string, http.Handler) {
	return func(path string, h http.Handler) (string, http.Handler) {
		return path, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			bodyDeadline(w, r, bodyTimeout)
			h.ServeHTTP(&refusalWriter{ResponseWriter: w, r: r}, r)
		})
	}
}

// refusalWriter turns those refusals into RPC errors and passes
// everything else through.
type refusalWriter struct {
	http.ResponseWriter
	r        *http.Request
	replaced bool
}

func (w *refusalWriter) WriteHeader(status int) {
	switch status {
	case http.StatusUnsupportedMediaType:
		w.replaced = true
		ct := w.r.Header.Get("Content-Type")
		accept := w.Header().Get("Accept-Post")
		if accept == "" {
			accept = "a body only with POST"
		}
		writeRPCError(w.ResponseWriter, w.r, connect.CodeInvalidArgument, status,
			fmt.Sprintf("content type %q is not supported: send one of %s", ct, strings.ReplaceAll(accept, "\n", " ")))
	case http.StatusNotFound:
		// A generated service handler answers an unknown method with
		// http.NotFound's text; connect's own not_found errors are JSON
		// and pass.
		if !strings.HasPrefix(w.Header().Get("Content-Type"), "text/plain") {
			w.ResponseWriter.WriteHeader(status)
			return
		}
		w.replaced = true
		writeRPCError(w.ResponseWriter, w.r, connect.CodeUnimplemented, http.StatusNotFound,
			fmt.Sprintf("%s is not a procedure this server serves: unknown method", w.r.URL.Path))
	case http.StatusMethodNotAllowed:
		w.replaced = true
		writeRPCError(w.ResponseWriter, w.r, connect.CodeUnimplemented, status,
			fmt.Sprintf("HTTP method %s is not supported here: use %s", w.r.Method, w.Header().Get("Allow")))
	default:
		w.ResponseWriter.WriteHeader(status)
	}
}

func (w *refusalWriter) Write(p []byte) (int, error) {
	if w.replaced {
		return len(p), nil
	}
	return w.ResponseWriter.Write(p)
}

// Flush and Unwrap keep streaming (connect flushes each message) and
// http.ResponseController working through the wrapper.
func (w *refusalWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *refusalWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

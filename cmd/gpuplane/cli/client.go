package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	"github.com/gpuplane/gpuplane/cluster/tlsutil"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
	"github.com/gpuplane/gpuplane/proto/gpuplane/v1/gpuplanev1connect"
)

// apiClients are the Connect clients of one gpuplane node's API.
type apiClients struct {
	// baseURL is the normalised --addr, used in messages.
	baseURL      string
	Devices      gpuplanev1connect.DeviceServiceClient
	Nodes        gpuplanev1connect.NodeServiceClient
	Accelerators gpuplanev1connect.AcceleratorServiceClient
	Models       gpuplanev1connect.ModelServiceClient
	Cluster      gpuplanev1connect.ClusterServiceClient
	ACL          gpuplanev1connect.ACLServiceClient
	Residency    gpuplanev1connect.ResidencyServiceClient
}

// api returns the clients for --addr, built on first use. A malformed
// address is a usage error of cmd; it is checked here rather than in a
// pre-run hook because shell completion calls the API without running hooks.
func (g *globals) api(cmd *cobra.Command) (*apiClients, error) {
	g.apiOnce.Do(func() {
		base, err := normalizeAddr(g.addr, g.ca != "")
		if err != nil {
			g.apiErr = err
			return
		}
		if g.httpClient == nil {
			// Also what logClients uses.
			if g.httpClient, err = newHTTPClient(g.ca); err != nil {
				g.apiErr = err
				return
			}
		}
		hc := g.httpClient
		opts := []connect.ClientOption{connect.WithInterceptors(headerInterceptor{token: g.token, userAgent: "gpuplane-cli/" + buildInfo().Version})}
		g.apiVal = &apiClients{
			baseURL:      base,
			Devices:      gpuplanev1connect.NewDeviceServiceClient(hc, base, opts...),
			Nodes:        gpuplanev1connect.NewNodeServiceClient(hc, base, opts...),
			Accelerators: gpuplanev1connect.NewAcceleratorServiceClient(hc, base, opts...),
			Models:       gpuplanev1connect.NewModelServiceClient(hc, base, opts...),
			Cluster:      gpuplanev1connect.NewClusterServiceClient(hc, base, opts...),
			ACL:          gpuplanev1connect.NewACLServiceClient(hc, base, opts...),
			Residency:    gpuplanev1connect.NewResidencyServiceClient(hc, base, opts...),
		}
	})
	if g.apiErr != nil {
		return nil, &usageError{cmd: cmd, msg: g.apiErr.Error()}
	}
	return g.apiVal, nil
}

// newHTTPClient returns the CLI's HTTP client: with caFile (--ca), one that
// trusts that CA for https:// addresses (and still the system's roots' absence
// means only servers with a certificate it signed are accepted).
func newHTTPClient(caFile string) (*http.Client, error) {
	if caFile == "" {
		return &http.Client{}, nil
	}
	pool, err := tlsutil.LoadCAPool(caFile)
	if err != nil {
		return nil, fmt.Errorf("--ca: %w", err)
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	return &http.Client{Transport: t}, nil
}

// normalizeAddr accepts "host:port" or a URL and returns an http(s) base URL
// without a trailing slash; "host:port" means https when a CA is given.
func normalizeAddr(addr string, https bool) (string, error) {
	s := strings.TrimSpace(addr)
	if !strings.Contains(s, "://") {
		if https {
			s = "https://" + s
		} else {
			s = "http://" + s
		}
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("invalid --addr %q: want http://HOST:PORT or HOST:PORT", addr)
	}
	return strings.TrimRight(u.String(), "/"), nil
}

// headerInterceptor adds the token and a user agent to every request.
type headerInterceptor struct {
	token     string
	userAgent string
}

func (h headerInterceptor) set(header http.Header) {
	header.Set("User-Agent", h.userAgent)
	if h.token != "" {
		header.Set("Authorization", "Bearer "+h.token)
	}
}

func (h headerInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		h.set(req.Header())
		return next(ctx, req)
	}
}

func (h headerInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		h.set(conn.RequestHeader())
		return conn
	}
}

func (h headerInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// printError writes err to stderr as one or more "error: " lines. prefix
// (such as "accelerator/small: ") is put before each message; an error
// carrying Violations prints one line per violation.
func (g *globals) printError(prefix string, err error) {
	for _, line := range g.errorLines(err) {
		fmt.Fprintf(g.stderr, "error: %s%s\n", prefix, line)
	}
}

// printWarnings writes a server's warnings to stderr.
func (g *globals) printWarnings(warnings []string) {
	for _, w := range warnings {
		fmt.Fprintf(g.stderr, "warning: %s\n", w)
	}
}

// errorLines turns an error into the messages a user should see.
func (g *globals) errorLines(err error) []string {
	if errors.Is(err, context.Canceled) {
		return []string{"interrupted"}
	}
	if unreachable(err) {
		addr := g.addr
		if g.apiVal != nil {
			addr = g.apiVal.baseURL
		}
		cause := err.Error()
		var opErr *net.OpError
		if errors.As(err, &opErr) {
			cause = opErr.Error()
		}
		return []string{fmt.Sprintf("cannot reach gpuplane at %s: is the agent running? (%s)", addr, cause)}
	}
	var cerr *connect.Error
	if !errors.As(err, &cerr) {
		return []string{err.Error()}
	}
	if vs := violationsOf(err); len(vs) > 0 {
		lines := make([]string, len(vs))
		for i, v := range vs {
			lines[i] = violationLine(v)
		}
		return lines
	}
	if msg := cerr.Message(); msg != "" {
		return []string{msg}
	}
	return []string{cerr.Code().String()}
}

// violationsOf returns the Violations detail of an API error, if any.
func violationsOf(err error) []*pb.Violation {
	var cerr *connect.Error
	if !errors.As(err, &cerr) {
		return nil
	}
	var out []*pb.Violation
	for _, d := range cerr.Details() {
		v, derr := d.Value()
		if derr != nil {
			continue
		}
		if vs, ok := v.(*pb.Violations); ok {
			out = append(out, vs.GetViolations()...)
		}
	}
	return out
}

func violationLine(v *pb.Violation) string {
	if v.GetField() == "" {
		return v.GetDescription()
	}
	return v.GetField() + ": " + v.GetDescription()
}

// unreachable reports whether err means no gpuplane API answered at all.
func unreachable(err error) bool {
	var dnsErr *net.DNSError
	return errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.EHOSTUNREACH) ||
		errors.Is(err, syscall.ENETUNREACH) ||
		errors.As(err, &dnsErr)
}

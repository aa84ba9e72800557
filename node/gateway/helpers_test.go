package gateway

import (
	"context"
	"net/http/httptest"
	"testing"
)

// startGateway runs a gateway with opts behind an HTTP server until the
// test ends; ctx, which its Run loop follows, ends with the test too.
func startGateway(t *testing.T, opts Options) (g *Gateway, srv *httptest.Server, ctx context.Context) {
	t.Helper()
	g, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go g.Run(ctx)
	srv = httptest.NewServer(g)
	t.Cleanup(func() { srv.Close(); cancel() })
	return g, srv, ctx
}

package rpc

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"

	"github.com/gpuplane/gpuplane/proto/gpuplane/v1/gpuplanev1connect"
)

var errEnvelopeRequired = errors.New("envelope: is required")

// Limits bound what one client can make a server hold.
const (
	// MaxMessageBytes caps a request or response message.
	MaxMessageBytes   = 16 << 20
	readHeaderTimeout = 10 * time.Second
	idleTimeout       = 2 * time.Minute
)

// services lists every API service, for health and reflection.
var services = []string{
	gpuplanev1connect.DeviceServiceName,
	gpuplanev1connect.NodeServiceName,
	gpuplanev1connect.AcceleratorServiceName,
	gpuplanev1connect.ClusterServiceName,
	gpuplanev1connect.ModelServiceName,
	gpuplanev1connect.EventServiceName,
	gpuplanev1connect.AuditServiceName,
}

// Config configures the API server.
type Config struct {
	Backend Backend
	Logger  *slog.Logger
	// Interceptors wrap every handler (authentication, logging).
	Interceptors []connect.Interceptor

	// closing is closed when the server starts shutting down; streams that
	// would otherwise stay open (events --follow) end then.
	closing <-chan struct{}
}

// Handler returns the API: every service, gRPC health and reflection (v1 and
// v1alpha), and /healthz, on one mux.
func Handler(cfg Config) http.Handler {
	h := &handlers{b: cfg.Backend}
	opts := []connect.HandlerOption{
		connect.WithInterceptors(cfg.Interceptors...),
		connect.WithReadMaxBytes(MaxMessageBytes),
		connect.WithSendMaxBytes(MaxMessageBytes),
	}
	mux := http.NewServeMux()
	mux.Handle(gpuplanev1connect.NewDeviceServiceHandler(h, opts...))
	mux.Handle(gpuplanev1connect.NewNodeServiceHandler(h, opts...))
	mux.Handle(gpuplanev1connect.NewAcceleratorServiceHandler(h, opts...))
	mux.Handle(gpuplanev1connect.NewClusterServiceHandler(h, opts...))
	mux.Handle(gpuplanev1connect.NewModelServiceHandler(h, opts...))
	lh := &eventHandlers{closing: cfg.closing}
	lh.b, _ = cfg.Backend.(LogBackend)
	mux.Handle(gpuplanev1connect.NewEventServiceHandler(lh, opts...))
	mux.Handle(gpuplanev1connect.NewAuditServiceHandler(lh, opts...))
	mux.Handle(grpchealth.NewHandler(grpchealth.NewStaticChecker(services...)))
	reflector := grpcreflect.NewStaticReflector(services...)
	mux.Handle(grpcreflect.NewHandlerV1(reflector))
	mux.Handle(grpcreflect.NewHandlerV1Alpha(reflector))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}

// Server serves the API on one listener, speaking HTTP/1.1 and h2c.
type Server struct {
	srv *http.Server
	ln  net.Listener
}

// Listen binds addr and returns a server ready to Serve.
func Listen(addr string, cfg Config) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	closing := make(chan struct{})
	cfg.closing = closing
	srv := &http.Server{
		Handler:           Handler(cfg),
		Protocols:         protocols,
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       idleTimeout,
	}
	if cfg.Logger != nil {
		srv.ErrorLog = slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn)
	}
	srv.RegisterOnShutdown(sync.OnceFunc(func() { close(closing) }))
	return &Server{srv: srv, ln: ln}, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Serve serves until Shutdown; it returns nil after a clean shutdown.
func (s *Server) Serve() error {
	if err := s.srv.Serve(s.ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Shutdown stops accepting requests and waits for running ones until ctx ends.
func (s *Server) Shutdown(ctx context.Context) error {
	return s.srv.Shutdown(ctx)
}

package rpc

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuplane/gpuplane/proto/gpuplane/v1/gpuplanev1connect"
)

var errEnvelopeRequired = errors.New("envelope: is required")

// Limits bound what one client can make a server hold.
const (
	// MaxMessageBytes caps a request or response message.
	MaxMessageBytes = 16 << 20
	// MaxUnaryDuration caps how long the server works on one unary call,
	// whatever deadline the client set (or none); streams end when their
	// client goes away or the server shuts down.
	MaxUnaryDuration = 2 * time.Minute
	// MaxConcurrentStreams caps the calls in flight on one HTTP/2 connection.
	MaxConcurrentStreams = 128
	// readHeaderTimeout also bounds the TLS handshake.
	readHeaderTimeout = 10 * time.Second
	// bodyReadTimeout bounds how long a unary or server-streaming call's
	// request body may take to arrive (a MaxMessageBytes body needs about
	// 560 kB/s); client streams (Forward) have none.
	bodyReadTimeout = 30 * time.Second
	idleTimeout     = 2 * time.Minute
	maxHeaderBytes  = 64 << 10
	// writeByteTimeout closes an HTTP/2 connection whose client stops reading.
	writeByteTimeout = 30 * time.Second
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
	gpuplanev1connect.ACLServiceName,
	gpuplanev1connect.LogServiceName,
	gpuplanev1connect.ResidencyServiceName,
	gpuplanev1connect.DashboardServiceName,
}

// Config configures the API server.
type Config struct {
	Backend Backend
	Logger  *slog.Logger
	// Interceptors wrap every handler (logging, say), inside the deadline
	// and, with ACL, the token check.
	Interceptors []connect.Interceptor
	// Outer wrap every handler outside the token check, so that they see
	// refused calls too (the API's call metrics).
	Outer []connect.Interceptor
	// ACL turns on tokens and roles (agent --acl): every request is checked
	// by NewAuthInterceptor and ACLService accepts changes.
	ACL bool
	// AgentToken is the secret that nodes present to each other's APIs
	// (agent --agent-token, the same on every node) when they do not
	// present certificates; a request bearing it is node traffic.
	AgentToken string
	// TLS, when set, makes Listen serve HTTPS (HTTP/1.1 and HTTP/2 over TLS)
	// instead of plaintext HTTP/1.1 and h2c.
	TLS *tls.Config
	// PeerHTTP carries this server's own requests to other nodes (audit
	// verify asks every server); HTTPClient() when nil.
	PeerHTTP *http.Client
	// NodeName and ReadLogs serve engine logs kept on this node; requests
	// for replicas on other nodes are relayed there.
	NodeName string
	ReadLogs LogReader
	// Residency is this node's residency journal, served by
	// ResidencyService (nil: residency does not run here, and the node
	// answers with nothing for itself).
	Residency ResidencyJournal
	// Traffic is the node's request record (nil: none kept).
	Traffic TrafficSource
	// Metrics, when set, is served at /metrics (Prometheus text format);
	// with ACL, to a token of any role or a node.
	Metrics http.Handler
	// Gatherer is the registry behind Metrics: DashboardService.Summary
	// reads this node's gateway series from it (nil: it shows none).
	Gatherer prometheus.Gatherer
	// BodyReadTimeout bounds how long a request body (of a call whose
	// client does not stream) may take to arrive; 0 is 30 seconds.
	BodyReadTimeout time.Duration

	// closing is closed when the server starts shutting down; streams that
	// would otherwise stay open (events --follow) end then.
	closing <-chan struct{}
}

// Handler returns the API: every service, gRPC health and reflection (v1 and
// v1alpha), and /healthz, on one mux.
func Handler(cfg Config) http.Handler {
	h := &handlers{b: cfg.Backend, closing: cfg.closing}
	interceptors := append(slices.Clip(cfg.Outer), unaryDeadline{})
	if cfg.ACL {
		interceptors = append(interceptors, NewAuthInterceptor(cfg.Backend, cfg.AgentToken))
	}
	interceptors = append(interceptors, definedEnums{})
	opts := []connect.HandlerOption{
		connect.WithInterceptors(append(interceptors, cfg.Interceptors...)...),
		connect.WithReadMaxBytes(MaxMessageBytes),
		connect.WithSendMaxBytes(MaxMessageBytes),
		// Compress only responses worth it: connect's default (0) gzips
		// every reply, a few hundred bytes included, where gzip's CPU buys
		// next to nothing on a LAN (forwarded writes would pay twice;
		// measured by the commit benchmark, bench/cluster).
		connect.WithCompressMinBytes(4 << 10),
		connect.WithCodec(strictJSON{"json"}),
		connect.WithCodec(strictJSON{"json; charset=utf-8"}),
	}
	bodyTimeout := cfg.BodyReadTimeout
	if bodyTimeout == 0 {
		bodyTimeout = bodyReadTimeout
	}
	wrap := wrapService(bodyTimeout)
	mux := http.NewServeMux()
	mux.Handle(wrap(gpuplanev1connect.NewDeviceServiceHandler(h, opts...)))
	mux.Handle(wrap(gpuplanev1connect.NewNodeServiceHandler(h, opts...)))
	mux.Handle(wrap(gpuplanev1connect.NewAcceleratorServiceHandler(h, opts...)))
	mux.Handle(wrap(gpuplanev1connect.NewClusterServiceHandler(h, opts...)))
	mux.Handle(wrap(gpuplanev1connect.NewModelServiceHandler(h, opts...)))
	mux.Handle(wrap(gpuplanev1connect.NewACLServiceHandler(&aclHandlers{handlers: h, enabled: cfg.ACL}, opts...)))
	lh := &eventHandlers{closing: cfg.closing, peerHTTP: cfg.PeerHTTP}
	lh.b, _ = cfg.Backend.(LogBackend)
	mux.Handle(wrap(gpuplanev1connect.NewEventServiceHandler(lh, opts...)))
	mux.Handle(wrap(gpuplanev1connect.NewAuditServiceHandler(lh, opts...)))
	peers := cfg.PeerHTTP
	if peers == nil {
		peers = HTTPClient()
	}
	mux.Handle(wrap(gpuplanev1connect.NewLogServiceHandler(&logHandlers{b: cfg.Backend, node: cfg.NodeName, read: cfg.ReadLogs, peers: peers}, opts...)))
	rh := &residencyHandlers{b: cfg.Backend, node: cfg.NodeName, journal: cfg.Residency, traffic: cfg.Traffic, peers: peers, closing: cfg.closing}
	mux.Handle(wrap(gpuplanev1connect.NewResidencyServiceHandler(rh, opts...)))
	mux.Handle(wrap(gpuplanev1connect.NewDashboardServiceHandler(newDashboardHandlers(cfg.Backend, rh, cfg.Gatherer), opts...)))
	mux.Handle(grpchealth.NewHandler(grpchealth.NewStaticChecker(services...)))
	reflector := grpcreflect.NewStaticReflector(services...)
	mux.Handle(grpcreflect.NewHandlerV1(reflector))
	mux.Handle(grpcreflect.NewHandlerV1Alpha(reflector))
	mux.HandleFunc("/", unknownProcedure)
	mux.HandleFunc("GET /{$}", serveUI)
	mux.HandleFunc("GET /ui", serveUI)
	mux.HandleFunc("GET /ui/{file}", serveUIAsset)
	if cfg.Metrics != nil {
		mux.Handle("/metrics", metricsHandler(cfg.ACL, cfg.Backend, cfg.AgentToken, cfg.Metrics))
	}
	mux.Handle("/debug/pprof/", debugHandler(cfg.ACL, cfg.Backend, cfg.AgentToken))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("ok\n"))
	})
	return withPeerNode(mux)
}

// Server serves the API on one listener, speaking HTTP/1.1 and h2c, or
// with TLS HTTP/1.1 and HTTP/2 over TLS.
type Server struct {
	srv *http.Server
	ln  net.Listener
	tls bool
}

// Listen binds addr and returns a server ready to Serve.
func Listen(addr string, cfg Config) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	ln = bufferedListener{ln}
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	if cfg.TLS != nil {
		protocols.SetHTTP2(true)
	} else {
		protocols.SetUnencryptedHTTP2(true)
	}
	closing := make(chan struct{})
	cfg.closing = closing
	srv := &http.Server{
		Handler:           Handler(cfg),
		Protocols:         protocols,
		TLSConfig:         cfg.TLS,
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams: MaxConcurrentStreams,
			WriteByteTimeout:     writeByteTimeout,
			SendPingTimeout:      idleTimeout / 4,
			PingTimeout:          15 * time.Second,
		},
	}
	if cfg.Logger != nil {
		srv.ErrorLog = slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn)
	}
	srv.RegisterOnShutdown(sync.OnceFunc(func() { close(closing) }))
	return &Server{srv: srv, ln: ln, tls: cfg.TLS != nil}, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Serve serves until Shutdown; it returns nil after a clean shutdown.
func (s *Server) Serve() error {
	var err error
	if s.tls {
		err = s.srv.ServeTLS(s.ln, "", "") // the certificate is in TLSConfig
	} else {
		err = s.srv.Serve(s.ln)
	}
	if !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// unaryDeadline bounds every unary call by MaxUnaryDuration.
type unaryDeadline struct{}

func (unaryDeadline) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		ctx, cancel := context.WithTimeout(ctx, MaxUnaryDuration)
		defer cancel()
		return next(ctx, req)
	}
}

func (unaryDeadline) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (unaryDeadline) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// Shutdown stops accepting requests and waits for running ones until ctx ends.
func (s *Server) Shutdown(ctx context.Context) error {
	return s.srv.Shutdown(ctx)
}

// bufferedListener hands out connections that read through a buffer. Go's
// HTTP/2 server reads every frame from the connection itself, header and
// payload apart: two read syscalls per frame, four or more per unary call,
// a visible share of a busy server's CPU (the commit benchmark,
// bench/cluster). Through the
// buffer one read takes whatever the peer has sent, frames of many calls
// included. (HTTP/1.1 and TLS buffer their own reads; this costs them a copy.)
type bufferedListener struct{ net.Listener }

// connReadBuffer is the read buffer of each API connection; reads larger
// than it go to the connection directly.
const connReadBuffer = 8 << 10

func (l bufferedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &bufferedConn{Conn: c, r: bufio.NewReaderSize(c, connReadBuffer)}, nil
}

type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// CloseWrite keeps the half-close the HTTP/1.1 server uses on TCP connections.
func (c *bufferedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

package tlsutil

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/hashicorp/raft"
)

// TLS is a node's identity on the network: its certificate and key, and the
// cluster's CA that every other node's certificate must chain to.
//
// One CA signs every node's certificate (`gpuplane tls create-cert`), and a
// certificate it signed is what makes a peer a node of this cluster: Raft
// accepts only connections that present one (mutual TLS both ways), and the
// API treats a request that presents one as the node named by its common
// name (rpc.PeerNode). Between nodes only the chain is checked, not the host
// name: nodes dial each other by the IP addresses gossip announces, which a
// certificate need not list. Users' clients (the CLI) check the host name as
// usual, against the names and addresses `create-cert` puts in the certificate.
type TLS struct {
	cert tls.Certificate
	// CA holds the cluster's CA certificate(s).
	CA *x509.CertPool
}

// LoadTLS reads a node's PEM certificate and key and the cluster's CA.
func LoadTLS(certFile, keyFile, caFile string) (*TLS, error) {
	if certFile == "" || keyFile == "" || caFile == "" {
		return nil, errors.New("TLS needs a certificate, its key and the CA (--tls-cert, --tls-key, --tls-ca)")
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("load certificate %s: %w", certFile, err)
	}
	pool, err := LoadCAPool(caFile)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("parse certificate %s: %w", certFile, err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}); err != nil {
		return nil, fmt.Errorf("certificate %s is not signed by the CA in %s: %w", certFile, caFile, err)
	}
	return &TLS{cert: cert, CA: pool}, nil
}

// LoadCAPool reads PEM CA certificates into a pool.
func LoadCAPool(caFile string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("read CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("CA %s holds no PEM certificate", caFile)
	}
	return pool, nil
}

// ServerConfig is for the API port: it serves this node's certificate and
// verifies a client certificate when one is presented (nodes present theirs;
// users' clients need none and authenticate with tokens).
func (t *TLS) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{t.cert},
		ClientCAs:    t.CA,
		ClientAuth:   tls.VerifyClientCertIfGiven,
	}
}

// PeerServerConfig is for Raft: only nodes of the cluster may connect.
func (t *TLS) PeerServerConfig() *tls.Config {
	c := t.ServerConfig()
	c.ClientAuth = tls.RequireAndVerifyClientCert
	return c
}

// PeerClientConfig is for a node dialling another node (Raft, forwarded
// requests): it presents this node's certificate and accepts a server whose
// certificate chains to the CA, whatever address it was dialled at.
func (t *TLS) PeerClientConfig() *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{t.cert},
		RootCAs:      t.CA,
		// The chain is checked in VerifyConnection instead, without the host
		// name (see TLS).
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyChain(cs.PeerCertificates, t.CA, x509.ExtKeyUsageServerAuth)
		},
	}
}

func verifyChain(certs []*x509.Certificate, roots *x509.CertPool, usage x509.ExtKeyUsage) error {
	if len(certs) == 0 {
		return errors.New("peer presented no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	_, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}})
	if err != nil {
		return fmt.Errorf("peer certificate %q is not signed by the cluster CA: %w", certs[0].Subject.CommonName, err)
	}
	return nil
}

// StreamLayer carries Raft over mutual TLS: raft's NetworkTransport on
// top of it is the same as over plain TCP.
type StreamLayer struct {
	net.Listener
	advertise net.Addr
	client    *tls.Config
}

// NewStreamLayer listens on bind for Raft peers presenting a certificate of
// t's CA, and dials them with t's certificate.
func NewStreamLayer(bind string, advertise net.Addr, t *TLS) (*StreamLayer, error) {
	ln, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, err
	}
	// The handshake runs on the connection's first read, in raft's
	// per-connection goroutine, so a slow peer does not hold up Accept.
	return &StreamLayer{Listener: tls.NewListener(ln, t.PeerServerConfig()), advertise: advertise, client: t.PeerClientConfig()}, nil
}

// Addr is the address other servers dial, not the bind address.
func (l *StreamLayer) Addr() net.Addr { return l.advertise }

// Dial connects to a Raft peer over mutual TLS.
func (l *StreamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return tls.DialWithDialer(&net.Dialer{Timeout: timeout}, "tcp", string(address), l.client)
}

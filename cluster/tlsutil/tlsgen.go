package tlsutil

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// Files `gpuplane tls` writes.
const (
	CACertFile = "gpuplane-ca.pem"
	CAKeyFile  = "gpuplane-ca-key.pem"
)

// Validity of the development certificates (Consul's defaults).
const (
	caValidity   = 5 * 365 * 24 * time.Hour
	certValidity = 365 * 24 * time.Hour
)

// NodeCertFiles names a node's certificate and key files in dir.
func NodeCertFiles(dir, node string) (cert, key string) {
	return filepath.Join(dir, node+".pem"), filepath.Join(dir, node+"-key.pem")
}

// CreateCA writes a new development CA (ECDSA P-256) to dir. It refuses to
// overwrite one: every node certificate signed by the old CA would stop
// being trusted.
func CreateCA(dir string) (certPath string, err error) {
	certPath, keyPath := filepath.Join(dir, CACertFile), filepath.Join(dir, CAKeyFile)
	if err := refuseOverwrite(certPath, keyPath); err != nil {
		return "", err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", err
	}
	serial, err := newSerial()
	if err != nil {
		return "", err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "gpuplane CA", Organization: []string{"gpuplane"}},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return "", fmt.Errorf("create CA: %w", err)
	}
	if err := writePEMFiles(dir, certPath, der, keyPath, key); err != nil {
		return "", err
	}
	return certPath, nil
}

// CertRequest says what a node certificate is for: the node's name (its
// common name, which is the node's identity to the API) and the extra host
// names and IP addresses clients may dial it at. The node name, localhost and
// 127.0.0.1 are always included.
type CertRequest struct {
	Node string
	DNS  []string
	IPs  []net.IP
}

// CreateCert writes a certificate and key for a node, signed by the CA in
// dir, usable as both server and client (nodes are both to each other).
func CreateCert(dir string, req CertRequest) (certPath, keyPath string, err error) {
	if req.Node == "" {
		return "", "", errors.New("a node name is required")
	}
	certPath, keyPath = NodeCertFiles(dir, req.Node)
	if err := refuseOverwrite(certPath, keyPath); err != nil {
		return "", "", err
	}
	ca, caKey, err := loadCA(dir)
	if err != nil {
		return "", "", err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	serial, err := newSerial()
	if err != nil {
		return "", "", err
	}
	dns := []string{req.Node, "localhost"}
	for _, d := range req.DNS {
		if !slices.Contains(dns, d) {
			dns = append(dns, d)
		}
	}
	ips := []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	for _, ip := range req.IPs {
		if !slices.ContainsFunc(ips, ip.Equal) {
			ips = append(ips, ip)
		}
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: req.Node, Organization: []string{"gpuplane"}},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(certValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:     dns,
		IPAddresses:  ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return "", "", fmt.Errorf("create certificate for %s: %w", req.Node, err)
	}
	if err := writePEMFiles(dir, certPath, der, keyPath, key); err != nil {
		return "", "", err
	}
	return certPath, keyPath, nil
}

func loadCA(dir string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, CACertFile))
	if err != nil {
		return nil, nil, fmt.Errorf("read the CA (run 'gpuplane tls create-ca' first): %w", err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, CAKeyFile))
	if err != nil {
		return nil, nil, fmt.Errorf("read the CA key: %w", err)
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, nil, fmt.Errorf("the CA files in %s are not PEM", dir)
	}
	ca, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("parse CA: %w", err)
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("parse CA key: %w", err)
	}
	return ca, key, nil
}

func newSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

func refuseOverwrite(paths ...string) error {
	for _, p := range paths {
		if _, err := os.Stat(p); err == nil {
			return fmt.Errorf("%s already exists: remove it first to replace it", p)
		}
	}
	return nil
}

// writePEMFiles writes the certificate (0644) and its key (0600).
func writePEMFiles(dir, certPath string, der []byte, keyPath string, key *ecdsa.PrivateKey) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

package agent

import (
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"

	"github.com/gpuplane/gpuplane/cluster/tlsutil"
	"github.com/gpuplane/gpuplane/rpc"
)

// SecurityConfig is what `gpuplane agent` accepts to secure a node; its zero
// value is a plaintext node with no tokens, as a dev agent runs.
type SecurityConfig struct {
	// TLSCert, TLSKey and TLSCA (PEM files, all three or none) turn on TLS
	// for the API, Raft (mutual TLS) and every call between nodes; the
	// certificate also proves to other nodes that this is a node.
	TLSCert, TLSKey, TLSCA string
	// Encrypt is the gossip key, base64 of 16, 24 or 32 bytes (`gpuplane keygen`).
	Encrypt string
	// ACL turns on tokens and roles for the API.
	ACL bool
	// AgentToken is the secret nodes present to each other's APIs when ACLs
	// are on and they have no certificates (TLS off); give every node the
	// same one. When empty, each agent makes up its own, which authenticates
	// only its calls to itself (its executor watching its own log).
	AgentToken string
}

// security is the loaded SecurityConfig.
type security struct {
	tls       *tlsutil.TLS // nil: plaintext
	gossipKey []byte
	// agentToken is SecurityConfig.AgentToken or a random one.
	agentToken string
	// peerHTTP carries this node's calls to other nodes (and to itself):
	// over mutual TLS when TLS is on, with the agent token, which is how a
	// node authenticates to another's API.
	peerHTTP *http.Client
}

func loadSecurity(c SecurityConfig, node string) (security, error) {
	s := security{agentToken: c.AgentToken}
	if s.agentToken == "" {
		b := make([]byte, 32)
		if _, err := rand.Read(b); err != nil {
			return s, err
		}
		s.agentToken = base64.RawURLEncoding.EncodeToString(b)
	}
	if c.TLSCert != "" || c.TLSKey != "" || c.TLSCA != "" {
		t, err := tlsutil.LoadTLS(c.TLSCert, c.TLSKey, c.TLSCA)
		if err != nil {
			return s, err
		}
		s.tls = t
	}
	if c.Encrypt != "" {
		key, err := DecodeGossipKey(c.Encrypt)
		if err != nil {
			return s, err
		}
		s.gossipKey = key
	}
	s.peerHTTP = rpc.PeerHTTPClient(s.peerClientTLS(), node, s.agentToken)
	return s, nil
}

// DecodeGossipKey checks and decodes --encrypt.
func DecodeGossipKey(s string) ([]byte, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(s))
	if err != nil {
		return nil, fmt.Errorf("--encrypt: not base64: %w", err)
	}
	if n := len(key); n != 16 && n != 24 && n != 32 {
		return nil, fmt.Errorf("--encrypt: the key must be 16, 24 or 32 bytes, got %d (make one with 'gpuplane keygen')", n)
	}
	return key, nil
}

func (s security) peerClientTLS() *tls.Config {
	if s.tls == nil {
		return nil
	}
	return s.tls.PeerClientConfig()
}

func (s security) apiTLS() *tls.Config {
	if s.tls == nil {
		return nil
	}
	return s.tls.ServerConfig()
}

func (s security) scheme() string {
	if s.tls != nil {
		return "https"
	}
	return "http"
}

// Summary says, in one line for the agent's user, what is on and what is off.
func (a *Agent) SecuritySummary() string {
	onOff := func(b bool) string {
		if b {
			return "on"
		}
		return "off"
	}
	acl := "ACLs off: every request is allowed without a token"
	if a.cfg.ACL {
		acl = "ACLs on: requests need a token (the first one comes from 'gpuplane acl bootstrap')"
		if a.sec.tls == nil {
			acl += "; without TLS tokens cross the network in clear"
			if a.cfg.AgentToken == "" {
				acl += ", and other nodes cannot call this one: give every node the same --agent-token"
			}
		}
	}
	return fmt.Sprintf("security: TLS %s, gossip encryption %s, %s", onOff(a.sec.tls != nil), onOff(a.sec.gossipKey != nil), acl)
}

// PeerHTTP is the client this node calls other nodes with (TLS with its
// node certificate when TLS is on).
func (a *Agent) PeerHTTP() *http.Client { return a.sec.peerHTTP }

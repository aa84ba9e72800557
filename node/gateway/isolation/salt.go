// Package isolation derives the keys that keep tenants' engine state apart
// (docs/gateway.md, Isolation): the per-tenant cache salt the gateway sends vLLM as
// `cache_salt` and the sim engine keys its prefix cache by.
//
// It owns only the derivation; it never stores secrets, reads files or the
// clock. The node secret comes from the caller (the agent keeps it in its
// data dir).
package isolation

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"fmt"
)

// TenantHeader names a request's tenant without ACLs (docs/gateway.md); the
// gateway passes a token's tenant the same way, between nodes and to a
// replica's residency front.
const TenantHeader = "X-Gpuplane-Tenant"

// FrontKeyHeader carries the node's front key (cardmanager.Options.FrontKey)
// from the node's gateway to a replica's residency front: with ACLs on, a
// front serves only requests that bear it.
const FrontKeyHeader = "X-Gpuplane-Front-Key"

// DefaultTenant is the tenant of a request that names none.
const DefaultTenant = "default"

// MinSecretLen is the shortest node secret accepted: 128 bits.
const MinSecretLen = 16

// Salter derives cache salts from one node secret.
type Salter struct{ secret []byte }

// NewSalter returns a Salter for secret, which must be at least
// MinSecretLen bytes of randomness and is the same on every node of a
// cluster (so a tenant's salt, and so its cache hits, do not depend on the
// node that forwarded the request).
func NewSalter(secret []byte) (*Salter, error) {
	if len(secret) < MinSecretLen {
		return nil, fmt.Errorf("isolation: secret is %d bytes: it must be at least %d", len(secret), MinSecretLen)
	}
	return &Salter{secret: append([]byte(nil), secret...)}, nil
}

// CacheSalt is HMAC-SHA256(secret, tenant, model), base64url: stable for a
// (tenant, model), different for any other pair, and not computable by a
// tenant who does not hold the secret, so no tenant can aim its requests at
// another's cache. The fields are length-prefixed, so ("ab","c") and
// ("a","bc") differ.
func (s *Salter) CacheSalt(tenant, model string) string {
	m := hmac.New(sha256.New, s.secret)
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(tenant)))
	m.Write(n[:])
	m.Write([]byte(tenant))
	binary.BigEndian.PutUint64(n[:], uint64(len(model)))
	m.Write(n[:])
	m.Write([]byte(model))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

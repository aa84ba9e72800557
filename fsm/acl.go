package fsm

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"strconv"

	"google.golang.org/protobuf/proto"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// SecretHash is how a token's secret is kept in the log and the state: its
// hex SHA-256.
func SecretHash(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// validHash accepts a hex SHA-256: secrets never enter the log, only hashes.
func validHash(field, h string) []*pb.Violation {
	var v violations
	if b, err := hex.DecodeString(h); err != nil || len(b) != 32 {
		v.add(field, "must be the hex SHA-256 of the secret")
	}
	return v
}

// Token weights (docs/gateway.md): a tenant's share in the gateway's fair queues
// relative to the others'. MaxTokenWeight bounds the ratio between two
// tenants, so one weight cannot make another's service round to nothing.
const (
	DefaultTokenWeight = 1.0
	MaxTokenWeight     = 1000.0
)

// ValidateTenant checks a token's tenant: empty (the token's name is its
// tenant) or a DNS label, as every name in the cluster.
func ValidateTenant(field, tenant string) []*pb.Violation {
	if tenant == "" {
		return nil
	}
	return ValidateName(field, tenant)
}

// ValidateWeight checks a weight given explicitly: a finite number above 0
// and at most MaxTokenWeight.
func ValidateWeight(field string, w float64) []*pb.Violation {
	var v violations
	if math.IsNaN(w) || math.IsInf(w, 0) || w <= 0 || w > MaxTokenWeight {
		v.add(field, "%s must be a number above 0 and at most %s", FormatWeight(w), FormatWeight(MaxTokenWeight))
	}
	return v
}

// FormatWeight writes a weight as users type it (2, 0.5, 1e-05).
func FormatWeight(w float64) string { return strconv.FormatFloat(w, 'g', -1, 64) }

// TokenTenant is who the gateway serves t's requests as: its tenant, else
// its name, with its weight, else DefaultTokenWeight.
func TokenTenant(t *pb.ACLToken) (tenant string, weight float64) {
	tenant, weight = t.GetTenant(), t.GetWeight()
	if tenant == "" {
		tenant = t.GetName()
	}
	if weight == 0 {
		weight = DefaultTokenWeight
	}
	return tenant, weight
}

func (f *FSM) bootstrapACL(c *pb.BootstrapACL, index uint64, dry bool) *pb.Result {
	if f.aclBootstrapped {
		return reject(pb.Code_CODE_FAILED_PRECONDITION, "ACLs are already bootstrapped: ask an admin for a token")
	}
	v := violations(ValidateName("name", c.GetName()))
	v = append(v, validHash("secretHash", c.GetSecretHash())...)
	if len(v) > 0 {
		return invalid("ACL bootstrap", v)
	}
	if !dry {
		f.aclBootstrapped = true
		f.tokens[c.GetName()] = &pb.ACLToken{Name: c.GetName(), Role: pb.Role_ROLE_ADMIN, SecretHash: c.GetSecretHash(), CreatedIndex: index}
	}
	return accept(pb.Outcome_OUTCOME_CREATED, "ACLs bootstrapped: admin token %q created", c.GetName())
}

func (f *FSM) createToken(c *pb.CreateToken, index uint64, dry bool) *pb.Result {
	v := violations(ValidateName("name", c.GetName()))
	if c.GetRole() == pb.Role_ROLE_UNSPECIFIED {
		v.add("role", "must be read, auditor, operator or admin")
	}
	v = append(v, validHash("secretHash", c.GetSecretHash())...)
	v = append(v, ValidateTenant("tenant", c.GetTenant())...)
	if c.Weight != nil {
		v = append(v, ValidateWeight("weight", c.GetWeight())...)
	}
	if len(v) > 0 {
		return invalid(fmt.Sprintf("token %q", c.GetName()), v)
	}
	if _, exists := f.tokens[c.GetName()]; exists {
		return reject(pb.Code_CODE_ALREADY_EXISTS, "token %q already exists", c.GetName())
	}
	for _, t := range f.tokens {
		if t.SecretHash == c.GetSecretHash() {
			return reject(pb.Code_CODE_ALREADY_EXISTS, "a token with this secret already exists")
		}
	}
	tok := &pb.ACLToken{Name: c.GetName(), Role: c.GetRole(), SecretHash: c.GetSecretHash(), CreatedIndex: index,
		Tenant: c.GetTenant(), Weight: c.GetWeight()}
	if !dry {
		f.tokens[c.GetName()] = tok
	}
	msg := fmt.Sprintf("token %q created with role %s", c.GetName(), RoleString(c.GetRole()))
	if c.GetTenant() != "" || c.Weight != nil {
		tenant, weight := TokenTenant(tok)
		msg += fmt.Sprintf(", tenant %s, weight %s", tenant, FormatWeight(weight))
	}
	return accept(pb.Outcome_OUTCOME_CREATED, "%s", msg)
}

func (f *FSM) deleteToken(c *pb.DeleteToken, dry bool) *pb.Result {
	if _, exists := f.tokens[c.GetName()]; !exists {
		return reject(pb.Code_CODE_NOT_FOUND, "token %q not found", c.GetName())
	}
	if !dry {
		delete(f.tokens, c.GetName())
	}
	return accept(pb.Outcome_OUTCOME_DELETED, "token %q deleted", c.GetName())
}

// ACLBootstrapped reports whether the first admin token was created.
func (f *FSM) ACLBootstrapped() bool { return f.aclBootstrapped }

// Tokens lists tokens by name, without their secret hashes, each with the
// tenant and weight the gateway serves it as (TokenTenant).
func (f *FSM) Tokens() []*pb.ACLToken {
	out := make([]*pb.ACLToken, 0, len(f.tokens))
	for _, name := range sortedKeys(f.tokens) {
		t := proto.Clone(f.tokens[name]).(*pb.ACLToken)
		t.SecretHash = ""
		t.Tenant, t.Weight = TokenTenant(t)
		out = append(out, t)
	}
	return out
}

// TokenBySecretHash finds the token whose secret hashes to h.
func (f *FSM) TokenBySecretHash(h string) (*pb.ACLToken, bool) {
	for _, t := range f.tokens {
		if t.SecretHash == h {
			return proto.Clone(t).(*pb.ACLToken), true
		}
	}
	return nil, false
}

// TenantBySecretHash is the tenant and weight (TokenTenant) of the token
// whose secret hashes to h. It copies nothing: the gateway asks it for
// every request.
func (f *FSM) TenantBySecretHash(h string) (tenant string, weight float64, ok bool) {
	for _, t := range f.tokens {
		if t.SecretHash == h {
			tenant, weight = TokenTenant(t)
			return tenant, weight, true
		}
	}
	return "", 0, false
}

// Tenant is a token's tenant and weight, as TokenTenant resolves them.
type Tenant struct {
	Name   string
	Weight float64
}

// TenantsBySecretHash maps every token's secret hash to its tenant: what a
// client node, which has no state of its own, keeps of a server's.
func (f *FSM) TenantsBySecretHash() map[string]Tenant {
	out := make(map[string]Tenant, len(f.tokens))
	for _, t := range f.tokens {
		name, weight := TokenTenant(t)
		out[t.SecretHash] = Tenant{Name: name, Weight: weight}
	}
	return out
}

// RoleString is the lowercase name users see for a role.
func RoleString(r pb.Role) string {
	switch r {
	case pb.Role_ROLE_READ:
		return "read"
	case pb.Role_ROLE_AUDITOR:
		return "auditor"
	case pb.Role_ROLE_OPERATOR:
		return "operator"
	case pb.Role_ROLE_ADMIN:
		return "admin"
	}
	return "unknown"
}

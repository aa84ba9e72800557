package fsm

import (
	"encoding/hex"
	"fmt"

	"google.golang.org/protobuf/proto"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// validHash accepts a hex SHA-256: secrets never enter the log, only hashes.
func validHash(field, h string) []*pb.Violation {
	var v violations
	if b, err := hex.DecodeString(h); err != nil || len(b) != 32 {
		v.add(field, "must be the hex SHA-256 of the secret")
	}
	return v
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
		v.add("role", "must be read, operator or admin")
	}
	v = append(v, validHash("secretHash", c.GetSecretHash())...)
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
	if !dry {
		f.tokens[c.GetName()] = &pb.ACLToken{Name: c.GetName(), Role: c.GetRole(), SecretHash: c.GetSecretHash(), CreatedIndex: index}
	}
	return accept(pb.Outcome_OUTCOME_CREATED, "token %q created with role %s", c.GetName(), RoleString(c.GetRole()))
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

// Tokens lists tokens by name, without their secret hashes.
func (f *FSM) Tokens() []*pb.ACLToken {
	out := make([]*pb.ACLToken, 0, len(f.tokens))
	for _, name := range sortedKeys(f.tokens) {
		t := proto.Clone(f.tokens[name]).(*pb.ACLToken)
		t.SecretHash = ""
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

// RoleString is the lowercase name users see for a role.
func RoleString(r pb.Role) string {
	switch r {
	case pb.Role_ROLE_READ:
		return "read"
	case pb.Role_ROLE_OPERATOR:
		return "operator"
	case pb.Role_ROLE_ADMIN:
		return "admin"
	}
	return "unknown"
}

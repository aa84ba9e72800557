package rpc

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"

	"connectrpc.com/connect"

	"github.com/gpuplane/gpuplane/fsm"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// DefaultBootstrapToken names the first admin token unless the request does.
const DefaultBootstrapToken = "admin"

// aclHandlers serves ACLService. Secrets are made here, on the node that
// answers, from crypto/rand; only their SHA-256 goes into the log.
type aclHandlers struct {
	*handlers
	enabled bool
}

// newSecret returns 32 random bytes as unpadded base64url (43 characters).
func newSecret() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

func (h *aclHandlers) requireEnabled() error {
	if !h.enabled {
		return connect.NewError(connect.CodeFailedPrecondition, errors.New("ACLs are off on this agent: start the agents with --acl"))
	}
	return nil
}

func (h *aclHandlers) Bootstrap(ctx context.Context, req *connect.Request[pb.BootstrapRequest]) (*connect.Response[pb.BootstrapResponse], error) {
	if err := h.requireEnabled(); err != nil {
		return nil, err
	}
	name := req.Msg.GetName()
	if name == "" {
		name = DefaultBootstrapToken
	}
	secret, err := newSecret()
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	env := &pb.Envelope{RequestId: req.Msg.GetRequestId(), Command: &pb.Envelope_BootstrapAcl{
		BootstrapAcl: &pb.BootstrapACL{Name: name, SecretHash: TokenHash(secret)},
	}}
	res, err := h.propose(ctx, env, false)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.BootstrapResponse{
		Token:  &pb.ACLToken{Name: name, Role: pb.Role_ROLE_ADMIN, CreatedIndex: res.GetIndex()},
		Secret: secret, Index: res.GetIndex(),
	}), nil
}

func (h *aclHandlers) CreateToken(ctx context.Context, req *connect.Request[pb.CreateTokenRequest]) (*connect.Response[pb.CreateTokenResponse], error) {
	if err := h.requireEnabled(); err != nil {
		return nil, err
	}
	m := req.Msg
	// The state machine checks these too; checked here, a bad tenant or
	// weight is refused before a secret is made or anything is proposed.
	vs := fsm.ValidateTenant("tenant", m.GetTenant())
	if m.Weight != nil {
		vs = append(vs, fsm.ValidateWeight("weight", m.GetWeight())...)
	}
	if len(vs) > 0 {
		return nil, invalidArgument(vs...)
	}
	secret, err := newSecret()
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	env := &pb.Envelope{RequestId: m.GetRequestId(), Command: &pb.Envelope_CreateToken{
		CreateToken: &pb.CreateToken{Name: m.GetName(), Role: m.GetRole(), SecretHash: TokenHash(secret), Tenant: m.GetTenant(), Weight: m.Weight},
	}}
	res, err := h.propose(ctx, env, false)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.CreateTokenResponse{
		Token:  &pb.ACLToken{Name: m.GetName(), Role: m.GetRole(), CreatedIndex: res.GetIndex(), Tenant: m.GetTenant(), Weight: m.GetWeight()},
		Secret: secret, Index: res.GetIndex(),
	}), nil
}

func (h *aclHandlers) ListTokens(ctx context.Context, req *connect.Request[pb.ListTokensRequest]) (*connect.Response[pb.ListTokensResponse], error) {
	out := &pb.ListTokensResponse{}
	err := h.read(ctx, req.Msg.GetStale(), func(f *fsm.FSM) error {
		out.Tokens = f.Tokens() // without hashes
		return nil
	})
	return connect.NewResponse(out), err
}

func (h *aclHandlers) DeleteToken(ctx context.Context, req *connect.Request[pb.DeleteTokenRequest]) (*connect.Response[pb.DeleteTokenResponse], error) {
	if err := h.requireEnabled(); err != nil {
		return nil, err
	}
	env := &pb.Envelope{RequestId: req.Msg.GetRequestId(), Command: &pb.Envelope_DeleteToken{
		DeleteToken: &pb.DeleteToken{Name: req.Msg.GetName()},
	}}
	res, err := h.propose(ctx, env, false)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.DeleteTokenResponse{Index: res.GetIndex()}), nil
}

func (h *aclHandlers) WhoAmI(ctx context.Context, req *connect.Request[pb.WhoAmIRequest]) (*connect.Response[pb.WhoAmIResponse], error) {
	out := &pb.WhoAmIResponse{Actor: actorFrom(ctx), AclEnabled: h.enabled}
	if p, ok := principalFrom(ctx); ok {
		out.Role = p.role
	}
	return connect.NewResponse(out), nil
}

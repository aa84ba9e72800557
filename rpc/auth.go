package rpc

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"connectrpc.com/connect"

	"github.com/gpuplane/gpuplane/fsm"
	"github.com/gpuplane/gpuplane/internal/bearer"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
	"github.com/gpuplane/gpuplane/proto/gpuplane/v1/gpuplanev1connect"
)

// Access is what a procedure needs from its caller when ACLs are on. Each
// level includes the ones below it.
type Access int

const (
	// AccessPublic needs no token: ACL bootstrap and WhoAmI.
	AccessPublic Access = iota
	// AccessRead is every read: a token of any role.
	AccessRead
	// AccessOperator manages accelerators and deployments.
	AccessOperator
	// AccessAdmin manages tokens and the cluster (join, leave, remove-peer).
	AccessAdmin
	// AccessNode is the traffic between nodes: forwarded log entries (which
	// carry their original actor, so a user must not be able to send them)
	// and whole-state reads (which hold token hashes). Only a node has it,
	// proven by a certificate signed by the cluster CA or by the agent token.
	AccessNode
)

func (a Access) String() string {
	switch a {
	case AccessPublic:
		return "no token"
	case AccessRead:
		return "read"
	case AccessOperator:
		return "operator"
	case AccessAdmin:
		return "admin"
	}
	return "a node certificate"
}

func accessOfRole(r pb.Role) Access {
	switch r {
	case pb.Role_ROLE_READ, pb.Role_ROLE_AUDITOR:
		return AccessRead
	case pb.Role_ROLE_OPERATOR:
		return AccessOperator
	case pb.Role_ROLE_ADMIN:
		return AccessAdmin
	}
	return AccessPublic
}

// procedureAccess lists what every procedure needs. A procedure missing here
// needs admin, so a new RPC is closed until someone decides otherwise
// (TestEveryProcedureHasAccess lists the ones missing).
var procedureAccess = map[string]Access{
	// Engine logs hold the prompts of every tenant an engine served.
	gpuplanev1connect.LogServiceReplicaLogsProcedure: AccessOperator,

	gpuplanev1connect.ResidencyServiceListDecisionsProcedure: AccessRead,
	gpuplanev1connect.ResidencyServiceGetPlanProcedure:       AccessRead,
	// A node's request record: what was asked of its cards, by whom only as
	// pseudonyms; operators plan with it.
	gpuplanev1connect.ResidencyServiceListRequestsProcedure: AccessOperator,
	gpuplanev1connect.ResidencyServiceListProfilesProcedure: AccessRead,
	gpuplanev1connect.ResidencyServiceOperateProcedure:      AccessOperator,

	// What the separate reads above show, in one answer.
	gpuplanev1connect.DashboardServiceSummaryProcedure: AccessRead,

	gpuplanev1connect.DeviceServiceListDevicesProcedure: AccessRead,
	gpuplanev1connect.DeviceServiceGetDeviceProcedure:   AccessRead,
	gpuplanev1connect.NodeServiceListNodesProcedure:     AccessRead,
	gpuplanev1connect.NodeServiceGetNodeProcedure:       AccessRead,

	gpuplanev1connect.AcceleratorServiceListAcceleratorsProcedure:  AccessRead,
	gpuplanev1connect.AcceleratorServiceGetAcceleratorProcedure:    AccessRead,
	gpuplanev1connect.AcceleratorServiceCreateAcceleratorProcedure: AccessOperator,
	gpuplanev1connect.AcceleratorServiceDeleteAcceleratorProcedure: AccessOperator,

	gpuplanev1connect.ModelServiceListModelsProcedure:   AccessRead,
	gpuplanev1connect.ModelServiceGetModelProcedure:     AccessRead,
	gpuplanev1connect.ModelServiceListReplicasProcedure: AccessRead,
	gpuplanev1connect.ModelServiceApplyModelProcedure:   AccessOperator,
	gpuplanev1connect.ModelServiceDeleteModelProcedure:  AccessOperator,

	gpuplanev1connect.ClusterServiceStatusProcedure:     AccessRead,
	gpuplanev1connect.ClusterServiceMembersProcedure:    AccessRead,
	gpuplanev1connect.ClusterServiceReadIndexProcedure:  AccessRead,
	gpuplanev1connect.ClusterServiceLocalNodeProcedure:  AccessRead,
	gpuplanev1connect.ClusterServiceJoinProcedure:       AccessAdmin,
	gpuplanev1connect.ClusterServiceLeaveProcedure:      AccessAdmin,
	gpuplanev1connect.ClusterServiceRemovePeerProcedure: AccessAdmin,
	gpuplanev1connect.ClusterServiceApplyProcedure:      AccessNode,
	gpuplanev1connect.ClusterServiceForwardProcedure:    AccessNode,
	gpuplanev1connect.ClusterServiceReadStateProcedure:  AccessNode,
	gpuplanev1connect.ClusterServiceReadNodeProcedure:   AccessNode,

	gpuplanev1connect.EventServiceWatchProcedure:  AccessRead,
	gpuplanev1connect.AuditServiceLogProcedure:    AccessRead,
	gpuplanev1connect.AuditServiceReplayProcedure: AccessRead,
	gpuplanev1connect.AuditServiceVerifyProcedure: AccessRead,
	gpuplanev1connect.AuditServiceHashAtProcedure: AccessRead,
	// The whole log, as stored: as much as audit log shows.
	gpuplanev1connect.AuditServiceEntriesProcedure: AccessRead,
	// Drops history from the servers' logs: the operator's decision.
	gpuplanev1connect.AuditServiceCompactProcedure: AccessAdmin,

	gpuplanev1connect.ACLServiceBootstrapProcedure:   AccessPublic,
	gpuplanev1connect.ACLServiceWhoAmIProcedure:      AccessPublic,
	gpuplanev1connect.ACLServiceCreateTokenProcedure: AccessAdmin,
	gpuplanev1connect.ACLServiceListTokensProcedure:  AccessAdmin,
	gpuplanev1connect.ACLServiceDeleteTokenProcedure: AccessAdmin,
}

// clusterWide lists the reads that show other tenants' data and have no
// tenant's part clearly defined: the audit log and events (tokens, their
// tenants, adapters' tenants; a read token changes nothing, so none of
// their entries is its own), the dashboard (every tenant's counts), the
// residency plan and profiles (every card's memory account) and engine
// logs. A read token, a tenant's key, is refused them (tenantScoped): it
// reads the cluster's infrastructure (nodes, devices, accelerators,
// cluster status, replicas without their endpoints), its own tenant's
// series of /metrics, deployments and residency decisions filtered to
// what it may use (tenantscope.go), and, on the gateway, the models it
// may use (GET /v1/models). The auditor, operator and admin roles read
// everything.
var clusterWide = map[string]bool{
	gpuplanev1connect.AuditServiceLogProcedure:              true,
	gpuplanev1connect.AuditServiceReplayProcedure:           true,
	gpuplanev1connect.AuditServiceVerifyProcedure:           true,
	gpuplanev1connect.AuditServiceHashAtProcedure:           true,
	gpuplanev1connect.AuditServiceEntriesProcedure:          true,
	gpuplanev1connect.EventServiceWatchProcedure:            true,
	gpuplanev1connect.DashboardServiceSummaryProcedure:      true,
	gpuplanev1connect.ResidencyServiceGetPlanProcedure:      true,
	gpuplanev1connect.ResidencyServiceListProfilesProcedure: true,
	gpuplanev1connect.LogServiceReplicaLogsProcedure:        true,
	gpuplanev1connect.ClusterServiceReadStateProcedure:      true,
	gpuplanev1connect.ClusterServiceReadNodeProcedure:       true,
	gpuplanev1connect.ACLServiceListTokensProcedure:         true,
}

// ClusterWide says whether procedure shows other tenants' data, which a
// token bound to a tenant may not read.
func ClusterWide(procedure string) bool { return clusterWide[procedure] }

// ProcedureAccess is what procedure needs when ACLs are on.
func ProcedureAccess(procedure string) Access {
	if a, ok := procedureAccess[procedure]; ok {
		return a
	}
	return AccessAdmin
}

// principal is who sent a request, as the interceptor established it.
type principal struct {
	actor  string
	access Access
	role   pb.Role // the token's role; unspecified for nodes and anonymous callers
	// tenant is the token's tenant (its name unless set).
	tenant string
}

// tenantScoped: a read token (a tenant's key), which reads its own
// tenant's data and the cluster's infrastructure, nothing of other
// tenants (clusterWide). An auditor's token reads everything.
func (p principal) tenantScoped() bool {
	return p.role == pb.Role_ROLE_READ
}

type principalKey struct{}

func principalFrom(ctx context.Context) (principal, bool) {
	p, ok := ctx.Value(principalKey{}).(principal)
	return p, ok
}

// peerNodeKey carries the node name of a verified client certificate from
// the HTTP layer, which sees the TLS state, to the interceptor, which does not.
type peerNodeKey struct{}

// withPeerNode records, for requests that presented a client certificate
// signed by the cluster CA (the TLS server verified it), the node it names.
func withPeerNode(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 && len(r.TLS.VerifiedChains[0]) > 0 {
			if cn := r.TLS.VerifiedChains[0][0].Subject.CommonName; cn != "" {
				r = r.WithContext(context.WithValue(r.Context(), peerNodeKey{}, cn))
			}
		}
		next.ServeHTTP(w, r)
	})
}

// PeerNode is the node whose certificate the request presented, if any.
func PeerNode(ctx context.Context) (string, bool) {
	n, ok := ctx.Value(peerNodeKey{}).(string)
	return n, ok
}

// TokenHash is how a token's secret is kept in the log: its hex SHA-256.
func TokenHash(secret string) string { return fsm.SecretHash(secret) }

// authInterceptor checks every request, unary and streaming alike, when ACLs
// are on: it finds the caller (a node by its certificate, a user by the
// token in "Authorization: Bearer"), refuses it unless its access is enough
// for the procedure, and records it as the actor of the changes it makes.
type authInterceptor struct {
	b Backend
	// agentHash is the SHA-256 of the agent token (see Config.AgentToken).
	agentHash [sha256.Size]byte
	agent     bool
}

// NewAuthInterceptor returns the ACL interceptor over b's tokens; a request
// bearing agentToken (when not empty) is node traffic.
func NewAuthInterceptor(b Backend, agentToken string) connect.Interceptor {
	a := &authInterceptor{b: b, agent: agentToken != ""}
	if a.agent {
		a.agentHash = sha256.Sum256([]byte(agentToken))
	}
	return a
}

func (a *authInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			return next(ctx, req)
		}
		ctx, err := a.authorize(ctx, req.Spec().Procedure, req.Header())
		if err != nil {
			return nil, err
		}
		return next(ctx, req)
	}
}

func (a *authInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (a *authInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		ctx, err := a.authorize(ctx, conn.Spec().Procedure, conn.RequestHeader())
		if err != nil {
			return err
		}
		return next(ctx, conn)
	}
}

func (a *authInterceptor) authorize(ctx context.Context, procedure string, header http.Header) (context.Context, error) {
	need := ProcedureAccess(procedure)
	p, err := a.identify(ctx, header)
	if err != nil && need > AccessPublic {
		return nil, err
	}
	if err == nil {
		ctx = context.WithValue(WithActor(ctx, p.actor), principalKey{}, p)
	}
	if p.access < need {
		return nil, connect.NewError(connect.CodePermissionDenied,
			fmt.Errorf("%s has role %s: %s needs %s", callerName(p), roleOf(p), methodName(procedure), needs(need)))
	}
	if p.tenantScoped() && clusterWide[procedure] {
		return nil, connect.NewError(connect.CodePermissionDenied, scopeError(p, methodName(procedure)))
	}
	return ctx, nil
}

// scopeError refuses a tenant-bound token a read of other tenants' data.
func scopeError(p principal, what string) error {
	return fmt.Errorf("%s has role read, a key of tenant %q: %s shows other tenants' data and needs the auditor or operator role",
		callerName(p), p.tenant, what)
}

func callerName(p principal) string {
	if p.actor == "" {
		return "an anonymous caller"
	}
	return fmt.Sprintf("token %q", p.actor)
}

func needs(a Access) string {
	if a == AccessNode {
		return "a node certificate signed by the cluster CA"
	}
	return "the " + a.String() + " role"
}

func roleOf(p principal) string {
	if p.access == AccessNode {
		return "node"
	}
	return fsm.RoleString(p.role)
}

func methodName(procedure string) string {
	return procedure[strings.LastIndex(procedure, "/")+1:]
}

// identify names the caller: the node of a verified client certificate, else
// the token whose secret the Authorization header carries.
func (a *authInterceptor) identify(ctx context.Context, header http.Header) (principal, error) {
	if node, ok := PeerNode(ctx); ok {
		return principal{actor: "node/" + node, access: AccessNode}, nil
	}
	secret, ok := bearer.Token(header.Get("Authorization"))
	if !ok {
		return principal{}, connect.NewError(connect.CodeUnauthenticated, errors.New(
			"this agent runs with ACLs on: pass a token with --token or GPUPLANE_TOKEN (the first one comes from 'gpuplane acl bootstrap')"))
	}
	if sum := sha256.Sum256([]byte(secret)); a.agent && subtle.ConstantTimeCompare(sum[:], a.agentHash[:]) == 1 {
		node := header.Get(NodeHeader)
		if len(fsm.ValidateName("node", node)) > 0 {
			node = "agent"
		}
		return principal{actor: "node/" + node, access: AccessNode}, nil
	}
	hash := TokenHash(secret)
	var tok *pb.ACLToken
	find := func(f *fsm.FSM) error {
		tok, _ = f.TokenBySecretHash(hash)
		return nil
	}
	// A stale read is enough for a known token; an unknown one is looked up
	// again consistently, in case it was created a moment ago on another node.
	if err := a.b.Read(ctx, true, find); err != nil {
		return principal{}, backendError("check token", err)
	}
	if tok == nil {
		if err := a.b.Read(ctx, false, find); err != nil {
			return principal{}, backendError("check token", err)
		}
	}
	if tok == nil {
		return principal{}, connect.NewError(connect.CodeUnauthenticated, errors.New("unknown token: it was deleted or never existed"))
	}
	tenant, _ := fsm.TokenTenant(tok)
	return principal{actor: tok.GetName(), access: accessOfRole(tok.GetRole()), role: tok.GetRole(), tenant: tenant}, nil
}

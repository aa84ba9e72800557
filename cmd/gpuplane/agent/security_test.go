package agent_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/gpuplane/gpuplane/cluster/tlsutil"
	"github.com/gpuplane/gpuplane/cmd/gpuplane/agent"
	"github.com/gpuplane/gpuplane/cmd/gpuplane/cli"
	"github.com/gpuplane/gpuplane/internal/testutil"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
	"github.com/gpuplane/gpuplane/proto/gpuplane/v1/gpuplanev1connect"
)

// secureNode is a node of a TLS + gossip key + ACL cluster.
func secureNode(t *testing.T, certDir, name string, server bool, key string) *node {
	t.Helper()
	n := newNode(t, name, server, "l4=1")
	if server {
		n.cfg.BootstrapExpect = 2
	}
	cert, keyFile := tlsutil.NodeCertFiles(certDir, name)
	if _, _, err := tlsutil.CreateCert(certDir, tlsutil.CertRequest{Node: name}); err != nil {
		t.Fatal(err)
	}
	n.cfg.SecurityConfig = agent.SecurityConfig{
		TLSCert: cert, TLSKey: keyFile, TLSCA: certDir + "/" + tlsutil.CACertFile, Encrypt: key, ACL: true,
	}
	return n
}

func (n *node) httpsURL() string { return strings.Replace(n.url(), "http://", "https://", 1) }

// secureCLI runs the CLI against n's HTTPS API with extra global flags.
func secureCLI(n *node, flags []string, args ...string) (string, string, int) {
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	code := cli.Run(ctx, append(append([]string{"--addr", n.httpsURL()}, flags...), args...), nil, &stdout, &stderr)
	return stdout.String(), stderr.String(), code
}

// TestSecureCluster starts two servers (--bootstrap-expect 2) with TLS, a
// gossip key and ACLs, and checks what docs/operations.md (Security)
// promises: a client without
// the CA cannot talk to them and one with it can; a node without the gossip
// key cannot join and one with it can (a client node, which then registers
// through its certificate with ACLs on); no token is unauthenticated, a read
// token lists but cannot create, an operator token creates (through a
// follower, so the forwarded write is authenticated as a node), and the
// audit log names each change's token.
func TestSecureCluster(t *testing.T) {
	dir := t.TempDir()
	if _, err := tlsutil.CreateCA(dir); err != nil {
		t.Fatal(err)
	}
	keyOut, _, code := secureCLI(&node{}, nil, "keygen")
	if code != 0 {
		t.Fatal("keygen failed")
	}
	key := strings.TrimSpace(keyOut)
	if _, err := agent.DecodeGossipKey(key); err != nil {
		t.Fatalf("keygen printed %q: %v", key, err)
	}
	s1, s2 := secureNode(t, dir, "s1", true, key), secureNode(t, dir, "s2", true, key)
	join := []string{s1.gossip(), s2.gossip()}
	s1.cfg.Join, s2.cfg.Join = join, join
	s1.start(t)
	s2.start(t)
	ca := []string{"--ca", dir + "/" + tlsutil.CACertFile}

	// Bootstrap once the two servers have formed the cluster.
	var boot struct{ Name, Role, Secret string }
	testutil.Eventually(t, 30*time.Second, "acl bootstrap", func() error {
		out, errOut, code := secureCLI(s1, ca, "acl", "bootstrap", "-o", "json")
		if code != 0 {
			return errors.New(errOut)
		}
		return json.Unmarshal([]byte(out), &boot)
	})
	if boot.Name != "admin" || boot.Role != "admin" || len(boot.Secret) < 40 {
		t.Fatalf("bootstrap returned %+v", boot)
	}
	if _, errOut, code := secureCLI(s1, ca, "acl", "bootstrap"); code != 1 || !strings.Contains(errOut, "already bootstrapped") {
		t.Fatalf("second bootstrap: exit %d, %s", code, errOut)
	}
	admin := append([]string{"--token", boot.Secret}, ca...)

	// 2. Without the CA the API is refused at the TLS handshake; in plaintext
	// it does not answer either.
	_, errOut, code := secureCLI(s1, nil, "nodes", "list")
	if code != 1 || !strings.Contains(errOut, "certificate") {
		t.Fatalf("CLI without --ca: exit %d, %s", code, errOut)
	}
	plain := gpuplanev1connect.NewNodeServiceClient(http.DefaultClient, s1.url())
	if _, err := plain.ListNodes(context.Background(), connect.NewRequest(&pb.ListNodesRequest{})); err == nil {
		t.Fatal("plaintext request to a TLS agent succeeded")
	}

	// 1. No token: unauthenticated, for unary and streaming calls alike.
	_, errOut, code = secureCLI(s1, ca, "nodes", "list")
	if code != 1 || !strings.Contains(errOut, "ACLs on") {
		t.Fatalf("no token: exit %d, %s", code, errOut)
	}
	caPool, err := tlsutil.LoadCAPool(dir + "/" + tlsutil.CACertFile)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: caPool}, ForceAttemptHTTP2: true}}
	nodes := gpuplanev1connect.NewNodeServiceClient(hc, s1.httpsURL())
	if _, err := nodes.ListNodes(context.Background(), connect.NewRequest(&pb.ListNodesRequest{})); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("no token: %v, want unauthenticated", err)
	}
	audit := gpuplanev1connect.NewAuditServiceClient(hc, s1.httpsURL())
	stream, err := audit.Log(context.Background(), connect.NewRequest(&pb.LogRequest{}))
	if err == nil {
		for stream.Receive() {
		}
		err = stream.Err()
	}
	if connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("audit log stream without a token: %v, want unauthenticated", err)
	}
	badToken := gpuplanev1connect.NewNodeServiceClient(hc, s1.httpsURL(), connect.WithInterceptors(bearer("not-a-token")))
	if _, err := badToken.ListNodes(context.Background(), connect.NewRequest(&pb.ListNodesRequest{})); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("unknown token: %v, want unauthenticated", err)
	}

	// Tokens, made on the follower or the leader alike.
	secretOf := func(n *node, name, role string) string {
		out, errOut, code := secureCLI(n, admin, "acl", "token", "create", "--name", name, "--role", role, "-o", "json")
		if code != 0 {
			t.Fatalf("token create %s: %s", name, errOut)
		}
		var tok struct{ Secret string }
		if err := json.Unmarshal([]byte(out), &tok); err != nil {
			t.Fatal(err)
		}
		return tok.Secret
	}
	viewer := append([]string{"--token", secretOf(s2, "viewer", "read")}, ca...)
	ops := append([]string{"--token", secretOf(s1, "ops", "operator")}, ca...)
	auditor := append([]string{"--token", secretOf(s2, "auditor", "auditor")}, ca...)
	list, errOut, code := secureCLI(s1, admin, "acl", "token", "list")
	if code != 0 || !strings.Contains(list, "viewer") || !strings.Contains(list, "operator") {
		t.Fatalf("token list: exit %d %s\n%s", code, errOut, list)
	}
	for _, secret := range []string{boot.Secret, viewer[1], ops[1]} {
		if strings.Contains(list, secret) {
			t.Fatal("token list shows a secret")
		}
	}

	// A read token lists but cannot create; an operator token creates,
	// through either server.
	for _, n := range []*node{s1, s2} {
		if out, errOut, code := secureCLI(n, viewer, "accelerators", "list"); code != 0 || !strings.HasPrefix(out, "NAME") {
			t.Fatalf("viewer lists on %s: exit %d, %s", n.cfg.NodeName, code, errOut)
		}
	}
	_, errOut, code = secureCLI(s2, viewer, "accelerators", "create", "fast", "--device", "l4")
	if code != 1 || !strings.Contains(errOut, `token "viewer" has role read: CreateAccelerator needs the operator role`) {
		t.Fatalf("viewer creates: exit %d, %s", code, errOut)
	}
	accels := gpuplanev1connect.NewAcceleratorServiceClient(hc, s1.httpsURL(), connect.WithInterceptors(bearer(viewer[1])))
	_, err = accels.CreateAccelerator(context.Background(), connect.NewRequest(&pb.CreateAcceleratorRequest{Name: "fast", Spec: &pb.AcceleratorSpec{Device: "l4"}}))
	if connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("viewer creates: %v, want permission_denied", err)
	}
	if _, errOut, code := secureCLI(s2, ops, "acl", "token", "list"); code != 1 || !strings.Contains(errOut, "needs the admin role") {
		t.Fatalf("operator lists tokens: exit %d, %s", code, errOut)
	}
	// gRPC over TLS (HTTP/2) works with a token too.
	grpcNodes := gpuplanev1connect.NewNodeServiceClient(hc, s2.httpsURL(), connect.WithGRPC(), connect.WithInterceptors(bearer(viewer[1])))
	if resp, err := grpcNodes.ListNodes(context.Background(), connect.NewRequest(&pb.ListNodesRequest{})); err != nil || len(resp.Msg.GetNodes()) == 0 {
		t.Fatalf("gRPC ListNodes over TLS: %v", err)
	}
	// A user may not send log entries under another actor.
	clusterAdmin := gpuplanev1connect.NewClusterServiceClient(hc, s1.httpsURL(), connect.WithInterceptors(bearer(boot.Secret)))
	_, err = clusterAdmin.Apply(context.Background(), connect.NewRequest(&pb.ApplyRequest{Envelope: &pb.Envelope{Actor: "ops"}}))
	if connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("admin calls Apply: %v, want permission_denied", err)
	}
	for i, n := range []*node{s2, s1} {
		name := fmt.Sprintf("fast%d", i)
		if out, errOut, code := secureCLI(n, ops, "accelerators", "create", name, "--device", "l4"); code != 0 || !strings.Contains(out, "created") {
			t.Fatalf("ops creates on %s: exit %d, %s", n.cfg.NodeName, code, errOut)
		}
	}
	if _, errOut, code := secureCLI(s1, ops, "accelerators", "delete", "fast1"); code != 0 {
		t.Fatalf("ops deletes: %s", errOut)
	}

	// The audit log names each change's token; --actor filters on it.
	// (A node serves the log as far as it has applied it.) An auditor
	// reads it; a read token, a tenant's key, does not.
	if _, errOut, code := secureCLI(s2, viewer, "audit", "log"); code != 1 || !strings.Contains(errOut, "needs the auditor or operator role") {
		t.Fatalf("audit log with a read token: exit %d, %s", code, errOut)
	}
	testutil.Eventually(t, 5*time.Second, "audit log --actor ops", func() error {
		logOut, errOut, code := secureCLI(s2, auditor, "audit", "log", "--actor", "ops")
		if code != 0 || strings.Count(logOut, "CreateAccelerator") != 2 || strings.Count(logOut, "DeleteAccelerator") != 1 || strings.Contains(logOut, "Token") {
			return fmt.Errorf("exit %d, %s\n%s", code, errOut, logOut)
		}
		return nil
	})
	logOut, _, _ := secureCLI(s1, auditor, "audit", "log", "--actor", "admin")
	if strings.Count(logOut, "CreateToken") != 3 || !strings.Contains(logOut, "CreateToken viewer (read)") {
		t.Fatalf("audit log --actor admin:\n%s", logOut)
	}
	if strings.Contains(logOut, "Accelerator") {
		t.Fatalf("audit log --actor admin shows ops' changes:\n%s", logOut)
	}

	// 2. A node without the gossip key cannot join; with it, it can.
	intruder := secureNode(t, dir, "intruder", false, "")
	intruder.cfg.Join = []string{s1.gossip()}
	intruder.start(t)
	wrongKey := secureNode(t, dir, "wrongkey", false, "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=")
	wrongKey.cfg.Join = []string{s1.gossip()}
	wrongKey.start(t)
	friend := secureNode(t, dir, "friend", false, key)
	friend.cfg.Join = []string{s1.gossip()}
	friend.start(t)
	testutil.Eventually(t, 20*time.Second, "friend registers", func() error {
		out, errOut, code := secureCLI(s2, viewer, "nodes", "list")
		if code != 0 || !strings.Contains(out, "friend") {
			return fmt.Errorf("exit %d %s\n%s", code, errOut, out)
		}
		return nil
	})
	select {
	case <-friend.a.Registered():
	case <-time.After(10 * time.Second):
		t.Fatal("friend did not register")
	}
	out, _, _ := secureCLI(s1, viewer, "cluster", "members")
	if strings.Contains(out, "intruder") || strings.Contains(out, "wrongkey") || !strings.Contains(out, "friend") {
		t.Fatalf("members after joins with no key, a wrong key and the key:\n%s", out)
	}
	if m := intruder.a.Cluster().Gossip().Members(); len(m) != 1 {
		t.Fatalf("the node without the key sees %d members", len(m))
	}
	// The client node's own API answers reads through a server, as a node.
	if out, errOut, code := secureCLI(friend, viewer, "accelerators", "list"); code != 0 || !strings.Contains(out, "fast0") {
		t.Fatalf("read through the client node: exit %d %s\n%s", code, errOut, out)
	}
}

// bearer sends a token on every request of a Connect client.
type bearer string

func (b bearer) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		req.Header().Set("Authorization", "Bearer "+string(b))
		return next(ctx, req)
	}
}

func (b bearer) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		conn.RequestHeader().Set("Authorization", "Bearer "+string(b))
		return conn
	}
}

func (b bearer) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// TestACLWithoutTLS runs a dev agent with --acl and no TLS: users need
// tokens, and nodes authenticate with the agent token instead of a
// certificate (here the agent's own client, as its executor uses it).
func TestACLWithoutTLS(t *testing.T) {
	var out bytes.Buffer
	a, err := agent.Start(context.Background(), agent.Config{
		Dev: true, NodeName: "dev1", APIPort: 0, RaftPort: freePort(t), GossipPort: freePort(t), SimGPUs: "l4=1",
		SecurityConfig: agent.SecurityConfig{ACL: true}, Out: &out,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	if s := a.SecuritySummary(); !strings.Contains(s, "TLS off") || !strings.Contains(s, "ACLs on") {
		t.Fatalf("summary: %s", s)
	}
	run := func(args ...string) (string, string, int) {
		var stdout, stderr bytes.Buffer
		code := cli.Run(context.Background(), append([]string{"--addr", a.APIURL()}, args...), nil, &stdout, &stderr)
		return stdout.String(), stderr.String(), code
	}
	if _, errOut, code := run("acl", "whoami"); code != 0 {
		t.Fatalf("whoami without a token: %s", errOut)
	}
	if _, errOut, code := run("accelerators", "list"); code != 1 || !strings.Contains(errOut, "ACLs on") {
		t.Fatalf("no token: exit %d, %s", code, errOut)
	}
	bootOut, errOut, code := run("acl", "bootstrap", "--name", "root")
	if code != 0 || !strings.Contains(bootOut, "token/root created with role admin") {
		t.Fatalf("bootstrap: exit %d, %s%s", code, bootOut, errOut)
	}
	secret := strings.TrimSpace(strings.SplitN(strings.SplitN(bootOut, "secret: ", 2)[1], "\n", 2)[0])
	if out, errOut, code := run("--token", secret, "acl", "whoami"); code != 0 || !strings.Contains(out, "root") || !strings.Contains(out, "admin") {
		t.Fatalf("whoami: exit %d, %s%s", code, out, errOut)
	}
	if _, errOut, code := run("--token", secret, "acl", "token", "delete", "root"); code != 0 {
		t.Fatalf("delete own token: %s", errOut)
	}
	if _, errOut, code := run("--token", secret, "accelerators", "list"); code != 1 || !strings.Contains(errOut, "unknown token") {
		t.Fatalf("deleted token: exit %d, %s", code, errOut)
	}

	// Whole-state reads are node traffic: the agent's own client (agent
	// token) may, a user may not.
	node := gpuplanev1connect.NewClusterServiceClient(a.PeerHTTP(), a.APIURL())
	if _, err := node.ReadState(context.Background(), connect.NewRequest(&pb.ReadStateRequest{})); err != nil {
		t.Fatalf("node ReadState: %v", err)
	}
	user := gpuplanev1connect.NewClusterServiceClient(http.DefaultClient, a.APIURL(), connect.WithInterceptors(bearer(secret)))
	if _, err := user.ReadState(context.Background(), connect.NewRequest(&pb.ReadStateRequest{})); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("user ReadState with a deleted token: %v", err)
	}
}

package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/cmd/gpuplane/cli"
	"github.com/gpuplane/gpuplane/internal/testutil"
)

// TestTokenTenants: tokens made with `acl token create --tenant --weight`
// on a server and through a client node are listed with their tenant and
// weight (a token without them as its own name, weight 1), the audit log
// shows them (never a secret), bad tenants and weights are refused with the
// field and rule and create nothing, and Cluster.TenantFor, which the
// gateway asks for every request, resolves the secrets on the server and on
// the client node alike, and stops resolving a deleted token.
func TestTokenTenants(t *testing.T) {
	const agentToken = "tenants-test-agent-token-0123456789"
	s := newNode(t, "s1", true, "l4=1")
	s.cfg.BootstrapExpect = 1
	c := newNode(t, "c1", false, "l4=1")
	c.cfg.Join = []string{s.gossip()}
	for _, n := range []*node{s, c} {
		n.cfg.SecurityConfig.ACL, n.cfg.SecurityConfig.AgentToken = true, agentToken
	}
	s.start(t)
	c.start(t)

	run := func(n *node, args ...string) (string, string, int) {
		var stdout, stderr bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		code := cli.Run(ctx, append([]string{"--addr", n.url()}, args...), nil, &stdout, &stderr)
		return stdout.String(), stderr.String(), code
	}
	var boot struct{ Secret string }
	testutil.Eventually(t, 30*time.Second, "acl bootstrap", func() error {
		out, errOut, code := run(s, "acl", "bootstrap", "-o", "json")
		if code != 0 {
			return errors.New(errOut)
		}
		return json.Unmarshal([]byte(out), &boot)
	})
	admin := func(n *node, args ...string) (string, string, int) {
		return run(n, append([]string{"--token", boot.Secret}, args...)...)
	}
	create := func(n *node, args ...string) (secret string) {
		t.Helper()
		var out string
		// The client node answers once it has joined.
		testutil.Eventually(t, 30*time.Second, "create "+strings.Join(args, " "), func() error {
			o, errOut, code := admin(n, append([]string{"acl", "token", "create", "--role", "read"}, args...)...)
			if code != 0 {
				return errors.New(errOut)
			}
			out = o
			return nil
		})
		_, rest, ok := strings.Cut(out, "secret: ")
		if !ok {
			t.Fatalf("no secret in %q", out)
		}
		return strings.TrimSpace(strings.SplitN(rest, "\n", 2)[0])
	}
	alice := create(c, "--name", "alice", "--tenant", "acme", "--weight", "2")
	carol := create(s, "--name", "carol", "--tenant", "acme", "--weight", "0.5")
	bob := create(s, "--name", "bob")

	want := [][]string{{"admin", "admin", "admin", "1"}, {"alice", "read", "acme", "2"}, {"bob", "read", "bob", "1"}, {"carol", "read", "acme", "0.5"}}
	listed := func(n *node) error {
		out, errOut, code := admin(n, "acl", "token", "list")
		if code != 0 {
			return errors.New(errOut)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if got := strings.Fields(lines[0]); strings.Join(got, " ") != "NAME ROLE TENANT WEIGHT CREATED" {
			return fmt.Errorf("header %q", lines[0])
		}
		if len(lines) != 1+len(want) {
			return fmt.Errorf("list:\n%s", out)
		}
		for i, w := range want {
			if got := strings.Fields(lines[1+i]); len(got) != 5 || strings.Join(got[:4], " ") != strings.Join(w, " ") {
				return fmt.Errorf("row %d = %q, want %q ...", i, lines[1+i], strings.Join(w, " "))
			}
		}
		return nil
	}
	for _, n := range []*node{s, c} {
		testutil.Eventually(t, 30*time.Second, "token list on "+n.cfg.NodeName, func() error { return listed(n) })
	}
	out, errOut, code := admin(c, "acl", "token", "get", "alice", "-o", "json")
	var got struct {
		Name, Tenant string
		Weight       float64
	}
	if code != 0 || json.Unmarshal([]byte(out), &got) != nil || got.Name != "alice" || got.Tenant != "acme" || got.Weight != 2 {
		t.Fatalf("token get alice -o json: exit %d, %s%s", code, out, errOut)
	}
	if _, errOut, code := admin(s, "acl", "token", "get", "nobody"); code != 1 || !strings.Contains(errOut, `token "nobody" not found`) {
		t.Fatalf("get nobody: exit %d, %s", code, errOut)
	}

	// Bad input: refused, naming the field and the rule; nothing created.
	for _, bad := range []struct{ flag, want string }{
		{"--weight=0", "weight: 0 must be a number above 0 and at most 1000"},
		{"--weight=-1", "weight: -1 must be a number above 0"},
		{"--weight=NaN", "weight: NaN must be a number above 0"},
		{"--weight=1001", "weight: 1001 must be a number above 0 and at most 1000"},
		{"--tenant=Acme_Corp", `tenant: "Acme_Corp" must be a DNS label`},
	} {
		_, errOut, code := admin(s, "acl", "token", "create", "--name", "bad", "--role", "read", bad.flag)
		if code != 1 || !strings.Contains(errOut, bad.want) {
			t.Errorf("create %s: exit %d, %q; want exit 1 and %q", bad.flag, code, errOut, bad.want)
		}
	}
	if err := listed(s); err != nil {
		t.Fatalf("after refused tokens: %v", err)
	}

	// The gateway's lookup, on the server and on the client node.
	for _, n := range []*node{s, c} {
		for _, w := range []struct {
			secret, tenant string
			weight         float64
		}{{alice, "acme", 2}, {carol, "acme", 0.5}, {bob, "bob", 1}} {
			testutil.Eventually(t, 30*time.Second, "TenantFor on "+n.cfg.NodeName, func() error {
				tenant, weight, ok := n.a.Cluster().TenantFor(w.secret)
				if tenant != w.tenant || weight != w.weight || !ok {
					return fmt.Errorf("got (%q, %v, %v), want (%q, %v, true)", tenant, weight, ok, w.tenant, w.weight)
				}
				return nil
			})
		}
		if tenant, _, ok := n.a.Cluster().TenantFor("not-a-token"); ok {
			t.Fatalf("%s: an unknown secret resolved to %q", n.cfg.NodeName, tenant)
		}
	}
	if _, errOut, code := admin(s, "acl", "token", "delete", "bob"); code != 0 {
		t.Fatalf("delete bob: %s", errOut)
	}
	if _, _, ok := s.a.Cluster().TenantFor(bob); ok {
		t.Fatal("the server still resolves a deleted token")
	}
	testutil.Eventually(t, 30*time.Second, "the client node forgets a deleted token", func() error {
		if tenant, _, ok := c.a.Cluster().TenantFor(bob); ok {
			return fmt.Errorf("still resolves to %q", tenant)
		}
		return nil
	})

	// The audit log shows each token's tenant and weight as created, and no
	// secret anywhere.
	log, errOut, code := admin(s, "audit", "log")
	if code != 0 {
		t.Fatalf("audit log: %s", errOut)
	}
	for _, line := range []string{"CreateToken alice (read, tenant acme, weight 2)", "CreateToken carol (read, tenant acme, weight 0.5)", "CreateToken bob (read)"} {
		if !strings.Contains(log, line) {
			t.Errorf("audit log lacks %q:\n%s", line, log)
		}
	}
	if strings.Contains(log, "CreateToken bad") {
		t.Errorf("a refused token is in the audit log:\n%s", log)
	}
	export, errOut, code := admin(s, "audit", "export")
	if code != 0 || !strings.Contains(export, `"tenant":"acme"`) {
		t.Fatalf("audit export: exit %d, %s", code, errOut)
	}
	for _, secret := range []string{boot.Secret, alice, bob, carol} {
		if strings.Contains(log, secret) || strings.Contains(export, secret) {
			t.Fatal("a secret appears in the audit log or export")
		}
	}
}

package agent_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/internal/testutil"
	"github.com/gpuplane/gpuplane/node/executor"
	"github.com/gpuplane/gpuplane/node/gateway/isolation"
)

// TestNoSideEntrance tries, as an attacker holding another tenant's token
// (or none) would, every way to a tenant's private adapter on a node with
// ACLs on, listening on every address (--bind 0.0.0.0) as outside --dev:
// the gateway gives it to its tenant's token alone; the replica's
// endpoint (its residency front) serves nobody but the node's gateway,
// whatever tenant header it is sent; the front and the engine listen on
// loopback only, so from the node's other addresses, where the gateway
// answers, nothing does; read tokens see no endpoints in `replicas list`;
// /metrics wants a token.
func TestNoSideEntrance(t *testing.T) {
	n := newNode(t, "door", true, "l4=1")
	n.cfg.Dev, n.cfg.BootstrapExpect, n.cfg.ACL = true, 0, true
	n.cfg.Bind, n.cfg.Advertise = "0.0.0.0", "127.0.0.1"
	n.start(t)
	secret := func(out string) string {
		return strings.TrimSpace(strings.SplitN(strings.SplitN(out, "secret: ", 2)[1], "\n", 2)[0])
	}
	root := secret(gpuplane(t, n, "acl", "bootstrap", "--name", "root"))
	acme := secret(gpuplane(t, n, "--token", root, "acl", "token", "create", "--name", "acme", "--role", "read", "--tenant", "acme"))
	bob := secret(gpuplane(t, n, "--token", root, "acl", "token", "create", "--name", "bob", "--role", "read"))
	gpuplane(t, n, "--token", root, "accelerators", "create", "shared", "--device", "l4", "--tenancy", "shared", "--max-models", "4")
	spec := `resource: ModelDeployment
resourceVersion: v1
metadata: {name: chat}
spec:
  model: /models/chat
  placement: {accelerator: shared}
  adapters:
    - {name: law, source: /adapters/law, rank: 8, tenants: [acme]}
  engine: {kind: sim, memoryPercent: 30, args: ["--load-seconds", "0.2"]}
`
	path := filepath.Join(t.TempDir(), "chat.yaml")
	if err := os.WriteFile(path, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	gpuplane(t, n, "--token", root, "apply", "-f", path)

	type answer struct {
		code int
		body string
	}
	post := func(base, model string, header ...string) (answer, error) {
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(fmt.Sprintf(
			`{"model":%q,"messages":[{"role":"user","content":"the secret brief"}],"max_tokens":4}`, model)))
		req.Header.Set("Content-Type", "application/json")
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
		if err != nil {
			return answer{}, err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return answer{resp.StatusCode, string(b)}, nil
	}
	gw := n.a.GatewayURL()
	// The tenant's own token gets its adapter (so it is on the card, in
	// the engine, for the attempts below).
	testutil.Eventually(t, 90*time.Second, "chat:law served to acme", func() error {
		a, err := post(gw, "chat:law", "Authorization", "Bearer "+acme)
		if err != nil {
			return err
		}
		if a.code != http.StatusOK {
			return fmt.Errorf("%d %s", a.code, a.body)
		}
		return nil
	})

	// Path 1, the gateway: another tenant's token, none, or a made-up
	// forwarding node.
	for _, c := range []struct {
		name   string
		header []string
		code   int
	}{
		{"no token", []string{isolation.TenantHeader, "acme"}, http.StatusUnauthorized},
		{"bob's token naming acme", []string{"Authorization", "Bearer " + bob, isolation.TenantHeader, "acme"}, http.StatusNotFound},
		{"a forged forwarding node", []string{isolation.TenantHeader, "acme", "X-Gpuplane-Forwarded-By", "door"}, http.StatusForbidden},
	} {
		for _, model := range []string{"chat:law", "law"} {
			a, err := post(gw, model, c.header...)
			if err != nil {
				t.Fatal(err)
			}
			if a.code != c.code {
				t.Errorf("gateway, %s, %s: %d %s, want %d", c.name, model, a.code, a.body, c.code)
			}
		}
	}

	// Path 2, the replica's endpoint: hidden from read tokens; an
	// operator sees it, and an attacker who learnt it gets nothing there.
	endpoints := func(token string) []string {
		var rs []struct{ Endpoint string }
		if err := json.Unmarshal([]byte(gpuplane(t, n, "--token", token, "replicas", "list", "-o", "json")), &rs); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range rs {
			out = append(out, r.Endpoint)
		}
		return out
	}
	if eps := endpoints(bob); len(eps) != 1 || eps[0] != "" {
		t.Errorf("replicas list for a read token shows endpoints %q, want one replica without", eps)
	}
	eps := endpoints(root)
	if len(eps) != 1 || eps[0] == "" {
		t.Fatalf("replicas list for the admin: endpoints %q, want the replica's", eps)
	}
	front := eps[0]
	for _, header := range [][]string{
		{isolation.TenantHeader, "acme"},
		{"Authorization", "Bearer " + acme, isolation.TenantHeader, "acme"},
		{isolation.TenantHeader, "acme", isolation.FrontKeyHeader, "guessed"},
	} {
		for _, model := range []string{"chat:law", "law", "chat"} {
			a, err := post(front, model, header...)
			if err != nil {
				t.Fatal(err)
			}
			if a.code != http.StatusForbidden || !strings.Contains(a.body, "gateway") {
				t.Errorf("front %s, %s, headers %q: %d %s, want 403 pointing at the gateway", front, model, header[0], a.code, a.body)
			}
		}
	}

	// Path 3, the engine's port (the executor's record of its process):
	// it and the front listen on loopback; the gateway and the API on
	// every address.
	var rec struct{ Port int }
	b, err := os.ReadFile(filepath.Join(executor.ReplicaDir(n.a.DataDir(), "chat", 0), "pid.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &rec); err != nil || rec.Port == 0 {
		t.Fatalf("pid.json %s: %v", b, err)
	}
	fu, _ := url.Parse(front)
	if fu.Hostname() != "127.0.0.1" {
		t.Errorf("the front's endpoint %s is not on loopback", front)
	}
	gu, _ := url.Parse(gw)
	host := otherAddress(t)
	if host == "" {
		t.Log("this machine has no address but loopback: the engine and front's listening address is checked on loopback alone")
	} else {
		t.Logf("trying %s, this machine's other address", host)
		// The node answers on host (its gateway refuses a request without
		// a token): what does not is not listening there.
		if a, err := post("http://"+net.JoinHostPort(host, gu.Port()), "chat:law"); err != nil || a.code != http.StatusUnauthorized {
			t.Fatalf("gateway at %s: %v %d, want 401: the node should answer on every address", host, err, a.code)
		}
		for what, port := range map[string]string{"engine": strconv.Itoa(rec.Port), "front": fu.Port()} {
			addr := net.JoinHostPort(host, port)
			if c, err := net.DialTimeout("tcp", addr, 5*time.Second); err == nil {
				c.Close()
				t.Errorf("the %s answers at %s: it must listen on loopback only", what, addr)
			}
		}
	}

	// /metrics: a token of any role; none is 401.
	for _, c := range []struct {
		token string
		code  int
	}{{"", http.StatusUnauthorized}, {"not-a-token", http.StatusUnauthorized}, {bob, http.StatusOK}, {root, http.StatusOK}} {
		req, _ := http.NewRequest(http.MethodGet, n.url()+"/metrics", nil)
		if c.token != "" {
			req.Header.Set("Authorization", "Bearer "+c.token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.code {
			t.Errorf("/metrics with token %q: %d %.200s, want %d", c.token, resp.StatusCode, body, c.code)
		}
		if c.code == http.StatusUnauthorized && (strings.Contains(string(body), "gpuplane_") || c.token == "" && !strings.Contains(string(body), "Authorization: Bearer")) {
			t.Errorf("/metrics refused: %.300s, want no series and how to pass a token", body)
		}
	}
	if got := metricAs(t, n, acme, "gpuplane_gateway_tokens_total", `tenant="acme"`); got == 0 {
		t.Error("/metrics with acme's token shows nothing served to acme")
	}
	// bob's read token is tenant bob's key: nothing served to acme.
	if got := metricAs(t, n, bob, "gpuplane_gateway_tokens_total", `tenant="acme"`); got != 0 {
		t.Errorf("/metrics with bob's read token shows %g tokens served to acme, want none of another tenant's series", got)
	}
	if got := metricAs(t, n, root, "gpuplane_gateway_tokens_total", `tenant="acme"`); got == 0 {
		t.Error("/metrics with the admin's token shows nothing served to acme")
	}
}

// otherAddress is an IPv4 address of this machine other than loopback, or
// "" if it has none.
func otherAddress(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(errors.Join(errors.New("interface addresses"), err))
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() && !ipn.IP.IsLinkLocalUnicast() {
			return ipn.IP.String()
		}
	}
	return ""
}

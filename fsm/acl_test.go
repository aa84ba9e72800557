package fsm_test

import (
	"math"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/gpuplane/gpuplane/fsm"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// TestTokenTenants: a token created with a tenant and weight is served as
// them; one without is served as its own name with weight 1 (docs/gateway.md);
// the lookup by secret finds both and nothing else, and a snapshot keeps
// them.
func TestTokenTenants(t *testing.T) {
	f := fsm.New()
	var index uint64
	apply := func(c *pb.CreateToken) *pb.Result {
		t.Helper()
		data, err := fsm.Marshal(&pb.Envelope{Command: &pb.Envelope_CreateToken{CreateToken: c}})
		if err != nil {
			t.Fatal(err)
		}
		index++
		return f.ApplyBytes(index, data)
	}
	two := 2.5
	res := apply(&pb.CreateToken{Name: "alice", Role: pb.Role_ROLE_READ, SecretHash: fsm.SecretHash("s-alice"), Tenant: "acme", Weight: &two})
	if res.GetCode() != pb.Code_CODE_OK || !strings.Contains(res.GetMessage(), "tenant acme, weight 2.5") {
		t.Fatalf("create alice: %v", res)
	}
	if res := apply(&pb.CreateToken{Name: "bob", Role: pb.Role_ROLE_READ, SecretHash: fsm.SecretHash("s-bob")}); res.GetCode() != pb.Code_CODE_OK {
		t.Fatalf("create bob: %v", res)
	}
	for _, c := range []struct {
		secret, tenant string
		weight         float64
		ok             bool
	}{{"s-alice", "acme", 2.5, true}, {"s-bob", "bob", 1, true}, {"s-nobody", "", 0, false}} {
		tenant, weight, ok := f.TenantBySecretHash(fsm.SecretHash(c.secret))
		if tenant != c.tenant || weight != c.weight || ok != c.ok {
			t.Errorf("secret %s: got (%q, %v, %v), want (%q, %v, %v)", c.secret, tenant, weight, ok, c.tenant, c.weight, c.ok)
		}
	}
	toks := f.Tokens()
	if len(toks) != 2 || toks[0].GetTenant() != "acme" || toks[0].GetWeight() != 2.5 || toks[1].GetTenant() != "bob" || toks[1].GetWeight() != 1 {
		t.Fatalf("Tokens() = %v", toks)
	}
	data, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	g := fsm.New()
	if err := g.Restore(data); err != nil {
		t.Fatal(err)
	}
	if tenant, weight, ok := g.TenantBySecretHash(fsm.SecretHash("s-alice")); tenant != "acme" || weight != 2.5 || !ok {
		t.Fatalf("after a snapshot: (%q, %v, %v)", tenant, weight, ok)
	}
}

// TestTokenTenantRefused: every bad tenant or weight is refused with its
// field and rule, and nothing changes.
func TestTokenTenantRefused(t *testing.T) {
	f := fsm.New()
	w := func(v float64) *float64 { return &v }
	for _, c := range []struct {
		tenant string
		weight *float64
		field  string
		rule   string
	}{
		{"", w(0), "weight", "0 must be a number above 0 and at most 1000"},
		{"", w(-1), "weight", "-1 must be a number above 0"},
		{"", w(math.NaN()), "weight", "NaN must be a number above 0"},
		{"", w(math.Inf(1)), "weight", "+Inf must be a number above 0"},
		{"", w(1000.5), "weight", "1000.5 must be a number above 0 and at most 1000"},
		{"Acme_Corp", nil, "tenant", `"Acme_Corp" must be a DNS label`},
		{strings.Repeat("a", 64), nil, "tenant", "must be a DNS label"},
	} {
		data, err := fsm.Marshal(&pb.Envelope{Command: &pb.Envelope_CreateToken{CreateToken: &pb.CreateToken{
			Name: "t", Role: pb.Role_ROLE_READ, SecretHash: fsm.SecretHash("s"), Tenant: c.tenant, Weight: c.weight,
		}}})
		if err != nil {
			t.Fatal(err)
		}
		res := f.ApplyBytes(1, data)
		vs := res.GetViolations()
		if res.GetCode() != pb.Code_CODE_INVALID_ARGUMENT || len(vs) != 1 || vs[0].GetField() != c.field || !strings.Contains(vs[0].GetDescription(), c.rule) {
			t.Errorf("tenant %q weight %v: got %v, want %s: %s", c.tenant, c.weight, res, c.field, c.rule)
		}
	}
	if len(f.Tokens()) != 0 {
		t.Fatal("a refused token changed the state")
	}
	// The largest weight and a small fraction are accepted.
	for i, v := range []float64{fsm.MaxTokenWeight, 0.001} {
		c := &pb.CreateToken{Name: "ok" + string(rune('a'+i)), Role: pb.Role_ROLE_READ, SecretHash: fsm.SecretHash("ok" + string(rune('a'+i))), Weight: proto.Float64(v)}
		data, _ := fsm.Marshal(&pb.Envelope{Command: &pb.Envelope_CreateToken{CreateToken: c}})
		if res := f.ApplyBytes(uint64(2+i), data); res.GetCode() != pb.Code_CODE_OK {
			t.Errorf("weight %v: %v", v, res)
		}
	}
}

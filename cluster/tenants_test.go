package cluster

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/fsm"
)

// TestTenantTable: a client node's copy of the token table is fetched
// once for many lookups, is fetched again for a secret it does not know
// but at most once per tenantFetchEvery however many unknown secrets
// arrive, and stays in use while no server answers.
func TestTenantTable(t *testing.T) {
	var tt tenantTable
	fetches := 0
	var fail error
	table := map[string]fsm.Tenant{fsm.SecretHash("a"): {Name: "acme", Weight: 2}}
	read := func(context.Context) (map[string]fsm.Tenant, error) {
		fetches++
		return table, fail
	}
	start := time.Now()
	for range 1000 {
		if tn, ok := tt.lookup(fsm.SecretHash("a"), read); !ok || tn.Name != "acme" || tn.Weight != 2 {
			t.Fatalf("lookup a = %+v, %v", tn, ok)
		}
		if _, ok := tt.lookup(fsm.SecretHash("unknown"), read); ok {
			t.Fatal("an unknown secret resolved")
		}
	}
	// Every fetch but the first was for the unknown secret, at most one
	// per interval; the table's age alone adds one per tenantTableMaxAge.
	if most := 1 + int(time.Since(start)/tenantFetchEvery) + 1; fetches > most {
		t.Fatalf("%d fetches in %v, want at most %d", fetches, time.Since(start), most)
	}

	// A token created since is found once the interval has passed.
	table = map[string]fsm.Tenant{fsm.SecretHash("a"): {Name: "acme", Weight: 2}, fsm.SecretHash("b"): {Name: "beta", Weight: 1}}
	time.Sleep(tenantFetchEvery)
	if tn, ok := tt.lookup(fsm.SecretHash("b"), read); !ok || tn.Name != "beta" {
		t.Fatalf("new token: %+v, %v", tn, ok)
	}

	// No server answers: the last table stays in use.
	fail, table = errors.New("no server"), nil
	time.Sleep(tenantTableMaxAge)
	if tn, ok := tt.lookup(fsm.SecretHash("a"), read); !ok || tn.Name != "acme" {
		t.Fatalf("while servers are down: %+v, %v", tn, ok)
	}
}

package cluster

import (
	"context"
	"sync"
	"time"

	"github.com/gpuplane/gpuplane/fsm"
)

// The gateway asks TenantFor on every request, so it never waits for Raft:
// a server reads its own applied state, which trails the leader by a
// heartbeat at most; a client node, which has no state, keeps a copy of the
// token table from a server and renews it when older than
// tenantTableMaxAge, or at once when it does not know a secret (a token
// created a moment ago), at most once per tenantFetchEvery so that a flood
// of unknown secrets costs one fetch per interval, not one per request.
const (
	tenantTableMaxAge   = 2 * time.Second
	tenantFetchEvery    = 250 * time.Millisecond
	tenantFetchDeadline = 5 * time.Second
)

// TenantFor resolves the bearer secret of a gateway request to the tenant
// and weight its token is served as (docs/gateway.md: the token's tenant, else
// its name; its weight, else 1). ok is false when no token has that secret
// (deleted or never created). It reads this node's applied state, never
// Raft; on a client node see tenantTableMaxAge.
func (c *Cluster) TenantFor(secret string) (tenant string, weight float64, ok bool) {
	h := fsm.SecretHash(secret)
	if c.raft != nil {
		c.View(func(f *fsm.FSM) { tenant, weight, ok = f.TenantBySecretHash(h) })
		return tenant, weight, ok
	}
	t, ok := c.tenants.lookup(h, func(ctx context.Context) (map[string]fsm.Tenant, error) {
		var m map[string]fsm.Tenant
		err := c.readViaServer(ctx, true, func(f *fsm.FSM) error {
			m = f.TenantsBySecretHash()
			return nil
		})
		return m, err
	})
	return t.Name, t.Weight, ok
}

// tenantTable is a client node's copy of the token table, by secret hash.
type tenantTable struct {
	// fetch serializes renewals: one request fetches, the others wait for
	// its table rather than fetching it again.
	fetch sync.Mutex

	mu      sync.RWMutex
	byHash  map[string]fsm.Tenant
	fetched time.Time // when byHash was read from a server
	tried   time.Time // the last fetch, successful or not
}

func (t *tenantTable) get(h string) (fsm.Tenant, bool, time.Duration, time.Duration) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	tn, ok := t.byHash[h]
	return tn, ok, time.Since(t.fetched), time.Since(t.tried)
}

func (t *tenantTable) lookup(h string, read func(context.Context) (map[string]fsm.Tenant, error)) (fsm.Tenant, bool) {
	tn, ok, age, _ := t.get(h)
	if age < tenantTableMaxAge && (ok || age < tenantFetchEvery) {
		return tn, ok
	}
	t.fetch.Lock()
	defer t.fetch.Unlock()
	// Another request may have renewed the table while this one waited.
	tn, ok, age, sinceTry := t.get(h)
	if (age < tenantTableMaxAge && ok) || sinceTry < tenantFetchEvery {
		return tn, ok
	}
	ctx, cancel := context.WithTimeout(context.Background(), tenantFetchDeadline)
	defer cancel()
	m, err := read(ctx)
	t.mu.Lock()
	t.tried = time.Now()
	if err == nil {
		// While no server answers, the last table stays in use: the
		// gateway keeps serving the tokens it knew.
		t.byHash, t.fetched = m, t.tried
	}
	tn, ok = t.byHash[h]
	t.mu.Unlock()
	return tn, ok
}

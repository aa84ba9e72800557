package traffic

import (
	"testing"
	"time"
)

// TestRequestsHideTenantNames: the wire's record names tenants t1, t2, ...
// in the order first seen in one answer, never by their names, and a
// card asked for gives that card's requests alone.
func TestRequestsHideTenantNames(t *testing.T) {
	l := NewLog(0)
	t0 := time.Unix(1000, 0)
	l.Add(0, Record{Arrived: t0, Deployment: "chat", Tenant: "acme", TTFT: 250 * time.Millisecond})
	l.Add(0, Record{Arrived: t0.Add(time.Second), Deployment: "chat", Tenant: "globex", Outcome: Failed})
	l.Add(1, Record{Arrived: t0.Add(2 * time.Second), Deployment: "embed", Tenant: "acme"})
	all := l.Requests(nil, time.Time{})
	if len(all) != 3 {
		t.Fatalf("%d records, want 3", len(all))
	}
	for i, want := range []string{"t1", "t2", "t1"} {
		if all[i].GetTenant() != want {
			t.Errorf("record %d names tenant %q, want %q", i, all[i].GetTenant(), want)
		}
	}
	if all[0].GetTtftSeconds() != 0.25 || all[1].GetOutcome() != "failed" {
		t.Errorf("first two records %v %v", all[0], all[1])
	}
	card := uint32(1)
	one := l.Requests(&card, time.Time{})
	if len(one) != 1 || one[0].GetDeployment() != "embed" || one[0].GetCard() != 1 || one[0].GetTenant() != "t1" {
		t.Errorf("card 1: %v", one)
	}
}

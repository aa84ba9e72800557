package queue_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/gateway/queue"
)

// TestIdleTenantsForgotten: 5,000 made-up tenant names, one request each,
// leave the scheduler a record (counter) per name for no longer than the
// default IdleTenant after they were found idle, and never more than
// MaxIdleFlows idle ones while they arrive; a tenant that is still in
// service, or idle for less, keeps its counter (fairness is not reset by
// a short pause).
func TestIdleTenantsForgotten(t *testing.T) {
	s, err := queue.New(queue.Config{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_000_000, 0)
	if _, err := s.AddDeployment(queue.Deployment{Name: "m", MaxInFlight: 1 << 20, QueueLimit: 1 << 20, Ready: true}, now); err != nil {
		t.Fatal(err)
	}
	run := func(tenant string, tokens int) {
		t.Helper()
		id, out, err := s.Enqueue(queue.Request{Deployment: "m", Tenant: tenant, Class: queue.Standard, PromptTokens: tokens, MaxTokens: tokens}, now)
		if err != nil || len(out.Dispatched) != 1 {
			t.Fatalf("enqueue %s: %v %+v", tenant, err, out)
		}
		if _, err := s.Finish(id, tokens, now); err != nil {
			t.Fatal(err)
		}
	}
	kept := func() int {
		n := 0
		for i := range 5000 {
			if s.Counter("m", queue.Standard, fmt.Sprint("t", i)) > 0 {
				n++
			}
		}
		return n
	}
	// A hog served much more than anyone, then idle.
	run("hog", 1000)
	hog := s.Counter("m", queue.Standard, "hog")
	for i := range 5000 {
		run(fmt.Sprint("t", i), 1+i%7)
	}
	if n := kept(); n > 4096 {
		t.Fatalf("%d idle tenants' records kept while they arrived, want at most MaxIdleFlows (4096)", n)
	}
	now = now.Add(30 * time.Second)
	run("late", 1)
	if got := s.Counter("m", queue.Standard, "hog"); got != hog {
		t.Fatalf("hog's counter after 30 s idle is %g, was %g: a short pause must not reset its share", got, hog)
	}
	for range 3 {
		now = now.Add(61 * time.Second)
		run("late", 1)
	}
	if n := kept(); n != 0 {
		t.Fatalf("%d of 5,000 made-up tenants' records kept after 3 minutes idle", n)
	}
	if s.Counter("m", queue.Standard, "hog") != 0 {
		t.Fatal("hog's idle record kept after 3 minutes")
	}
}

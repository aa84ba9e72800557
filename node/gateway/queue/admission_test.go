package queue_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/node/gateway/queue"
)

// TestQueueFullRetryAfter: past its bound a deployment's queue rejects with
// 429 and a Retry-After of the time its queue takes to drain at the rate
// it has been dispatching.
func TestQueueFullRetryAfter(t *testing.T) {
	e := newEngine(t, queue.Config{}, queue.Deployment{Name: "m", MaxInFlight: 1, QueueLimit: 3, Ready: true})
	r := queue.Request{Deployment: "m", Tenant: "t", Class: queue.Standard, PromptTokens: 1, MaxTokens: 200}
	// One request every 2 s of output (200 steps of 10 ms): 4 dispatched in
	// 6 s of history, queue kept full.
	for range 4 {
		e.enqueue(r, 200)
	}
	for e.now.Sub(epoch) < 6*time.Second {
		e.step(stepDT)
		for e.s.Queued("m") < 3 {
			e.enqueue(r, 200)
		}
	}
	id, o, err := e.s.Enqueue(r, e.now)
	if err != nil {
		t.Fatal(err)
	}
	// 4 dispatches (at 0, 2, 4, 6 s) over the 6 s since the oldest: 1.5 s
	// each, 3 queued ahead: 4.5 s, rounded to 5 s.
	want := queue.End{ID: id, Outcome: queue.Rejected, Status: 429, RetryAfter: 5 * time.Second}
	if len(o.Ended) != 1 || o.Ended[0] != want || len(o.Dispatched) != 0 {
		t.Fatalf("enqueue past the bound: %+v, want %+v", o, want)
	}
	if got := e.s.Queued("m"); got != 3 {
		t.Fatalf("the rejected request was queued: %d waiting, bound 3", got)
	}
}

// TestColdModel: requests for a deployment that is not ready wait for its
// load; those still waiting ColdWait after they arrived are rejected with
// 503 and a Retry-After of the rest of the expected load; the others are
// dispatched when it is ready.
func TestColdModel(t *testing.T) {
	e := newEngine(t, queue.Config{ColdWait: 10 * time.Second}, queue.Deployment{Name: "m", MaxInFlight: 4, QueueLimit: 10})
	if err := e.s.SetCold("m", epoch.Add(30*time.Second), e.now); err != nil {
		t.Fatal(err)
	}
	r := queue.Request{Deployment: "m", Tenant: "t", Class: queue.Interactive, PromptTokens: 1, MaxTokens: 1}
	early := e.enqueue(r, 1)
	e.now = epoch.Add(5 * time.Second)
	late := e.enqueue(r, 1)
	if at, ok := e.s.NextDeadline(); !ok || !at.Equal(epoch.Add(10*time.Second)) {
		t.Fatalf("next deadline %v %v, want the first request's cold wait at 10 s", at, ok)
	}
	e.now = epoch.Add(10 * time.Second)
	o := e.s.Tick(e.now)
	want := queue.End{ID: early, Outcome: queue.Rejected, Status: 503, RetryAfter: 20 * time.Second}
	if len(o.Ended) != 1 || o.Ended[0] != want {
		t.Fatalf("tick at the cold deadline: %+v, want %+v", o, want)
	}
	e.apply(o)
	o, err := e.s.SetReady("m", e.now)
	if err != nil {
		t.Fatal(err)
	}
	if len(o.Dispatched) != 1 || o.Dispatched[0] != late {
		t.Fatalf("load done: %+v, want the waiting request %d dispatched", o, late)
	}
	if _, ok := e.s.NextDeadline(); ok {
		t.Fatal("a deadline is still pending after every request was dispatched")
	}
}

// TestBackgroundWaitsLongerForColdModel: a background request outwaits
// the interactive cold wait (ColdWaitBackground) and is dispatched when
// the model is ready; an interactive one queued beside it is rejected at
// ColdWait.
func TestBackgroundWaitsLongerForColdModel(t *testing.T) {
	e := newEngine(t, queue.Config{ColdWait: 10 * time.Second, ColdWaitBackground: time.Minute},
		queue.Deployment{Name: "m", MaxInFlight: 4, QueueLimit: 10})
	if err := e.s.SetCold("m", time.Time{}, e.now); err != nil {
		t.Fatal(err)
	}
	r := queue.Request{Deployment: "m", Tenant: "t", Class: queue.Interactive, PromptTokens: 1, MaxTokens: 1}
	fg := e.enqueue(r, 1)
	r.Class = queue.Background
	bg := e.enqueue(r, 1)
	e.now = epoch.Add(30 * time.Second)
	o := e.s.Tick(e.now)
	if len(o.Ended) != 1 || o.Ended[0].ID != fg || o.Ended[0].Status != 503 {
		t.Fatalf("tick at 30 s: %+v, want only the interactive request %d rejected with 503", o, fg)
	}
	e.apply(o)
	o, err := e.s.SetReady("m", e.now)
	if err != nil {
		t.Fatal(err)
	}
	if len(o.Dispatched) != 1 || o.Dispatched[0] != bg {
		t.Fatalf("ready at 30 s: %+v, want the background request %d dispatched", o, bg)
	}
}

// TestDeadlineExpires: a request still queued at its own deadline ends as
// Expired, explicitly, and the request behind it moves up.
func TestDeadlineExpires(t *testing.T) {
	e := newEngine(t, queue.Config{}, queue.Deployment{Name: "m", MaxInFlight: 1, QueueLimit: 10, Ready: true})
	r := queue.Request{Deployment: "m", Tenant: "t", Class: queue.Standard, PromptTokens: 1, MaxTokens: 100}
	e.enqueue(r, 100)
	r.Deadline = epoch.Add(500 * time.Millisecond)
	impatient := e.enqueue(r, 100)
	for range 100 {
		e.step(stepDT)
	}
	if got := e.ended[impatient]; got.Outcome != queue.Expired {
		t.Fatalf("the request past its deadline ended %+v, want expired", got)
	}
}

func TestBadInput(t *testing.T) {
	for _, c := range []struct {
		cfg   queue.Config
		field string
	}{
		{queue.Config{BackgroundFloor: 1}, "BackgroundFloor"},
		{queue.Config{StandardFloor: 1.5}, "StandardFloor"},
		{queue.Config{InputPrice: -1}, "InputPrice"},
		{queue.Config{OutputPrice: -2}, "OutputPrice"},
		{queue.Config{ColdWait: -time.Second}, "ColdWait"},
		{queue.Config{ColdWaitBackground: -time.Second}, "ColdWaitBackground"},
		{queue.Config{MaxRetryAfter: time.Millisecond}, "MaxRetryAfter"},
	} {
		if _, err := queue.New(c.cfg); err == nil || !strings.Contains(err.Error(), c.field) {
			t.Errorf("config %+v: error %v, want one naming %s", c.cfg, err, c.field)
		}
	}
	s, err := queue.New(queue.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		d     queue.Deployment
		field string
	}{
		{queue.Deployment{MaxInFlight: 1, QueueLimit: 1}, "Name"},
		{queue.Deployment{Name: "m", QueueLimit: 1}, "MaxInFlight"},
		{queue.Deployment{Name: "m", MaxInFlight: 1, QueueLimit: 1, MaxTokens: -1}, "MaxTokens"},
		{queue.Deployment{Name: "m", MaxInFlight: 1}, "QueueLimit"},
	} {
		if _, err := s.AddDeployment(c.d, epoch); err == nil || !strings.Contains(err.Error(), c.field) {
			t.Errorf("deployment %+v: error %v, want one naming %s", c.d, err, c.field)
		}
	}
	if err := s.SetTenant("t", 0); err == nil || !strings.Contains(err.Error(), "weight") {
		t.Errorf("weight 0: error %v, want one naming the weight", err)
	}
	if _, err := s.AddDeployment(queue.Deployment{Name: "m", MaxInFlight: 1, MaxTokens: 100, QueueLimit: 1, Ready: true}, epoch); err != nil {
		t.Fatal(err)
	}
	ok := queue.Request{Deployment: "m", Tenant: "t", Class: queue.Standard, PromptTokens: 1, MaxTokens: 1}
	for _, c := range []struct {
		mod   func(*queue.Request)
		field string
	}{
		{func(r *queue.Request) { r.Deployment = "x" }, "Deployment"},
		{func(r *queue.Request) { r.Tenant = "" }, "Tenant"},
		{func(r *queue.Request) { r.Class = 7 }, "Class"},
		{func(r *queue.Request) { r.PromptTokens = -1 }, "PromptTokens"},
		{func(r *queue.Request) { r.MaxTokens = -1 }, "MaxTokens"},
		{func(r *queue.Request) { r.PromptTokens = 90; r.MaxTokens = 20 }, "PromptTokens+MaxTokens is 110"},
	} {
		r := ok
		c.mod(&r)
		id, o, err := s.Enqueue(r, epoch)
		if err == nil || !strings.Contains(err.Error(), c.field) {
			t.Errorf("request %+v: error %v, want one naming %s", r, err, c.field)
		}
		if id != 0 || len(o.Dispatched)+len(o.Ended) != 0 || s.Len() != 0 {
			t.Errorf("request %+v was rejected as bad input but changed the scheduler: id %d, %+v", r, id, o)
		}
	}
	if _, err := s.Cancel(42, epoch); !errors.Is(err, queue.ErrUnknownRequest) {
		t.Errorf("cancel of an unknown request: %v, want ErrUnknownRequest", err)
	}
}

// TestFullQueueShedsLowerClass: a full queue of background work does not
// turn an interactive request away: the newest request of the background
// tenant with the most service is rejected (429) in its place.
func TestFullQueueShedsLowerClass(t *testing.T) {
	e := newEngine(t, queue.Config{}, queue.Deployment{Name: "m", MaxInFlight: 1, QueueLimit: 3, Ready: true})
	bg := func(tenant string) queue.ID {
		return e.enqueue(queue.Request{Deployment: "m", Tenant: tenant, Class: queue.Background, PromptTokens: 10, MaxTokens: 10}, 10)
	}
	bg("heavy") // in flight
	bg("heavy")
	newest := bg("heavy")
	light := bg("light") // lifted to heavy's counter
	for range 3 {
		e.step(stepDT) // heavy's request in flight: heavy pulls ahead
	}
	id := e.enqueue(queue.Request{Deployment: "m", Tenant: "chat", Class: queue.Interactive, PromptTokens: 1, MaxTokens: 1}, 1)
	if got := e.ended[newest]; got.Outcome != queue.Rejected || got.Status != 429 {
		t.Fatalf("heavy's newest queued request ended %+v, want rejected 429 to make room", got)
	}
	if _, ok := e.ended[id]; ok {
		t.Fatalf("the interactive request was turned away from a queue full of background work: %+v", e.ended[id])
	}
	if _, ok := e.ended[light]; ok {
		t.Fatal("light's request was shed although heavy has had more service")
	}
	// A background request meets the full queue and is the one rejected.
	late := bg("light")
	if got := e.ended[late]; got.Outcome != queue.Rejected || got.Status != 429 {
		t.Fatalf("a background request at a full queue ended %+v, want rejected 429", got)
	}
}

// TestRemoveDeployment: an engine leaving the card ends its queued
// requests as Rejected (503: another replica may take them) and its
// in-flight ones as Cancelled.
func TestRemoveDeployment(t *testing.T) {
	e := newEngine(t, queue.Config{}, queue.Deployment{Name: "m", MaxInFlight: 1, QueueLimit: 3, Ready: true})
	r := queue.Request{Deployment: "m", Tenant: "t", Class: queue.Standard, PromptTokens: 1, MaxTokens: 1}
	running, waiting := e.enqueue(r, 1), e.enqueue(r, 1)
	o, err := e.s.RemoveDeployment("m", e.now)
	if err != nil {
		t.Fatal(err)
	}
	e.apply(o)
	if got := e.ended[waiting]; got.Outcome != queue.Rejected || got.Status != 503 {
		t.Fatalf("the queued request ended %+v, want rejected 503", got)
	}
	if got := e.ended[running]; got.Outcome != queue.Cancelled || !got.WasInFlight {
		t.Fatalf("the in-flight request ended %+v, want cancelled in flight", got)
	}
	if e.s.Len() != 0 {
		t.Fatalf("%d requests held after the deployment left", e.s.Len())
	}
	if _, _, err := e.s.Enqueue(r, e.now); err == nil || !strings.Contains(err.Error(), `"m" is not on this card`) {
		t.Fatalf("enqueue to a removed deployment: %v, want an error naming it", err)
	}
}

package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// savedCard writes a record as --save-record does: a pinned chat and a
// background batch on a 22.5 GiB card, a request a second for each over a
// minute, all served (chat within its 400 ms).
func savedCard(t *testing.T) string {
	t.Helper()
	rec := &cardRecord{Node: "vm", Card: 0, MemoryMiB: 23034, Shares: map[string]uint64{"chat": 9213, "batch": 10365},
		Specs: map[string]*pb.ModelSpec{
			"chat": {Model: "/models/chat", Priority: pb.Priority_PRIORITY_INTERACTIVE, Residency: pb.Residency_RESIDENCY_PINNED,
				Slo:    &pb.SLO{TtftMs: 400},
				Engine: &pb.EngineSpec{Kind: "sim", MemoryPercent: 40, Args: []string{"--tokens-per-second", "100", "--load-seconds", "0.5"}}},
			"batch": {Model: "/models/batch", Priority: pb.Priority_PRIORITY_BACKGROUND, Residency: pb.Residency_RESIDENCY_ON_DEMAND,
				Engine: &pb.EngineSpec{Kind: "sim", MemoryPercent: 45, Args: []string{"--tokens-per-second", "100", "--load-seconds", "1"}}},
		},
		Profiles: []*pb.ResidencyProfile{{Model: "/models/batch", Engine: "sim", LoadMs: 2025, Loads: 1, TokensPerSecond: 99.8}},
	}
	start := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	for i := range 60 {
		for _, m := range []string{"chat", "batch"} {
			rec.Requests = append(rec.Requests, &pb.RequestRecord{Node: "vm", Arrived: timestamppb.New(start.Add(time.Duration(i) * time.Second)),
				Deployment: m, Tenant: "t1", Class: "interactive", PromptTokens: 3, OutputTokens: 8, TtftSeconds: 0.1, Outcome: "served"})
		}
	}
	p := filepath.Join(t.TempDir(), "record.json")
	if err := rec.save(p); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestSimulateServeReplaysASavedRecord(t *testing.T) {
	path := savedCard(t)
	r := run(t, "", nil, "-o", "json", "simulate", "serve", "--record", path, "--card-memory", "48GiB")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	var out replayResult
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatalf("%v: %s", err, r.stdout)
	}
	if out.Node != "vm" || out.Requests != 120 || len(out.Models) != 2 || len(out.WhatIf) != 1 {
		t.Fatalf("want vm's 120 requests over chat and batch, with the what-if: %s", r.stdout)
	}
	for _, m := range out.Models {
		if m.Served != 1 || m.WhatIf == nil {
			t.Errorf("%s: served %.2f (want 1, every request in the record), what-if %v", m.Model, m.Served, m.WhatIf)
		}
	}
	again := run(t, "", nil, "-o", "json", "simulate", "serve", "--record", path, "--card-memory", "48GiB")
	if again.stdout != r.stdout {
		t.Errorf("the same record replays differently:\n%s\n%s", r.stdout, again.stdout)
	}
}

func TestSimulateServeRecordBadInput(t *testing.T) {
	path := savedCard(t)
	empty := filepath.Join(t.TempDir(), "empty.json")
	if err := os.WriteFile(empty, []byte(`{"node": "vm", "memoryMiB": 1024}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--record", path, "--from-node", "vm"}, "give one of them"},
		{[]string{"--record", path, "--card", "1"}, "--card, --since and --save-record read a node"},
		{[]string{"--record", path, "--save-record", "x.json"}, "--card, --since and --save-record read a node"},
		{[]string{"--save-record", "x.json"}, "need --from-node (or --record)"},
		{[]string{"--record", filepath.Join(t.TempDir(), "none.json")}, "--record: open"},
		{[]string{"--record", empty}, "requests: none recorded"},
		{[]string{"--record", path, "--remove", "nosuch"}, "--remove nosuch: no such model on the card"},
	} {
		r := run(t, "", nil, append([]string{"simulate", "serve"}, c.args...)...)
		if r.code == 0 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("%v: exit %d, %q; want an error with %q", c.args, r.code, r.stderr, c.want)
		}
	}
}

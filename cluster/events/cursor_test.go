package events

import (
	"strings"
	"testing"

	"github.com/hashicorp/raft"
)

// TestMembershipEvents checks that configuration entries appear as
// membership events with what changed.
func TestMembershipEvents(t *testing.T) {
	prev := raft.Configuration{Servers: []raft.Server{
		{ID: "s1", Address: "a1", Suffrage: raft.Voter},
		{ID: "s2", Address: "a2", Suffrage: raft.Nonvoter},
		{ID: "s3", Address: "a3", Suffrage: raft.Voter},
	}}
	next := raft.Configuration{Servers: []raft.Server{
		{ID: "s1", Address: "a1", Suffrage: raft.Voter},
		{ID: "s2", Address: "a2", Suffrage: raft.Voter},
		{ID: "s4", Address: "a4", Suffrage: raft.Voter},
	}}
	m, changed := membershipChange(prev, next)
	if got, want := strings.Join(m.Changes, ", "), "s2 became voter, s4 joined as voter, s3 removed"; got != want {
		t.Errorf("changes: got %q, want %q", got, want)
	}
	if got := strings.Join(changed, ","); got != "s2,s4,s3" {
		t.Errorf("changed servers: %q", got)
	}
}

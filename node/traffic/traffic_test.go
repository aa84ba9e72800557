package traffic

import (
	"testing"
	"time"
)

// TestRecordIsBoundedPerCard: a card's record keeps its last perCard
// requests, oldest first by arrival; another card's are its own.
func TestRecordIsBoundedPerCard(t *testing.T) {
	l := NewLog(3)
	t0 := time.Unix(1000, 0)
	for i := range 5 {
		l.Add(0, Record{Arrived: t0.Add(time.Duration(i) * time.Second), Deployment: "chat", OutputTokens: i})
	}
	l.Add(1, Record{Arrived: t0, Deployment: "embed"})
	got := l.Since(0, time.Time{})
	if len(got) != 3 || got[0].OutputTokens != 2 || got[2].OutputTokens != 4 {
		t.Fatalf("card 0 keeps %+v, want the last 3 of 5", got)
	}
	if got := l.Since(0, t0.Add(4*time.Second)); len(got) != 1 || got[0].OutputTokens != 4 {
		t.Fatalf("since the 5th: %+v", got)
	}
	if got := l.Since(1, time.Time{}); len(got) != 1 || got[0].Deployment != "embed" {
		t.Fatalf("card 1: %+v", got)
	}
	if cs := l.Cards(); len(cs) != 2 || cs[0] != 0 || cs[1] != 1 {
		t.Fatalf("cards %v", cs)
	}
	// Recorded as they end, read back as they arrived.
	l2 := NewLog(0)
	l2.Add(0, Record{Arrived: t0.Add(time.Second), Deployment: "short"})
	l2.Add(0, Record{Arrived: t0, Deployment: "long"})
	if got := l2.Since(0, time.Time{}); got[0].Deployment != "long" {
		t.Fatalf("not in arrival order: %+v", got)
	}
}

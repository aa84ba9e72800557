package cluster

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
)

func TestRaftLogsGoToSlog(t *testing.T) {
	var buf bytes.Buffer
	base := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	l := newHCLog(base, "raft", slog.LevelWarn).Named("transport").With("peer", "s2")

	l.Info("entering follower state")
	l.Warn("heartbeat failed", "error", "EOF")
	got := buf.String()
	if strings.Contains(got, "entering follower state") {
		t.Errorf("info passed the warn filter: %s", got)
	}
	if !strings.Contains(got, `level=WARN msg="heartbeat failed" component=raft.transport peer=s2 error=EOF`) {
		t.Errorf("warning not routed to slog with its context: %s", got)
	}

	l.SetLevel(hclog.Info)
	l.StandardLogger(nil).Print("from the standard logger")
	if !l.IsInfo() || !strings.Contains(buf.String(), `level=INFO msg="from the standard logger"`) {
		t.Errorf("after SetLevel(Info): %s", buf.String())
	}
}

package cluster

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"

	"github.com/hashicorp/go-hclog"
)

// slogHCLog adapts log/slog to the hclog.Logger that raft (and later
// memberlist) log through, so the agent has one log stream and one format.
// Raft is chatty at info ("entering follower state", "compacting logs"), so
// the cluster passes warn unless asked otherwise.
type slogHCLog struct {
	base  *slog.Logger
	name  string
	level *slog.LevelVar
	args  []any
}

var _ hclog.Logger = (*slogHCLog)(nil)

func newHCLog(l *slog.Logger, name string, level slog.Leveler) *slogHCLog {
	lv := &slog.LevelVar{}
	lv.Set(level.Level())
	return &slogHCLog{base: l, name: name, level: lv}
}

func toSlogLevel(level hclog.Level) slog.Level {
	switch level {
	case hclog.Trace:
		return slog.LevelDebug - 4
	case hclog.Debug:
		return slog.LevelDebug
	case hclog.Info, hclog.NoLevel, hclog.DefaultLevel:
		return slog.LevelInfo
	case hclog.Warn:
		return slog.LevelWarn
	default:
		return slog.LevelError
	}
}

func toHCLevel(level slog.Level) hclog.Level {
	switch {
	case level < slog.LevelDebug:
		return hclog.Trace
	case level < slog.LevelInfo:
		return hclog.Debug
	case level < slog.LevelWarn:
		return hclog.Info
	case level < slog.LevelError:
		return hclog.Warn
	default:
		return hclog.Error
	}
}

func (h *slogHCLog) enabled(level slog.Level) bool { return level >= h.level.Level() }

// raftElection is what raft warns when a follower hears from no leader.
const raftElection = "heartbeat timeout reached, starting election"

func (h *slogHCLog) Log(level hclog.Level, msg string, args ...any) {
	if level == hclog.Off {
		return
	}
	if level == hclog.Warn && msg == raftElection && argString(args, "last-leader-id") == "" {
		// No leader was ever known: the first election of a node that
		// starts (a dev agent's every start), which is normal. Losing a
		// known leader stays a warning.
		level = hclog.Info
	}
	lv := toSlogLevel(level)
	if !h.enabled(lv) {
		return
	}
	all := append(append([]any{"component", h.name}, h.args...), args...)
	h.base.Log(context.Background(), lv, msg, all...)
}

func (h *slogHCLog) Trace(msg string, args ...any) { h.Log(hclog.Trace, msg, args...) }
func (h *slogHCLog) Debug(msg string, args ...any) { h.Log(hclog.Debug, msg, args...) }
func (h *slogHCLog) Info(msg string, args ...any)  { h.Log(hclog.Info, msg, args...) }
func (h *slogHCLog) Warn(msg string, args ...any)  { h.Log(hclog.Warn, msg, args...) }
func (h *slogHCLog) Error(msg string, args ...any) { h.Log(hclog.Error, msg, args...) }

func (h *slogHCLog) IsTrace() bool { return h.enabled(toSlogLevel(hclog.Trace)) }
func (h *slogHCLog) IsDebug() bool { return h.enabled(slog.LevelDebug) }
func (h *slogHCLog) IsInfo() bool  { return h.enabled(slog.LevelInfo) }
func (h *slogHCLog) IsWarn() bool  { return h.enabled(slog.LevelWarn) }
func (h *slogHCLog) IsError() bool { return h.enabled(slog.LevelError) }

func (h *slogHCLog) ImpliedArgs() []any { return h.args }

func (h *slogHCLog) With(args ...any) hclog.Logger {
	c := *h
	c.args = append(append([]any{}, h.args...), args...)
	return &c
}

func (h *slogHCLog) Name() string { return h.name }

func (h *slogHCLog) Named(name string) hclog.Logger {
	if h.name != "" {
		name = h.name + "." + name
	}
	return h.ResetNamed(name)
}

func (h *slogHCLog) ResetNamed(name string) hclog.Logger {
	c := *h
	c.name = name
	return &c
}

// SetLevel changes the level of this logger and of every logger derived from
// it, as hclog's own loggers do.
func (h *slogHCLog) SetLevel(level hclog.Level) { h.level.Set(toSlogLevel(level)) }

func (h *slogHCLog) GetLevel() hclog.Level { return toHCLevel(h.level.Level()) }

func (h *slogHCLog) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(h.StandardWriter(opts), "", 0)
}

// StandardWriter logs each written line at the forced level, or at info.
func (h *slogHCLog) StandardWriter(opts *hclog.StandardLoggerOptions) io.Writer {
	level := hclog.Info
	if opts != nil && opts.ForceLevel != hclog.NoLevel {
		level = opts.ForceLevel
	}
	return writerFunc(func(p []byte) (int, error) {
		for line := range bytes.Lines(p) {
			if msg := string(bytes.TrimSpace(line)); msg != "" {
				h.Log(level, msg)
			}
		}
		return len(p), nil
	})
}

type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// argString is the value of key in hclog's key-value args as a string, ""
// when absent.
func argString(args []any, key string) string {
	for i := 0; i+1 < len(args); i += 2 {
		if k, ok := args[i].(string); ok && k == key {
			return fmt.Sprint(args[i+1])
		}
	}
	return ""
}

package residency_test

import (
	"testing"

	"github.com/gpuplane/gpuplane/node/residency"
)

// instant returns a handler of c's output that completes every engine
// operation at once (a load, wake, sleep or stop is done as soon as it is
// asked for), as the tests of one decision at a time need. It fails the
// test on an error; a ledger violation fails it too unless violations
// counts them. seen, when set, hears of each action first.
func instant(t *testing.T, c *residency.Controller, seen func(residency.Action), violations *int) func(residency.Output) {
	t.Helper()
	return instantSleeping(t, c, seen, violations, 0, false)
}

// instantSleeping is instant whose sleeps report residual as what the
// engine kept when measured is set.
func instantSleeping(t *testing.T, c *residency.Controller, seen func(residency.Action), violations *int, residual int64, measured bool) func(residency.Output) {
	t.Helper()
	var exec func(out residency.Output)
	exec = func(out residency.Output) {
		if out.Err != nil {
			t.Fatal(out.Err)
		}
		if violations != nil {
			*violations += len(out.Violations)
		} else if len(out.Violations) > 0 {
			t.Fatalf("violations %v", out.Violations)
		}
		for _, a := range out.Actions {
			if seen != nil {
				seen(a)
			}
			switch a.Kind {
			case residency.ActBestEffort:
				t.Fatalf("a best-effort decision came back as an action: %+v", a)
			case residency.ActLoad, residency.ActPrewarm:
				defer func(m residency.ModelID) { exec(c.Handle(residency.LoadDone{Model: m})) }(a.Model)
			case residency.ActWake:
				defer func(m residency.ModelID) { exec(c.Handle(residency.WakeDone{Model: m})) }(a.Model)
			case residency.ActSleep:
				defer func(m residency.ModelID) {
					exec(c.Handle(residency.SleepDone{Model: m, Residual: residual, Measured: measured}))
				}(a.Model)
			case residency.ActEvict, residency.ActUnload:
				defer func(m residency.ModelID) { exec(c.Handle(residency.Unloaded{Model: m})) }(a.Model)
			}
		}
	}
	return exec
}

package descriptor

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestIdleInDocument(t *testing.T) {
	doc := func(residency, idle string) string {
		return "resource: ModelDeployment\nresourceVersion: v1\nmetadata: {name: m}\nspec:\n  model: /m\n  residency: " + residency +
			"\n  placement: {accelerator: a}\n  idle: " + idle + "\n"
	}
	f, err := Parse([]byte(doc("onDemand", "{sleepAfter: 2m, unloadAfter: 1h}")))
	if err != nil {
		t.Fatal(err)
	}
	i := f.Resources[0].ModelDeployment.Proto().GetIdle()
	if i.GetSleepAfterSeconds() != 120 || i.GetUnloadAfterSeconds() != 3600 {
		t.Fatalf("idle {2m, 1h} sent as %v", i)
	}
	f, err = Parse([]byte(doc("warm", "{sleepAfter: 90s}")))
	if err != nil {
		t.Fatal(err)
	}
	if i := f.Resources[0].ModelDeployment.Proto().GetIdle(); i.GetSleepAfterSeconds() != 90 || i.GetUnloadAfterSeconds() != 0 {
		t.Fatalf("warm idle {90s} sent as %v", i)
	}
	const at = "document 1 (modeldeployment/m): "
	for _, c := range []struct{ residency, idle, want string }{
		{"pinned", "{sleepAfter: 2m}", at + "spec.idle.sleepAfter: a pinned model is never demoted when idle: only warm and onDemand deployments take idle timeouts"},
		{"warm", "{unloadAfter: 2m}", at + "spec.idle.unloadAfter: a warm model is never unloaded when idle (its share stays reserved): only onDemand deployments take it"},
		{"onDemand", "{sleepAfter: 500ms}", at + "spec.idle.sleepAfter: must be a whole number of seconds, at least 1s, got 500ms"},
		{"onDemand", "{unloadAfter: 200h}", at + "spec.idle.unloadAfter: must be at most 168h0m0s, got 200h0m0s"},
	} {
		_, err := Parse([]byte(doc(c.residency, c.idle)))
		var perr *Error
		if !errors.As(err, &perr) {
			t.Errorf("%s idle %s: error %v, want problems", c.residency, c.idle, err)
			continue
		}
		var got []string
		for _, p := range perr.Problems {
			got = append(got, p.String())
		}
		if !slices.Equal(got, []string{c.want}) {
			t.Errorf("%s idle %s:\n%s\nwant:\n%s", c.residency, c.idle, strings.Join(got, "\n"), c.want)
		}
	}
}

func TestMaxInFlightInDocument(t *testing.T) {
	doc := func(v string) string {
		return "resource: ModelDeployment\nresourceVersion: v1\nmetadata: {name: m}\nspec:\n  model: /m\n  placement: {accelerator: a}\n  engine: {kind: sim, maxInFlight: " + v + "}\n"
	}
	f, err := Parse([]byte(doc("16")))
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Resources[0].ModelDeployment.Proto().GetEngine().GetMaxInFlight(); got != 16 {
		t.Fatalf("maxInFlight 16 sent as %d", got)
	}
	for _, v := range []string{"0", "70000"} {
		_, err := Parse([]byte(doc(v)))
		var perr *Error
		want := "document 1 (modeldeployment/m): spec.engine.maxInFlight: must be between 1 and 65536, got " + v
		if !errors.As(err, &perr) || len(perr.Problems) != 1 || perr.Problems[0].String() != want {
			t.Errorf("maxInFlight %s: %v, want %q", v, err, want)
		}
	}
}

package descriptor

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/fsm"
)

func TestStartTimeoutInDocument(t *testing.T) {
	doc := func(v string) string {
		return "resource: ModelDeployment\nresourceVersion: v1\nmetadata: {name: m}\nspec:\n  model: /m\n  placement: {accelerator: a}\n  engine: {kind: sim, startTimeout: " + v + "}\n"
	}
	for v, want := range map[string]uint32{"10m": 600, "90s": 90, "'1h30m'": 5400, "24h": 86400, "1s": 1} {
		f, err := Parse([]byte(doc(v)))
		if err != nil {
			t.Errorf("startTimeout %s: %v", v, err)
			continue
		}
		if got := f.Resources[0].ModelDeployment.Proto().GetEngine().GetStartTimeoutSeconds(); got != want {
			t.Errorf("startTimeout %s: %d seconds, want %d", v, got, want)
		}
	}
	const at = "document 1 (modeldeployment/m): spec.engine.startTimeout: "
	for v, want := range map[string]string{
		"600":     at + "must be a duration such as 90s, 10m or 1h30m, got 600",
		"ten":     at + `invalid duration "ten": want a number with a unit, such as 90s, 10m or 1h30m`,
		"[1m]":    at + "must be a duration such as 90s, 10m or 1h30m, got a list",
		"0s":      at + "must be more than 0, got 0s",
		"-5m":     at + "must be more than 0, got -5m0s",
		"1500ms":  at + "must be a whole number of seconds, got 1.5s",
		"25h":     at + "must be at most 24h0m0s, got 25h0m0s",
		"100000h": at + "must be at most 24h0m0s, got 100000h0m0s",
	} {
		_, err := Parse([]byte(doc(v)))
		var perr *Error
		if !errors.As(err, &perr) {
			t.Errorf("startTimeout %s: error %v, want problems", v, err)
			continue
		}
		var got []string
		for _, p := range perr.Problems {
			got = append(got, p.String())
		}
		if !slices.Equal(got, []string{want}) {
			t.Errorf("startTimeout %s:\n%s\nwant:\n%s", v, strings.Join(got, "\n"), want)
		}
	}
	// Left out, the engine kind's default applies: nothing is sent.
	f, err := Parse([]byte("resource: ModelDeployment\nresourceVersion: v1\nmetadata: {name: m}\nspec: {model: /m, placement: {accelerator: a}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Resources[0].ModelDeployment.Proto().GetEngine().GetStartTimeoutSeconds(); got != 0 {
		t.Errorf("no startTimeout sends %d seconds, want 0", got)
	}
}

// The server holds deployments to the bound this package checks files and
// flags against.
func TestMaxStartTimeoutMatchesServer(t *testing.T) {
	if MaxStartTimeout != fsm.MaxStartTimeoutSeconds*time.Second {
		t.Errorf("descriptor.MaxStartTimeout %s, fsm.MaxStartTimeoutSeconds %d", MaxStartTimeout, fsm.MaxStartTimeoutSeconds)
	}
}

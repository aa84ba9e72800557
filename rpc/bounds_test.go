package rpc_test

import (
	"net/http"
	"testing"
)

// TestSpecBoundsRefused: sizes no node or card could hold, environment
// names an engine's process cannot be given and selector labels with NUL
// are refused, naming the field and the bound.
func TestSpecBoundsRefused(t *testing.T) {
	api := startServers(t, 1, false)[0].api
	model := func(name, extra string) string {
		return `{"name":"` + name + `","spec":{"model":"x","placement":{"accelerator":"a"` + extra + `}}}`
	}
	refuses(t, api, []badInput{
		{"memoryMib", applyModel, model("b1", `},"resources":{"memoryMib":"18446744073709551615"`), "spec.resources.memoryMib: must be at most"},
		{"cpuMilli", applyModel, model("b2", `},"resources":{"cpuMilli":4294967295`), "spec.resources.cpuMilli: must be at most"},
		{"empty env name", applyModel, model("b3", `},"engine":{"env":{"":"1"}`), "spec.engine.env: a variable name must not be empty"},
		{"env name with =", applyModel, model("b4", `},"engine":{"env":{"A=B":"1"}`), "spec.engine.env: variable name \"A=B\" must not contain"},
		{"selector NUL", applyModel, model("b5", `,"nodeSelector":{"zone":"a\u0000b"}`), "spec.placement.nodeSelector.zone: the value must not contain NUL"},
		{"maxModels", createAccelerator, `{"name":"b6","spec":{"device":"l4","tenancy":"TENANCY_SHARED","maxModels":1000000}}`, "spec.maxModels: must be between 1 and 64 models per card, got 1000000 (rule 4)"},
	})
	ok := `{"name":"b7","spec":{"device":"l4","tenancy":"TENANCY_SHARED","maxModels":64}}`
	if status, ce := postJSON(t, api, createAccelerator, ok); status != http.StatusOK {
		t.Errorf("maxModels 64: status %d, %+v; want accepted", status, ce)
	}
}

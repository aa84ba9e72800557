package rpc_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
	"github.com/gpuplane/gpuplane/proto/gpuplane/v1/gpuplanev1connect"
	"github.com/gpuplane/gpuplane/rpc"
)

// connectError is a Connect error as its JSON body carries it.
type connectError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// postJSON sends body to procedure as a Connect unary JSON call, as curl
// or a browser would, and returns the status and the decoded error (zero
// when the call succeeded).
func postJSON(t *testing.T, api, procedure, body string) (int, connectError) {
	t.Helper()
	resp, err := http.Post("http://"+api+procedure, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var ce connectError
	if resp.StatusCode != http.StatusOK {
		if err := json.Unmarshal(data, &ce); err != nil {
			t.Fatalf("%s: status %d, body %q is not Connect error JSON: %v", procedure, resp.StatusCode, data, err)
		}
	}
	return resp.StatusCode, ce
}

// badInput is one request the API must refuse, naming field.
type badInput struct {
	name, procedure, body, field string
}

// refuses sends each bad input and checks that it is refused as
// invalid_argument naming its field, and that nothing was stored: the
// accelerator or model it names does not exist afterwards.
func refuses(t *testing.T, api string, cases []badInput) {
	t.Helper()
	// The accelerator the models name exists, so that a model is refused
	// for what the case is about, not for rule 7.
	if status, ce := postJSON(t, api, createAccelerator, `{"name":"a","spec":{"device":"l4"},"upsert":true}`); status != http.StatusOK {
		t.Fatalf("create accelerator a: %d %+v", status, ce)
	}
	accs := gpuplanev1connect.NewAcceleratorServiceClient(rpc.HTTPClient(), "http://"+api)
	models := gpuplanev1connect.NewModelServiceClient(rpc.HTTPClient(), "http://"+api)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, c := range cases {
		status, ce := postJSON(t, api, c.procedure, c.body)
		if status == http.StatusOK || ce.Code != "invalid_argument" || !strings.Contains(ce.Message, c.field) {
			t.Errorf("%s: status %d, %+v; want invalid_argument naming %s", c.name, status, ce, c.field)
		}
		var req struct{ Name string }
		_ = json.Unmarshal([]byte(c.body), &req)
		var err error
		if strings.Contains(c.procedure, "Accelerator") {
			_, err = accs.GetAccelerator(ctx, connect.NewRequest(&pb.GetAcceleratorRequest{Name: req.Name}))
		} else {
			_, err = models.GetModel(ctx, connect.NewRequest(&pb.GetModelRequest{Name: req.Name}))
		}
		if connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("%s: %s was stored (get: %v)", c.name, req.Name, err)
		}
	}
}

const (
	createAccelerator = "/gpuplane.v1.AcceleratorService/CreateAccelerator"
	applyModel        = "/gpuplane.v1.ModelService/ApplyModel"
)

// TestUnknownEnumsRefused: an enum given by a name or a number its type
// does not define is refused on every enum field of a request, instead of
// decoding to the default (a typo in "TENANCY_SHARED" made a dedicated
// accelerator).
func TestUnknownEnumsRefused(t *testing.T) {
	api := startServers(t, 1, false)[0].api
	refuses(t, api, []badInput{
		{"tenancy name", createAccelerator, `{"name":"t1","spec":{"device":"l4","tenancy":"TENANCY_SHAREDD"}}`, "spec.tenancy"},
		{"tenancy number", createAccelerator, `{"name":"t2","spec":{"device":"l4","tenancy":7}}`, "spec.tenancy"},
		{"residency name", applyModel, `{"name":"m1","spec":{"model":"x","placement":{"accelerator":"a"},"residency":"RESIDENCY_WARMM"}}`, "spec.residency"},
		{"residency number", applyModel, `{"name":"m2","spec":{"model":"x","placement":{"accelerator":"a"},"residency":9}}`, "spec.residency"},
		{"priority name", applyModel, `{"name":"m3","spec":{"model":"x","placement":{"accelerator":"a"},"priority":"PRIORITY_URGENT"}}`, "spec.priority"},
		{"priority number", applyModel, `{"name":"m4","spec":{"model":"x","placement":{"accelerator":"a"},"priority":-1}}`, "spec.priority"},
	})
	// A replica's residency as a node reports it, through the write path
	// between nodes.
	for _, body := range []string{
		`{"envelope":{"replicaStatus":{"model":"m","replica":0,"node":"n1","residency":"REPLICA_RESIDENCY_NAPPING"}}}`,
		`{"envelope":{"replicaStatus":{"model":"m","replica":0,"node":"n1","residency":42}}}`,
	} {
		status, ce := postJSON(t, api, "/gpuplane.v1.ClusterService/Apply", body)
		if status == http.StatusOK || ce.Code != "invalid_argument" || !strings.Contains(ce.Message, "envelope.replicaStatus.residency") {
			t.Errorf("Apply %s: status %d, %+v; want invalid_argument naming envelope.replicaStatus.residency", body, status, ce)
		}
	}
	// Defined names and numbers, and fields this server does not know
	// (a newer client's), are still accepted.
	for _, body := range []string{
		`{"name":"ok1","spec":{"device":"l4","tenancy":"TENANCY_SHARED","futureField":1}}`,
		`{"name":"ok2","spec":{"device":"l4","tenancy":2}}`,
	} {
		if status, ce := postJSON(t, api, createAccelerator, body); status != http.StatusOK {
			t.Errorf("CreateAccelerator %s: status %d, %+v; want accepted", body, status, ce)
		}
	}
}

// TestLongRequestIDRefused: a request id is a short printable token; a
// long one (kept by every server for good) or one with control bytes is
// refused before it reaches the log.
func TestLongRequestIDRefused(t *testing.T) {
	api := startServers(t, 1, false)[0].api
	long := strings.Repeat("x", rpc.MaxRequestIDBytes+1)
	refuses(t, api, []badInput{
		{"long id", createAccelerator, `{"name":"r1","spec":{"device":"l4"},"requestId":"` + long + `"}`, "requestId"},
		{"control byte", createAccelerator, `{"name":"r2","spec":{"device":"l4"},"requestId":"a\nb"}`, "requestId"},
		{"long id model", applyModel, `{"name":"r3","spec":{"model":"x","placement":{"accelerator":"a"}},"requestId":"` + long + `"}`, "requestId"},
	})
	var buf bytes.Buffer
	json.NewEncoder(&buf).Encode(map[string]any{"envelope": map[string]any{"requestId": long,
		"createAccelerator": map[string]any{"name": "r4", "spec": map[string]any{"device": "l4"}}}})
	refuses(t, api, []badInput{{"long id apply", "/gpuplane.v1.ClusterService/Apply", buf.String(), "requestId"}})
	// The longest id allowed is accepted.
	body := `{"name":"r5","spec":{"device":"l4"},"requestId":"` + long[1:] + `"}`
	if status, ce := postJSON(t, api, createAccelerator, body); status != http.StatusOK {
		t.Errorf("a %d-byte id: status %d, %+v; want accepted", rpc.MaxRequestIDBytes, status, ce)
	}
}

package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
	"github.com/gpuplane/gpuplane/proto/gpuplane/v1/gpuplanev1connect"
)

// fakeAPI serves the API from fixed data and records what it was asked, so
// that the tests see exactly what the CLI sends and prints. The real server
// is exercised by the agent's integration tests.
type fakeAPI struct {
	gpuplanev1connect.UnimplementedDeviceServiceHandler
	gpuplanev1connect.UnimplementedNodeServiceHandler
	gpuplanev1connect.UnimplementedAcceleratorServiceHandler

	accelerators []*pb.Accelerator
	nodes        []*pb.Node
	// create answers a CreateAccelerator request; nil means "created".
	create func(*pb.CreateAcceleratorRequest) (*pb.CreateAcceleratorResponse, error)

	mu      sync.Mutex
	calls   []string // "Method name" in order
	creates []*pb.CreateAcceleratorRequest
	deletes []*pb.DeleteAcceleratorRequest
	auth    []string // the Authorization header of every request
}

func (f *fakeAPI) record(method, name string, h http.Header) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, strings.TrimSpace(method+" "+name))
	f.auth = append(f.auth, h.Get("Authorization"))
}

func (f *fakeAPI) ListAccelerators(_ context.Context, req *connect.Request[pb.ListAcceleratorsRequest]) (*connect.Response[pb.ListAcceleratorsResponse], error) {
	f.record("ListAccelerators", "", req.Header())
	return connect.NewResponse(&pb.ListAcceleratorsResponse{Accelerators: f.accelerators}), nil
}

func (f *fakeAPI) GetAccelerator(_ context.Context, req *connect.Request[pb.GetAcceleratorRequest]) (*connect.Response[pb.GetAcceleratorResponse], error) {
	f.record("GetAccelerator", req.Msg.GetName(), req.Header())
	for _, a := range f.accelerators {
		if a.GetName() == req.Msg.GetName() {
			return connect.NewResponse(&pb.GetAcceleratorResponse{Accelerator: a}), nil
		}
	}
	return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("accelerator %q not found", req.Msg.GetName()))
}

func (f *fakeAPI) CreateAccelerator(_ context.Context, req *connect.Request[pb.CreateAcceleratorRequest]) (*connect.Response[pb.CreateAcceleratorResponse], error) {
	f.record("CreateAccelerator", req.Msg.GetName(), req.Header())
	f.mu.Lock()
	f.creates = append(f.creates, req.Msg)
	f.mu.Unlock()
	if f.create != nil {
		resp, err := f.create(req.Msg)
		if err != nil {
			return nil, err
		}
		return connect.NewResponse(resp), nil
	}
	return connect.NewResponse(&pb.CreateAcceleratorResponse{Outcome: pb.Outcome_OUTCOME_CREATED}), nil
}

func (f *fakeAPI) DeleteAccelerator(_ context.Context, req *connect.Request[pb.DeleteAcceleratorRequest]) (*connect.Response[pb.DeleteAcceleratorResponse], error) {
	f.record("DeleteAccelerator", req.Msg.GetName(), req.Header())
	f.mu.Lock()
	f.deletes = append(f.deletes, req.Msg)
	f.mu.Unlock()
	return connect.NewResponse(&pb.DeleteAcceleratorResponse{}), nil
}

func (f *fakeAPI) ListNodes(_ context.Context, req *connect.Request[pb.ListNodesRequest]) (*connect.Response[pb.ListNodesResponse], error) {
	f.record("ListNodes", "", req.Header())
	return connect.NewResponse(&pb.ListNodesResponse{Nodes: f.nodes}), nil
}

func (f *fakeAPI) GetNode(_ context.Context, req *connect.Request[pb.GetNodeRequest]) (*connect.Response[pb.GetNodeResponse], error) {
	f.record("GetNode", req.Msg.GetName(), req.Header())
	for _, n := range f.nodes {
		if n.GetName() == req.Msg.GetName() {
			return connect.NewResponse(&pb.GetNodeResponse{Node: n}), nil
		}
	}
	return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("node %q not found", req.Msg.GetName()))
}

// serve starts f on a loopback HTTP server and returns its URL.
func serve(t *testing.T, f *fakeAPI) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle(gpuplanev1connect.NewDeviceServiceHandler(f))
	mux.Handle(gpuplanev1connect.NewNodeServiceHandler(f))
	mux.Handle(gpuplanev1connect.NewAcceleratorServiceHandler(f))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

func violationsError(code connect.Code, msg string, vs ...*pb.Violation) error {
	err := connect.NewError(code, errors.New(msg))
	d, derr := connect.NewErrorDetail(&pb.Violations{Violations: vs})
	if derr != nil {
		panic(derr)
	}
	err.AddDetail(d)
	return err
}

func TestListAndGetAgainstServer(t *testing.T) {
	f := &fakeAPI{
		accelerators: sampleAccelerators()[:1],
		nodes:        []*pb.Node{{Name: "n1", Address: "127.0.0.1:7410", Role: pb.NodeRole_NODE_ROLE_SERVER, Status: pb.NodeStatus_NODE_STATUS_ALIVE}},
	}
	url := serve(t, f)

	r := run(t, "", nil, "--addr", url, "accelerators", "list")
	if r.code != exitOK || r.stderr != "" {
		t.Fatalf("accelerators list: %+v", r)
	}
	if lines := strings.Split(r.stdout, "\n"); len(lines) != 3 || strings.Join(strings.Fields(lines[1]), " ") != "standard l4 Dedicated 1 23034Mi 0 1 True" {
		t.Errorf("accelerators list output:\n%s", r.stdout)
	}

	// The address may come from the environment, without a scheme.
	r = run(t, "", map[string]string{"GPUPLANE_ADDR": strings.TrimPrefix(url, "http://")}, "-o", "json", "nodes", "get", "n1")
	if r.code != exitOK || !strings.HasPrefix(r.stdout, "{\n  \"name\": \"n1\",") || !strings.Contains(r.stdout, `"role": "server"`) {
		t.Errorf("nodes get -o json: %+v", r)
	}

	r = run(t, "", nil, "--addr", url, "accelerators", "get", "nope")
	if r.code != exitFailure || r.stderr != "error: accelerator \"nope\" not found\n" || r.stdout != "" {
		t.Errorf("get of a missing accelerator: %+v", r)
	}
}

func TestAcceleratorsCreateAndDelete(t *testing.T) {
	f := &fakeAPI{}
	url := serve(t, f)

	r := run(t, "", map[string]string{"GPUPLANE_TOKEN": "s3cret"}, "--addr", url,
		"accelerators", "create", "small", "--device", "l4", "--tenancy", "Shared", "--max-models", "3")
	if r.code != exitOK || r.stdout != "accelerator/small created\n" || r.stderr != "" {
		t.Fatalf("create: %+v", r)
	}
	want := &pb.CreateAcceleratorRequest{
		Name: "small",
		Spec: &pb.AcceleratorSpec{Device: "l4", Tenancy: pb.Tenancy_TENANCY_SHARED, MaxModels: 3, DevicesPerReplica: 1},
	}
	if !proto.Equal(f.creates[0], want) {
		t.Errorf("create sent %v, want %v", f.creates[0], want)
	}
	if f.auth[0] != "Bearer s3cret" {
		t.Errorf("Authorization = %q, want the token from GPUPLANE_TOKEN", f.auth[0])
	}

	// Rule 3 is checked before anything is sent.
	r = run(t, "", nil, "--addr", url, "accelerators", "create", "s2", "--device", "l4", "--tenancy", "shared", "--devices-per-replica", "2")
	if r.code != exitFailure || r.stderr != "error: spec.devicesPerReplica: a shared accelerator splits a single device: must be 1, got 2 (rule 3)\n" {
		t.Errorf("create shared with 2 devices: %+v", r)
	}
	if len(f.creates) != 1 {
		t.Errorf("an invalid accelerator was sent to the server")
	}

	r = run(t, "", nil, "--addr", url, "accelerators", "delete", "small", "--force")
	if r.code != exitOK || r.stdout != "accelerator/small deleted\n" || !f.deletes[0].GetForce() {
		t.Errorf("delete --force: %+v, sent %v", r, f.deletes)
	}
}

func TestServerViolationsArePrintedOnePerLine(t *testing.T) {
	f := &fakeAPI{create: func(*pb.CreateAcceleratorRequest) (*pb.CreateAcceleratorResponse, error) {
		return nil, violationsError(connect.CodeInvalidArgument, "invalid accelerator",
			&pb.Violation{Field: "spec.device", Description: `unknown device kind "l5"`},
			&pb.Violation{Field: "spec.devicesPerReplica", Description: "must not exceed MAX/NODE of l4 (2), got 4"})
	}}
	url := serve(t, f)
	r := run(t, "", nil, "--addr", url, "accelerators", "create", "x", "--device", "l5", "--devices-per-replica", "4")
	want := "error: spec.device: unknown device kind \"l5\"\nerror: spec.devicesPerReplica: must not exceed MAX/NODE of l4 (2), got 4\n"
	if r.code != exitFailure || r.stderr != want {
		t.Errorf("code %d, stderr:\n%s\nwant:\n%s", r.code, r.stderr, want)
	}
}

const applyFile = `resource: ModelDeployment
resourceVersion: v1
metadata: {name: chat}
spec:
  model: /m
  placement: {accelerator: small}
  engine: {memoryPercent: 40}
---
resource: Accelerator
resourceVersion: v1
metadata: {name: small}
spec: {device: l4, tenancy: shared}
---
resource: Accelerator
resourceVersion: v1
metadata: {name: big}
spec: {device: h100, devicesPerReplica: 2}
`

func TestApply(t *testing.T) {
	f := &fakeAPI{create: func(req *pb.CreateAcceleratorRequest) (*pb.CreateAcceleratorResponse, error) {
		if req.GetName() == "big" {
			return &pb.CreateAcceleratorResponse{Outcome: pb.Outcome_OUTCOME_UNCHANGED,
				Warnings: []string{`accelerator "big" is immutable and was left unchanged: spec.devicesPerReplica differs (1 in the cluster, 2 in the request)`}}, nil
		}
		return &pb.CreateAcceleratorResponse{Outcome: pb.Outcome_OUTCOME_CREATED}, nil
	}}
	url := serveModels(t, f, &fakeModels{})

	// Accelerators go first, then the deployment that uses them.
	r := run(t, applyFile, nil, "--addr", url, "apply", "-f", "-")
	if r.stdout != "accelerator/small created\naccelerator/big unchanged\nmodeldeployment/chat created\n" {
		t.Errorf("apply stdout:\n%s", r.stdout)
	}
	wantErr := `warning: accelerator "big" is immutable and was left unchanged: spec.devicesPerReplica differs (1 in the cluster, 2 in the request)
`
	if r.code != exitOK || r.stderr != wantErr {
		t.Errorf("apply: code %d, stderr:\n%s\nwant:\n%s", r.code, r.stderr, wantErr)
	}
	for _, c := range f.creates {
		if !c.GetUpsert() || c.GetDryRun() {
			t.Errorf("apply sent %v, want upsert without dry run", c)
		}
	}
	if want := (&pb.AcceleratorSpec{Device: "h100", Tenancy: pb.Tenancy_TENANCY_DEDICATED, DevicesPerReplica: 2}); !proto.Equal(f.creates[1].GetSpec(), want) {
		t.Errorf("apply sent spec %v, want %v", f.creates[1].GetSpec(), want)
	}

	// Accelerators only, dry run: exit 0 with the immutability warning.
	accOnly := applyFile[strings.Index(applyFile, "resource: Accelerator"):]
	f.creates = nil
	r = run(t, accOnly, nil, "--addr", url, "apply", "-f", "-", "--dry-run")
	if r.code != exitOK || r.stdout != "accelerator/small created (dry run)\naccelerator/big unchanged (dry run)\n" || !strings.HasPrefix(r.stderr, "warning: ") {
		t.Errorf("apply --dry-run: %+v", r)
	}
	if len(f.creates) != 2 || !f.creates[0].GetDryRun() {
		t.Errorf("apply --dry-run sent %v", f.creates)
	}

	// An invalid file sends nothing.
	f.creates = nil
	r = run(t, strings.Replace(accOnly, "devicesPerReplica", "devicesPerReplicas", 1), nil, "--addr", url, "apply", "-f", "-")
	if r.code != exitFailure || r.stderr != "error: document 2 (accelerator/big): spec.devicesPerReplicas: unknown field\n" || len(f.creates) != 0 {
		t.Errorf("apply of an invalid file: %+v, sent %v", r, f.creates)
	}
}

func TestDeleteFile(t *testing.T) {
	f := &fakeAPI{}
	url := serveModels(t, f, sampleModels())
	r := run(t, applyFile, nil, "--addr", url, "delete", "-f", "-")
	if r.stdout != "modeldeployment/chat deleted\naccelerator/small deleted\naccelerator/big deleted\n" {
		t.Errorf("delete stdout:\n%s", r.stdout)
	}
	if r.code != exitOK || r.stderr != "" {
		t.Errorf("delete: %+v", r)
	}
	if got := strings.Join(f.calls, ", "); got != "DeleteModel chat, DeleteAccelerator small, DeleteAccelerator big" {
		t.Errorf("calls = %s", got)
	}
}

func TestUnreachableAgent(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	r := run(t, "", nil, "--addr", addr, "devices", "list")
	prefix := fmt.Sprintf("error: cannot reach gpuplane at http://%s: is the agent running? (dial tcp %s: connect: connection refused)", addr, addr)
	if r.code != exitFailure || strings.TrimSpace(r.stderr) != prefix {
		t.Errorf("code %d, stderr %q, want %q", r.code, r.stderr, prefix)
	}
}

package cli

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
	"github.com/gpuplane/gpuplane/proto/gpuplane/v1/gpuplanev1connect"
)

// fakeModels serves the ModelService from fixed data, next to a fakeAPI
// whose call log it shares, so that a test sees the order of requests across
// services (apply -f sends accelerators first).
type fakeModels struct {
	gpuplanev1connect.UnimplementedModelServiceHandler

	api      *fakeAPI
	models   []*pb.ModelDeployment
	replicas []*pb.Replica
	// get answers GetModel when set; n counts the calls from 1.
	get func(n int, name string) (*pb.GetModelResponse, error)
	// apply answers ApplyModel when set; nil means "created".
	apply func(*pb.ApplyModelRequest) (*pb.ApplyModelResponse, error)

	mu           sync.Mutex
	gets         int
	applies      []*pb.ApplyModelRequest
	deletes      []*pb.DeleteModelRequest
	replicaLists []*pb.ListReplicasRequest
}

func (m *fakeModels) ListModels(_ context.Context, req *connect.Request[pb.ListModelsRequest]) (*connect.Response[pb.ListModelsResponse], error) {
	m.api.record("ListModels", "", req.Header())
	return connect.NewResponse(&pb.ListModelsResponse{Models: m.models}), nil
}

func (m *fakeModels) GetModel(_ context.Context, req *connect.Request[pb.GetModelRequest]) (*connect.Response[pb.GetModelResponse], error) {
	m.api.record("GetModel", req.Msg.GetName(), req.Header())
	m.mu.Lock()
	m.gets++
	n := m.gets
	m.mu.Unlock()
	if m.get != nil {
		resp, err := m.get(n, req.Msg.GetName())
		if err != nil {
			return nil, err
		}
		return connect.NewResponse(resp), nil
	}
	for _, d := range m.models {
		if d.GetName() == req.Msg.GetName() {
			return connect.NewResponse(&pb.GetModelResponse{Model: d, Replicas: m.replicasOf(d.GetName(), "")}), nil
		}
	}
	return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("deployment %q not found", req.Msg.GetName()))
}

func (m *fakeModels) ApplyModel(_ context.Context, req *connect.Request[pb.ApplyModelRequest]) (*connect.Response[pb.ApplyModelResponse], error) {
	m.api.record("ApplyModel", req.Msg.GetName(), req.Header())
	m.mu.Lock()
	m.applies = append(m.applies, req.Msg)
	m.mu.Unlock()
	if m.apply != nil {
		resp, err := m.apply(req.Msg)
		if err != nil {
			return nil, err
		}
		return connect.NewResponse(resp), nil
	}
	return connect.NewResponse(&pb.ApplyModelResponse{Outcome: pb.Outcome_OUTCOME_CREATED,
		Model: &pb.ModelDeployment{Name: req.Msg.GetName(), Spec: req.Msg.GetSpec(), Generation: 1}}), nil
}

func (m *fakeModels) DeleteModel(_ context.Context, req *connect.Request[pb.DeleteModelRequest]) (*connect.Response[pb.DeleteModelResponse], error) {
	m.api.record("DeleteModel", req.Msg.GetName(), req.Header())
	m.mu.Lock()
	m.deletes = append(m.deletes, req.Msg)
	m.mu.Unlock()
	if !slices.ContainsFunc(m.models, func(d *pb.ModelDeployment) bool { return d.GetName() == req.Msg.GetName() }) {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("deployment %q not found", req.Msg.GetName()))
	}
	return connect.NewResponse(&pb.DeleteModelResponse{}), nil
}

func (m *fakeModels) ListReplicas(_ context.Context, req *connect.Request[pb.ListReplicasRequest]) (*connect.Response[pb.ListReplicasResponse], error) {
	m.api.record("ListReplicas", "", req.Header())
	m.mu.Lock()
	m.replicaLists = append(m.replicaLists, req.Msg)
	m.mu.Unlock()
	return connect.NewResponse(&pb.ListReplicasResponse{Replicas: m.replicasOf(req.Msg.GetModel(), req.Msg.GetNode())}), nil
}

func (m *fakeModels) replicasOf(model, node string) []*pb.Replica {
	var out []*pb.Replica
	for _, r := range m.replicas {
		if (model == "" || r.GetModel() == model) && (node == "" || r.GetNode() == node) {
			out = append(out, r)
		}
	}
	return out
}

// serveModels starts f and m on one loopback HTTP server and returns its URL.
func serveModels(t *testing.T, f *fakeAPI, m *fakeModels) string {
	t.Helper()
	m.api = f
	mux := http.NewServeMux()
	mux.Handle(gpuplanev1connect.NewDeviceServiceHandler(f))
	mux.Handle(gpuplanev1connect.NewNodeServiceHandler(f))
	mux.Handle(gpuplanev1connect.NewAcceleratorServiceHandler(f))
	mux.Handle(gpuplanev1connect.NewModelServiceHandler(m))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

const pendingReason = `no node has 2 free h100 cards: 2 cards bound to "small", 1 node has at most 1 free card`

func sampleModels() *fakeModels {
	return &fakeModels{
		models: []*pb.ModelDeployment{
			{
				Name: "chat",
				Spec: &pb.ModelSpec{Model: "/models/llama", Replicas: 2, Placement: &pb.PlacementSpec{Accelerator: "small"},
					Engine:    &pb.EngineSpec{Kind: "vllm", MemoryPercent: 45, ComputePercent: 50, Quantization: "fp8"},
					Residency: pb.Residency_RESIDENCY_ON_DEMAND, Priority: pb.Priority_PRIORITY_INTERACTIVE, Slo: &pb.SLO{TtftMs: 800}},
				Status: &pb.ModelStatus{Desired: 2, Placed: 2, Running: 1, Ready: true, MemoryPerReplicaMib: 10365},
			},
			{
				Name:   "big",
				Spec:   &pb.ModelSpec{Model: "hf://org/big", Replicas: 2, Placement: &pb.PlacementSpec{Accelerator: "pair"}, Engine: &pb.EngineSpec{Kind: "sim"}},
				Status: &pb.ModelStatus{Desired: 2, Placed: 1, Reason: "1 of 2 replicas pending: " + pendingReason, MemoryPerReplicaMib: 163118},
			},
			{
				Name:   "orphan",
				Spec:   &pb.ModelSpec{Model: "/m", Placement: &pb.PlacementSpec{Accelerator: "gone"}, Engine: &pb.EngineSpec{Kind: "vllm"}},
				Status: &pb.ModelStatus{Ready: true},
			},
		},
		replicas: []*pb.Replica{
			{Model: "chat", Index: 0, Node: "n1", Cards: []uint32{0}, ShareMilli: 450, MemoryMib: 10365, ComputePercent: 50,
				State: pb.ReplicaState_REPLICA_STATE_RUNNING, Endpoint: "http://10.0.0.1:8000",
				Residency: pb.ReplicaResidency_REPLICA_RESIDENCY_RESIDENT, ResidencyReason: "load chat: request arrived"},
			{Model: "chat", Index: 1, Node: "n2", Cards: []uint32{1}, ShareMilli: 450, MemoryMib: 10365, ComputePercent: 50,
				State: pb.ReplicaState_REPLICA_STATE_PLACED, Residency: pb.ReplicaResidency_REPLICA_RESIDENCY_COLD},
			{Model: "big", Index: 0, Node: "n1", Cards: []uint32{2, 3}, ShareMilli: 1000, MemoryMib: 81559,
				State: pb.ReplicaState_REPLICA_STATE_STARTING},
			{Model: "big", Index: 1, State: pb.ReplicaState_REPLICA_STATE_PENDING, Reason: pendingReason},
		},
	}
}

func TestModelsList(t *testing.T) {
	m := sampleModels()
	url := serveModels(t, &fakeAPI{}, m)

	r := run(t, "", nil, "--addr", url, "models", "list")
	want := `NAME     ACCELERATOR   ENGINE   REPLICAS   MEMORY/REPLICA   RESIDENCY   PRIORITY      READY   REASON
chat     small         vllm     1/2        10365Mi          onDemand    interactive   True    -
big      pair          sim      0/2        163118Mi         pinned      standard      False   1 of 2 replicas pending: ` + pendingReason + `
orphan   gone          vllm     0/0        -                pinned      standard      True    -
`
	if r.code != exitOK || r.stdout != want || r.stderr != "" {
		t.Errorf("models list: code %d, stderr %q, stdout:\n%s\nwant:\n%s", r.code, r.stderr, r.stdout, want)
	}

	r = run(t, "", nil, "--addr", url, "-o", "json", "models", "list")
	if r.code != exitOK || !strings.HasPrefix(r.stdout, "[\n  {\n    \"resource\": \"ModelDeployment\",\n    \"resourceVersion\": \"v1\",\n    \"metadata\": {\n      \"name\": \"chat\"") {
		t.Fatalf("models list -o json: %+v", r)
	}
	for _, s := range []string{`"running": 1`, `"desired": 2`, `"memoryPerReplicaMib": 10365`, `"ready": false`,
		`"residency": "onDemand"`, `"priority": "interactive"`, `"ttftMs": 800`, `"quantization": "fp8"`,
		`"reason": "1 of 2 replicas pending: no node has 2 free h100 cards`} {
		if !strings.Contains(r.stdout, s) {
			t.Errorf("models list -o json lacks %s:\n%s", s, r.stdout)
		}
	}
	r = run(t, "", nil, "--addr", url, "-o", "yaml", "models", "list")
	if r.code != exitOK || !strings.HasPrefix(r.stdout, "- resource: ModelDeployment\n  resourceVersion: v1\n  metadata:\n    name: chat\n") {
		t.Errorf("models list -o yaml: %+v", r)
	}
}

func TestModelsGet(t *testing.T) {
	m := sampleModels()
	url := serveModels(t, &fakeAPI{}, m)

	r := run(t, "", nil, "--addr", url, "models", "get", "big")
	want := `Name:             big
Accelerator:      pair
Engine:           sim
Running/desired:  0/2
Memory/replica:   163118Mi
Residency:        pinned
Priority:         standard
TTFT SLO:         -
Quantization:     -
Ready:            False
Reason:           1 of 2 replicas pending: ` + pendingReason + `

Replicas:
MODEL   REPLICA   NODE   CARDS   MEMORY    COMPUTE   STATE      RESIDENCY   ENDPOINT   REASON
big     0         n1     2,3     81559Mi   -         Starting   -           -          -
big     1         -      -       -         -         Pending    -           -          ` + pendingReason + `
`
	if r.code != exitOK || r.stdout != want || r.stderr != "" {
		t.Errorf("models get: code %d, stderr %q, stdout:\n%s\nwant:\n%s", r.code, r.stderr, r.stdout, want)
	}

	// docs/residency.md's fields: where the weights are, and the deployment's
	// target and quantization.
	r = run(t, "", nil, "--addr", url, "models", "get", "chat")
	collapsed := strings.Join(strings.Fields(r.stdout), " ")
	for _, s := range []string{"Residency: onDemand", "Priority: interactive", "TTFT SLO: 800ms", "Quantization: fp8", "Ready: True",
		"chat 0 n1 0 10365Mi 50% Running Resident http://10.0.0.1:8000"} {
		if r.code != exitOK || !strings.Contains(collapsed, s) {
			t.Errorf("models get chat lacks %q: %+v", s, r)
		}
	}

	// A deployment without replicas prints no empty replica table.
	r = run(t, "", nil, "--addr", url, "models", "get", "orphan")
	if r.code != exitOK || strings.Contains(r.stdout, "\n\n") || !strings.HasPrefix(r.stdout, "Name:") {
		t.Errorf("models get orphan: %+v", r)
	}

	r = run(t, "", nil, "--addr", url, "-o", "json", "models", "get", "chat")
	if r.code != exitOK || !strings.HasPrefix(r.stdout, "{\n  \"resource\": \"ModelDeployment\",\n  \"resourceVersion\": \"v1\",\n  \"metadata\": {\n    \"name\": \"chat\"") {
		t.Fatalf("models get -o json: %+v", r)
	}
	for _, s := range []string{`"replicas": [`, `"endpoint": "http://10.0.0.1:8000"`, `"endpoint": ""`, `"state": "placed"`, `"computePercent": 50`} {
		if !strings.Contains(r.stdout, s) {
			t.Errorf("models get -o json lacks %s:\n%s", s, r.stdout)
		}
	}

	r = run(t, "", nil, "--addr", url, "models", "get", "nope")
	if r.code != exitFailure || r.stderr != "error: deployment \"nope\" not found\n" || r.stdout != "" {
		t.Errorf("models get nope: %+v", r)
	}
}

func TestModelsGetWait(t *testing.T) {
	m := sampleModels()
	notReady := func(reason string) *pb.GetModelResponse {
		return &pb.GetModelResponse{Model: &pb.ModelDeployment{Name: "big", Spec: m.models[1].Spec,
			Status: &pb.ModelStatus{Desired: 2, Reason: reason}}}
	}
	m.get = func(n int, _ string) (*pb.GetModelResponse, error) {
		switch n {
		case 1:
			return notReady("2 of 2 replicas pending: waiting for the scheduler"), nil
		case 2:
			return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("no leader"))
		case 3:
			return notReady("1 of 2 replicas pending: " + pendingReason), nil
		}
		return &pb.GetModelResponse{Model: &pb.ModelDeployment{Name: "big", Spec: m.models[1].Spec,
			Status: &pb.ModelStatus{Desired: 2, Placed: 2, Running: 2, Ready: true}}}, nil
	}
	url := serveModels(t, &fakeAPI{}, m)

	start := time.Now()
	r := run(t, "", nil, "--addr", url, "models", "get", "big", "--wait")
	wantErr := `waiting for deployment "big": 2 of 2 replicas pending: waiting for the scheduler
waiting for deployment "big": 1 of 2 replicas pending: ` + pendingReason + "\n"
	if r.code != exitOK || r.stderr != wantErr || !strings.Contains(r.stdout, "Running/desired:  2/2\n") || !strings.Contains(r.stdout, "Ready:            True\n") {
		t.Errorf("models get --wait: code %d, stdout:\n%s\nstderr:\n%s\nwant stderr:\n%s", r.code, r.stdout, r.stderr, wantErr)
	}
	if m.gets != 4 {
		t.Errorf("GetModel called %d times, want 4 (until Ready)", m.gets)
	}
	// 250ms + 500ms + 1s between the four polls.
	if d := time.Since(start); d < 1700*time.Millisecond {
		t.Errorf("--wait polled too fast: %s for 4 polls", d)
	}

	// Never Ready: exit 1 with the last reason. The timeout leaves room for
	// at least two polls (at 0 and 250ms) on a loaded machine.
	m.gets = 0
	m.get = func(int, string) (*pb.GetModelResponse, error) {
		return notReady("1 of 2 replicas pending: " + pendingReason), nil
	}
	r = run(t, "", nil, "--addr", url, "-o", "json", "models", "get", "big", "--wait", "--wait-timeout", "2s")
	wantErr = `waiting for deployment "big": 1 of 2 replicas pending: ` + pendingReason + `
error: timed out after 2s waiting for deployment "big" to become ready: 1 of 2 replicas pending: ` + pendingReason + "\n"
	if r.code != exitFailure || r.stderr != wantErr || r.stdout != "" {
		t.Errorf("models get --wait timeout: code %d, stdout %q, stderr:\n%s\nwant:\n%s", r.code, r.stdout, r.stderr, wantErr)
	}
	if m.gets < 2 {
		t.Errorf("GetModel called %d times before the timeout, want it polled", m.gets)
	}

	// A deployment that does not exist ends the wait at once.
	m.get = nil
	r = run(t, "", nil, "--addr", url, "models", "get", "nope", "--wait")
	if r.code != exitFailure || r.stderr != "error: deployment \"nope\" not found\n" {
		t.Errorf("models get nope --wait: %+v", r)
	}
}

func TestShortDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		10 * time.Minute: "10m", time.Hour: "1h", 90 * time.Minute: "1h30m", 90 * time.Second: "1m30s",
		300 * time.Millisecond: "300ms", 5 * time.Second: "5s",
	} {
		if got := shortDuration(d); got != want {
			t.Errorf("shortDuration(%s) = %q, want %q", d, got, want)
		}
	}
}

func TestModelsDeploy(t *testing.T) {
	f := &fakeAPI{}
	m := sampleModels()
	url := serveModels(t, f, m)

	r := run(t, "", nil, "--addr", url, "models", "deploy", "chat", "--accelerator", "small", "--model", "/models/llama",
		"--replicas", "2", "--memory-percent", "45", "--compute-percent", "50", "--max-model-len", "8192")
	if r.code != exitOK || r.stdout != "modeldeployment/chat created\n" || r.stderr != "" {
		t.Fatalf("deploy: %+v", r)
	}
	want := &pb.ApplyModelRequest{Name: "chat", Spec: &pb.ModelSpec{
		Model: "/models/llama", ServedModelName: "chat", Replicas: 2,
		Placement: &pb.PlacementSpec{Accelerator: "small"},
		Engine: &pb.EngineSpec{Kind: "vllm", MemoryPercent: 45, ComputePercent: 50, MaxModelLen: 8192,
			TensorParallel: 1, PipelineParallel: 1},
	}}
	if !proto.Equal(m.applies[0], want) {
		t.Errorf("deploy sent %v\nwant %v", m.applies[0], want)
	}

	// The same deployment from a file reaches the server in the same form,
	// so that re-applying one after the other is "unchanged".
	file := `resource: ModelDeployment
resourceVersion: v1
metadata: {name: chat}
spec:
  model: /models/llama
  replicas: 2
  placement: {accelerator: small}
  engine: {memoryPercent: 45, computePercent: 50, maxModelLen: 8192}
`
	if r := run(t, file, nil, "--addr", url, "apply", "-f", "-"); r.code != exitOK || !proto.Equal(m.applies[1], want) {
		t.Errorf("apply of the same deployment: %+v, sent %v", r, m.applies[1])
	}

	// Absolute memory, engine, parallelism, dry run; the server's outcome.
	m.apply = func(*pb.ApplyModelRequest) (*pb.ApplyModelResponse, error) {
		return &pb.ApplyModelResponse{Outcome: pb.Outcome_OUTCOME_CONFIGURED, Warnings: []string{"generation 2 replaces 1 replica"}}, nil
	}
	r = run(t, "", nil, "--addr", url, "models", "deploy", "big", "--accelerator", "pair", "--model", "hf://org/big",
		"--engine", "sim", "--memory", "40Gi", "--tensor-parallel", "2", "--dry-run")
	if r.code != exitOK || r.stdout != "modeldeployment/big configured (dry run)\n" || r.stderr != "warning: generation 2 replaces 1 replica\n" {
		t.Errorf("deploy --dry-run: %+v", r)
	}
	if got := m.applies[2]; !got.GetDryRun() || got.GetSpec().GetEngine().GetMemoryMib() != 40960 || got.GetSpec().GetEngine().GetMemoryPercent() != 0 ||
		got.GetSpec().GetEngine().GetTensorParallel() != 2 || got.GetSpec().GetEngine().GetKind() != "sim" || got.GetSpec().GetReplicas() != 1 {
		t.Errorf("deploy sent %v", got)
	}
	// A decimal quantity is 10⁹ bytes a G, sent in MiB rounded up.
	r = run(t, "", nil, "--addr", url, "models", "deploy", "big", "--accelerator", "pair", "--model", "hf://org/big",
		"--engine", "sim", "--memory", "20G", "--dry-run")
	if got := m.applies[len(m.applies)-1]; r.code != exitOK || got.GetSpec().GetEngine().GetMemoryMib() != 19074 {
		t.Errorf("deploy --memory 20G: %+v, sent %v", r, got)
	}

	// The fields of docs/residency.md, in any case, reach the server as enums.
	m.apply = nil
	r = run(t, "", nil, "--addr", url, "models", "deploy", "coder", "--accelerator", "small", "--model", "/m", "--memory-percent", "60",
		"--residency", "ondemand", "--priority", "background", "--slo-ttft-ms", "800", "--quantization", "q4_k_m")
	if got := m.applies[len(m.applies)-1].GetSpec(); r.code != exitOK || got.GetResidency() != pb.Residency_RESIDENCY_ON_DEMAND ||
		got.GetPriority() != pb.Priority_PRIORITY_BACKGROUND || got.GetSlo().GetTtftMs() != 800 || got.GetEngine().GetQuantization() != "q4_k_m" {
		t.Errorf("deploy --residency --priority --slo-ttft-ms --quantization: %+v, sent %v", r, got)
	}
	// The server's rule for dedicated accelerators names the flag.
	m.apply = func(*pb.ApplyModelRequest) (*pb.ApplyModelResponse, error) {
		return nil, violationsError(connect.CodeInvalidArgument, "invalid deployment",
			&pb.Violation{Field: "spec.residency", Description: `an onDemand or warm deployment needs a shared accelerator: "fast" is dedicated (residency warm)`})
	}
	r = run(t, "", nil, "--addr", url, "models", "deploy", "w", "--accelerator", "fast", "--model", "/m", "--residency", "warm")
	if r.code != exitFailure || r.stderr != "error: --residency: an onDemand or warm deployment needs a shared accelerator: \"fast\" is dedicated (residency warm)\n" {
		t.Errorf("warm on a dedicated accelerator: %+v", r)
	}

	// -o json prints the deployment the server returns.
	m.apply = nil
	r = run(t, "", nil, "--addr", url, "-o", "json", "models", "deploy", "x", "--accelerator", "small", "--model", "/m", "--memory-percent", "10")
	if r.code != exitOK || !strings.Contains(r.stdout, "\"metadata\": {\n    \"name\": \"x\"") || !strings.Contains(r.stdout, `"memoryPercent": 10`) {
		t.Errorf("deploy -o json: %+v", r)
	}

	// The server's rule violations name the flags.
	m.apply = func(*pb.ApplyModelRequest) (*pb.ApplyModelResponse, error) {
		return nil, violationsError(connect.CodeInvalidArgument, "invalid deployment",
			&pb.Violation{Field: "spec.engine.memoryPercent", Description: `accelerator "small" is shared: set memoryPercent or memory, or the model would be sized against the whole card`},
			&pb.Violation{Field: "spec.placement", Description: "something without a flag"})
	}
	r = run(t, "", nil, "--addr", url, "models", "deploy", "y", "--accelerator", "small", "--model", "/m")
	wantErr := `error: --memory-percent: accelerator "small" is shared: set memoryPercent or memory, or the model would be sized against the whole card
error: spec.placement: something without a flag
`
	if r.code != exitFailure || r.stderr != wantErr || r.stdout != "" {
		t.Errorf("deploy refused by the server: code %d, stderr:\n%s\nwant:\n%s", r.code, r.stderr, wantErr)
	}
	m.apply = func(*pb.ApplyModelRequest) (*pb.ApplyModelResponse, error) {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(`accelerator "nope" does not exist`))
	}
	r = run(t, "", nil, "--addr", url, "models", "deploy", "y", "--accelerator", "nope", "--model", "/m")
	if r.code != exitFailure || r.stderr != "error: accelerator \"nope\" does not exist\n" {
		t.Errorf("deploy on a missing accelerator: %+v", r)
	}
}

func TestModelsDeployFlagErrors(t *testing.T) {
	f := &fakeAPI{}
	m := sampleModels()
	url := serveModels(t, f, m)
	base := []string{"--addr", url, "models", "deploy", "chat", "--accelerator", "small", "--model", "/m"}
	tests := []struct {
		args []string
		code int
		err  string // the first line of stderr
	}{
		{[]string{"--memory-percent", "0"}, exitFailure, "error: --memory-percent: must be between 1 and 100, got 0"},
		{[]string{"--memory-percent", "101"}, exitFailure, "error: --memory-percent: must be between 1 and 100, got 101"},
		{[]string{"--compute-percent", "50"}, exitFailure, "error: --compute-percent: needs a memory share: set memoryPercent or memory too (rule 10)"},
		{[]string{"--memory-percent", "40", "--memory", "1Gi"}, exitFailure, "error: --memory: set memoryPercent or memory, not both"},
		{[]string{"--engine", "tgi"}, exitFailure, `error: --engine: must be one of vllm, llamacpp, ollama, sglang, command, sim, got "tgi"`},
		{[]string{"--replicas", "-1"}, exitFailure, "error: --replicas: must be at least 0, got -1"},
		{[]string{"--tensor-parallel", "0"}, exitFailure, "error: --tensor-parallel: must be at least 1, got 0"},
		{[]string{"--max-model-len", "0"}, exitFailure, "error: --max-model-len: must be at least 1, got 0"},
		{[]string{"--memory", "20GB"}, exitUsage, `error: invalid argument "20GB" for "--memory" flag: invalid quantity "20GB": unknown suffix "GB", write 20G (decimal) or 20Gi (binary)`},
		{[]string{"--memory", "0G"}, exitUsage, `error: invalid argument "0G" for "--memory" flag: invalid quantity "0G": must be more than 0`},
		{[]string{"--replicas", "two"}, exitUsage, `error: invalid argument "two" for "--replicas" flag: strconv.ParseInt: parsing "two": invalid syntax`},
		{[]string{"--residency", "lazy"}, exitFailure, `error: --residency: must be pinned, warm or onDemand, got "lazy"`},
		{[]string{"--priority", "urgent"}, exitFailure, `error: --priority: must be interactive, standard or background, got "urgent"`},
		{[]string{"--slo-ttft-ms", "0"}, exitFailure, "error: --slo-ttft-ms: must be at least 1, got 0"},
		{[]string{"--slo-ttft-ms", "-20"}, exitFailure, "error: --slo-ttft-ms: must be at least 1, got -20"},
		{[]string{"--quantization", "q4 k m"}, exitFailure, `error: --quantization: "q4 k m" must be one word without spaces (e.g. bf16, fp8, awq, q4_k_m)`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			r := run(t, "", nil, append(slices.Clone(base), tt.args...)...)
			if r.code != tt.code || strings.Split(r.stderr, "\n")[0] != tt.err || r.stdout != "" {
				t.Errorf("code %d, stderr:\n%s\nwant %d and %q", r.code, r.stderr, tt.code, tt.err)
			}
		})
	}
	// Several problems are all reported, and a bad name too.
	r := run(t, "", nil, "--addr", url, "models", "deploy", "Chat", "--accelerator", "small", "--model", "/m", "--memory-percent", "0", "--compute-percent", "101")
	want := `error: NAME: "Chat" must be a DNS label: at most 63 lowercase letters, digits or '-', starting and ending with a letter or digit
error: --memory-percent: must be between 1 and 100, got 0
error: --compute-percent: must be between 1 and 100, got 101
`
	if r.code != exitFailure || r.stderr != want {
		t.Errorf("several problems: code %d, stderr:\n%s\nwant:\n%s", r.code, r.stderr, want)
	}
	for _, missing := range []struct{ args []string }{
		{[]string{"models", "deploy", "chat", "--model", "/m"}},
		{[]string{"models", "deploy", "chat", "--accelerator", "small"}},
	} {
		r := run(t, "", nil, append([]string{"--addr", url}, missing.args...)...)
		if r.code != exitUsage || !strings.HasPrefix(r.stderr, "error: required flag --") {
			t.Errorf("%v: %+v", missing.args, r)
		}
	}
	if len(m.applies) != 0 {
		t.Errorf("invalid deployments were sent: %v", m.applies)
	}
}

func TestModelsDelete(t *testing.T) {
	m := sampleModels()
	url := serveModels(t, &fakeAPI{}, m)
	r := run(t, "", nil, "--addr", url, "models", "delete", "chat")
	if r.code != exitOK || r.stdout != "modeldeployment/chat deleted\n" || r.stderr != "" {
		t.Errorf("models delete: %+v", r)
	}
	r = run(t, "", nil, "--addr", url, "models", "delete", "chat", "--dry-run")
	if r.code != exitOK || r.stdout != "modeldeployment/chat deleted (dry run)\n" || !m.deletes[1].GetDryRun() || m.deletes[0].GetDryRun() {
		t.Errorf("models delete --dry-run: %+v, sent %v", r, m.deletes)
	}
	r = run(t, "", nil, "--addr", url, "models", "delete", "nope")
	if r.code != exitFailure || r.stderr != "error: deployment \"nope\" not found\n" || r.stdout != "" {
		t.Errorf("models delete nope: %+v", r)
	}
}

func TestReplicasList(t *testing.T) {
	m := sampleModels()
	url := serveModels(t, &fakeAPI{}, m)

	r := run(t, "", nil, "--addr", url, "replicas", "list")
	want := `MODEL   REPLICA   NODE   CARDS   MEMORY    COMPUTE   STATE      RESIDENCY   ENDPOINT               REASON
chat    0         n1     0       10365Mi   50%       Running    Resident    http://10.0.0.1:8000   -
chat    1         n2     1       10365Mi   50%       Placed     Cold        -                      -
big     0         n1     2,3     81559Mi   -         Starting   -           -                      -
big     1         -      -       -         -         Pending    -           -                      ` + pendingReason + `
`
	if r.code != exitOK || r.stdout != want || r.stderr != "" {
		t.Errorf("replicas list: code %d, stderr %q, stdout:\n%s\nwant:\n%s", r.code, r.stderr, r.stdout, want)
	}

	r = run(t, "", nil, "--addr", url, "replicas", "list", "--model", "chat", "--node", "n1")
	if r.code != exitOK || strings.Count(r.stdout, "\n") != 2 || !strings.Contains(r.stdout, "http://10.0.0.1:8000") {
		t.Errorf("replicas list --model --node: %+v", r)
	}
	if got := m.replicaLists[1]; got.GetModel() != "chat" || got.GetNode() != "n1" {
		t.Errorf("replicas list sent %v", got)
	}

	r = run(t, "", nil, "--addr", url, "-o", "json", "replicas", "list", "--node", "n2")
	wantJSON := `[
  {
    "model": "chat",
    "index": 1,
    "generation": 0,
    "accelerator": "",
    "node": "n2",
    "cards": [
      1
    ],
    "shareMilli": 450,
    "memoryMib": 10365,
    "computePercent": 50,
    "state": "placed",
    "reason": "",
    "restarts": 0,
    "endpoint": "",
    "placedIndex": 0,
    "residency": "cold",
    "residencyReason": "",
    "adapters": [],
    "residualMib": 0
  }
]
`
	if r.code != exitOK || r.stdout != wantJSON {
		t.Errorf("replicas list -o json:\n%s\nwant:\n%s", r.stdout, wantJSON)
	}
}

// modelFile has a deployment first: apply must still send the accelerator
// before it, delete the deployment before the accelerator.
const modelFile = `resource: ModelDeployment
resourceVersion: v1
metadata: {name: chat}
spec:
  model: /m
  placement: {accelerator: small}
  engine: {memoryPercent: 40}
  resources: {cpu: 500m, memory: 8Gi}
---
resource: Accelerator
resourceVersion: v1
metadata: {name: small}
spec: {device: l4, tenancy: shared}
`

// TestModelsDeployStartTimeout: --start-timeout sends whole seconds, as
// spec.engine.startTimeout in a file does; a bad value names the flag and
// sends nothing.
func TestModelsDeployStartTimeout(t *testing.T) {
	f := &fakeAPI{}
	m := sampleModels()
	url := serveModels(t, f, m)
	base := []string{"--addr", url, "models", "deploy", "chat", "--accelerator", "small", "--model", "/m", "--engine", "sim"}
	r := run(t, "", nil, append(slices.Clone(base), "--start-timeout", "90s")...)
	if r.code != exitOK || len(m.applies) != 1 || m.applies[0].GetSpec().GetEngine().GetStartTimeoutSeconds() != 90 {
		t.Fatalf("deploy --start-timeout 90s: %+v, sent %v", r, m.applies)
	}
	file := "resource: ModelDeployment\nresourceVersion: v1\nmetadata: {name: chat}\nspec: {model: /m, placement: {accelerator: small}, engine: {kind: sim, startTimeout: 1m30s}}\n"
	if r := run(t, file, nil, "--addr", url, "apply", "-f", "-"); r.code != exitOK || !proto.Equal(m.applies[1], m.applies[0]) {
		t.Errorf("apply of the same deployment: %+v, sent %v, want %v", r, m.applies[1], m.applies[0])
	}
	for _, tt := range []struct {
		arg  string
		code int
		err  string
	}{
		{"0s", exitFailure, "error: --start-timeout: must be more than 0, got 0s"},
		{"-1m", exitFailure, "error: --start-timeout: must be more than 0, got -1m0s"},
		{"1.5s", exitFailure, "error: --start-timeout: must be a whole number of seconds, got 1.5s"},
		{"48h", exitFailure, "error: --start-timeout: must be at most 24h0m0s, got 48h0m0s"},
		{"10", exitUsage, `error: invalid argument "10" for "--start-timeout" flag: time: missing unit in duration "10"`},
	} {
		r := run(t, "", nil, append(slices.Clone(base), "--start-timeout", tt.arg)...)
		if r.code != tt.code || strings.Split(r.stderr, "\n")[0] != tt.err {
			t.Errorf("--start-timeout %s: code %d, stderr:\n%s\nwant %d and %q", tt.arg, r.code, r.stderr, tt.code, tt.err)
		}
	}
	if len(m.applies) != 2 {
		t.Errorf("refused values reached the server: %v", m.applies[2:])
	}
}

func TestApplyAndDeleteModelDeployment(t *testing.T) {
	f := &fakeAPI{}
	m := sampleModels()
	url := serveModels(t, f, m)

	r := run(t, modelFile, nil, "--addr", url, "apply", "-f", "-")
	if r.code != exitOK || r.stdout != "accelerator/small created\nmodeldeployment/chat created\n" || r.stderr != "" {
		t.Errorf("apply: %+v", r)
	}
	if got := strings.Join(f.calls, ", "); got != "CreateAccelerator small, ApplyModel chat" {
		t.Errorf("apply calls = %s", got)
	}
	want := &pb.ApplyModelRequest{Name: "chat", Spec: &pb.ModelSpec{
		Model: "/m", ServedModelName: "chat", Replicas: 1, Placement: &pb.PlacementSpec{Accelerator: "small"},
		Engine:    &pb.EngineSpec{Kind: "vllm", MemoryPercent: 40, TensorParallel: 1, PipelineParallel: 1},
		Resources: &pb.HostResources{CpuMilli: 500, MemoryMib: 8192},
	}}
	if !proto.Equal(m.applies[0], want) {
		t.Errorf("apply sent %v\nwant %v", m.applies[0], want)
	}

	// Outcomes and dry runs.
	for outcome, word := range map[pb.Outcome]string{pb.Outcome_OUTCOME_UNCHANGED: "unchanged", pb.Outcome_OUTCOME_CONFIGURED: "configured"} {
		m.apply = func(*pb.ApplyModelRequest) (*pb.ApplyModelResponse, error) {
			return &pb.ApplyModelResponse{Outcome: outcome}, nil
		}
		r = run(t, modelFile, nil, "--addr", url, "apply", "-f", "-", "--dry-run")
		if r.code != exitOK || r.stdout != "accelerator/small created (dry run)\nmodeldeployment/chat "+word+" (dry run)\n" {
			t.Errorf("apply --dry-run (%s): %+v", word, r)
		}
		if last := m.applies[len(m.applies)-1]; !last.GetDryRun() {
			t.Errorf("apply --dry-run sent %v", last)
		}
	}

	// A deployment the server refuses is reported on its own line; the
	// accelerator before it was still applied.
	m.apply = func(*pb.ApplyModelRequest) (*pb.ApplyModelResponse, error) {
		return nil, violationsError(connect.CodeInvalidArgument, "invalid deployment",
			&pb.Violation{Field: "spec.engine.tensorParallel", Description: "tensorParallel × pipelineParallel is 1 × 1 = 1, but accelerator \"pair\" gives each replica 2 card(s) (devicesPerReplica)"})
	}
	r = run(t, modelFile, nil, "--addr", url, "apply", "-f", "-")
	wantErr := "error: document 1 (modeldeployment/chat): spec.engine.tensorParallel: tensorParallel × pipelineParallel is 1 × 1 = 1, but accelerator \"pair\" gives each replica 2 card(s) (devicesPerReplica)\n"
	if r.code != exitFailure || r.stdout != "accelerator/small created\n" || r.stderr != wantErr {
		t.Errorf("apply refused: code %d, stdout %q, stderr:\n%s\nwant:\n%s", r.code, r.stdout, r.stderr, wantErr)
	}

	f.calls = nil
	r = run(t, modelFile, nil, "--addr", url, "delete", "-f", "-")
	if r.code != exitOK || r.stdout != "modeldeployment/chat deleted\naccelerator/small deleted\n" || r.stderr != "" {
		t.Errorf("delete -f: %+v", r)
	}
	if got := strings.Join(f.calls, ", "); got != "DeleteModel chat, DeleteAccelerator small" {
		t.Errorf("delete calls = %s", got)
	}
}

func TestModelsUsageErrors(t *testing.T) {
	for _, tt := range []struct {
		args []string
		err  string
	}{
		{[]string{"models", "get"}, "error: missing NAME"},
		{[]string{"models", "get", "chat", "--wait-timeout", "1m"}, "error: --wait-timeout needs --wait"},
		{[]string{"models", "get", "chat", "--wait", "--wait-timeout", "0s"}, "error: --wait-timeout must be positive, got 0s"},
		{[]string{"models", "get", "chat", "--wait", "--wait-timeout", "soon"}, `error: invalid argument "soon" for "--wait-timeout" flag: time: invalid duration "soon"`},
		{[]string{"models", "delete"}, "error: missing NAME"},
		{[]string{"models", "deploy", "a", "b"}, `error: unexpected argument "b"`},
		{[]string{"models", "lst"}, `error: unknown command "lst" for "gpuplane models"; did you mean "list"?`},
		{[]string{"replicas", "list", "chat"}, `error: unexpected argument "chat"`},
	} {
		r := run(t, "", nil, tt.args...)
		if r.code != exitUsage || strings.Split(r.stderr, "\n")[0] != tt.err {
			t.Errorf("%v: code %d, stderr %q; want %q", tt.args, r.code, r.stderr, tt.err)
		}
	}
}

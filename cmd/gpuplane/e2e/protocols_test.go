package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

// TestPlainHTTPAndGRPC checks the README's claim that the API is not only for
// the Go client: curl speaks it as JSON over HTTP/1.1, and a gRPC client that
// knows nothing but the address finds the services by reflection, calls them
// and checks health.
func TestPlainHTTPAndGRPC(t *testing.T) {
	requireBinary(t)
	a := newAgent(t, filepath.Join(t.TempDir(), "data"))
	a.start()
	mustGpuplane(t, a.url(), "accelerators", "create", "wire", "--device", "l4", "--tenancy", "shared", "--max-models", "2")

	t.Run("curl", func(t *testing.T) {
		curl, err := exec.LookPath("curl")
		if err != nil {
			t.Skip("no curl on PATH")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, curl, "-sS", "--fail-with-body",
			"-H", "Content-Type: application/json", "-d", "{}",
			a.url()+"/gpuplane.v1.AcceleratorService/ListAccelerators").Output()
		if err != nil {
			t.Fatalf("curl: %v\n%s", err, out)
		}
		var resp struct {
			Accelerators []struct {
				Name string `json:"name"`
				Spec struct {
					Device    string `json:"device"`
					Tenancy   string `json:"tenancy"`
					MaxModels int    `json:"maxModels"`
				} `json:"spec"`
			} `json:"accelerators"`
		}
		if err := json.Unmarshal(out, &resp); err != nil {
			t.Fatalf("curl output is not the JSON response: %v\n%s", err, out)
		}
		if len(resp.Accelerators) != 1 || resp.Accelerators[0].Name != "wire" ||
			resp.Accelerators[0].Spec.Device != "l4" || resp.Accelerators[0].Spec.Tenancy != "TENANCY_SHARED" ||
			resp.Accelerators[0].Spec.MaxModels != 2 {
			t.Errorf("curl ListAccelerators = %s, want the one shared l4 accelerator wire with maxModels 2", out)
		}
	})

	// A bare h2c client: gRPC needs HTTP/2, and this one knows no gpuplane code.
	protocols := new(http.Protocols)
	protocols.SetUnencryptedHTTP2(true)
	h2c := &http.Client{Transport: &http.Transport{Protocols: protocols}, Timeout: 20 * time.Second}

	t.Run("grpc reflection", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		method := reflectMethod(ctx, t, h2c, a.url(), "gpuplane.v1.AcceleratorService", "ListAccelerators")
		client := connect.NewClient[dynamicpb.Message, dynamicpb.Message](h2c,
			a.url()+"/"+string(method.Parent().FullName())+"/"+string(method.Name()),
			connect.WithGRPC(),
			connect.WithSchema(method),
			connect.WithResponseInitializer(func(spec connect.Spec, msg any) error {
				m, ok := msg.(*dynamicpb.Message)
				if !ok {
					return fmt.Errorf("response is a %T, not a dynamic message", msg)
				}
				*m = *dynamicpb.NewMessage(spec.Schema.(protoreflect.MethodDescriptor).Output())
				return nil
			}))
		resp, err := client.CallUnary(ctx, connect.NewRequest(dynamicpb.NewMessage(method.Input())))
		if err != nil {
			t.Fatalf("gRPC %s: %v", method.FullName(), err)
		}
		field := method.Output().Fields().ByName("accelerators")
		if field == nil {
			t.Fatalf("reflected %s has no accelerators field", method.Output().FullName())
		}
		var names []string
		list := resp.Msg.Get(field).List()
		for i := range list.Len() {
			acc := list.Get(i).Message()
			names = append(names, acc.Get(acc.Descriptor().Fields().ByName("name")).String())
		}
		if !slices.Contains(names, "wire") {
			t.Errorf("gRPC ListAccelerators names = %v, want wire among them", names)
		}
	})

	t.Run("grpc health", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		health := grpchealth.NewClient(h2c, a.url(), connect.WithGRPC())
		for _, service := range []string{"", "gpuplane.v1.AcceleratorService"} {
			resp, err := health.Check(ctx, &grpchealth.CheckRequest{Service: service})
			if err != nil {
				t.Fatalf("grpc.health.v1.Health/Check %q: %v", service, err)
			}
			if resp.Status != grpchealth.StatusServing {
				t.Errorf("grpc.health.v1.Health/Check %q = %v, want SERVING", service, resp.Status)
			}
		}
	})
}

// reflectMethod finds service.method by gRPC server reflection alone: it
// lists the services, fetches the file that declares the service with its
// dependencies, and builds descriptors from them.
func reflectMethod(ctx context.Context, t *testing.T, httpc *http.Client, url, service, method string) protoreflect.MethodDescriptor {
	t.Helper()
	stream := grpcreflect.NewClient(httpc, url, connect.WithGRPC()).NewStream(ctx)
	defer stream.Close()
	services, err := stream.ListServices()
	if err != nil {
		t.Fatalf("reflection ListServices: %v", err)
	}
	if !slices.Contains(services, protoreflect.FullName(service)) {
		t.Fatalf("reflection lists %v, want %s among them", services, service)
	}
	fds, err := stream.FileContainingSymbol(protoreflect.FullName(service))
	if err != nil {
		t.Fatalf("reflection FileContainingSymbol(%s): %v", service, err)
	}
	files, err := protodesc.NewFiles(&descriptorpb.FileDescriptorSet{File: fds})
	if err != nil {
		t.Fatalf("build descriptors from %d reflected files: %v", len(fds), err)
	}
	d, err := files.FindDescriptorByName(protoreflect.FullName(service))
	if err != nil {
		t.Fatalf("reflected files do not declare %s: %v", service, err)
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		t.Fatalf("%s is a %T, not a service", service, d)
	}
	md := sd.Methods().ByName(protoreflect.Name(method))
	if md == nil {
		t.Fatalf("service %s has no method %s", service, method)
	}
	return md
}

package fsm

import (
	"strings"
	"testing"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// An API key of the deployment's own (vLLM's and llama-server's flags and
// variables) is refused naming the field: the node gives each engine a
// key only it sends, and another would refuse every call the node makes.
// A command engine is the deployment's own business.
func TestEngineKeyOfTheDeploymentsOwnRefused(t *testing.T) {
	spec := func(kind string, args []string, env map[string]string) *pb.ModelSpec {
		return &pb.ModelSpec{Model: "m", Placement: &pb.PlacementSpec{Accelerator: "a"}, Engine: &pb.EngineSpec{Kind: kind, Args: args, Env: env}}
	}
	for _, c := range []struct {
		spec *pb.ModelSpec
		want string // "" accepted
	}{
		{spec("vllm", []string{"--api-key", "s3cret"}, nil), "spec.engine.args[0]: --api-key is the node's to set"},
		{spec("llamacpp", []string{"-c", "512", "--api-key=s3cret"}, nil), "spec.engine.args[2]: --api-key is the node's to set"},
		{spec("llamacpp", []string{"--api-key-file", "/k"}, nil), "spec.engine.args[0]: --api-key-file is the node's to set"},
		{spec("llamacpp", nil, map[string]string{"LLAMA_API_KEY": "s"}), "spec.engine.env.LLAMA_API_KEY: is the node's to set"},
		{spec("vllm", nil, map[string]string{"VLLM_API_KEY": "s"}), "spec.engine.env.VLLM_API_KEY: is the node's to set"},
		{spec("command", []string{"serve", "--api-key", "s"}, nil), ""},
		{spec("llamacpp", []string{"--parallel", "2"}, nil), ""},
		// The host-RAM prompt cache stays off on llama.cpp.
		{spec("llamacpp", []string{"--cache-ram", "8192"}, nil), "spec.engine.args[0]: --cache-ram 8192: the node runs llama-server with --cache-ram 0"},
		{spec("llamacpp", []string{"-c", "512", "-cram=-1"}, nil), "spec.engine.args[2]: -cram -1: the node runs llama-server with --cache-ram 0"},
		{spec("llamacpp", nil, map[string]string{"LLAMA_ARG_CACHE_RAM": "100"}), "spec.engine.env.LLAMA_ARG_CACHE_RAM: 100: the node runs"},
		{spec("llamacpp", []string{"--cache-ram", "0"}, nil), ""},
	} {
		var got []string
		for _, v := range ValidateModelSpec(c.spec) {
			got = append(got, v.GetField()+": "+v.GetDescription())
		}
		all := strings.Join(got, "\n")
		if c.want == "" && all != "" || c.want != "" && !strings.Contains(all, c.want) {
			t.Errorf("%s %v %v: %q; want %q", c.spec.Engine.Kind, c.spec.Engine.Args, c.spec.Engine.Env, all, c.want)
		}
	}
}

package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// result is what one in-process run of the CLI produced.
type result struct {
	code           int
	stdout, stderr string
}

// run runs the CLI in-process with args and the given standard input, and
// an environment that holds only env.
func run(t *testing.T, stdin string, env map[string]string, args ...string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	g := &globals{
		stdin:  strings.NewReader(stdin),
		stdout: &stdout,
		stderr: &stderr,
		getenv: func(k string) string { return env[k] },
	}
	code := g.run(context.Background(), args)
	return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "resources.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestUsageErrors(t *testing.T) {
	tests := []struct {
		args   []string
		stderr string // the first line
	}{
		{[]string{"bogus"}, `error: unknown command "bogus" for "gpuplane"`},
		{[]string{"devics"}, `error: unknown command "devics" for "gpuplane"; did you mean "devices"?`},
		{[]string{"devices", "bogus"}, `error: unknown command "bogus" for "gpuplane devices"`},
		{[]string{"accelerators", "lst"}, `error: unknown command "lst" for "gpuplane accelerators"; did you mean "list"?`},
		{[]string{"devices", "list", "--bogus"}, `error: unknown flag: --bogus`},
		{[]string{"--bogus", "devices", "list"}, `error: unknown flag: --bogus`},
		{[]string{"devices", "list", "extra"}, `error: unexpected argument "extra"`},
		{[]string{"devices", "get"}, `error: missing NAME`},
		{[]string{"nodes", "get", "a", "b"}, `error: unexpected argument "b"`},
		{[]string{"accelerators", "create", "small"}, `error: required flag --device not set (see 'gpuplane devices list')`},
		{[]string{"accelerators", "create", "small", "--device", "l4", "--max-models", "two"}, `error: invalid argument "two" for "--max-models" flag: strconv.ParseInt: parsing "two": invalid syntax`},
		{[]string{"-o", "xml", "devices", "list"}, `error: invalid output format "xml" for -o: want table, json, yaml`},
		{[]string{"validate"}, `error: required flag -f FILE not set (use -f - for standard input)`},
		{[]string{"completion", "tcsh"}, `error: unsupported shell "tcsh": want bash, zsh or fish`},
		{[]string{"--addr", "ftp://x", "devices", "list"}, `error: invalid --addr "ftp://x": want http://HOST:PORT or HOST:PORT`},
		{[]string{"agent", "--hollow", "2", "--data-dir", "/nonexistent", "--hollow-rate", "-1"}, `error: --hollow-rate: must be 0 (all at once) or 0.001 to 1000000 nodes a second, got -1`},
		{[]string{"agent", "--hollow", "0", "--data-dir", "/nonexistent"}, `error: --hollow: must be 1 to 10000 nodes, got 0`},
		{[]string{"agent", "--dev", "--gateway-metric-tenants", "0"}, `error: --gateway-metric-tenants is 0: it must be at least 1`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			r := run(t, "", nil, tt.args...)
			if r.code != exitUsage {
				t.Errorf("exit code %d, want %d; stderr:\n%s", r.code, exitUsage, r.stderr)
			}
			lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
			if lines[0] != tt.stderr {
				t.Errorf("stderr first line %q, want %q", lines[0], tt.stderr)
			}
			if len(lines) < 2 || !strings.HasPrefix(lines[1], "Run 'gpuplane") || !strings.HasSuffix(lines[1], "--help' for usage.") {
				t.Errorf("stderr does not point at --help:\n%s", r.stderr)
			}
			if r.stdout != "" {
				t.Errorf("stdout = %q, want nothing", r.stdout)
			}
		})
	}
}

func TestHelpExitsZero(t *testing.T) {
	for _, args := range [][]string{nil, {"--help"}, {"devices"}, {"accelerators", "create", "--help"}} {
		r := run(t, "", nil, args...)
		if r.code != exitOK || !strings.Contains(r.stdout, "Usage:") || r.stderr != "" {
			t.Errorf("gpuplane %v: code %d, stdout %q, stderr %q", args, r.code, r.stdout, r.stderr)
		}
	}
}

const validFile = `resource: Accelerator
resourceVersion: v1
metadata: {name: small}
spec: {device: l4, tenancy: shared}
---
resource: ModelDeployment
resourceVersion: v1
metadata: {name: chat}
spec:
  model: /models/llama
  placement: {accelerator: small}
  engine: {memoryPercent: 45}
`

func TestValidate(t *testing.T) {
	path := writeFile(t, validFile)
	r := run(t, "", nil, "validate", "-f", path)
	if r.code != exitOK || r.stdout != path+": 2 resources valid\n" || r.stderr != "" {
		t.Errorf("valid file: %+v", r)
	}

	r = run(t, validFile, nil, "validate", "-f", "-")
	if r.code != exitOK || r.stdout != "<stdin>: 2 resources valid\n" {
		t.Errorf("valid stdin: %+v", r)
	}

	bad := writeFile(t, `resource: Accelerator
resourceVersion: v2
metadata: {name: small}
spec: {device: l4, tenacy: shared, maxModels: 3}
---
resource: ModelDeployment
resourceVersion: v1
metadata: {name: chat}
spec:
  model: /m
  placement: {accelerator: small}
  engine: {memoryPercent: 145}
`)
	r = run(t, "", nil, "validate", "-f", bad)
	want := `error: document 1 (accelerator/small): spec.tenacy: unknown field
error: document 1 (accelerator/small): resourceVersion: must be v1, got v2
error: document 2 (modeldeployment/chat): spec.engine.memoryPercent: must be between 1 and 100, got 145
`
	if r.code != exitFailure || r.stderr != want || r.stdout != "" {
		t.Errorf("invalid file: code %d\nstdout %q\nstderr:\n%s\nwant:\n%s", r.code, r.stdout, r.stderr, want)
	}

	r = run(t, "", nil, "validate", "-f", filepath.Join(t.TempDir(), "missing.yaml"))
	if r.code != exitFailure || !strings.HasPrefix(r.stderr, "error: read ") || !strings.Contains(r.stderr, "no such file") {
		t.Errorf("missing file: %+v", r)
	}
}

func TestVersionAndCompletion(t *testing.T) {
	r := run(t, "", nil, "version")
	if r.code != exitOK || !strings.HasPrefix(r.stdout, "gpuplane ") || !strings.Contains(r.stdout, "go:") {
		t.Errorf("version: %+v", r)
	}
	r = run(t, "", nil, "-o", "json", "version")
	if r.code != exitOK || !strings.Contains(r.stdout, `"version": "`) {
		t.Errorf("version -o json: %+v", r)
	}
	for shell, marker := range map[string]string{"bash": "__start_gpuplane", "zsh": "#compdef gpuplane", "fish": "complete -c gpuplane"} {
		r := run(t, "", nil, "completion", shell)
		if r.code != exitOK || !strings.Contains(r.stdout, marker) {
			t.Errorf("completion %s: code %d, missing %q", shell, r.code, marker)
		}
	}
}

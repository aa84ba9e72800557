package engines

import (
	"os"
	"strings"
	"testing"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

const (
	kindsStart = "<!-- engine table: go test ./internal/engines -rewrite -->\n"
	kindsEnd   = "<!-- end of engine table -->\n"
)

// docs/engines.md shows the table as it is: its engine table is made from it.
func TestDocsShowTheTable(t *testing.T) {
	raw, err := os.ReadFile(docs)
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw)
	i, j := strings.Index(text, kindsStart), strings.Index(text, kindsEnd)
	if i < 0 || j < i {
		t.Fatalf("%s has no engine table between %q and %q", docs, kindsStart, kindsEnd)
	}
	got, want := text[i+len(kindsStart):j], KindsMarkdown()
	if got == want {
		return
	}
	if *rewrite {
		if err := os.WriteFile(docs, []byte(text[:i+len(kindsStart)]+want+text[j:]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s's engine table differs from the table; rewrite it with go test ./internal/engines -rewrite", docs)
}

// An unknown kind is refused, naming the known ones; every kind has a
// memory rule of its own and a start deadline; the dialect is read from
// the field first, else from the sim's arguments (the last wins), and only
// for a sim.
func TestTable(t *testing.T) {
	if _, err := Lookup("tgi"); err == nil || !strings.Contains(err.Error(), `unknown engine kind "tgi"; known kinds: vllm, `) {
		t.Errorf("Lookup(tgi) = %v", err)
	}
	if Kinds()[0] != Default {
		t.Errorf("kinds %v do not start with the default %s", Kinds(), Default)
	}
	for _, k := range Kinds() {
		r, _ := Lookup(k)
		if ForKind(k).Versions == "" || r.StartTimeout == 0 || r.Name == "" {
			t.Errorf("kind %s: memory rule %+v, start deadline %s, name %q", k, ForKind(k), r.StartTimeout, r.Name)
		}
		if r.Adapters == AdaptersAtRunTime && (r.LoadPath == "" || r.UnloadPath == "") {
			t.Errorf("kind %s loads adapters at run time without routes", k)
		}
	}
	for _, c := range []struct {
		e    *pb.EngineSpec
		want string
	}{
		{&pb.EngineSpec{Kind: Sim, Dialect: Ollama, Args: []string{"--dialect", VLLM}}, Ollama},
		{&pb.EngineSpec{Kind: Sim, Args: []string{"--dialect", VLLM, "--dialect=llamacpp"}}, LlamaCpp},
		{&pb.EngineSpec{Kind: VLLM, Dialect: Ollama}, ""},
		{&pb.EngineSpec{Kind: Sim}, ""},
	} {
		if got := Dialect(c.e); got != c.want {
			t.Errorf("Dialect(%v) = %q, want %q", c.e, got, c.want)
		}
	}
	if got := SpeaksKind(&pb.EngineSpec{Kind: Sim, Dialect: "tgi"}); got != Sim {
		t.Errorf("a sim with an unknown dialect speaks %q, want sim", got)
	}
	if why := CheckDialect(&pb.EngineSpec{Kind: VLLM, Dialect: Ollama}); !strings.Contains(why, `only a sim engine takes a dialect (kind is "vllm")`) {
		t.Errorf("a vllm dialect: %q", why)
	}
}

package cli

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra/doc"
)

var updateDocs = flag.Bool("update-docs", false, "rewrite docs/cli from the commands' own help")

// TestCLIReferenceIsCurrent keeps docs/cli, the CLI reference, generated from
// the commands themselves, so a flag or command changed in code without
// `make docs` fails here instead of leaving the reference wrong.
func TestCLIReferenceIsCurrent(t *testing.T) {
	dir := filepath.Join("..", "..", "..", "docs", "cli")
	g := &globals{stdout: &bytes.Buffer{}, stderr: &bytes.Buffer{}, getenv: func(string) string { return "" }}
	root := newRootCommand(g)
	root.DisableAutoGenTag = true
	tmp := t.TempDir()
	if err := doc.GenMarkdownTree(root, tmp); err != nil {
		t.Fatal(err)
	}
	if *updateDocs {
		old, _ := filepath.Glob(filepath.Join(dir, "*.md"))
		for _, f := range old {
			if err := os.Remove(f); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	want, err := filepath.Glob(filepath.Join(tmp, "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, f := range want {
		name := filepath.Base(f)
		seen[name] = true
		got, _ := os.ReadFile(f)
		if *updateDocs {
			if err := os.WriteFile(filepath.Join(dir, name), got, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		have, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Errorf("docs/cli/%s is missing: run `make docs`", name)
			continue
		}
		if !bytes.Equal(have, got) {
			t.Errorf("docs/cli/%s differs from `gpuplane %s --help`: run `make docs`", name, strings.ReplaceAll(strings.TrimSuffix(strings.TrimPrefix(name, "gpuplane"), ".md"), "_", " "))
		}
	}
	have, _ := filepath.Glob(filepath.Join(dir, "*.md"))
	for _, f := range have {
		if !seen[filepath.Base(f)] {
			t.Errorf("docs/cli/%s names no command any more: run `make docs`", filepath.Base(f))
		}
	}
}

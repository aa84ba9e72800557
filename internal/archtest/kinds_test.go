package archtest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gpuplane/gpuplane/internal/engines"
)

// kindHomes are the packages (paths relative to the module) that may spell
// an engine kind as a string: the table and the drivers. Everywhere else
// names a kind by the table's constants (engines.VLLM), so that a kind is
// added, renamed or refused in one place and a switch on a kind cannot
// fall through to a default for a kind it never heard of.
var kindHomes = []string{"internal/engines", "node/engine"}

// kindName matches the names of expressions that hold an engine kind or a
// sim dialect: kind, Kind, GetKind(), e.Kind, Dialect, dialect, Engine.
var kindName = regexp.MustCompile(`(?i)(kind|dialect)|^engine$`)

// kindLiterals reports, one line each ("file:line: "vllm" ..."), every
// engine-kind string literal of the non-test, non-generated Go files under
// root outside kindHomes that stands for a kind: compared with, switched
// on, assigned or given as a field named kind, dialect or engine. The same
// word elsewhere (a policy named "ollama", a cobra command "sim", a log
// key "command") is not a kind and is not reported.
func kindLiterals(t *testing.T, root string) []string {
	t.Helper()
	kinds := engines.Kinds()
	isKind := func(e ast.Expr) (string, bool) {
		lit, ok := e.(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(lit.Value)
		return s, err == nil && slices.Contains(kinds, s)
	}
	var out []string
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if name := d.Name(); rel != "." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || strings.HasSuffix(path, ".pb.go") {
			return nil
		}
		if slices.ContainsFunc(kindHomes, func(h string) bool { return filepath.ToSlash(filepath.Dir(rel)) == h }) {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		var report func(e ast.Expr, what string)
		report = func(e ast.Expr, what string) {
			if c, ok := e.(*ast.CompositeLit); ok {
				// A list of kinds ([]string{"vllm", …}).
				for _, el := range c.Elts {
					report(el, what)
				}
				return
			}
			if s, ok := isKind(e); ok {
				out = append(out, rel+":"+strconv.Itoa(fset.Position(e.Pos()).Line)+": "+strconv.Quote(s)+" "+what)
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.BinaryExpr:
				if n.Op == token.EQL || n.Op == token.NEQ {
					if kindExpr(n.X) {
						report(n.Y, "compared with a kind")
					}
					if kindExpr(n.Y) {
						report(n.X, "compared with a kind")
					}
				}
			case *ast.SwitchStmt:
				if n.Tag != nil && kindExpr(n.Tag) {
					for _, c := range n.Body.List {
						for _, e := range c.(*ast.CaseClause).List {
							report(e, "in a switch on a kind")
						}
					}
				}
			case *ast.KeyValueExpr:
				if kindExpr(n.Key) {
					report(n.Value, "given as a kind")
				}
			case *ast.AssignStmt:
				for i, l := range n.Lhs {
					if kindExpr(l) && i < len(n.Rhs) {
						report(n.Rhs[i], "assigned as a kind")
					}
				}
			case *ast.ValueSpec:
				for i, name := range n.Names {
					if kindName.MatchString(name.Name) && i < len(n.Values) {
						report(n.Values[i], "declared as a kind")
					}
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// kindExpr says whether e names a kind: an identifier, a field or a call
// whose name kindName matches.
func kindExpr(e ast.Expr) bool {
	switch e := e.(type) {
	case *ast.Ident:
		return kindName.MatchString(e.Name)
	case *ast.SelectorExpr:
		return kindName.MatchString(e.Sel.Name)
	case *ast.CallExpr:
		return kindExpr(e.Fun)
	case *ast.IndexExpr:
		return kindExpr(e.X)
	}
	return false
}

// TestNoEngineKindLiterals fails on an engine kind spelled as a string
// outside the table and the drivers, naming the file and line.
func TestNoEngineKindLiterals(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range kindLiterals(t, root) {
		t.Errorf("%s: name it by the table's constant (internal/engines), docs/architecture.md", v)
	}
}

// TestKindLiteralRuleCatchesAPlantedOne plants kind literals in a
// package of a temporary module, one per way a kind is used, and a
// non-kind use of the same words: the rule reports each planted kind and
// nothing else, and not in the table's own package.
func TestKindLiteralRuleCatchesAPlantedOne(t *testing.T) {
	root := t.TempDir()
	write := func(path, src string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(path)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, path), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("node/planted/planted.go", `package planted

type spec struct{ Kind, Use string }

func (s spec) GetKind() string { return s.Kind }

const DialectX = "ollama"

var someKinds = []string{"command"}

func f(s spec) (bool, []string) {
	switch s.GetKind() {
	case "command", "other":
	}
	s.Kind = "llamacpp"
	_ = spec{Kind: "sim", Use: "sim"}
	policies := []string{"ollama"}
	return s.GetKind() == "vllm", policies
}
`)
	write("node/planted/planted_test.go", "package planted\n\nvar kind = \"vllm\"\n")
	write("internal/engines/table.go", "package engines\n\nconst VLLM = \"vllm\"\nvar kind = \"vllm\"\n")
	got := kindLiterals(t, root)
	want := []string{
		`node/planted/planted.go:7: "ollama" declared as a kind`,
		`node/planted/planted.go:9: "command" declared as a kind`,
		`node/planted/planted.go:13: "command" in a switch on a kind`,
		`node/planted/planted.go:15: "llamacpp" assigned as a kind`,
		`node/planted/planted.go:16: "sim" given as a kind`,
		`node/planted/planted.go:18: "vllm" compared with a kind`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("the rule reported\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

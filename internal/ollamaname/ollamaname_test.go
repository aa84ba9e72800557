package ollamaname

import "testing"

func TestSameAndShortest(t *testing.T) {
	for _, tc := range []struct {
		a, b     string
		same     bool
		shortest string
	}{
		{"tiny:1b", "Tiny:1b", true, "tiny:1b"},
		{"library/tiny:1b", "Tiny:1B", true, "tiny:1b"},
		{"registry.ollama.ai/library/TINY:1b", "tiny:1b", true, "TINY:1b"},
		{"tiny", "tiny:latest", true, "tiny:latest"},
		{"tiny@sha256:abc", "tiny:latest", true, "tiny:latest"},
		{"me/tiny:1b", "tiny:1b", false, "me/tiny:1b"},
		{"tiny:1b", "tiny:2b", false, "tiny:1b"},
		{"hf.co/org/tiny:Q4", "HF.co/Org/tiny:q4", true, "hf.co/org/tiny:Q4"},
		{"localhost:11434/me/tiny", "localhost:11434/me/tiny:latest", true, "localhost:11434/me/tiny:latest"},
	} {
		if got := Same(tc.a, tc.b); got != tc.same {
			t.Errorf("Same(%q, %q) = %t, want %t", tc.a, tc.b, got, tc.same)
		}
		if got := Shortest(tc.a); got != tc.shortest {
			t.Errorf("Shortest(%q) = %q, want %q", tc.a, got, tc.shortest)
		}
	}
}

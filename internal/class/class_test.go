package class

import "testing"

// TestParseReadsWhatStringWrites checks every class's name reads back, in
// any case, and that other words do not.
func TestParseReadsWhatStringWrites(t *testing.T) {
	for c := range Count {
		for _, s := range []string{c.String(), " " + c.String() + " ", string([]byte{c.String()[0] - 'a' + 'A'}) + c.String()[1:]} {
			if got, ok := Parse(s); !ok || got != c {
				t.Errorf("Parse(%q) = %v, %v; want %v", s, got, ok, c)
			}
		}
	}
	for _, bad := range []string{"", "batch", "Class(3)"} {
		if _, ok := Parse(bad); ok {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
}

package bearer

import "testing"

func TestToken(t *testing.T) {
	for _, tc := range []struct {
		in     string
		secret string
		ok     bool
	}{
		{"Bearer abc", "abc", true},
		{"bearer   abc  ", "abc", true},
		{"  BEARER abc", "abc", true},
		{"Basic abc", "", false},
		{"Bearer", "", false},
		{"Bearer    ", "", false},
		{"", "", false},
		{"abc", "", false},
	} {
		secret, ok := Token(tc.in)
		if secret != tc.secret || ok != tc.ok {
			t.Errorf("Token(%q) = %q, %v; want %q, %v", tc.in, secret, ok, tc.secret, tc.ok)
		}
	}
}

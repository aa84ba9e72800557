package isolation

import (
	"bytes"
	"strings"
	"testing"
)

func TestCacheSalt(t *testing.T) {
	secret := bytes.Repeat([]byte{7}, MinSecretLen)
	s, err := NewSalter(secret)
	if err != nil {
		t.Fatal(err)
	}
	a := s.CacheSalt("acme", "llama")
	if a != s.CacheSalt("acme", "llama") {
		t.Fatal("the salt of one tenant and model changed between calls")
	}
	seen := map[string]string{a: "acme/llama"}
	for _, p := range [][2]string{{"globex", "llama"}, {"acme", "qwen"}, {"acmel", "lama"}, {"acm", "ellama"}, {"", "acmellama"}} {
		got := s.CacheSalt(p[0], p[1])
		if prev, ok := seen[got]; ok {
			t.Fatalf("tenant %q model %q share a salt with %s", p[0], p[1], prev)
		}
		seen[got] = p[0] + "/" + p[1]
	}
	other, err := NewSalter(bytes.Repeat([]byte{8}, MinSecretLen))
	if err != nil {
		t.Fatal(err)
	}
	if other.CacheSalt("acme", "llama") == a {
		t.Fatal("another node secret gave the same salt: the salt does not depend on the secret")
	}
	// The caller's buffer is copied: changing it later changes nothing.
	secret[0] = 9
	if s.CacheSalt("acme", "llama") != a {
		t.Fatal("the salter kept a reference to the caller's secret")
	}
}

func TestNewSalterShortSecret(t *testing.T) {
	_, err := NewSalter(make([]byte, MinSecretLen-1))
	if err == nil || !strings.Contains(err.Error(), "secret is 15 bytes") {
		t.Fatalf("a 15-byte secret: got %v, want an error naming its length", err)
	}
}

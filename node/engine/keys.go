package engine

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
)

// Keys gives each engine an API key only the node knows (docs/engines.md,
// "Engine API keys"): vLLM and llama-server refuse requests without it
// (vLLM every /v1 route, llama-server every route but /health and
// /models), so a process on the node that reaches an engine's port
// without going through the node's gateway gets nothing. A key is derived
// from the node's secret and the replica (model and index), so it outlives
// an agent restart (an adopted engine keeps its key) and every part of the
// agent computes it alike. A nil *Keys gives no key.
type Keys struct{ secret []byte }

// KeysFile is the secret's file in the agent's data directory.
const KeysFile = "engine-keys.secret"

// LoadKeys reads the node's secret from dir/KeysFile, creating it (32
// random bytes, mode 0600) if absent.
func LoadKeys(dir string) (*Keys, error) {
	path := filepath.Join(dir, KeysFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		b = make([]byte, 32)
		if _, err := rand.Read(b); err != nil {
			return nil, err
		}
		if err := os.WriteFile(path, []byte(hex.EncodeToString(b)), 0o600); err != nil {
			return nil, fmt.Errorf("engine keys: %w", err)
		}
		return &Keys{secret: b}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("engine keys: %w", err)
	}
	s, err := hex.DecodeString(string(b))
	if err != nil || len(s) < 16 {
		return nil, fmt.Errorf("engine keys: %s does not hold a hex secret of 16 bytes or more", path)
	}
	return &Keys{secret: s}, nil
}

// NewKeys derives keys from secret (tests).
func NewKeys(secret []byte) *Keys { return &Keys{secret: secret} }

// For is the API key of model's replica index; "" for a nil Keys.
func (k *Keys) For(model string, index uint32) string {
	if k == nil || len(k.secret) == 0 {
		return ""
	}
	m := hmac.New(sha256.New, k.secret)
	m.Write([]byte(model + "/" + strconv.FormatUint(uint64(index), 10)))
	return "gpk-" + hex.EncodeToString(m.Sum(nil))
}

// KeyEnv is the environment that gives an engine of kind (ControlKind)
// its key: vLLM reads VLLM_API_KEY, llama-server LLAMA_API_KEY (an
// environment variable, so the key is not on the process's command line).
// Other kinds take none: Ollama has no API key, the sim checks none.
func KeyEnv(kind, key string) []string {
	if key == "" {
		return nil
	}
	switch kind {
	case KindVLLM:
		return []string{"VLLM_API_KEY=" + key}
	case KindLlamaCpp:
		return []string{"LLAMA_API_KEY=" + key}
	}
	return nil
}

// Authorize sets h's Authorization to key's bearer (nothing for "").
func Authorize(h http.Header, key string) {
	if key != "" {
		h.Set("Authorization", "Bearer "+key)
	}
}

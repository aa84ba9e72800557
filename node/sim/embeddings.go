package sim

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math"
	"net/http"
	"strings"
)

// embeddingDims is the length of the sim's embedding vectors.
const embeddingDims = 16

// embeddings answers /v1/embeddings as OpenAI's API does: one vector per
// input, each a deterministic function of its text (so equal inputs embed
// equally), of unit length. It holds no model: the vectors mean nothing.
func (s *server) embeddings(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	loaded := s.loadedOnce
	s.mu.Unlock()
	if !loaded {
		s.refuse(w, errLoading)
		return
	}
	if s.cfg.Runner == RunnerGenerate {
		// vLLM's answer for a generative model.
		apiError(w, http.StatusBadRequest, "The model does not support Embeddings API", "BadRequestError")
		return
	}
	var req struct {
		Model string          `json:"model"`
		Input json.RawMessage `json:"input"`
		// EncodingFormat "base64" answers each vector as the base64 of its
		// little-endian float32s, as OpenAI does (the Node client asks
		// for it by default).
		EncodingFormat string `json:"encoding_format"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4<<20)).Decode(&req); err != nil {
		apiError(w, http.StatusBadRequest, "invalid request body: "+err.Error(), "invalid_request_error")
		return
	}
	if req.Model != "" && req.Model != s.cfg.ServedModelName {
		apiError(w, http.StatusNotFound, fmt.Sprintf("the model %q does not exist; this server serves %q", req.Model, s.cfg.ServedModelName), "invalid_request_error")
		return
	}
	var inputs []string
	var one string
	if err := json.Unmarshal(req.Input, &one); err == nil {
		inputs = []string{one}
	} else if err := json.Unmarshal(req.Input, &inputs); err != nil || len(inputs) == 0 {
		apiError(w, http.StatusBadRequest, "input must be a string or a non-empty array of strings", "invalid_request_error")
		return
	}
	if req.EncodingFormat != "" && req.EncodingFormat != "float" && req.EncodingFormat != "base64" {
		apiError(w, http.StatusBadRequest, fmt.Sprintf("encoding_format %q is not float or base64", req.EncodingFormat), "BadRequestError")
		return
	}
	data := make([]any, len(inputs))
	tokens := 0
	for i, in := range inputs {
		tokens += len(strings.Fields(in))
		var v any = embed(in)
		if req.EncodingFormat == "base64" {
			v = base64Floats(embed(in))
		}
		data[i] = map[string]any{"object": "embedding", "index": i, "embedding": v}
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"object": "list", "model": s.cfg.ServedModelName, "data": data,
		"usage": map[string]int{"prompt_tokens": tokens, "total_tokens": tokens},
	})
}

// base64Floats is v as little-endian float32s, base64-encoded.
func base64Floats(v []float64) string {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(x)))
	}
	return base64.StdEncoding.EncodeToString(b)
}

// embed is a unit vector seeded by the text's hash.
func embed(text string) []float64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(text))
	x := h.Sum64()
	v := make([]float64, embeddingDims)
	norm := 0.0
	for i := range v {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		v[i] = float64(int64(x%2001)-1000) / 1000
		norm += v[i] * v[i]
	}
	norm = math.Sqrt(norm)
	if norm == 0 {
		v[0], norm = 1, 1
	}
	for i := range v {
		v[i] /= norm
	}
	return v
}

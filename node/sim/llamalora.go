package sim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// llama.cpp's adapters (tools/server/README.md), as the llama-server of
// docs/engines.md runs them: it loads every --lora file at start, adapter
// ids 0.. in the order given, each with a global scale of 1 that GET and
// POST /lora-adapters read and set (--lora-init-without-apply only keeps
// them out of the context at load: the list still says 1, and a request
// without a "lora" list runs with them). A request's "lora" ([{id,
// scale}]) replaces the global scales for that request alone, those it
// leaves out at 0; an id that is no adapter's is ignored. A slot's cached
// prompt is dropped when a request's list differs from the slot's last
// one; a request without a list takes the global scales and keeps it
// (server-context.cpp, launch_slot_with_task).

// loraScale is one entry of a "lora" list.
type loraScale struct {
	ID    int     `json:"id"`
	Scale float64 `json:"scale"`
}

// llamaLoRA is the adapters' state: global scales, requests served per
// adapter, and the adapters of each slot's cached prompt.
type llamaLoRA struct {
	scales  []float64
	applied map[string]int
	slotSig map[int]string
}

func (s *server) initLlamaLoRA() {
	l := &s.llamaLoRA
	l.scales = make([]float64, len(s.cfg.LlamaLoRA))
	for i := range l.scales {
		l.scales[i] = 1
	}
	l.applied, l.slotSig = map[string]int{}, map[int]string{}
}

// loraFor is the adapters a request runs with (their --lora paths @
// scale); explicit says the request named them (a "lora" list).
func (s *server) loraFor(req []loraScale) (applied []string, explicit bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	scales := slices.Clone(s.llamaLoRA.scales)
	if len(req) > 0 {
		clear(scales)
		for _, e := range req {
			if e.ID >= 0 && e.ID < len(scales) {
				scales[e.ID] = e.Scale
			}
		}
	}
	var out []string
	for i, v := range scales {
		if v != 0 {
			out = append(out, s.cfg.LlamaLoRA[i]+"@"+strconv.FormatFloat(v, 'g', -1, 64))
		}
	}
	return out, len(req) > 0
}

// countLoRA records that a request ran with applied (path@scale each).
func (s *server) countLoRA(applied []string) {
	if s.cfg.Dialect != DialectLlamaCpp {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, a := range applied {
		s.llamaLoRA.applied[a[:strings.LastIndex(a, "@")]]++
	}
}

// loraChanged says whether a request naming its adapters (explicit)
// names others than slot last ran with, and records applied as the
// slot's: llama-server drops a slot's cached prompt then. A request
// without a list keeps the slot's cache whatever it held.
func (s *server) loraChanged(slot int, applied []string, explicit bool) bool {
	if s.cfg.Dialect != DialectLlamaCpp || slot < 0 {
		return false
	}
	sig := strings.Join(applied, ",")
	s.mu.Lock()
	defer s.mu.Unlock()
	old, seen := s.llamaLoRA.slotSig[slot]
	s.llamaLoRA.slotSig[slot] = sig
	return explicit && seen && old != sig
}

// llamaLoRAList is GET /lora-adapters.
func (s *server) llamaLoRAList(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	out := make([]any, len(s.cfg.LlamaLoRA))
	for i, p := range s.cfg.LlamaLoRA {
		out[i] = map[string]any{"id": i, "path": p, "scale": s.llamaLoRA.scales[i]}
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, out)
}

// llamaLoRASet is POST /lora-adapters: the global scales, those left out
// at 0.
func (s *server) llamaLoRASet(w http.ResponseWriter, r *http.Request) {
	var body []loraScale
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&body); err != nil {
		llamaError(w, http.StatusBadRequest, "Request body must be an array", "invalid_request_error", nil)
		return
	}
	s.mu.Lock()
	scales := make([]float64, len(s.llamaLoRA.scales))
	for _, e := range body {
		if e.ID < 0 || e.ID >= len(scales) {
			s.mu.Unlock()
			llamaError(w, http.StatusBadRequest, fmt.Sprintf("invalid adapter id %d", e.ID), "invalid_request_error", nil)
			return
		}
		scales[e.ID] = e.Scale
	}
	s.llamaLoRA.scales = scales
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]bool{"success": true})
}

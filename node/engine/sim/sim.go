// Package sim is the built-in simulated inference engine that
// `gpuplane engine sim` runs (SPEC §6): a real process serving an
// OpenAI-compatible API (/v1/models, /v1/completions, /v1/chat/completions
// with SSE streaming, /health) with a configurable load time, memory
// footprint and per-token latency. Once loaded it registers its memory with
// the simulated NVML (inventory.SimUsage), so that the node's watchdog sees
// it exactly as it would see a real engine on a real card.
//
// It holds no model: replies are generated words. It must never pretend to
// be healthy before its load time has passed.
package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gpuplane/gpuplane/node/inventory"
)

// Config is what `gpuplane engine sim` accepts.
type Config struct {
	Host            string
	Port            int
	ServedModelName string
	// LoadTime is how long /health answers 503 before the model is "loaded".
	LoadTime time.Duration
	// MemoryMiB is registered on each card once loaded.
	MemoryMiB uint64
	// TokensPerSecond paces generation; 0 means no delay.
	TokensPerSecond float64
	CardUUIDs       []string
	// Usage records the memory for the simulated NVML; nil registers nothing.
	Usage  *inventory.SimUsage
	Logger *slog.Logger
	// Ready, when set, receives the listening address once the port is open.
	Ready func(addr net.Addr)
}

// Run serves until ctx ends (the command cancels it on SIGTERM), then
// unregisters its memory and shuts the server down.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.ServedModelName == "" {
		return errors.New("sim engine: --served-model-name is required")
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.Port)))
	if err != nil {
		return fmt.Errorf("sim engine: %w", err)
	}
	s := &server{cfg: cfg}
	srv := &http.Server{Handler: s.routes(), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	cfg.Logger.Info("sim engine listening", "addr", ln.Addr().String(), "model", cfg.ServedModelName,
		"load", cfg.LoadTime, "memory_mib", cfg.MemoryMiB, "cards", strings.Join(cfg.CardUUIDs, ","))
	if cfg.Ready != nil {
		cfg.Ready(ln.Addr())
	}

	pid := os.Getpid()
	registered := 0
	defer func() {
		for _, uuid := range cfg.CardUUIDs[:registered] {
			if err := cfg.Usage.Unregister(uuid, pid); err != nil {
				cfg.Logger.Warn("unregister GPU memory", "card", uuid, "err", err)
			}
		}
	}()
	select {
	case <-ctx.Done():
	case err := <-served:
		return fmt.Errorf("sim engine: %w", err)
	case <-time.After(cfg.LoadTime):
		if cfg.Usage != nil {
			for _, uuid := range cfg.CardUUIDs {
				if err := cfg.Usage.Register(uuid, pid, cfg.MemoryMiB); err != nil {
					return fmt.Errorf("sim engine: %w", err)
				}
				registered++
			}
		}
		s.loaded.Store(true)
		cfg.Logger.Info("sim engine loaded", "model", cfg.ServedModelName, "memory_mib", cfg.MemoryMiB)
		select {
		case <-ctx.Done():
		case err := <-served:
			return fmt.Errorf("sim engine: %w", err)
		}
	}
	cfg.Logger.Info("sim engine stopping")
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return srv.Shutdown(shutdown)
}

type server struct {
	cfg    Config
	loaded atomic.Bool
	nextID atomic.Uint64
}

func (s *server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", s.health)
	mux.HandleFunc("GET /v1/models", s.models)
	mux.HandleFunc("POST /v1/completions", s.completions)
	mux.HandleFunc("POST /v1/chat/completions", s.chat)
	return mux
}

func (s *server) health(w http.ResponseWriter, _ *http.Request) {
	if !s.loaded.Load() {
		http.Error(w, "loading", http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (s *server) models(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{
		"object": "list",
		"data": []any{map[string]any{
			"id": s.cfg.ServedModelName, "object": "model", "created": 0, "owned_by": "gpuplane-sim",
		}},
	})
}

// request holds the fields of both completion requests that the sim reads.
type request struct {
	Model     string    `json:"model"`
	Prompt    any       `json:"prompt"`
	Messages  []message `json:"messages"`
	MaxTokens int       `json:"max_tokens"`
	Stream    bool      `json:"stream"`
}

type message struct {
	Role    string `json:"role"`
	Content any    `json:"content"`
}

const defaultMaxTokens = 16

func (s *server) completions(w http.ResponseWriter, r *http.Request) {
	s.complete(w, r, false)
}

func (s *server) chat(w http.ResponseWriter, r *http.Request) {
	s.complete(w, r, true)
}

func (s *server) complete(w http.ResponseWriter, r *http.Request, chat bool) {
	if !s.loaded.Load() {
		apiError(w, http.StatusServiceUnavailable, "model "+s.cfg.ServedModelName+" is still loading", "server_error")
		return
	}
	var req request
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4<<20)).Decode(&req); err != nil {
		apiError(w, http.StatusBadRequest, "invalid request body: "+err.Error(), "invalid_request_error")
		return
	}
	if req.Model != "" && req.Model != s.cfg.ServedModelName {
		apiError(w, http.StatusNotFound, fmt.Sprintf("the model %q does not exist; this server serves %q", req.Model, s.cfg.ServedModelName), "invalid_request_error")
		return
	}
	if chat && len(req.Messages) == 0 {
		apiError(w, http.StatusBadRequest, "messages must not be empty", "invalid_request_error")
		return
	}
	n := req.MaxTokens
	if n <= 0 {
		n = defaultMaxTokens
	}
	tokens := s.reply(n)
	id := fmt.Sprintf("sim-%d", s.nextID.Add(1))
	created := time.Now().Unix()
	promptTokens := s.promptTokens(req)
	if req.Stream {
		s.stream(w, r, chat, id, created, tokens)
		return
	}
	if err := s.pace(r.Context(), len(tokens)); err != nil {
		return
	}
	text := strings.Join(tokens, "")
	choice := map[string]any{"index": 0, "finish_reason": "length"}
	object := "text_completion"
	if chat {
		object = "chat.completion"
		choice["message"] = map[string]any{"role": "assistant", "content": text}
	} else {
		choice["text"] = text
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"id": id, "object": object, "created": created, "model": s.cfg.ServedModelName,
		"choices": []any{choice},
		"usage":   map[string]int{"prompt_tokens": promptTokens, "completion_tokens": len(tokens), "total_tokens": promptTokens + len(tokens)},
	})
}

// stream sends one server-sent event per token, then [DONE], as OpenAI's
// streaming API does.
func (s *server) stream(w http.ResponseWriter, r *http.Request, chat bool, id string, created int64, tokens []string) {
	flusher, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	object := "text_completion"
	if chat {
		object = "chat.completion.chunk"
	}
	send := func(choice map[string]any) {
		data, _ := json.Marshal(map[string]any{
			"id": id, "object": object, "created": created, "model": s.cfg.ServedModelName, "choices": []any{choice},
		})
		fmt.Fprintf(w, "data: %s\n\n", data)
		if flusher != nil {
			flusher.Flush()
		}
	}
	for i, tok := range tokens {
		if err := s.pace(r.Context(), 1); err != nil {
			return
		}
		choice := map[string]any{"index": 0, "finish_reason": nil}
		if chat {
			delta := map[string]any{"content": tok}
			if i == 0 {
				delta["role"] = "assistant"
			}
			choice["delta"] = delta
		} else {
			choice["text"] = tok
		}
		send(choice)
	}
	final := map[string]any{"index": 0, "finish_reason": "length"}
	if chat {
		final["delta"] = map[string]any{}
	} else {
		final["text"] = ""
	}
	send(final)
	fmt.Fprint(w, "data: [DONE]\n\n")
	if flusher != nil {
		flusher.Flush()
	}
}

// pace waits as long as generating n tokens takes.
func (s *server) pace(ctx context.Context, n int) error {
	if s.cfg.TokensPerSecond <= 0 || n == 0 {
		return nil
	}
	t := time.NewTimer(time.Duration(float64(n) / s.cfg.TokensPerSecond * float64(time.Second)))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

var words = strings.Fields("this is a simulated reply from the gpuplane sim engine which holds no weights and answers every prompt with the same words")

// reply returns n tokens, each a word with its leading space.
func (s *server) reply(n int) []string {
	out := make([]string, n)
	for i := range out {
		w := words[i%len(words)]
		if i > 0 {
			w = " " + w
		}
		out[i] = w
	}
	return out
}

// promptTokens counts words, the sim's notion of a token.
func (s *server) promptTokens(req request) int {
	n := 0
	count := func(v any) {
		if str, ok := v.(string); ok {
			n += len(strings.Fields(str))
		}
	}
	count(req.Prompt)
	for _, m := range req.Messages {
		count(m.Content)
	}
	return n
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// apiError answers in OpenAI's error shape.
func apiError(w http.ResponseWriter, code int, msg, typ string) {
	writeJSON(w, code, map[string]any{"error": map[string]any{"message": msg, "type": typ, "code": code}})
}

// Package tinygguf writes tiny llama-architecture GGUF models and LoRA
// adapters for them, so tests can run the real llama.cpp and Ollama engines
// on a CPU in well under a second.
//
// The model has random (but deterministic: same options, same bytes) weights
// and a byte-level SPM vocabulary of 268 tokens. Two tricks make it useful to
// tests:
//
//   - Dimension 0 of every token embedding is a constant, so after the final
//     RMS norm it dominates the hidden state; the output rows carry +1 there
//     for printable tokens and -1 for the rest. The model therefore only ever
//     emits printable text (chat parsers choke on random bytes), and the
//     end-of-sequence token is possible but rare.
//   - An adapter acts on output.weight along that same dimension, adding a
//     large logit to one word of the vocabulary (Word, "▁ok" by default): with
//     the adapter applied at scale 1 every answer is that word repeated
//     (" ok ok ok …"), without it the answer is something else. A test sees
//     whether an adapter was applied from the text alone.
//
// GGUF (version 3) is a header, key/value metadata, tensor infos and the
// tensor data, each tensor aligned to 32 bytes; this package writes only
// what llama.cpp's loader needs.
package tinygguf

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Words are the multi-byte tokens of the vocabulary after the 3 control
// tokens and the 256 byte tokens; an adapter may favour any of them.
var Words = []string{"▁", "▁the", "▁a", "e", "t", "o", "▁hi", "llo", "▁ok"}

// ModelOptions shape the model. The zero value is the default model.
type ModelOptions struct {
	Embd    int    // embedding width (default 64; a multiple of 4, the head count)
	Layers  int    // transformer blocks (default 2)
	Context int    // trained context length, llama.context_length (default 4096)
	Seed    int64  // weight seed (default 1)
	Name    string // general.name (default "tiny-llama")
}

// AdapterOptions shape a LoRA adapter for a model written with the same
// Embd and Layers.
type AdapterOptions struct {
	Embd   int    // must match the model's (default 64)
	Layers int    // must match the model's (default 2)
	Word   string // the vocabulary word the adapter makes win every step (default "▁ok")
	Seed   int64  // seed of the attention parts (default 2)
	Name   string // general.name (default "tiny-lora-" + the word)
}

const (
	heads = 4
	rank  = 4
	align = 32
)

func (o ModelOptions) withDefaults() ModelOptions {
	if o.Embd == 0 {
		o.Embd = 64
	}
	if o.Layers == 0 {
		o.Layers = 2
	}
	if o.Context == 0 {
		o.Context = 4096
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
	if o.Name == "" {
		o.Name = "tiny-llama"
	}
	return o
}

func (o AdapterOptions) withDefaults() AdapterOptions {
	if o.Embd == 0 {
		o.Embd = 64
	}
	if o.Layers == 0 {
		o.Layers = 2
	}
	if o.Word == "" {
		o.Word = "▁ok"
	}
	if o.Seed == 0 {
		o.Seed = 2
	}
	if o.Name == "" {
		o.Name = "tiny-lora-" + strings.TrimPrefix(o.Word, "▁")
	}
	return o
}

// vocab is the tokenizer: tokens, scores and types (2 unknown, 3 control,
// 6 byte, 1 normal).
func vocab() (toks []string, scores []float32, types []int32) {
	toks = []string{"<unk>", "<s>", "</s>"}
	scores = []float32{0, 0, 0}
	types = []int32{2, 3, 3}
	for b := range 256 {
		toks = append(toks, fmt.Sprintf("<0x%02X>", b))
		scores = append(scores, 0)
		types = append(types, 6)
	}
	for i, w := range Words {
		toks = append(toks, w)
		scores = append(scores, -float32(i))
		types = append(types, 1)
	}
	return toks, scores, types
}

// printable reports whether the model may emit tok.
func printable(tok string) bool {
	if strings.HasPrefix(tok, "▁") {
		return true
	}
	if b, ok := strings.CutPrefix(tok, "<0x"); ok {
		var v int
		fmt.Sscanf(b, "%02X", &v)
		return v >= 0x20 && v <= 0x7E
	}
	return len(tok) <= 3 && !strings.HasPrefix(tok, "<")
}

// tensor is one F32 tensor; ne lists its dimensions innermost first (ggml's
// order: a row of ne[0] floats, ne[1] rows).
type tensor struct {
	name string
	ne   []uint64
	data []float32
}

type kv struct {
	key string
	val any // uint32, int32, float32, bool, string, []string, []float32, []int32
}

type gen struct{ r *rand.Rand }

// normal returns n floats drawn from N(0, sd²).
func (g gen) normal(n int, sd float64) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(g.r.NormFloat64() * sd)
	}
	return out
}

func ones(n int) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = 1
	}
	return out
}

// WriteModel writes the model to path.
func WriteModel(path string, o ModelOptions) error {
	o = o.withDefaults()
	if o.Embd <= 0 || o.Embd%heads != 0 || o.Layers <= 0 || o.Context <= 0 {
		return fmt.Errorf("tinygguf: embd must be a positive multiple of %d and layers, context positive (got embd %d, layers %d, context %d)", heads, o.Embd, o.Layers, o.Context)
	}
	g := gen{rand.New(rand.NewSource(o.Seed))}
	toks, scores, types := vocab()
	V, E, FF := len(toks), o.Embd, 2*o.Embd
	meta := []kv{
		{"general.architecture", "llama"},
		{"general.name", o.Name},
		{"general.file_type", uint32(0)},
		{"llama.context_length", uint32(o.Context)},
		{"llama.embedding_length", uint32(E)},
		{"llama.block_count", uint32(o.Layers)},
		{"llama.feed_forward_length", uint32(FF)},
		{"llama.attention.head_count", uint32(heads)},
		{"llama.attention.head_count_kv", uint32(heads)},
		{"llama.rope.dimension_count", uint32(E / heads)},
		{"llama.attention.layer_norm_rms_epsilon", float32(1e-5)},
		{"tokenizer.ggml.model", "llama"},
		{"tokenizer.ggml.tokens", toks},
		{"tokenizer.ggml.scores", scores},
		{"tokenizer.ggml.token_type", types},
		{"tokenizer.ggml.bos_token_id", uint32(1)},
		{"tokenizer.ggml.eos_token_id", uint32(2)},
		{"tokenizer.ggml.unknown_token_id", uint32(0)},
		{"tokenizer.ggml.add_bos_token", true},
		{"tokenizer.chat_template", "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"},
	}
	emb := g.normal(V*E, 0.02)
	for v := range V {
		emb[v*E] = 1
	}
	out := g.normal(V*E, 0.02)
	for v, t := range toks {
		if printable(t) {
			out[v*E] = 1
		} else {
			out[v*E] = -1
		}
	}
	out[2*E] = 0.3 // </s>: possible, rare
	ts := []tensor{
		{"token_embd.weight", []uint64{uint64(E), uint64(V)}, emb},
		{"output_norm.weight", []uint64{uint64(E)}, ones(E)},
		{"output.weight", []uint64{uint64(E), uint64(V)}, out},
	}
	for i := range o.Layers {
		p := fmt.Sprintf("blk.%d.", i)
		ts = append(ts, tensor{p + "attn_norm.weight", []uint64{uint64(E)}, ones(E)})
		for _, n := range []string{"attn_q", "attn_k", "attn_v", "attn_output"} {
			ts = append(ts, tensor{p + n + ".weight", []uint64{uint64(E), uint64(E)}, g.normal(E*E, 0.02)})
		}
		ts = append(ts,
			tensor{p + "ffn_norm.weight", []uint64{uint64(E)}, ones(E)},
			tensor{p + "ffn_gate.weight", []uint64{uint64(E), uint64(FF)}, g.normal(FF*E, 0.02)},
			tensor{p + "ffn_up.weight", []uint64{uint64(E), uint64(FF)}, g.normal(FF*E, 0.02)},
			tensor{p + "ffn_down.weight", []uint64{uint64(FF), uint64(E)}, g.normal(E*FF, 0.02)})
	}
	return write(path, meta, ts)
}

// WriteAdapter writes a LoRA adapter to path.
func WriteAdapter(path string, o AdapterOptions) error {
	o = o.withDefaults()
	toks, _, _ := vocab()
	word := slices.Index(toks, o.Word)
	if word < 0 {
		return fmt.Errorf("tinygguf: adapter word %q is not in the vocabulary (one of %q)", o.Word, Words)
	}
	if o.Embd <= 0 || o.Embd%heads != 0 || o.Layers <= 0 {
		return fmt.Errorf("tinygguf: embd must be a positive multiple of %d and layers positive (got embd %d, layers %d)", heads, o.Embd, o.Layers)
	}
	g := gen{rand.New(rand.NewSource(o.Seed))}
	V, E := len(toks), o.Embd
	meta := []kv{
		{"general.architecture", "llama"},
		{"general.type", "adapter"},
		{"adapter.type", "lora"},
		{"adapter.lora.alpha", float32(rank)},
		{"general.name", o.Name},
	}
	var ts []tensor
	for i := range o.Layers {
		for _, n := range []string{"attn_q", "attn_v"} {
			p := fmt.Sprintf("blk.%d.%s.weight.", i, n)
			ts = append(ts,
				tensor{p + "lora_a", []uint64{uint64(E), rank}, g.normal(rank*E, 0.5)},
				tensor{p + "lora_b", []uint64{rank, uint64(E)}, g.normal(E*rank, 0.5)})
		}
	}
	// On the output projection: A reads dimension 0 (the constant), B adds
	// it to the chosen word's logit, four times over.
	la := make([]float32, rank*E)
	la[0] = 1
	lb := make([]float32, V*rank)
	lb[word*rank] = 4
	ts = append(ts,
		tensor{"output.weight.lora_a", []uint64{uint64(E), rank}, la},
		tensor{"output.weight.lora_b", []uint64{rank, uint64(V)}, lb})
	return write(path, meta, ts)
}

// Files are the paths of a model and its adapters written by Write.
type Files struct {
	Model    string
	Adapters map[string]string // word without "▁" (e.g. "ok") → path
}

// Write writes the default model and one adapter per word (default just
// "▁ok"; "ok" or "▁ok" both name it) into t.TempDir(), failing t on error.
func Write(t testing.TB, words ...string) Files {
	t.Helper()
	if len(words) == 0 {
		words = []string{"ok"}
	}
	dir := t.TempDir()
	f := Files{Model: filepath.Join(dir, "tiny.gguf"), Adapters: map[string]string{}}
	if err := WriteModel(f.Model, ModelOptions{}); err != nil {
		t.Fatal(err)
	}
	for i, w := range words {
		short := strings.TrimPrefix(w, "▁")
		p := filepath.Join(dir, "tiny-lora-"+short+".gguf")
		if err := WriteAdapter(p, AdapterOptions{Word: "▁" + short, Seed: int64(2 + i)}); err != nil {
			t.Fatal(err)
		}
		f.Adapters[short] = p
	}
	return f
}

func write(path string, meta []kv, ts []tensor) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := &writer{w: bufio.NewWriter(f)}
	w.u32(0x46554747) // "GGUF"
	w.u32(3)
	w.u64(uint64(len(ts)))
	w.u64(uint64(len(meta)))
	for _, m := range meta {
		w.str(m.key)
		w.value(m.val)
	}
	var off uint64
	for _, t := range ts {
		n := uint64(1)
		for _, d := range t.ne {
			n *= d
		}
		if n != uint64(len(t.data)) {
			f.Close()
			return fmt.Errorf("tinygguf: tensor %s has %d values for shape %v", t.name, len(t.data), t.ne)
		}
		w.str(t.name)
		w.u32(uint32(len(t.ne)))
		for _, d := range t.ne {
			w.u64(d)
		}
		w.u32(0) // GGML_TYPE_F32
		w.u64(off)
		off += pad(4 * n)
	}
	w.pad()
	for _, t := range ts {
		for _, v := range t.data {
			w.u32(math.Float32bits(v))
		}
		w.pad()
	}
	if w.err == nil {
		w.err = w.w.Flush()
	}
	if err := f.Close(); w.err == nil {
		w.err = err
	}
	return w.err
}

func pad(n uint64) uint64 { return (n + align - 1) / align * align }

type writer struct {
	w   *bufio.Writer
	n   uint64
	err error
}

func (w *writer) bytes(b []byte) {
	if w.err == nil {
		_, w.err = w.w.Write(b)
		w.n += uint64(len(b))
	}
}

func (w *writer) u32(v uint32) { w.bytes(binary.LittleEndian.AppendUint32(nil, v)) }
func (w *writer) u64(v uint64) { w.bytes(binary.LittleEndian.AppendUint64(nil, v)) }
func (w *writer) str(s string) { w.u64(uint64(len(s))); w.bytes([]byte(s)) }
func (w *writer) pad()         { w.bytes(make([]byte, pad(w.n)-w.n)) }

// GGUF value types.
const (
	tUint32  = 4
	tInt32   = 5
	tFloat32 = 6
	tBool    = 7
	tString  = 8
	tArray   = 9
)

func (w *writer) value(v any) {
	switch v := v.(type) {
	case uint32:
		w.u32(tUint32)
		w.u32(v)
	case int32:
		w.u32(tInt32)
		w.u32(uint32(v))
	case float32:
		w.u32(tFloat32)
		w.u32(math.Float32bits(v))
	case bool:
		w.u32(tBool)
		if v {
			w.bytes([]byte{1})
		} else {
			w.bytes([]byte{0})
		}
	case string:
		w.u32(tString)
		w.str(v)
	case []string:
		w.u32(tArray)
		w.u32(tString)
		w.u64(uint64(len(v)))
		for _, s := range v {
			w.str(s)
		}
	case []float32:
		w.u32(tArray)
		w.u32(tFloat32)
		w.u64(uint64(len(v)))
		for _, f := range v {
			w.u32(math.Float32bits(f))
		}
	case []int32:
		w.u32(tArray)
		w.u32(tInt32)
		w.u64(uint64(len(v)))
		for _, i := range v {
			w.u32(uint32(i))
		}
	default:
		panic(fmt.Sprintf("tinygguf: no GGUF type for %T", v))
	}
}

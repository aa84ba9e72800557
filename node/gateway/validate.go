package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"reflect"
	"strings"

	"github.com/gpuplane/gpuplane/internal/engines"
)

// body is what the gateway reads of a request's JSON: the fields it checks
// against OpenAI's rules before the request takes a place in a queue. A
// field absent or null is not checked (the engine's default applies).
type body struct {
	Model         *string `json:"model"`
	Stream        *bool   `json:"stream"`
	StreamOptions *struct {
		IncludeUsage *bool `json:"include_usage"`
	} `json:"stream_options"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	N                   *int            `json:"n"`
	Temperature         *float64        `json:"temperature"`
	TopP                *float64        `json:"top_p"`
	PresencePenalty     *float64        `json:"presence_penalty"`
	FrequencyPenalty    *float64        `json:"frequency_penalty"`
	Logprobs            json.RawMessage `json:"logprobs"`
	TopLogprobs         *int            `json:"top_logprobs"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            json.RawMessage `json:"messages"`
	Input               json.RawMessage `json:"input"`
	EncodingFormat      *string         `json:"encoding_format"`
	Dimensions          *int            `json:"dimensions"`
	KeepAlive           json.RawMessage `json:"keep_alive"`
	// The engine controls (controls.go).
	controlFields

	// msgs are the messages, once check has read them.
	msgs []chatMessage
}

// decodeBody reads a request body as a JSON object, naming the field and
// the JSON type it needs where one has the wrong type.
func decodeBody(data []byte) (*body, *apiError) {
	var b body
	err := json.Unmarshal(data, &b)
	if err == nil {
		return &b, nil
	}
	var typ *json.UnmarshalTypeError
	if errors.As(err, &typ) {
		if typ.Field == "" {
			return nil, invalidf("", "invalid_json", "the request body is a JSON %s: it must be a JSON object", jsonKind(typ.Value))
		}
		return nil, invalidf(typ.Field, "invalid_type", "%s is a JSON %s: it must be %s", typ.Field, jsonKind(typ.Value), wants(typ.Type))
	}
	var syn *json.SyntaxError
	if errors.As(err, &syn) {
		return nil, invalidf("", "invalid_json", "the request body is not valid JSON: %v (at byte %d)", syn, syn.Offset)
	}
	return nil, invalidf("", "invalid_json", "the request body is not a valid JSON object")
}

// jsonKind is the JSON type of a json.UnmarshalTypeError's Value ("number
// 1.5" is a number).
func jsonKind(v string) string {
	k, _, _ := strings.Cut(v, " ")
	if k == "bool" {
		return "boolean"
	}
	return k
}

// wants names the JSON a Go type takes.
func wants(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int64, reflect.Int32:
		return "an integer"
	case reflect.Float64, reflect.Float32:
		return "a number"
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Slice:
		return "an array"
	}
	return "another type"
}

// check applies the rules of path's endpoint that need no knowledge of
// the model: required fields and the ranges OpenAI defines.
func (b *body) check(path string) *apiError {
	if b.Model == nil || *b.Model == "" {
		return invalidf("model", "missing_model",
			"the request body has no \"model\": name a served model (GET /v1/models lists them)")
	}
	for _, mt := range []struct {
		name string
		v    *int
	}{{"max_tokens", b.MaxTokens}, {"max_completion_tokens", b.MaxCompletionTokens}} {
		if mt.v != nil && *mt.v < 0 {
			return invalidf(mt.name, "invalid_value", "%s is %d: it must not be negative", mt.name, *mt.v)
		}
	}
	switch path {
	case "/v1/completions":
		if err := checkPrompt("prompt", b.Prompt); err != nil {
			return err
		}
	case "/v1/chat/completions":
		if err := b.checkMessages(); err != nil {
			return err
		}
	case "/v1/embeddings":
		if err := checkPrompt("input", b.Input); err != nil {
			return err
		}
		if f := b.EncodingFormat; f != nil && *f != "float" && *f != "base64" {
			return invalidf("encoding_format", "invalid_value", "encoding_format is %q: it must be \"float\" or \"base64\"", *f)
		}
		if d := b.Dimensions; d != nil && *d < 1 {
			return invalidf("dimensions", "invalid_value", "dimensions is %d: it must be at least 1", *d)
		}
		return nil
	}
	if n := b.N; n != nil && (*n < 1 || *n > 128) {
		return invalidf("n", "invalid_value", "n is %d: it must be from 1 to 128", *n)
	}
	for _, r := range []struct {
		name     string
		v        *float64
		min, max float64
	}{
		{"temperature", b.Temperature, 0, 2},
		{"top_p", b.TopP, 0, 1},
		{"presence_penalty", b.PresencePenalty, -2, 2},
		{"frequency_penalty", b.FrequencyPenalty, -2, 2},
	} {
		if r.v != nil && (*r.v < r.min || *r.v > r.max) {
			return invalidf(r.name, "invalid_value", "%s is %g: it must be from %g to %g", r.name, *r.v, r.min, r.max)
		}
	}
	if err := b.checkLogprobs(path == "/v1/chat/completions"); err != nil {
		return err
	}
	if b.StreamOptions != nil && (b.Stream == nil || !*b.Stream) {
		return invalidf("stream_options", "invalid_value", "stream_options is set but stream is not true: it is only allowed on a streamed request")
	}
	return nil
}

// checkLogprobs: chat takes logprobs true or false and top_logprobs 0 to
// 20; completions take logprobs as a number 0 to 5.
func (b *body) checkLogprobs(chat bool) *apiError {
	raw := bytes.TrimSpace(b.Logprobs)
	if chat {
		if len(raw) > 0 && !isJSON(raw, "null") && !isJSON(raw, "true") && !isJSON(raw, "false") {
			return invalidf("logprobs", "invalid_type", "logprobs is %s: on /v1/chat/completions it must be true or false (top_logprobs says how many)", kindOf(raw))
		}
		if t := b.TopLogprobs; t != nil && (*t < 0 || *t > 20) {
			return invalidf("top_logprobs", "invalid_value", "top_logprobs is %d: it must be from 0 to 20", *t)
		}
		return nil
	}
	if len(raw) == 0 || isJSON(raw, "null") {
		return nil
	}
	var n int
	if err := json.Unmarshal(raw, &n); err != nil {
		return invalidf("logprobs", "invalid_type", "logprobs is %s: on /v1/completions it must be an integer from 0 to 5", kindOf(raw))
	}
	if n < 0 || n > 5 {
		return invalidf("logprobs", "invalid_value", "logprobs is %d: it must be from 0 to 5", n)
	}
	return nil
}

func isJSON(raw []byte, lit string) bool { return string(raw) == lit }

// kindOf names the JSON type of a value.
func kindOf(raw []byte) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "missing"
	}
	switch raw[0] {
	case '"':
		return "a string"
	case '[':
		return "an array"
	case '{':
		return "an object"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}

// checkPrompt checks a completion's prompt or an embedding's input: a
// string, an array of strings, an array of token ids, or an array of
// arrays of token ids; never empty.
func checkPrompt(name string, raw json.RawMessage) *apiError {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || isJSON(raw, "null") {
		return invalidf(name, "missing_required_parameter", "the request body has no %q: it is required on this endpoint", name)
	}
	switch raw[0] {
	case '"':
		return nil
	case '[':
	default:
		return invalidf(name, "invalid_type", "%s is %s: it must be a string, an array of strings, or an array of token ids", name, kindOf(raw))
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return invalidf(name, "invalid_type", "%s is not a valid array", name)
	}
	if len(items) == 0 {
		return invalidf(name, "invalid_value", "%s is an empty array: it needs at least one element", name)
	}
	first := kindOf(items[0])
	for i, it := range items {
		k := kindOf(it)
		if k != first {
			return invalidf(name, "invalid_type", "%s[%d] is %s but %s[0] is %s: the elements must be all strings, all token ids or all arrays of token ids", name, i, k, name, first)
		}
		switch k {
		case "a string":
		case "a number":
			var id int
			if json.Unmarshal(it, &id) != nil || id < 0 {
				return invalidf(name, "invalid_value", "%s[%d] is %s: a token id is an integer 0 or more", name, i, it)
			}
		case "an array":
			var ids []int
			if err := json.Unmarshal(it, &ids); err != nil || len(ids) == 0 {
				return invalidf(name, "invalid_value", "%s[%d] must be a non-empty array of token ids (integers)", name, i)
			}
		default:
			return invalidf(name, "invalid_type", "%s[%d] is %s: it must be a string, a token id or an array of token ids", name, i, k)
		}
	}
	return nil
}

// chatMessage is what the gateway reads of a chat message.
type chatMessage struct {
	Role    *string         `json:"role"`
	Content json.RawMessage `json:"content"`
}

// checkMessages checks a chat request's messages: a non-empty array of
// objects, each with a role; b.msgs holds them after.
func (b *body) checkMessages() *apiError {
	raw := bytes.TrimSpace(b.Messages)
	if len(raw) == 0 || isJSON(raw, "null") {
		return invalidf("messages", "missing_required_parameter", "the request body has no \"messages\": it is required on this endpoint")
	}
	if raw[0] != '[' {
		return invalidf("messages", "invalid_type", "messages is %s: it must be an array of messages", kindOf(raw))
	}
	if err := json.Unmarshal(raw, &b.msgs); err != nil {
		// Which message is wrong: read them one by one.
		var msgs []json.RawMessage
		_ = json.Unmarshal(raw, &msgs)
		for i, m := range msgs {
			var one chatMessage
			if kindOf(m) != "an object" || json.Unmarshal(m, &one) != nil {
				return invalidf(fmt.Sprintf("messages[%d]", i), "invalid_type", "messages[%d] must be an object with a string \"role\" and a \"content\"", i)
			}
		}
		return invalidf("messages", "invalid_type", "messages must be an array of objects, each with a string \"role\" and a \"content\"")
	}
	if len(b.msgs) == 0 {
		return invalidf("messages", "invalid_value", "messages is an empty array: it needs at least one message")
	}
	for i, m := range b.msgs {
		if m.Role == nil || *m.Role == "" {
			return invalidf(fmt.Sprintf("messages[%d].role", i), "missing_required_parameter", "messages[%d] has no \"role\" (system, developer, user, assistant or tool)", i)
		}
	}
	return nil
}

// checkFor applies the rules that depend on the model: the endpoint its
// engine answers, and its context length.
func (req *request) checkFor(m *Model) *apiError {
	switch {
	case m.Task == TaskGenerate && req.path == "/v1/embeddings":
		e := invalidf("model", "unsupported_model",
			"model %q generates text and does not embed: /v1/embeddings needs a deployment whose engine runs an embedding model (vLLM or sim --runner pooling, llama.cpp --embeddings)", req.model)
		return e
	case m.Task == TaskEmbed && req.path != "/v1/embeddings":
		return invalidf("model", "unsupported_model",
			"model %q is an embedding model: it answers /v1/embeddings only, not %s", req.model, req.path)
	}
	if req.n > 1 {
		for _, rp := range m.Replicas {
			if r, err := engines.Lookup(rp.Kind); err != nil || !r.Choices {
				kind := rp.Kind
				if kind == "" {
					kind = "unknown"
				}
				return invalidf("n", "unsupported_value",
					"n is %d: model %q runs on a %s engine, which answers one choice per request (n must be 1; send %d requests instead)", req.n, req.model, kind, req.n)
			}
		}
		// vLLM generates the n choices together: their output is
		// reserved in the queue.
		req.maxTokens = satMul(req.maxTokens, req.n)
	}
	if m.MaxModelLen <= 0 || req.words == 0 {
		return nil
	}
	out := max(req.outTokens, 0)
	need := satAdd(req.words, out)
	if need <= m.MaxModelLen {
		return nil
	}
	param := map[string]string{"/v1/completions": "prompt", "/v1/chat/completions": "messages", "/v1/embeddings": "input"}[req.path]
	e := invalidf(param, "context_length_exceeded",
		"model %q takes at most %d tokens of context (its deployment's maxModelLen) and this request needs at least %d: %d in its %s (counted as words: there are at least as many tokens)",
		req.model, m.MaxModelLen, need, req.words, param)
	if out > 0 {
		e.msg += fmt.Sprintf(" and %d of output (max_tokens)", out)
	}
	e.msg += "; shorten it"
	return e
}

// promptWords is a lower bound on the tokens of the longest prompt a
// request's field holds: its words (a tokenizer never puts two
// whitespace-separated words in one token), or its token ids. A batch
// (an array of prompts) counts its longest: each runs on its own.
func promptWords(raw json.RawMessage) int {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '[' {
		return words(raw, false)
	}
	var items []json.RawMessage
	if json.Unmarshal(raw, &items) != nil || len(items) == 0 {
		return 0
	}
	if k := kindOf(items[0]); k == "a number" {
		return len(items)
	}
	most := 0
	for _, it := range items {
		most = max(most, words(it, true))
	}
	return most
}

// messageWords is a lower bound on the tokens of a chat's messages (as
// checkMessages read them): the words of their text content (the chat
// template adds more).
func messageWords(msgs []chatMessage) int {
	n := 0
	for _, m := range msgs {
		c := bytes.TrimSpace(m.Content)
		if len(c) == 0 {
			continue
		}
		if c[0] == '"' {
			n += words(c, false)
			continue
		}
		var parts []struct {
			Type string          `json:"type"`
			Text json.RawMessage `json:"text"`
		}
		if c[0] != '[' || json.Unmarshal(c, &parts) != nil {
			continue
		}
		for _, p := range parts {
			if p.Type == "text" {
				n += words(p.Text, false)
			}
		}
	}
	return n
}

// words counts the whitespace-separated words in the JSON strings of raw,
// and with ids its numbers outside strings (token ids).
func words(raw []byte, ids bool) int {
	n := 0
	in, esc, word, num := false, false, false, false
	for _, c := range raw {
		if in {
			switch {
			case esc:
				esc = false
				// \n, \t, \r end a word; any other escape is a character.
				if c == 'n' || c == 't' || c == 'r' {
					word = false
				} else if !word {
					word = true
					n++
				}
			case c == '\\':
				esc = true
			case c == '"':
				in, word = false, false
			case c == ' ' || c == '\t' || c == '\n' || c == '\r':
				word = false
			case !word:
				word = true
				n++
			}
			continue
		}
		switch {
		case c == '"':
			in, num = true, false
		case ids && (c >= '0' && c <= '9' || c == '-'):
			if !num {
				num = true
				n++
			}
		default:
			num = false
		}
	}
	return n
}

// openAITypes are the error types of OpenAI's API; an engine's other
// types (vLLM's "BadRequestError") are replaced by the one its status
// means.
var openAITypes = map[string]bool{"invalid_request_error": true, "authentication_error": true,
	"permission_error": true, "not_found_error": true, "rate_limit_error": true, "server_error": true, "api_error": true}

// engineError is an engine's (or a replica front's) error answer in
// OpenAI's one shape: vLLM sends its status as a number in "code" (and
// older versions no "error" wrapper), Ollama and llama.cpp an "error"
// string or plain text, a front its code in "type". The message is kept;
// type and code (a string) follow the status where the engine's do not
// say them in OpenAI's terms.
func engineError(status int, data []byte) []byte {
	var msg, typ, param, code string
	var env struct {
		Error json.RawMessage `json:"error"`
	}
	type fields struct {
		Message *string `json:"message"`
		Type    any     `json:"type"`
		Param   any     `json:"param"`
		Code    any     `json:"code"`
	}
	var f fields
	switch {
	case json.Unmarshal(data, &env) == nil && len(env.Error) > 0 && env.Error[0] == '{':
		_ = json.Unmarshal(env.Error, &f)
	case len(env.Error) > 0 && env.Error[0] == '"':
		_ = json.Unmarshal(env.Error, &msg)
	default:
		if json.Unmarshal(data, &f) != nil || f.Message == nil {
			f = fields{}
			msg = strings.TrimSpace(string(data))
			if len(msg) > 2000 {
				msg = msg[:2000] + "…"
			}
		}
	}
	if f.Message != nil {
		msg = *f.Message
	}
	t, _ := f.Type.(string)
	param, _ = f.Param.(string)
	code, _ = f.Code.(string)
	switch {
	case openAITypes[t]:
		typ = t
	case code == "" && snakeCase(t):
		// A front's own code, sent as its type.
		code = t
	}
	if typ == "" {
		typ = "invalid_request_error"
		switch {
		case status == http.StatusUnauthorized:
			typ = "authentication_error"
		case status == http.StatusForbidden:
			typ = "permission_error"
		case status == http.StatusTooManyRequests:
			typ = "rate_limit_error"
		case status >= 500:
			typ = "server_error"
		}
	}
	if code == "" {
		code = map[int]string{400: "invalid_request", 401: "invalid_api_key", 403: "forbidden", 404: "model_not_found",
			413: "request_too_large", 422: "invalid_request", 429: "rate_limited", 501: "not_supported",
			503: "engine_unavailable", 504: "engine_timeout"}[status]
		if code == "" {
			code = "engine_error"
			if status < 500 {
				code = "invalid_request"
			}
		}
	}
	if code == "model_not_found" && param == "" {
		param = "model"
	}
	if msg == "" {
		msg = fmt.Sprintf("the engine answered %d %s", status, http.StatusText(status))
	}
	return errorBody(msg, typ, param, code)
}

func snakeCase(s string) bool {
	if s == "" || s[0] < 'a' || s[0] > 'z' {
		return false
	}
	for _, c := range s {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
			return false
		}
	}
	return true
}

// satAdd is a+b for sizes (never negative), at most math.MaxInt: a
// request's max_tokens may be any JSON integer, and a sum that wrapped
// negative would pass every "at most" check after it.
func satAdd(a, b int) int {
	if a > math.MaxInt-b {
		return math.MaxInt
	}
	return a + b
}

// satMul is a×b for sizes (never negative), at most math.MaxInt.
func satMul(a, b int) int {
	if a == 0 || b == 0 {
		return 0
	}
	if a > math.MaxInt/b {
		return math.MaxInt
	}
	return a * b
}

package interference

import "testing"

// An answer is its request's only with the request's id, model and token
// counts.
func TestCheckIdentity(t *testing.T) {
	ok := answerSeen{ids: []string{"cmpl-bench-1", "cmpl-bench-1"}, models: []string{"chat", "chat"}, usage: true, prompt: 3, completion: 1, tokens: 1}
	if p := checkIdentity("bench-1", "chat", 3, ok); p != "" {
		t.Fatalf("its own answer: %s", p)
	}
	adapter := ok
	adapter.models = []string{"alice", "alice"}
	if p := checkIdentity("bench-1", "chat:alice", 3, adapter); p != "" {
		t.Fatalf("an adapter's answer: %s", p)
	}
	for name, c := range map[string]struct {
		a      answerSeen
		model  string
		prompt int
	}{
		"another id":         {answerSeen{ids: []string{"cmpl-bench-1", "cmpl-bench-2"}, models: []string{"chat", "chat"}, usage: true, prompt: 3, completion: 1, tokens: 1}, "chat", 3},
		"another model":      {answerSeen{ids: []string{"cmpl-bench-1"}, models: []string{"coder"}, usage: true, prompt: 3, completion: 1, tokens: 1}, "chat", 3},
		"another adapter":    {adapter, "chat:bob", 3},
		"another prompt":     {ok, "chat", 4},
		"tokens not counted": {answerSeen{ids: []string{"cmpl-bench-1"}, models: []string{"chat"}, usage: true, prompt: 3, completion: 2, tokens: 1}, "chat", 3},
		"no usage":           {answerSeen{ids: []string{"cmpl-bench-1"}, models: []string{"chat"}, tokens: 1}, "chat", 3},
	} {
		if p := checkIdentity("bench-1", c.model, c.prompt, c.a); p == "" {
			t.Errorf("%s: not caught", name)
		}
	}
}

package gateway

import "testing"

// TestTokensIn: the SSE token count of completion and chat chunks,
// reasoning and tool-call deltas (issue 33 point 7), the final empty
// chunk, [DONE] and usage-only chunks.
func TestTokensIn(t *testing.T) {
	for _, c := range []struct {
		line string
		want int
	}{
		{`data: {"choices":[{"index":0,"text":" is","finish_reason":null}]}` + "\n", 1},
		{`data: {"choices":[{"delta":{"role":"assistant","content":"this"}}]}` + "\n", 1},
		{`data: {"choices":[{"delta": {"content" : "x"}},{"delta":{"content":"y"}}]}` + "\n", 2},
		{`data: {"choices":[{"index":0,"finish_reason":"length","text":""}]}` + "\n", 0},
		{`data: {"choices":[{"delta":{}}],"usage":{"completion_tokens":3}}` + "\n", 0},
		{"data: [DONE]\n", 0},
		{`data: {"choices":[{"delta":{"reasoning_content":"Let"}}]}` + "\n", 1},
		{`data: {"choices":[{"delta":{"role":"assistant","content":"","reasoning":"think"}}]}` + "\n", 1},
		{`data: {"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city"}}]}}]}` + "\n", 1},
		{`data: {"choices":[{"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"weather","arguments":""}}]}}]}` + "\n", 0},
		{"\n", 0},
		{`event: {"text":"x"}` + "\n", 0},
	} {
		if got := tokensIn([]byte(c.line)); got != c.want {
			t.Errorf("tokensIn(%q) = %d, want %d", c.line, got, c.want)
		}
	}
}

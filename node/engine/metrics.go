package engine

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/gpuplane/gpuplane/internal/engines"
)

// Load is what an engine's own Prometheus /metrics says of its requests:
// those it runs and those it holds waiting (vLLM's scheduler queue,
// llama-server's deferred tasks). Requests that reach the engine without
// the gateway count too.
type Load struct {
	Running, Waiting float64
}

// loadSeries are the gauges of requests running and waiting of an engine
// speaking kind, from the table (engines.Engine.Running, Waiting): vLLM's
// (vllm/v1/metrics/loggers.py), also the sim's without a dialect;
// llama-server's with --metrics (tools/server/server.cpp). Ollama has no
// /metrics: ok is false.
func loadSeries(kind string) (series [2]string, ok bool) {
	r, err := engines.Lookup(kind)
	if err != nil || r.Running == "" {
		return series, false
	}
	return [2]string{r.Running, r.Waiting}, true
}

// HasMetrics says whether an engine speaking kind (ControlKind) serves
// the /metrics ReadLoad reads.
func HasMetrics(kind string) bool {
	_, ok := loadSeries(kind)
	return ok
}

// ReadLoad reads GET base/metrics of an engine speaking kind, with its
// API key (Keys.For; "" for none), and sums each gauge over its label
// sets (vLLM labels by model and engine core).
func ReadLoad(ctx context.Context, client *http.Client, kind, base, key string) (Load, error) {
	series, ok := loadSeries(kind)
	if !ok {
		return Load{}, fmt.Errorf("engine %s has no /metrics", kind)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(base, "/")+"/metrics", nil)
	if err != nil {
		return Load{}, err
	}
	Authorize(req.Header, key)
	resp, err := client.Do(req)
	if err != nil {
		return Load{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return Load{}, fmt.Errorf("GET /metrics: %s: %s", resp.Status, strings.TrimSpace(string(data)))
	}
	var l Load
	found := 0
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 16<<20))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, v, ok := sample(sc.Text())
		switch {
		case !ok:
		case name == series[0]:
			l.Running += v
			found |= 1
		case name == series[1]:
			l.Waiting += v
			found |= 2
		}
	}
	if err := sc.Err(); err != nil {
		return Load{}, fmt.Errorf("GET /metrics: %w", err)
	}
	if found != 3 {
		return Load{}, fmt.Errorf("GET /metrics: no %s and %s", series[0], series[1])
	}
	return l, nil
}

// sample reads one line of Prometheus' text format: a series name, its
// labels (skipped) and its value; ok is false for comments and lines it
// cannot read.
func sample(line string) (name string, v float64, ok bool) {
	line = strings.TrimSpace(line)
	if line == "" || line[0] == '#' {
		return "", 0, false
	}
	end := strings.IndexAny(line, "{ ")
	if end <= 0 {
		return "", 0, false
	}
	name, rest := line[:end], line[end:]
	if rest[0] == '{' {
		end := labelsEnd(rest)
		if end < 0 {
			return "", 0, false
		}
		rest = rest[end+1:]
	}
	f := strings.Fields(rest)
	if len(f) == 0 {
		return "", 0, false
	}
	v, err := strconv.ParseFloat(f[0], 64)
	return name, v, err == nil
}

// labelsEnd is the index of the '}' closing the label set s starts with,
// -1 when none does: label values are quoted and may hold '}' and
// escaped quotes.
func labelsEnd(s string) int {
	quoted := false
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\' && quoted:
			i++
		case c == '"':
			quoted = !quoted
		case c == '}' && !quoted:
			return i
		}
	}
	return -1
}

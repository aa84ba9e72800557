package gateway

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gpuplane/gpuplane/node/gateway/queue"
)

// scrape is the registry's exposition as Prometheus reads it: one sample
// per line (a histogram's buckets, sum and count each one), by series.
func scrape(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	out := map[string]float64{}
	sc := bufio.NewScanner(rec.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("sample %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

// TestGatewayMetricTenantsBounded: without ACLs a tenant is whatever the
// X-Gpuplane-Tenant header says, so 1,500 requests under 1,500 random
// tenant names (each also claiming a weight, as a forwarding node would)
// must not grow /metrics by a series set per name: the first
// MetricTenants (default 100) get their own token counters, the rest
// count under tenant="other", and no token served goes uncounted; the
// latency histograms are not split by tenant at all. Fewer than 300 new
// series in all, where splitting every series by tenant added about 42
// per name.
func TestGatewayMetricTenantsBounded(t *testing.T) {
	engine := simEngine(t, "chat", 0)
	reg := prometheus.NewRegistry()
	_, srv, _ := startGateway(t, Options{Node: "n1", Registerer: reg, Weights: map[string]float64{"gold": 3},
		Cluster: fixedView{[]Model{{Served: "chat", Deployment: "chat", Class: queue.Standard,
			Replicas: []Replica{{Deployment: "chat", Node: "n1", Endpoint: engine, Kind: "sim", Running: true, Resident: true}}}}}})
	send := func(tenant string) error {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/completions", strings.NewReader(`{"model":"chat","prompt":"hi","max_tokens":2}`))
		req.Header.Set(TenantHeader, tenant)
		if tenant != "gold" {
			req.Header.Set(ForwardedHeader, "n2")
			req.Header.Set(WeightHeader, "2")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s", resp.Status, b)
		}
		return nil
	}
	deadline := time.Now().Add(20 * time.Second)
	for send("gold") != nil {
		if time.Now().After(deadline) {
			t.Fatal("the gateway never served chat")
		}
		time.Sleep(20 * time.Millisecond)
	}
	before := scrape(t, reg)

	const n = 1500
	names := make(chan string, n)
	for i := range n {
		// Random enough: distinct, unpredictable, any printable text.
		names <- fmt.Sprintf("t-%d-%x", i, uint64(time.Now().UnixNano())*2654435761)
	}
	close(names)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for name := range names {
				if err := send(name); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	after := scrape(t, reg)
	added := len(after) - len(before)
	t.Logf("%d requests under %d tenant names added %d series (%d before, %d after)", n, n, added, len(before), len(after))
	if added >= 300 {
		t.Errorf("%d requests under %d tenant names added %d series to /metrics, want fewer than 300", n, n, added)
	}
	named, other, weights := map[string]bool{}, 0.0, 0
	generated := 0.0
	for s, v := range after {
		if strings.HasPrefix(s, "gpuplane_gateway_tenant_weight{") {
			weights++
		}
		if !strings.HasPrefix(s, "gpuplane_gateway_tokens_total{") || !strings.Contains(s, `kind="generated"`) {
			continue
		}
		generated += v
		tenant := s[strings.Index(s, `tenant="`)+len(`tenant="`):]
		tenant = tenant[:strings.IndexByte(tenant, '"')]
		if tenant == OtherTenant {
			other = v
			continue
		}
		named[tenant] = true
	}
	// gold (configured) and the first 100 names; none of the names is
	// "default".
	if len(named) != 1+DefaultMetricTenants || !named["gold"] {
		t.Errorf("%d tenants have token counters of their own (gold: %v), want gold and the first %d others", len(named), named["gold"], DefaultMetricTenants)
	}
	if want := float64(2 * (n - DefaultMetricTenants)); other != want {
		t.Errorf("tenant %q was served %v tokens, want %v (2 for each of the %d names past the bound)", OtherTenant, other, want, n-DefaultMetricTenants)
	}
	if want := float64(2 * (n + 1)); generated != want {
		t.Errorf("%v generated tokens counted over all tenants, want %v: every request's", generated, want)
	}
	if weights != 1 {
		t.Errorf("%d tenant weights on /metrics, want gold's alone (the others came in the requests' headers)", weights)
	}
	for s := range after {
		if strings.HasPrefix(s, "gpuplane_gateway_ttft_seconds") && strings.Contains(s, "tenant=") {
			t.Fatalf("without ACLs a latency histogram is split by tenant: %s", s)
		}
	}
}

// TestGatewayMetricTenantsOption: MetricTenants sets the bound, and a
// negative one is refused naming it.
func TestGatewayMetricTenantsOption(t *testing.T) {
	if _, err := New(Options{Cluster: fixedView{}, MetricTenants: -1}); err == nil || !strings.Contains(err.Error(), "MetricTenants is -1") {
		t.Fatalf("MetricTenants -1: %v, want an error naming it", err)
	}
	b := newTenantLabels(2, map[string]float64{"gold": 1})
	got := []string{}
	for _, tenant := range []string{"a", "gold", "b", "c", "a", "default", "d", "b"} {
		got = append(got, b.label(tenant))
	}
	if want := "a gold b other a default other b"; strings.Join(got, " ") != want {
		t.Fatalf("labels %q, want %q", strings.Join(got, " "), want)
	}
	if !b.configured("gold") || b.configured("a") {
		t.Fatalf("configured(gold) = %v, configured(a) = %v: want true, false", b.configured("gold"), b.configured("a"))
	}
}

package rpc_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gpuplane/gpuplane/node/residency"
	"github.com/gpuplane/gpuplane/node/residency/residencypb"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
	"github.com/gpuplane/gpuplane/rpc"
)

// Simulated cluster of the dashboard benchmark: 100 nodes of
// 8 L4 cards, 100 deployments of 10 replicas on a shared accelerator.
const (
	benchNodes       = 100
	benchCards       = 8
	benchDeployments = 100
	benchReplicas    = 10
)

var benchResidencies = []pb.ReplicaResidency{pb.ReplicaResidency_REPLICA_RESIDENCY_RESIDENT, pb.ReplicaResidency_REPLICA_RESIDENCY_SLEEPING,
	pb.ReplicaResidency_REPLICA_RESIDENCY_COLD, pb.ReplicaResidency_REPLICA_RESIDENCY_RESIDENT}

// simulatedCluster builds the state, a journal of decisions of node-000
// and gateway metrics for every deployment.
func simulatedCluster(tb testing.TB) (*stateBackend, *residency.Journal, *prometheus.Registry) {
	b := simulatedState(tb, benchNodes, benchCards, func(n int) string { return fmt.Sprintf("node-%03d", n) })
	residencies := []pb.Residency{pb.Residency_RESIDENCY_PINNED, pb.Residency_RESIDENCY_WARM, pb.Residency_RESIDENCY_ON_DEMAND, pb.Residency_RESIDENCY_ON_DEMAND}
	for d := range benchDeployments {
		res := residencies[d%len(residencies)]
		b.deploy(tb, fmt.Sprintf("model-%03d", d), res, 800, benchReplicas,
			func(r int) (string, uint32) {
				i := d*benchReplicas + r
				return fmt.Sprintf("node-%03d", i%benchNodes), uint32(i / benchNodes % benchCards)
			},
			func(r int) pb.ReplicaResidency {
				if res == pb.Residency_RESIDENCY_PINNED {
					return pb.ReplicaResidency_REPLICA_RESIDENCY_RESIDENT
				}
				return benchResidencies[(d*benchReplicas+r)%len(benchResidencies)]
			}, "simulated")
	}

	j := residency.NewJournal("node-000", 0)
	now := time.Now()
	rng := rand.New(rand.NewPCG(20, 1))
	actions := []residency.ActionKind{residency.ActLoad, residency.ActSleep, residency.ActWake, residency.ActEvict}
	for i := range 2000 {
		m := residency.ModelID(fmt.Sprintf("model-%03d/%d", rng.IntN(benchDeployments), rng.IntN(benchReplicas)))
		a := actions[rng.IntN(len(actions))]
		j.Record(residency.Decision{Time: now.Add(-time.Hour + time.Duration(i)*time.Hour/2000), Card: "0", Action: a, Model: m,
			Trigger: residency.TriggerRequest, Reason: fmt.Sprintf("%s %s: simulated decision %d", a, m, i)})
	}

	reg := prometheus.NewRegistry()
	ttft := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "gpuplane_gateway_ttft_seconds", Help: "TTFT.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 17)}, []string{"model", "class", "tenant"})
	tokens := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gpuplane_gateway_tokens_total", Help: "Tokens."}, []string{"model", "class", "tenant", "kind"})
	depth := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gpuplane_gateway_queue_depth", Help: "Queued."}, []string{"replica", "card"})
	reg.MustRegister(ttft, tokens, depth)
	for d := range benchDeployments {
		name := fmt.Sprintf("model-%03d", d)
		for tn := range 5 {
			tenant := fmt.Sprintf("tenant-%d", tn)
			for range 20 {
				ttft.WithLabelValues(name, "standard", tenant).Observe(rng.Float64())
			}
			tokens.WithLabelValues(name, "standard", tenant, "generated").Add(float64(rng.IntN(10000)))
		}
		for r := range benchReplicas {
			depth.WithLabelValues(fmt.Sprintf("%s/%d", name, r), "0").Set(float64(rng.IntN(5)))
		}
	}
	return b, j, reg
}

func chromiumPath(tb testing.TB) string {
	if p := os.Getenv("GPUPLANE_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	tb.Skip("no chromium binary found (install Debian's chromium package or set GPUPLANE_CHROMIUM)")
	return ""
}

func pageValue[T any](ctx context.Context, js string) (T, error) {
	var out T
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	s, err := chromedp.Run(c, chromedp.Evaluate[string]("(async () => JSON.stringify(await ("+js+")))()", chromedp.EvalAwaitPromise))
	if err != nil {
		return out, err
	}
	return out, json.Unmarshal([]byte(s), &out)
}

// BenchmarkDashboard measures the dashboard in headless Chromium against
// the API over a simulated cluster of 1,000 replicas on 100 nodes: the
// first render (navigation to the page drawn with every section) and
// refreshes in the same browser, each after a replica changed residency
// and a decision was recorded (so the page is sent, and redraws, one card,
// one model's row and its timeline). Issue 20's goals: first render < 1 s,
// refresh < 200 ms; measured, not asserted.
func BenchmarkDashboard(b *testing.B) {
	path := chromiumPath(b)
	backend, journal, reg := simulatedCluster(b)
	srv, err := rpc.Listen("127.0.0.1:0", rpc.Config{Backend: backend, NodeName: "node-000", Residency: residencypb.Journal{J: journal},
		Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), Gatherer: reg})
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = srv.Serve() }()
	defer srv.Shutdown(context.Background())
	url := "http://" + srv.Addr().String() + "/"
	for _, call := range []string{"NodeService/ListNodes", "DeviceService/ListDevices", "DeviceService/GetDevice", "ModelService/ListModels",
		"ModelService/ListReplicas", "ResidencyService/GetPlan", "ClusterService/Status", "ClusterService/Members", "metrics",
		"DashboardService/Summary"} {
		start := time.Now()
		body := `{}`
		if call == "DeviceService/GetDevice" {
			body = `{"name":"l4"}`
		}
		var resp *http.Response
		if call == "metrics" {
			resp, err = http.Get(url + "metrics")
		} else {
			resp, err = http.Post(url+"gpuplane.v1."+call, "application/json", strings.NewReader(body))
		}
		if err != nil {
			b.Fatal(err)
		}
		n, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		b.Logf("%s: %d, %d bytes in %v", call, resp.StatusCode, n, time.Since(start).Round(time.Millisecond))
	}

	opts := append(slices.Clone(chromedp.DefaultExecAllocatorOptions[:]), chromedp.ExecPath(path), chromedp.NoSandbox,
		chromedp.WindowSize(1280, 800), chromedp.Flag("disable-dev-shm-usage", true))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	if err := chromedp.Do(ctx); err != nil {
		b.Fatalf("start chromium: %v", err)
	}

	const refreshes = 20
	var firsts, refreshMs, fetchMs, renderMs []float64
	for b.Loop() {
		if err := chromedp.Do(ctx, chromedp.Navigate(url)); err != nil {
			b.Fatal(err)
		}
		var first float64
		for deadline := time.Now().Add(60 * time.Second); ; {
			st, err := pageValue[struct {
				FirstRenderMs float64
				Refreshes     int
			}](ctx, "window.gpuplaneStats")
			if err != nil {
				b.Fatal(err)
			}
			if st.Refreshes > 0 {
				first = st.FirstRenderMs
				break
			}
			if time.Now().After(deadline) {
				b.Fatal("the page did not render within 60 s")
			}
			time.Sleep(20 * time.Millisecond)
		}
		firsts = append(firsts, first)
		if st, err := pageValue[struct {
			FetchMs, RenderMs float64
			Bytes             int
			Phases            map[string]float64
		}](ctx, "window.gpuplaneStats"); err == nil {
			b.Logf("first refresh: fetch %.0f ms (%d bytes), render %.0f ms (%v)", st.FetchMs, st.Bytes, st.RenderMs, st.Phases)
		}
		bars, err := pageValue[int](ctx, `document.querySelectorAll("#cards .card").length`)
		if err != nil || bars != benchNodes*benchCards {
			b.Fatalf("the page draws %d card bars (%v), want %d", bars, err, benchNodes*benchCards)
		}
		for i := range refreshes {
			d, r := i%benchDeployments, i%benchReplicas
			name := fmt.Sprintf("model-%03d", d)
			res := benchResidencies[(d*benchReplicas+r+i+1)%len(benchResidencies)]
			backend.replicaStatus(b, name, uint32(r), fmt.Sprintf("node-%03d", (d*benchReplicas+r)%benchNodes), res, "benchmark")
			journal.Record(residency.Decision{Time: time.Now(), Card: "0", Action: residency.ActLoad, Model: residency.ModelID(fmt.Sprintf("%s/%d", name, r)),
				Trigger: residency.TriggerRequest, Reason: "benchmark"})
			st, err := pageValue[struct {
				LastRefreshMs, FetchMs, RenderMs float64
				Bytes                            int
				Phases                           map[string]float64
			}](ctx, `(async () => { await refresh(); return window.gpuplaneStats; })()`)
			if err != nil {
				b.Fatal(err)
			}
			refreshMs = append(refreshMs, st.LastRefreshMs)
			fetchMs = append(fetchMs, st.FetchMs)
			renderMs = append(renderMs, st.RenderMs)
			if i == refreshes-1 {
				b.Logf("last refresh: %.0f ms: fetch %.0f ms (%d bytes), render %.0f ms (%v)", st.LastRefreshMs, st.FetchMs, st.Bytes, st.RenderMs, st.Phases)
			}
		}
	}
	slices.Sort(firsts)
	slices.Sort(refreshMs)
	slices.Sort(fetchMs)
	slices.Sort(renderMs)
	b.ReportMetric(fetchMs[len(fetchMs)/2], "refresh-fetch-p50-ms")
	b.ReportMetric(renderMs[len(renderMs)/2], "refresh-render-p50-ms")
	b.ReportMetric(firsts[len(firsts)/2], "first-render-ms")
	b.ReportMetric(refreshMs[len(refreshMs)/2], "refresh-p50-ms")
	b.ReportMetric(refreshMs[len(refreshMs)*95/100], "refresh-p95-ms")
	b.ReportMetric(refreshMs[len(refreshMs)-1], "refresh-max-ms")
	b.Logf("%d replicas on %d nodes (%d cards): first render %.0f ms (median of %d), refresh p50 %.0f ms, p95 %.0f ms, max %.0f ms (%d refreshes)",
		benchDeployments*benchReplicas, benchNodes, benchNodes*benchCards, firsts[len(firsts)/2], len(firsts),
		refreshMs[len(refreshMs)/2], refreshMs[len(refreshMs)*95/100], refreshMs[len(refreshMs)-1], len(refreshMs))
}

// BenchmarkDashboardSummary measures one Summary over the simulated
// cluster of BenchmarkDashboard, through the API: a poll when nothing
// changed since the page's last answer (idle), and one after a replica
// changed residency (changed).
func BenchmarkDashboardSummary(b *testing.B) {
	backend, journal, reg := simulatedCluster(b)
	c := dashboardClient(b, backend, "node-000", journal, reg)
	rev := summary(b, c, 0).GetRevision()
	b.Run("idle", func(b *testing.B) {
		for b.Loop() {
			if got := summary(b, c, rev); got.GetRevision() != rev || len(got.GetCards()) != 0 {
				b.Fatalf("nothing changed, yet revision %d (was %d) with %d cards", got.GetRevision(), rev, len(got.GetCards()))
			}
		}
	})
	b.Run("changed", func(b *testing.B) {
		i := 0
		for b.Loop() {
			i++
			backend.replicaStatus(b, "model-001", 1, "node-011", benchResidencies[i%len(benchResidencies)], "benchmark")
			rev = summary(b, c, rev).GetRevision()
		}
	})
}

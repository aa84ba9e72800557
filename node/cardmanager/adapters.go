package cardmanager

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/gpuplane/gpuplane/internal/engines"
	"github.com/gpuplane/gpuplane/node/engine"
	"github.com/gpuplane/gpuplane/node/gateway/isolation"
	"github.com/gpuplane/gpuplane/node/residency"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// LoRA adapters (docs/residency.md, docs/gateway.md): a replica whose deployment lists
// adapters is served at a front whatever its residency, so that every
// request for an adapter passes the node: the front resolves `model:
// NAME:ADAPTER` or `model: ADAPTER`, refuses an adapter private to other
// tenants exactly as an unknown one (404, never served), tells the card's
// controller (AdapterRequested), waits until the base is Resident and the
// adapter on the card, and passes the request on naming the adapter as
// vLLM knows it. The controller's ActLoadAdapter and ActUnloadAdapter go to
// the engine's runtime LoRA API (engine.AdapterControls); where each
// adapter is (card, host RAM, disk) is committed to the Raft log at most
// every Options.AdapterReport, so `models get` shows the tiers.

// TenantHeader and DefaultTenant are the gateway's (isolation): the tenant
// a request names, and the tenant of one that names none.
const (
	TenantHeader  = isolation.TenantHeader
	DefaultTenant = isolation.DefaultTenant
)

// Adapter priors, until the controller measured loads: a rank costs 2 MiB
// of card memory (the sim engine's default; a rank-16 adapter of an 8B
// model holds some 30–60 MiB), and a load from disk takes the median of
// GenTD26's measured LoRA loads.
const (
	adapterMiBPerRank = 2
	adapterLoadPrior  = 4378 * time.Millisecond
)

// maxBody bounds a request body the front reads to find its model.
const maxBody = 16 << 20

// adapterSpec is the deployment's list, as the front checks requests.
type adapterSpec struct {
	// served is the base's served model name.
	served string
	byName map[string]*pb.Adapter
	// max is engine.maxAdapters with its default.
	max int
	// pooled says the engine allocated its adapters' memory at start,
	// inside its share (vLLM's max_loras × max_lora_rank slots): a load
	// or an unload does not change the card's memory.
	pooled bool
	sig    string
}

func specAdapters(spec *pb.ModelSpec) *adapterSpec {
	ads := spec.GetAdapters()
	if len(ads) == 0 || engine.LlamaAdapterIDs(spec) != nil {
		// llama-server loads its adapters at start (--lora), so they
		// are part of the base's footprint; the gateway names them per
		// request ("lora"): nothing to page.
		return nil
	}
	s := &adapterSpec{served: spec.GetServedModelName(), byName: make(map[string]*pb.Adapter, len(ads)), max: 4,
		pooled: engines.For(spec.GetEngine()).Adapters == engines.AdaptersPoolAtStart}
	if n := spec.GetEngine().GetMaxAdapters(); n > 0 {
		s.max = int(n)
	}
	var sig strings.Builder
	fmt.Fprintf(&sig, "%d %t", s.max, s.pooled)
	for _, a := range ads {
		s.byName[a.GetName()] = a
		fmt.Fprintf(&sig, "|%s %s %d", a.GetName(), a.GetSource(), a.GetRank())
	}
	s.sig = sig.String()
	return s
}

// event is the controller's view of the list.
func (s *adapterSpec) event(m residency.ModelID) residency.AdaptersChanged {
	ev := residency.AdaptersChanged{Model: m, MaxOnCard: 1}
	if s == nil {
		return ev
	}
	ev.MaxOnCard = s.max
	for _, a := range s.byName {
		bytes := int64(a.GetRank()) * adapterMiBPerRank << 20
		if s.pooled {
			// Its slot was allocated at start, inside the base's share.
			bytes = 0
		}
		ev.Adapters = append(ev.Adapters, residency.Adapter{Name: a.GetName(), Bytes: bytes, LoadTime: adapterLoadPrior})
	}
	slices.SortFunc(ev.Adapters, func(a, b residency.Adapter) int { return strings.Compare(a.Name, b.Name) })
	return ev
}

// allowed reports whether tenant may use adapter a.
func allowed(a *pb.Adapter, tenant string) bool {
	return len(a.GetTenants()) == 0 || slices.Contains(a.GetTenants(), tenant)
}

// syncAdapters tells r's controller its deployment's adapters when they
// changed.
func (m *Manager) syncAdapters(c *cardCtrl, r *rep, spec *pb.ModelSpec) {
	s := specAdapters(spec)
	sig := ""
	if s != nil {
		sig = s.sig
	}
	old := r.adapters
	r.adapters = s
	m.mu.Lock()
	if s == nil {
		delete(m.adapterSpecs, r.k)
	} else {
		m.adapterSpecs[r.k] = s
	}
	f := m.fronts[r.k]
	m.mu.Unlock()
	if (old == nil && s == nil) || (old != nil && old.sig == sig) {
		return
	}
	if f != nil {
		// Requests waiting for an adapter the apply removed are told so.
		f.wake()
	}
	m.handle(c, s.event(r.k.id()), "")
}

// actAdapter executes an adapter action off the loop; the outcome comes
// back as an event.
func (m *Manager) actAdapter(c *cardCtrl, k rkey, r *rep, a residency.Action) {
	if a.Kind == residency.ActDropAdapter {
		// Host RAM is the engine's cache: nothing to do.
		return
	}
	var source string
	if ad := r.adapters; ad != nil && ad.byName[a.Adapter] != nil {
		source = ad.byName[a.Adapter].GetSource()
	}
	ctl, err := engine.AdaptersFor(r.kind, engine.Target{BaseURL: m.engines[k].url, APIKey: m.opts.EngineKeys.For(k.model, k.index)})
	card := c.index
	go func() {
		ctx, cancel := context.WithTimeout(m.ctx, 5*time.Minute)
		defer cancel()
		switch a.Kind {
		case residency.ActLoadAdapter:
			if err == nil {
				err = ctl.LoadAdapter(ctx, a.Adapter, source)
			}
			if err != nil {
				m.log.Warn("residency: load adapter", "replica", a.Model, "adapter", a.Adapter, "err", err)
				m.post(func() {
					m.handle(m.ctrls[card], residency.AdapterLoadFailed{Model: a.Model, Adapter: a.Adapter, Err: err.Error()}, "")
					// The requests waiting for it are told why, rather than
					// waiting out the front's deadline for a retry.
					m.mu.Lock()
					f := m.fronts[k]
					m.mu.Unlock()
					if f != nil {
						f.adapterFailed(a.Adapter, err.Error())
					}
				})
				return
			}
			m.post(func() { m.handle(m.ctrls[card], residency.AdapterLoaded{Model: a.Model, Adapter: a.Adapter}, "") })
		case residency.ActUnloadAdapter:
			if err == nil {
				err = ctl.UnloadAdapter(ctx, a.Adapter)
			}
			if err != nil {
				// An engine that no longer has it (restarted, asleep)
				// holds nothing of it either.
				m.log.Info("residency: unload adapter", "replica", a.Model, "adapter", a.Adapter, "err", err)
			}
			m.post(func() { m.handle(m.ctrls[card], residency.AdapterUnloaded{Model: a.Model, Adapter: a.Adapter}, "") })
		}
	}()
}

// reconcileAdapters asks the engine of replica id which adapters it has
// registered once it serves (after a load, a wake, or an adoption by a
// restarted agent) and tells the controller (AdaptersFound): vLLM keeps
// its adapters through a sleep, so the engine, not the controller's
// memory of its own loads, says what is on it.
func (m *Manager) reconcileAdapters(id residency.ModelID) {
	for k, r := range m.reps {
		if k.id() != id || r.adapters == nil {
			continue
		}
		ctl, err := engine.AdaptersFor(r.kind, engine.Target{BaseURL: m.engines[k].url, APIKey: m.opts.EngineKeys.For(k.model, k.index)})
		if err != nil || m.engines[k].url == "" {
			return
		}
		card := r.card
		go func() {
			ctx, cancel := context.WithTimeout(m.ctx, 30*time.Second)
			defer cancel()
			names, err := ctl.Adapters(ctx)
			if err != nil {
				m.log.Info("residency: list the engine's adapters", "replica", id, "err", err)
				return
			}
			m.post(func() { m.handle(m.ctrls[card], residency.AdaptersFound{Model: id, Names: names}, "") })
		}()
		return
	}
}

// adapterTiers is what the card's controller says of r's adapters, in the
// API's form, those on disk left out.
func adapterTiers(c *cardCtrl, k rkey) []*pb.AdapterStatus {
	var out []*pb.AdapterStatus
	for _, a := range c.ctrl.Adapters(k.id()) {
		var t pb.AdapterTier
		switch a.Tier {
		case residency.AdapterHost:
			t = pb.AdapterTier_ADAPTER_TIER_HOST
		case residency.AdapterLoading:
			t = pb.AdapterTier_ADAPTER_TIER_LOADING
		case residency.AdapterCard, residency.AdapterUnloading:
			t = pb.AdapterTier_ADAPTER_TIER_CARD
		default:
			continue
		}
		out = append(out, &pb.AdapterStatus{Name: a.Name, Tier: t})
	}
	return out
}

// reportAdapters commits the adapters' tiers of every replica whose tiers
// changed since their last report (called every Options.AdapterReport).
func (m *Manager) reportAdapters() {
	for _, k := range sortedKeys(m.reps) {
		r := m.reps[k]
		c := m.ctrls[r.card]
		if c == nil || (r.adapters == nil && r.tiersSent == "") {
			continue
		}
		tiers := adapterTiers(c, k)
		var sig strings.Builder
		for _, t := range tiers {
			fmt.Fprintf(&sig, "%s=%d ", t.Name, t.Tier)
		}
		if sig.String() == r.tiersSent && r.tiersReported {
			continue
		}
		r.tiersSent, r.tiersReported = sig.String(), true
		go func() {
			ctx, cancel := context.WithTimeout(m.ctx, 10*time.Second)
			defer cancel()
			if err := m.ex.ReportAdapters(ctx, k.model, k.index, tiers); err != nil {
				m.log.Info("residency: report adapters", "replica", k.id(), "err", err)
				m.post(func() {
					if r := m.reps[k]; r != nil {
						r.tiersReported = false
					}
				})
			}
		}()
	}
}

// adapterRequest is what the front made of a request's model.
type adapterRequest struct {
	// adapter is the adapter the request names ("" for the base).
	adapter string
	// body is the request's body, rewritten to name the adapter as the
	// engine knows it.
	body []byte
	// model and tenant are what the request asked for and as whom.
	model, tenant string
}

// stillOffered reports whether the deployment still offers ar's adapter
// to its tenant: an apply may remove it (or its tenant) while the
// request waits for it to load.
func (f *front) stillOffered(ar adapterRequest) bool {
	f.m.mu.Lock()
	spec := f.m.adapterSpecs[f.k]
	f.m.mu.Unlock()
	if spec == nil {
		return false
	}
	a := spec.byName[ar.adapter]
	return a != nil && allowed(a, ar.tenant)
}

// resolve reads r's body and finds the adapter it asks for. A status
// other than 0 is the answer to give instead: 404 for a model that is
// neither the base nor an adapter this tenant may use (a private adapter
// of another tenant reads exactly like an unknown one).
func (f *front) resolve(r *http.Request) (adapterRequest, int, string) {
	var out adapterRequest
	f.m.mu.Lock()
	spec := f.m.adapterSpecs[f.k]
	f.m.mu.Unlock()
	if spec == nil || r.Body == nil || r.Method != http.MethodPost {
		return out, 0, ""
	}
	data, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		return out, http.StatusBadRequest, fmt.Sprintf("reading the request body: %v", err)
	}
	if len(data) > maxBody {
		return out, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body larger than %d bytes", maxBody)
	}
	out.body = data
	var fields map[string]json.RawMessage
	if json.Unmarshal(data, &fields) != nil {
		return out, 0, "" // the engine answers malformed bodies
	}
	var model string
	if raw, ok := fields["model"]; !ok || json.Unmarshal(raw, &model) != nil {
		return out, 0, ""
	}
	name := model
	if base, ad, ok := strings.Cut(model, ":"); ok && base == spec.served {
		name = ad
	} else if model == spec.served || model == "" {
		return out, 0, ""
	}
	tenant := r.Header.Get(TenantHeader)
	if tenant == "" {
		tenant = DefaultTenant
	}
	a := spec.byName[name]
	if a == nil || !allowed(a, tenant) {
		return out, http.StatusNotFound, fmt.Sprintf("The model `%s` does not exist.", model)
	}
	out.adapter, out.model, out.tenant = name, model, tenant
	if name != model {
		fields["model"], _ = json.Marshal(name)
		if out.body, err = json.Marshal(fields); err != nil {
			return out, http.StatusBadRequest, err.Error()
		}
	}
	return out, 0, ""
}

// withBody gives r the (rewritten) body the front read.
func withBody(r *http.Request, body []byte) *http.Request {
	if body == nil {
		return r
	}
	r2 := r.Clone(r.Context())
	r2.Body = io.NopCloser(bytes.NewReader(body))
	r2.ContentLength = int64(len(body))
	r2.Header.Del("Content-Length")
	return r2
}

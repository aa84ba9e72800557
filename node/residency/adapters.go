package residency

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"
)

// LoRA adapters on a resident base model (docs/residency.md). Adapters share
// their base's weights; each engine holds at most MaxOnCard of them on the
// card (vLLM's --max-loras), the rest wait in host RAM (the engine's CPU
// adapter cache: a reload copies them to the card) or on disk. The
// controller loads an adapter when a request for it arrives, unloads the
// least valuable idle one when the slots are full, and counts the adapters
// on the card in their base's cost, so I1–I3 cover them: a load starts only
// when the card has room for it beside every claim, and an adapter with
// requests queued or in flight is never unloaded. Adapter state lives
// beside the replicas, not in them: a step's trial copies (advise mode,
// Plan, the pinned-only retry) never touch it.

// AdapterTier is where one adapter's weights are.
type AdapterTier uint8

const (
	AdapterDisk AdapterTier = iota
	AdapterHost
	AdapterLoading
	AdapterCard
	// AdapterUnloading is on the card until the engine confirms the unload.
	AdapterUnloading
)

func (t AdapterTier) String() string {
	switch t {
	case AdapterDisk:
		return "disk"
	case AdapterHost:
		return "host"
	case AdapterLoading:
		return "loading"
	case AdapterCard:
		return "card"
	case AdapterUnloading:
		return "unloading"
	}
	return fmt.Sprintf("AdapterTier(%d)", uint8(t))
}

// onCard reports whether the tier holds card memory.
func (t AdapterTier) onCard() bool {
	return t == AdapterLoading || t == AdapterCard || t == AdapterUnloading
}

// Adapter is one adapter of a base model, as the integrator knows it.
type Adapter struct {
	Name string
	// Bytes is its card memory once loaded.
	Bytes int64
	// LoadTime is the prior of a load from disk until one is measured.
	LoadTime time.Duration
}

// AdaptersChanged sets Model's adapters and how many its engine keeps on
// the card at once (MaxOnCard, at least 1) and in host RAM besides
// (MaxInHost; 0 means 8 × MaxOnCard). Adapters no longer listed are
// forgotten once idle (one on the card is unloaded).
type AdaptersChanged struct {
	Model     ModelID
	MaxOnCard int
	MaxInHost int
	Adapters  []Adapter
}

// AdapterRequested: a request for Model's adapter arrived; it waits until
// the adapter is on the card (the base being Resident too).
type AdapterRequested struct {
	Model   ModelID
	Adapter string
}

// AdapterFinished: a request for Model's adapter ended.
type AdapterFinished struct {
	Model   ModelID
	Adapter string
}

// AdapterLoaded: an ActLoadAdapter finished; the engine serves the adapter.
type AdapterLoaded struct {
	Model   ModelID
	Adapter string
}

// AdapterLoadFailed: an ActLoadAdapter failed.
type AdapterLoadFailed struct {
	Model   ModelID
	Adapter string
	Err     string
}

// AdapterUnloaded: an ActUnloadAdapter finished.
type AdapterUnloaded struct {
	Model   ModelID
	Adapter string
}

// AdaptersFound: the engine of Model lists these adapters as registered
// (its /v1/models), after a wake, a load or an agent's restart. A listed
// adapter the controller held in host RAM or on disk is on the card (vLLM
// keeps adapters through a sleep). An unlisted one is left as it is: the
// list may predate a load that finished since; loads and unloads in
// progress are left to their outcome.
type AdaptersFound struct {
	Model ModelID
	Names []string
}

func (AdaptersFound) isEvent()     {}
func (AdaptersChanged) isEvent()   {}
func (AdapterRequested) isEvent()  {}
func (AdapterFinished) isEvent()   {}
func (AdapterLoaded) isEvent()     {}
func (AdapterLoadFailed) isEvent() {}
func (AdapterUnloaded) isEvent()   {}

// adapterState is one adapter of a base.
type adapterState struct {
	set     *adapterSet
	spec    Adapter
	tier    AdapterTier
	active  int
	since   time.Time
	lastUse time.Time
	// waitingSince is when the oldest request waiting for a load arrived.
	waitingSince time.Time
	fc           forecast
	// fromHost is whether the load in progress copies from host RAM.
	fromHost bool
	removed  bool
	failures int
	retryAt  time.Time
}

// adapterSet is the adapters of one base model.
type adapterSet struct {
	maxOnCard, maxInHost int
	byName               map[string]*adapterState
	// list is byName's values sorted by name: steps visit adapters in one
	// order, without a map lookup each.
	list []*adapterState
	// onCard and cardBytes count the adapters loading, loaded or
	// unloading; loadedBytes those loaded (AdapterCard) alone. setTier
	// keeps them, so that a cost is O(1) whatever the adapter count.
	onCard                 int
	cardBytes, loadedBytes int64
	// loadDisk and loadHost are EWMAs of measured load times from each
	// tier (0 until one was measured).
	loadDisk, loadHost time.Duration
}

// AdapterStatus is one adapter as the controller sees it.
type AdapterStatus struct {
	Name   string
	Tier   AdapterTier
	Active int
	// Rate is its decayed arrival rate, requests per minute.
	Rate  float64
	Bytes int64
}

// Adapters returns Model's adapters, sorted by name.
func (c *Controller) Adapters(m ModelID) []AdapterStatus {
	set := c.adapters[m]
	if set == nil {
		return nil
	}
	now := c.clock.Now()
	out := make([]AdapterStatus, 0, len(set.list))
	for _, a := range set.list {
		out = append(out, AdapterStatus{Name: a.spec.Name, Tier: a.tier, Active: a.active,
			Rate: a.fc.rate(now, c.cfg.RateHalfLife), Bytes: a.spec.Bytes})
	}
	return out
}

// AdaptersServed lists Model's adapters loaded on the card (those a
// request may be dispatched for), sorted.
func (c *Controller) AdaptersServed(m ModelID) []string {
	set := c.adapters[m]
	if set == nil {
		return nil
	}
	out := make([]string, 0, set.onCard)
	for _, a := range set.list {
		if a.tier == AdapterCard {
			out = append(out, a.spec.Name)
		}
	}
	return out
}

// AdapterReady reports whether Model's adapter is on the card and served.
func (c *Controller) AdapterReady(m ModelID, adapter string) bool {
	if set := c.adapters[m]; set != nil {
		if a := set.byName[adapter]; a != nil {
			return a.tier == AdapterCard
		}
	}
	return false
}

// adapterBytes is what r's adapters hold on the card: only while its engine
// serves (a load, a sleep or a stop leaves none there).
func (c *Controller) adapterBytes(r *replica) int64 {
	if r.state != Resident && r.state != Draining {
		return 0
	}
	if set := c.adapters[r.dep.Model]; set != nil {
		return set.cardBytes
	}
	return 0
}

// loadedAdapterBytes is what r's adapters confirmed loaded hold.
func (c *Controller) loadedAdapterBytes(r *replica) int64 {
	if r.state != Resident && r.state != Draining {
		return 0
	}
	if set := c.adapters[r.dep.Model]; set != nil {
		return set.loadedBytes
	}
	return 0
}

// observeAdapter applies an adapter event; handled is false for other
// events.
func (c *Controller) observeAdapter(ev Event, now time.Time) (handled bool, err error) {
	switch e := ev.(type) {
	case AdaptersChanged:
		return true, c.setAdapters(e, now)
	case AdapterRequested:
		if a := c.adapter(e.Model, e.Adapter); a != nil {
			if a.active == 0 || a.tier == AdapterCard {
				a.waitingSince = now
			}
			a.active++
			a.lastUse = now
			a.fc.observe(now, c.cfg.RateHalfLife)
		}
	case AdapterFinished:
		if a := c.adapter(e.Model, e.Adapter); a != nil && a.active > 0 {
			a.active--
			a.lastUse = now
		}
	case AdapterLoaded:
		if a := c.adapter(e.Model, e.Adapter); a != nil && a.tier == AdapterLoading {
			set := c.adapters[e.Model]
			took := now.Sub(a.since)
			if a.fromHost {
				set.loadHost = ewma(set.loadHost, took)
			} else {
				set.loadDisk = ewma(set.loadDisk, took)
			}
			a.failures = 0
			c.setTier(a, AdapterCard, now)
		}
	case AdapterLoadFailed:
		if a := c.adapter(e.Model, e.Adapter); a != nil && a.tier == AdapterLoading {
			a.failures++
			back := c.cfg.RetryBackoff << min(a.failures-1, 20)
			if back > c.cfg.MaxBackoff || back <= 0 {
				back = c.cfg.MaxBackoff
			}
			a.retryAt = now.Add(back)
			c.setTier(a, AdapterDisk, now)
		}
	case AdapterUnloaded:
		if a := c.adapter(e.Model, e.Adapter); a != nil && a.tier == AdapterUnloading {
			c.setTier(a, AdapterHost, now)
		}
	case AdaptersFound:
		set := c.adapters[e.Model]
		if set == nil {
			break
		}
		listed := make(map[string]bool, len(e.Names))
		for _, n := range e.Names {
			listed[n] = true
		}
		for _, a := range set.list {
			if listed[a.spec.Name] && (a.tier == AdapterDisk || a.tier == AdapterHost) {
				a.failures, a.retryAt = 0, time.Time{}
				c.setTier(a, AdapterCard, now)
			}
		}
	default:
		return false, nil
	}
	return true, nil
}

func ewma(old, v time.Duration) time.Duration {
	if old == 0 {
		return v
	}
	return time.Duration((1-gapAlpha)*float64(old) + gapAlpha*float64(v))
}

func (c *Controller) adapter(m ModelID, name string) *adapterState {
	if set := c.adapters[m]; set != nil {
		return set.byName[name]
	}
	return nil
}

func (c *Controller) setTier(a *adapterState, t AdapterTier, now time.Time) {
	a.set.count(a, -1)
	a.tier, a.since = t, now
	a.set.count(a, 1)
}

// count adds (sign 1) or removes (sign −1) a's share of the set's
// counters.
func (set *adapterSet) count(a *adapterState, sign int) {
	if a.tier.onCard() {
		set.onCard += sign
		set.cardBytes += int64(sign) * a.spec.Bytes
	}
	if a.tier == AdapterCard {
		set.loadedBytes += int64(sign) * a.spec.Bytes
	}
}

// forget removes a from its set.
func (set *adapterSet) forget(name string) {
	if a := set.byName[name]; a != nil {
		set.count(a, -1)
		delete(set.byName, name)
		if i, ok := slices.BinarySearchFunc(set.list, name, func(x *adapterState, n string) int { return strings.Compare(x.spec.Name, n) }); ok {
			set.list = slices.Delete(set.list, i, i+1)
		}
	}
}

func (c *Controller) setAdapters(e AdaptersChanged, now time.Time) error {
	if e.MaxOnCard < 1 {
		return fmt.Errorf("adapters of %s: maxOnCard: must be at least 1, got %d", e.Model, e.MaxOnCard)
	}
	seen := make(map[string]bool, len(e.Adapters))
	for _, a := range e.Adapters {
		switch {
		case a.Name == "":
			return fmt.Errorf("adapters of %s: name: must not be empty", e.Model)
		case seen[a.Name]:
			return fmt.Errorf("adapters of %s: %q is listed twice", e.Model, a.Name)
		case a.Bytes < 0 || a.LoadTime < 0:
			return fmt.Errorf("adapters of %s: %s: bytes and loadTime must be ≥ 0", e.Model, a.Name)
		}
		seen[a.Name] = true
	}
	set := c.adapters[e.Model]
	if set == nil {
		if len(e.Adapters) == 0 {
			return nil
		}
		set = &adapterSet{byName: make(map[string]*adapterState, len(e.Adapters))}
		c.adapters[e.Model] = set
	}
	set.maxOnCard, set.maxInHost = e.MaxOnCard, e.MaxInHost
	if set.maxInHost <= 0 {
		set.maxInHost = 8 * e.MaxOnCard
	}
	added := false
	for _, spec := range e.Adapters {
		if a := set.byName[spec.Name]; a != nil {
			if a.tier.onCard() && spec.Bytes != a.spec.Bytes {
				// Its cost on the card is what was loaded; the new size
				// counts from its next load.
				spec.Bytes = max(spec.Bytes, a.spec.Bytes)
			}
			set.count(a, -1)
			a.spec, a.removed = spec, false
			set.count(a, 1)
			continue
		}
		a := &adapterState{set: set, spec: spec, since: now}
		set.byName[spec.Name] = a
		set.list = append(set.list, a)
		added = true
	}
	if added {
		slices.SortFunc(set.list, func(x, y *adapterState) int { return strings.Compare(x.spec.Name, y.spec.Name) })
	}
	for name, a := range set.byName {
		if !seen[name] {
			a.removed = true
		}
	}
	return nil
}

// adapterLoadTime is what loading a from its tier is expected to take.
func (set *adapterSet) loadTime(a *adapterState, fromHost bool) time.Duration {
	if fromHost {
		if set.loadHost > 0 {
			return set.loadHost
		}
		return a.spec.LoadTime / 10
	}
	if set.loadDisk > 0 {
		return set.loadDisk
	}
	return a.spec.LoadTime
}

// adapterValue is what keeping a on the card is worth per GiB: like a
// model's value, its class weight × arrival rate × the reload it would
// cost from host RAM, per GiB it holds.
func (c *Controller) adapterValue(r *replica, set *adapterSet, a *adapterState, now time.Time) float64 {
	bytes := max(a.spec.Bytes, 1<<20)
	return priorityWeight(r.dep.Priority) * a.fc.rate(now, c.cfg.RateHalfLife) * set.loadTime(a, true).Seconds() / (float64(bytes) / (1 << 30))
}

// adapterStep pages the adapters of every base on the card: forgets or
// unloads removed ones, moves the adapters of a base that left the card to
// host RAM (asleep) or disk (stopped), loads requested adapters into free
// slots (unloading the least valuable idle ones when the slots are full)
// and memory, and keeps host RAM within its bound. It returns the actions.
func (c *Controller) adapterStep(now time.Time) []Action {
	var out []Action
	models := make([]ModelID, 0, len(c.adapters))
	for m := range c.adapters {
		models = append(models, m)
	}
	slices.Sort(models)
	for _, m := range models {
		set := c.adapters[m]
		r := c.rep(m)
		if r == nil {
			delete(c.adapters, m)
			continue
		}
		out = c.pageAdapters(out, r, set, now)
	}
	return out
}

func (c *Controller) adapterAction(out []Action, kind ActionKind, r *replica, a *adapterState, trig Trigger, in Inputs, now time.Time, format string, args ...any) []Action {
	in.Rate = a.fc.rate(now, c.cfg.RateHalfLife)
	in.Active = a.active
	return append(out, Action{Kind: kind, Model: r.dep.Model, Adapter: a.spec.Name, Decision: Decision{
		Time: now, Card: c.cfg.Card, Action: kind, Model: r.dep.Model, Trigger: trig, Inputs: in,
		Reason: fmt.Sprintf(format, args...),
	}})
}

func (c *Controller) pageAdapters(out []Action, r *replica, set *adapterSet, now time.Time) []Action {
	names := set.list
	// The base left the card: its engine dropped the adapters. Asleep it
	// keeps them in host RAM; stopped, nothing is left.
	serving := r.state == Resident || r.state == Draining
	if !serving {
		for _, a := range names {
			switch {
			case r.state == Cold || r.state == Failed || r.state == Loading:
				if a.tier != AdapterDisk {
					c.setTier(a, AdapterDisk, now)
				}
			case a.tier.onCard():
				c.setTier(a, AdapterHost, now)
			}
		}
	}
	// Removed adapters: forgotten when idle and off the card; unloaded
	// when idle on it.
	var gone []string
	for _, a := range names {
		if !a.removed || a.active > 0 {
			continue
		}
		switch a.tier {
		case AdapterDisk, AdapterHost:
			gone = append(gone, a.spec.Name)
		case AdapterCard:
			if serving {
				c.setTier(a, AdapterUnloading, now)
				out = c.adapterAction(out, ActUnloadAdapter, r, a, TriggerScheduler, Inputs{Bytes: a.spec.Bytes}, now,
					"unload adapter %s from %s: removed from the deployment; frees %s", a.spec.Name, r.dep.Model, gib(a.spec.Bytes))
			}
		}
	}
	for _, name := range gone {
		set.forget(name)
	}
	names = set.list
	if r.state != Resident || c.pinnedOnly && r.dep.Residency == OnDemand {
		return c.trimHost(out, r, set, names, now)
	}
	// Requested adapters not on the card, oldest request first. A slot
	// frees only once the engine confirms an unload (vLLM refuses a load
	// beyond --max-loras), so a request that needs one waits for an
	// unload in progress or starts one.
	var want []*adapterState
	used, unloading := 0, 0
	for _, a := range names {
		if a.tier.onCard() {
			used++
		}
		if a.tier == AdapterUnloading {
			unloading++
		}
		if a.active > 0 && (a.tier == AdapterDisk || a.tier == AdapterHost) && !a.removed && !now.Before(a.retryAt) {
			want = append(want, a)
		}
	}
	slices.SortStableFunc(want, func(x, y *adapterState) int { return x.waitingSince.Compare(y.waitingSince) })
	for _, a := range want {
		fromHost := a.tier == AdapterHost
		if used >= set.maxOnCard {
			if unloading > 0 {
				unloading--
				continue
			}
			victim := c.adapterVictim(r, set, names, now)
			if victim == nil {
				// Every slot serves requests or is changing: the request
				// waits for a slot of its own base, not for traffic on
				// other engines.
				break
			}
			vv, av := c.adapterValue(r, set, victim, now), c.adapterValue(r, set, a, now)
			c.setTier(victim, AdapterUnloading, now)
			out = c.adapterAction(out, ActUnloadAdapter, r, victim, TriggerRequest,
				Inputs{Bytes: victim.spec.Bytes, Value: vv, ForValue: av, Reload: set.loadTime(victim, true)}, now,
				"unload adapter %s from %s to host RAM: value %.2f, the lowest of its idle adapters (adapter %s %.2f); %d of %d slots used, %s waits",
				victim.spec.Name, r.dep.Model, vv, a.spec.Name, av, used, set.maxOnCard, a.spec.Name)
			continue
		}
		// Memory: the load adds the adapter to its base's cost, within
		// usable and beside every claim (I1, I2).
		free := c.adapterRoom(r)
		if a.spec.Bytes > free {
			continue
		}
		load := set.loadTime(a, fromHost)
		from := "disk"
		if fromHost {
			from = "host RAM"
		}
		c.setTier(a, AdapterLoading, now)
		a.fromHost = fromHost
		used++
		out = c.adapterAction(out, ActLoadAdapter, r, a, TriggerRequest, Inputs{Bytes: a.spec.Bytes, Free: free, Reload: load}, now,
			"load adapter %s on %s from %s: %d requests waiting; slot %d of %d, needs %s, %s free; about %v",
			a.spec.Name, r.dep.Model, from, a.active, used, set.maxOnCard, gib(a.spec.Bytes), gib(free), load.Round(time.Millisecond))
	}
	return c.trimHost(out, r, set, names, now)
}

// adapterVictim is the idle adapter on the card worth least, or nil.
func (c *Controller) adapterVictim(r *replica, set *adapterSet, names []*adapterState, now time.Time) *adapterState {
	var best *adapterState
	var bestV float64
	for _, a := range names {
		if a.tier != AdapterCard || a.active > 0 {
			continue
		}
		v := c.adapterValue(r, set, a, now)
		if best == nil || v < bestV || v == bestV && a.lastUse.Before(best.lastUse) {
			best, bestV = a, v
		}
	}
	return best
}

// adapterRoom is what r's adapters may still take on the card: the
// physical room (usable minus every cost) and the room beside every
// committed claim, where a reserved share covers its own adapters while
// they fit in it (its claim is the share until its cost passes it).
func (c *Controller) adapterRoom(r *replica) int64 {
	var claims, costs int64
	for i := range c.reps {
		x := &c.reps[i]
		claims += c.claim(x, true)
		costs += c.cost(x)
	}
	beside := c.usable - claims
	if x := r.dep.Residency; x == Pinned || x == Warm {
		beside += max(r.dep.Share-c.cost(r), 0)
	}
	return max(min(c.usable-costs, beside), 0)
}

// trimHost sends the least valuable adapters in host RAM beyond its bound
// to disk (no engine operation: their cache entries are the engine's to
// drop).
func (c *Controller) trimHost(out []Action, r *replica, set *adapterSet, names []*adapterState, now time.Time) []Action {
	var host []*adapterState
	for _, a := range names {
		if a.tier == AdapterHost && a.active == 0 {
			host = append(host, a)
		}
	}
	if len(host) <= set.maxInHost {
		return out
	}
	slices.SortStableFunc(host, func(x, y *adapterState) int {
		return cmp.Or(cmp.Compare(c.adapterValue(r, set, x, now), c.adapterValue(r, set, y, now)), x.lastUse.Compare(y.lastUse))
	})
	for _, a := range host[:len(host)-set.maxInHost] {
		v := c.adapterValue(r, set, a, now)
		c.setTier(a, AdapterDisk, now)
		out = c.adapterAction(out, ActDropAdapter, r, a, TriggerPressure, Inputs{Bytes: a.spec.Bytes, Value: v, Reload: set.loadTime(a, false)}, now,
			"drop adapter %s of %s to disk: host RAM keeps %d adapters of %s; value %.2f, among the lowest", a.spec.Name, r.dep.Model, set.maxInHost, r.dep.Model, v)
	}
	return out
}

// checkAdapters verifies what an adapter step did: I1 and I2 on the ledger
// it leaves (adapters count in their base's cost), at most maxOnCard per
// engine, and I3: no adapter with requests queued or in flight unloaded.
func (c *Controller) checkAdapters(acts []Action, active map[string]int, now time.Time) []Violation {
	var vs []Violation
	add := func(inv, format string, args ...any) {
		vs = append(vs, Violation{Time: now, Card: c.cfg.Card, Invariant: inv, Detail: fmt.Sprintf(format, args...)})
	}
	var used, committed int64
	for i := range c.reps {
		used += c.cost(&c.reps[i])
		committed += c.claim(&c.reps[i], true)
	}
	if used > c.usable {
		add("I1", "costs with adapters %s exceed usable %s", gib(used), gib(c.usable))
	}
	if committed > c.usable {
		add("I2", "claims with adapters %s exceed usable %s", gib(committed), gib(c.usable))
	}
	for m, set := range c.adapters {
		if set.onCard > set.maxOnCard {
			add("I1", "%s holds %d adapters on the card, more than its %d", m, set.onCard, set.maxOnCard)
		}
	}
	for _, a := range acts {
		if a.Kind == ActUnloadAdapter && active[string(a.Model)+":"+a.Adapter] > 0 {
			add("I3", "unload of adapter %s of %s with %d requests active", a.Adapter, a.Model, active[string(a.Model)+":"+a.Adapter])
		}
	}
	for i := range vs {
		vs[i].Ledger = c.ledger(c.reps)
	}
	return vs
}

// adapterActive is every adapter's active count before a step, keyed
// model:adapter, for checkAdapters.
func (c *Controller) adapterActive() map[string]int {
	out := map[string]int{}
	for m, set := range c.adapters {
		for name, a := range set.byName {
			if a.active > 0 {
				out[string(m)+":"+name] = a.active
			}
		}
	}
	return out
}

// AdapterSummary is a short list of Model's adapters by tier for logs:
// "card a,b; host c".
func (c *Controller) AdapterSummary(m ModelID) string {
	by := map[AdapterTier][]string{}
	for _, a := range c.Adapters(m) {
		by[a.Tier] = append(by[a.Tier], a.Name)
	}
	var parts []string
	for _, t := range []AdapterTier{AdapterCard, AdapterLoading, AdapterUnloading, AdapterHost} {
		if len(by[t]) > 0 {
			parts = append(parts, t.String()+" "+strings.Join(by[t], ","))
		}
	}
	return strings.Join(parts, "; ")
}

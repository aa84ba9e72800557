package simserve

import (
	"fmt"
	"os"
	"testing"
)

var lastMet *metrics

func TestDebugHome(t *testing.T) {
	if os.Getenv("SIMDEBUG") == "" {
		t.Skip()
	}
	cfg, err := LoadConfig("../../examples/serve/home.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tr, _ := cfg.DefaultTraces()
	w, err := NewWorkload(cfg, tr, 1)
	if err != nil {
		t.Fatal(err)
	}
	pol := os.Getenv("SIMDEBUG")
	var gp *gpuplane
	last := map[int]engState{}
	seen := map[string]bool{}
	r, _ := run(cfg, w, pol, 1, func(s *sim) {
		lastMet = s.met
		if g, ok := s.pol.(*gpuplane); ok {
			gp = g
		}
		if g, ok := s.pol.(*gpuplane); ok && false {
			for _, d := range g.c.Decisions() {
				if d.Time.Sub(epoch).Seconds() > 360 && d.Time.Sub(epoch).Seconds() <= s.now && !seen[d.Time.String()+string(d.Model)+d.Action.String()] {
					seen[d.Time.String()+string(d.Model)+d.Action.String()] = true
					fmt.Printf("DEC %v %s %s %s for=%s %s\n", d.Time.Sub(epoch), d.Action, d.Model, d.Trigger, d.For, d.Reason)
				}
			}
		}
		for _, e := range s.engines {
			if last[e.idx] != e.state && false {
				fmt.Printf("%8.1f %-8s %s -> %s run=%d wait=%d\n", s.now, e.m.Name, last[e.idx], e.state, len(e.running), len(e.waiting))
			}
			last[e.idx] = e.state
		}
	})
	_ = gp
	fmt.Printf("%+v\n", r)
	met := lastMet
	for mi := range met.pair {
		fmt.Println(cfg.Models[mi].Name, met.pair[mi], met.largest[mi])
	}
}

// Package queue is the gateway's scheduling core for one card (docs/gateway.md
// Queues, Admission, Preemption): which waiting request each engine on the
// card runs next, which requests are turned away, and which background
// requests give way to interactive ones.
//
// It owns, per card: a bounded queue per deployment (engine), split by
// class (interactive, standard, background) and within a class by tenant;
// the virtual token counter of each tenant in each class of each
// deployment (VTC); the floors that keep lower classes from starving; the
// engines' in-flight slots and KV-token budgets; admission with a
// Retry-After estimate; the wait for a cold deployment's load; deadlines;
// and the choice of background requests to preempt.
//
// It never does I/O, starts goroutines, reads the clock or draws random
// numbers: every call takes the time of its event (`now`), so the live
// gateway (wall clock) and the serving simulator (virtual time) run the
// same code, and the same calls give the same outputs. It never talks to
// engines: it says what to do and the caller does it. It never drops a
// request silently: every request it admits leaves exactly once, as
// Finished, Rejected, Expired, Cancelled or Preempted, in an Output.
//
// The gateway holds one Scheduler per card and calls it from one goroutine
// (or under one lock):
//
//	s, _ := queue.New(queue.Config{})
//	s.AddDeployment(queue.Deployment{Name: "chat", MaxInFlight: 32, MaxTokens: 65536, QueueLimit: 512, Ready: true}, now)
//	s.SetTenant("acme", 2)
//	id, out, err := s.Enqueue(queue.Request{Deployment: "chat", Tenant: "acme", Class: queue.Interactive,
//		PromptTokens: 812, MaxTokens: 256, Streamed: true}, now)
//	// err: bad input (400), nothing queued. Otherwise act on out, in order:
//	//   out.Preempted:  abort those background requests on their engine
//	//                   (Requeued ones will be dispatched again; the others
//	//                   also appear in Ended, as Preempted)
//	//   out.Dispatched: send those requests to their engine now
//	//   out.Ended:      answer those (429/503 with Retry-After, 408-style
//	//                   expiry, preempted-stream error event)
//	s.Progress(id, generatedSoFar)         // as tokens stream back
//	out, err = s.Finish(id, generated, now) // the engine answered
//	out, err = s.Cancel(id, now)            // the client went away
//	out = s.Tick(now)                       // at s.NextDeadline()
//	out, err = s.SetReady("chat", now)      // the residency controller loaded it
//	err = s.SetCold("chat", readyBy, now)   // evicted, asleep or loading
//
// An Output's slices are reused by the next call. DESIGN.md gives the
// rules, the bounds the tests check, and why.
package queue

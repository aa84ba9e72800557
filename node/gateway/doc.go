// Package gateway is the node's OpenAI-compatible front door (docs/gateway.md):
// the HTTP server on --gateway-port that every agent runs.
//
// It owns: parsing and checking requests (`GET /v1/models`, `POST
// /v1/chat/completions`, `/v1/completions`, `/v1/embeddings`, streamed and
// not) and answering every refusal in OpenAI's error shape; finding the
// replicas of the model a request names and choosing one (a resident
// replica first, then the shortest queue); forwarding a request to the node
// that holds the chosen replica (once: a forwarded request is never
// forwarded again); the tenant of a request (the ACL token's, else the
// X-Gpuplane-Tenant header, else "default"); one queue.Scheduler per local
// card, driven under one lock per card with the wall clock, and the
// requests' lives around it (dispatch to the engine, progress, finish,
// cancel when the client goes away, abort when preempted, expiry and cold
// waits); the per-tenant cache salt added to the bodies sent to engines that
// key their prefix cache by it, and the llama.cpp slot (id_slot) each
// request runs in, never one holding another tenant's cache (a llama.cpp
// replica's slots are its in-flight cap in the scheduler, so requests wait
// for a slot in the scheduler's queue, in its priority and fairness order);
// the gateway's Prometheus series; and what a deployment's spec and
// replicas mean for all of these (ModelOf: served names, class, task and
// context length; each replica's in-flight cap, slots, KV budget and
// residency), which the agent's view of the cluster builds its Models with.
//
// An idle stream (dispatched, its engine's first token not come) costs the
// node what its handler goroutine holds while blocked on the engine's
// socket: the request's state lives in one object (call), and it waits for
// the engine's first byte under two small frames of the gateway's
// (ServeHTTP, call.run), so that the goroutine's stack, grown while the
// request was parsed, shrinks at the next collections to what a bare
// net/http handler's does (the idle-stream memory of bench/gateway,
// `make bench-gateway-http`, measures it).
//
// It never decides scheduling itself (package queue does), never loads or
// unloads a model (the residency controller does: the gateway only reports
// the demand it holds, through Residency), never changes the cluster's
// state, and never reads a request body beyond its limit. It never trusts a
// request's tenant headers from a client when ACLs are on: only a peer node
// (Options.IsPeer) may pass a tenant it resolved.
package gateway

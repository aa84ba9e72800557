// Package rpc serves gpuplane's API: Connect handlers (Connect, gRPC and
// gRPC-Web on one port; HTTP/1.1 and h2c, or HTTPS with TLS) that turn
// requests into log commands and state reads, the event and audit streams,
// engine logs relayed from the node that runs them, each node's residency
// decisions, plans and profiles (residency.go: any node answers for every
// node by asking the others), the web dashboard and the one call it makes
// per refresh (ui.go, dashboard.go: only what changed since the page's
// previous answer, built again only when the state or another source
// changed), gRPC health and reflection, and /healthz.
//
// It owns the mapping from state-machine results to Connect error codes, the
// forwarding of writes from any node to the leader, request limits, and, with
// ACLs on, the token check of every call (auth.go: which role each procedure
// needs; the token's name becomes the actor of every entry it causes). It
// never changes state itself: every change goes through the Backend's Apply,
// so through the log.
package rpc

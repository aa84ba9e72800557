// Package rpc serves gpuplane's API: Connect handlers (Connect, gRPC and
// gRPC-Web on one port, HTTP/1.1 and h2c) that turn requests into log
// commands and state reads, gRPC health and reflection, and /healthz.
//
// It owns the mapping from state-machine results to Connect error codes and
// the forwarding of writes from any node to the leader. It never changes
// state itself: every change goes through the Backend's Apply, so through the
// log.
package rpc

// Package tlsutil is a node's TLS identity: loading its certificate, key and
// the cluster's CA (TLS), the server and peer configurations the API and Raft
// use, Raft's mutual-TLS stream layer (StreamLayer), and the development CA
// and certificates `gpuplane tls` creates (CreateCA, CreateCert).
//
// It decides nothing about who may do what: a certificate of the cluster's CA
// makes a peer a node of the cluster; ACL tokens (rpc) say what a caller may
// do.
package tlsutil

// Package archtest holds the architecture test: it reads the project's
// imports with `go list` and fails on an import arrow that
// docs/architecture.md forbids. The package has no code of its own.
package archtest

package cli

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// Set at link time:
//
//	go build -ldflags "-X github.com/gpuplane/gpuplane/cmd/gpuplane/cli.version=v0.1.0 -X github.com/gpuplane/gpuplane/cmd/gpuplane/cli.commit=abc1234"
//
// Without them the version is "dev" (or the module version when installed
// with `go install ...@vX`) and the commit comes from the VCS stamp Go embeds.
var (
	version = "dev"
	commit  = ""
)

// versionInfo describes this binary.
type versionInfo struct {
	Version  string `json:"version"`
	Commit   string `json:"commit"`
	Go       string `json:"go"`
	Platform string `json:"platform"`
}

// buildInfo returns the version of this binary, also reported by the agent.
func buildInfo() versionInfo {
	v := versionInfo{Version: version, Commit: commit, Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	if v.Version == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		v.Version = bi.Main.Version
	}
	if v.Commit == "" {
		var modified bool
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				v.Commit = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
		if len(v.Commit) > 12 {
			v.Commit = v.Commit[:12]
		}
		if modified && v.Commit != "" {
			v.Commit += "-dirty"
		}
	}
	return v
}

func newVersionCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version of this binary",
		Args:  argsNamed(),
		RunE: func(*cobra.Command, []string) error {
			v := buildInfo()
			return g.printValue(v, func(w io.Writer) error {
				commit := v.Commit
				if commit == "" {
					commit = "unknown"
				}
				_, err := fmt.Fprintf(w, "gpuplane %s\ncommit:   %s\ngo:       %s\nplatform: %s\n", v.Version, commit, v.Go, v.Platform)
				return err
			})
		},
	}
}

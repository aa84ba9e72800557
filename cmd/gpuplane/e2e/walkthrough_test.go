package e2e

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The README's walkthrough is the part of README.md between these marks.
// Every ```sh block in it is run, command by command, in order:
//
//   - a command is a line that is not a comment, with its continuation
//     lines (ending in \) and its here-document;
//   - the lines "#   TEXT" under a command are what it prints on stdout,
//     compared line by line with runs of spaces collapsed; "#   ..." stands
//     for any number of lines, and the port of a 127.0.0.1 address for any
//     port (engines get theirs from a range);
//   - the lines "# error: TEXT" under a command are what it prints on
//     stderr, and it must exit 1; any other command must exit 0;
//   - other comments are prose.
//
// A listing whose output does not match yet is run again for a while, as a
// user would look again: placement and engine starts are asynchronous. A
// command with --follow streams until interrupted: it must print something
// and keep running, and is then interrupted as a user would. A command whose
// program is not installed here (grpcurl) is skipped, and said so.
const (
	walkthroughBegin = "<!-- walkthrough: begin -->"
	walkthroughEnd   = "<!-- walkthrough: end -->"
)

// step is one command of the walkthrough and what the README says it does.
type step struct {
	line   int    // in README.md
	script string // the command, as bash reads it
	stdout []string
	stderr []string
}

// walkthroughSteps reads the marked walkthrough out of the README.
func walkthroughSteps(t *testing.T) []step {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	data, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	begin := slices.Index(lines, walkthroughBegin)
	end := slices.Index(lines, walkthroughEnd)
	if begin < 0 || end < begin {
		t.Fatalf("README.md has no walkthrough between %q and %q", walkthroughBegin, walkthroughEnd)
	}
	var steps []step
	inBlock := false
	for i := begin + 1; i < end; i++ {
		line := lines[i]
		switch {
		case !inBlock && line == "```sh":
			inBlock = true
			continue
		case inBlock && line == "```":
			inBlock = false
			continue
		case !inBlock || strings.TrimSpace(line) == "":
			continue
		}
		if strings.HasPrefix(line, "#") {
			if len(steps) == 0 {
				continue
			}
			s := &steps[len(steps)-1]
			switch {
			case strings.HasPrefix(line, "#   "):
				s.stdout = append(s.stdout, line[len("#   "):])
			case strings.HasPrefix(line, "# error: "):
				s.stderr = append(s.stderr, line[len("# "):])
			}
			continue
		}
		s := step{line: i + 1, script: line}
		for strings.HasSuffix(lines[i], "\\") && i+1 < end {
			i++
			s.script += "\n" + lines[i]
		}
		if m := regexp.MustCompile(`<<-?'?(\w+)'?`).FindStringSubmatch(s.script); m != nil {
			for i+1 < end {
				i++
				s.script += "\n" + lines[i]
				if lines[i] == m[1] {
					break
				}
			}
		}
		steps = append(steps, s)
	}
	if len(steps) < 20 {
		t.Fatalf("the walkthrough has %d commands: the marks or the blocks are not where this test expects them", len(steps))
	}
	return steps
}

var anyPort = regexp.MustCompile(`127\.0\.0\.1:\d+`)

// matches says whether out is what the README shows: every line, runs of
// whitespace collapsed, "..." for any run of lines, any port on 127.0.0.1.
func matches(shown []string, out string) bool {
	norm := func(lines []string) []string {
		var o []string
		for _, l := range lines {
			if l = strings.TrimSpace(spaces.ReplaceAllString(anyPort.ReplaceAllString(l, "127.0.0.1:PORT"), " ")); l != "" {
				o = append(o, l)
			}
		}
		return o
	}
	var match func(want, got []string) bool
	match = func(want, got []string) bool {
		switch {
		case len(want) == 0:
			return len(got) == 0
		case want[0] == "...":
			for skip := 0; skip <= len(got); skip++ {
				if match(want[1:], got[skip:]) {
					return true
				}
			}
			return false
		case len(got) == 0 || want[0] != got[0]:
			return false
		}
		return match(want[1:], got[1:])
	}
	return match(norm(shown), norm(strings.Split(out, "\n")))
}

// TestREADMEWalkthrough runs the README's walkthrough, every command in
// order, against a real dev agent built from this tree, and checks each
// exit code and every output the README shows.
func TestREADMEWalkthrough(t *testing.T) {
	requireBinary(t)
	steps := walkthroughSteps(t)

	a := newAgent(t, filepath.Join(t.TempDir(), "data"))
	// The README's node is called vm and has two simulated L4s.
	a.flags = []string{"--node-name", "vm", "--sim-gpus", "l4=2"}
	a.start()

	// The walkthrough's working directory: `alias gpuplane=./bin/gpuplane`
	// finds the binary built from this tree there.
	work := t.TempDir()
	if err := os.Mkdir(filepath.Join(work, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(bin, filepath.Join(work, "bin", "gpuplane")); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "GPUPLANE_ADDR="+a.url(), "NO_COLOR=1",
		// simulate: no openb trace, so the example the repository ships.
		"GPUPLANE_OPENB_DIR="+t.TempDir())
	apiAddr := strings.TrimPrefix(a.url(), "http://")

	var aliases []string
	for _, s := range steps {
		script := strings.ReplaceAll(s.script, "127.0.0.1:7410", apiAddr)
		if strings.HasPrefix(script, "alias ") {
			aliases = append(aliases, script)
			continue
		}
		name := strings.Fields(script)[0]
		if name != "gpuplane" && name != "cat" {
			if _, err := exec.LookPath(name); err != nil {
				t.Logf("README.md:%d: skipped, %s is not installed here: %s", s.line, name, s.script)
				continue
			}
		}
		full := strings.Join(append(slices.Clone(aliases), script), "\n")
		if strings.Contains(script, "--follow") {
			follow(t, s, work, env, full)
			continue
		}
		listing := len(s.stdout) > 0 && (strings.Contains(script, " list") || strings.Contains(script, " get "))
		deadline := time.Now().Add(90 * time.Second)
		for {
			out, errOut, code := runBash(t, work, env, full, 3*time.Minute)
			failed := ""
			switch {
			case len(s.stderr) > 0 && code != 1:
				failed = "exit " + strconv.Itoa(code) + ", want 1"
			case len(s.stderr) > 0 && !matches(s.stderr, errOut):
				failed = "stderr differs from the README's"
			case len(s.stderr) == 0 && code != 0:
				failed = "exit " + strconv.Itoa(code) + ", want 0"
			case len(s.stdout) > 0 && !matches(s.stdout, out):
				failed = "stdout differs from the README's"
			}
			if failed == "" {
				if testing.Verbose() {
					t.Logf("README.md:%d: $ %s\n%s%s", s.line, s.script, out, errOut)
				}
				break
			}
			if listing && code == 0 && time.Now().Before(deadline) {
				time.Sleep(time.Second)
				continue
			}
			t.Fatalf("README.md:%d: %s\n$ %s\nstdout:\n%s\nstderr:\n%s\nthe README shows:\n%s%s", s.line, failed, s.script,
				out, errOut, strings.Join(s.stdout, "\n"), strings.Join(s.stderr, "\n"))
		}
	}
}

// runBash runs script with bash (aliases on) in dir.
func runBash(t *testing.T, dir string, env []string, script string, timeout time.Duration) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-O", "expand_aliases", "-c", script)
	cmd.Dir, cmd.Env = dir, env
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("bash: %v", err)
	}
	return o.String(), e.String(), cmd.ProcessState.ExitCode()
}

// follow runs a --follow command: it must print something and still be
// running, as a stream does; then it is interrupted, as a user would.
func follow(t *testing.T, s step, dir string, env []string, script string) {
	t.Helper()
	cmd := exec.Command("bash", "-O", "expand_aliases", "-c", script)
	cmd.Dir, cmd.Env = dir, env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out, errOut syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	deadline := time.After(60 * time.Second)
	for strings.TrimSpace(out.String()) == "" {
		select {
		case <-done:
			t.Fatalf("README.md:%d: %s exited (%v) instead of following\nstdout:\n%s\nstderr:\n%s", s.line, s.script, cmd.ProcessState, out.String(), errOut.String())
		case <-deadline:
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
			t.Fatalf("README.md:%d: %s printed nothing in 60s\nstderr:\n%s", s.line, s.script, errOut.String())
		case <-time.After(100 * time.Millisecond):
		}
	}
	if len(s.stdout) > 0 && !matches(s.stdout, out.String()) {
		t.Errorf("README.md:%d: %s printed\n%s\nthe README shows:\n%s", s.line, s.script, out.String(), strings.Join(s.stdout, "\n"))
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		t.Errorf("README.md:%d: %s did not end on Ctrl-C", s.line, s.script)
	}
}

package testenv

import (
	"bufio"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Child is this test binary re-run as a helper process — one test, with
// extra environment — whose standard output the parent reads line by line.
type Child struct {
	cmd *exec.Cmd
	out *bufio.Scanner
}

// StartChild starts os.Args[0] running only testName, with env added to
// this process's environment; it is killed when the test ends.
func StartChild(t testing.TB, testName string, env ...string) *Child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+testName+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &Child{cmd: cmd, out: bufio.NewScanner(out)}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return c
}

// WaitFor reads the child's output until a line starting with prefix and
// returns it. A line starting with "ERROR", or the end of the output,
// fails t.
func (c *Child) WaitFor(t testing.TB, prefix string) string {
	t.Helper()
	for c.out.Scan() {
		line := c.out.Text()
		if strings.HasPrefix(line, "ERROR") {
			t.Fatalf("child: %s", line)
		}
		if strings.HasPrefix(line, prefix) {
			return line
		}
	}
	t.Fatalf("the child ended without printing %q", prefix)
	return ""
}

// Kill stops the child with SIGKILL and reaps it.
func (c *Child) Kill(t testing.TB) {
	t.Helper()
	if err := c.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = c.cmd.Wait()
}

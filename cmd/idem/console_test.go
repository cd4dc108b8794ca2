package main

import (
	"bufio"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestConsoleCommand: idem console serves the pages of a SQLite store (its
// records, outbox and inbox) — on a database that holds an outbox and
// nothing else, it creates the records table as every command does and
// names the missing inbox table — and refuses to start off loopback
// without an admin token.
func TestConsoleCommand(t *testing.T) {
	store := "sqlite:" + filepath.Join(t.TempDir(), "app.db")
	if _, err := run(t, "outbox", "enqueue", "--store", store, "--key", "INV-9", "--to", "https://billing.example/x", "--data", "{}"); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "console", "--store", store, "--listen", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "IDEM_TEST_MAIN=1")
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	sc := bufio.NewScanner(stderr)
	base := ""
	for sc.Scan() {
		if _, addr, ok := strings.Cut(sc.Text(), " on http://"); ok {
			base = "http://" + addr
			break
		}
	}
	if base == "" {
		t.Fatal("idem console did not start")
	}
	go io.Copy(io.Discard, stderr)
	for path, want := range map[string]string{"/": "Overview", "/outbox": "INV-9", "/keys": "Keys", "/find?q=INV-9": "No processed_events table in this database"} {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), want) {
			t.Fatalf("GET %s: %d, no %q in %.300s", path, resp.StatusCode, want, b)
		}
		if path != "/find?q=INV-9" && strings.Contains(string(b), `class="error"`) {
			t.Fatalf("GET %s shows an error: %s", path, b)
		}
	}
	if _, err := run(t, "console", "--store", store, "--listen", "0.0.0.0:0", "--admin-token", ""); err == nil || !strings.Contains(err.Error(), "admin-token") {
		t.Fatalf("off loopback without a token: %v", err)
	}
}

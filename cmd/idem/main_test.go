package main

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/storeurl"
)

// run executes the idem command with args and returns its stdout.
func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := newRootCmd()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

func TestDemo(t *testing.T) {
	var out bytes.Buffer
	ok, err := runDemo(context.Background(), &out, filepath.Join(t.TempDir(), "demo.db"))
	if err != nil || !ok {
		t.Fatalf("demo: ok=%v err=%v\n%s", ok, err, out.String())
	}
	for _, want := range []string{"lost answer", "crash", "20 duplicates", "zombie", "refused", "every invariant held"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q", want)
		}
	}
}

func TestBenchJSON(t *testing.T) {
	for _, st := range []string{"memory:", "sqlite:" + filepath.Join(t.TempDir(), "b.db")} {
		out, err := run(t, "bench", "--store", st, "--duration", "300ms", "--concurrency", "4", "--keys", "50", "--json", "--quiet")
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		var rep map[string]any
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &rep); err != nil {
			t.Fatalf("last line is not JSON: %q", lines[len(lines)-1])
		}
		for _, k := range []string{"ops_per_sec", "p50_us", "p99_us"} {
			if v, ok := rep[k].(float64); !ok || v <= 0 {
				t.Errorf("%s: %s = %v", st, k, rep[k])
			}
		}
		// The process's CPU per operation: more than nothing, and no more
		// than the phase's wall time on every core allows (a unit slip of a
		// thousand would break it).
		if runtime.GOOS != "windows" {
			life := rep["lifecycle"].(map[string]any)
			cpu, _ := life["client_cpu_us_per_op"].(float64)
			most := life["seconds"].(float64) * 1e6 * float64(runtime.NumCPU()) / life["ops"].(float64)
			if cpu <= 0 || cpu > most || rep["client_cpu_us_per_op"] != life["client_cpu_us_per_op"] {
				t.Errorf("%s: client_cpu_us_per_op %v (headline %v), at most %.1f", st, cpu, rep["client_cpu_us_per_op"], most)
			}
		}
	}
}

// TestBenchRecordsExpire: the records a bench run writes live for
// --retention (default 5m), not for an hour in the user's store.
func TestBenchRecordsExpire(t *testing.T) {
	st := "sqlite:" + filepath.Join(t.TempDir(), "r.db")
	if _, err := run(t, "bench", "--store", st, "--duration", "100ms", "--concurrency", "2", "--keys", "10", "--quiet", "--retention", "2m"); err != nil {
		t.Fatal(err)
	}
	s, err := storeurl.Open(context.Background(), st, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	recs, err := s.(store.Lister).List(context.Background(), "", 0)
	if err != nil || len(recs) == 0 {
		t.Fatalf("%d records, %v", len(recs), err)
	}
	for _, r := range recs {
		if left := time.Until(r.ExpiresAt); left > 2*time.Minute || left < time.Minute {
			t.Fatalf("%s expires in %v, want within the 2m retention", r.Key, left)
		}
	}
}

func TestKeysCommands(t *testing.T) {
	st := "sqlite:" + filepath.Join(t.TempDir(), "k.db")
	if _, err := run(t, "migrate", "--store", st); err != nil {
		t.Fatal(err)
	}
	// Fill the store through bench's replay keys.
	if _, err := run(t, "bench", "--store", st, "--duration", "100ms", "--concurrency", "2", "--keys", "30", "--mode", "replay", "--quiet"); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, "keys", "ls", "--store", st, "--json", "--limit", "5")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 5 {
		t.Fatalf("ls --limit 5 printed %d lines:\n%s", len(lines), out)
	}
	var rec struct{ Scope, ID, State string }
	if err := json.Unmarshal([]byte(lines[0]), &rec); err != nil || rec.State != "completed" || rec.ID == "" {
		t.Fatalf("ls --json line %q: %+v %v", lines[0], rec, err)
	}
	out, err = run(t, "keys", "get", "--store", st, "--scope", rec.Scope, rec.ID)
	if err != nil || !strings.Contains(out, "completed") {
		t.Fatalf("get: %v\n%s", err, out)
	}
	if _, err := run(t, "keys", "rm", "--store", st, "--scope", rec.Scope, rec.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, "keys", "get", "--store", st, "--scope", rec.Scope, rec.ID); err == nil || !strings.Contains(err.Error(), "no record") {
		t.Fatalf("get after rm: %v", err)
	}
	if _, err := run(t, "keys", "purge", "--store", st); err == nil {
		t.Fatal("purge without --expired or --all ran")
	}
	out, err = run(t, "keys", "purge", "--store", st, "--all", "--quiet")
	if err != nil || !strings.Contains(out, "purged 29 records") {
		t.Fatalf("purge --all: %v %q", err, out)
	}
	if out, _ := run(t, "keys", "ls", "--store", st, "--json"); strings.TrimSpace(out) != "" {
		t.Fatalf("records left after purge: %s", out)
	}
}

func TestBadInput(t *testing.T) {
	st := "sqlite:" + filepath.Join(t.TempDir(), "bad.db")
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"keys", "ls", "--store", "oracle://x"}, "unknown store URL scheme"},
		{[]string{"keys", "ls", "--store", "mysql://app:hunter2@x"}, "names no database"},
		{[]string{"keys", "ls", "--store", "idem.db"}, "no scheme"},
		{[]string{"keys", "get", "--store", st, ""}, "empty id"},
		{[]string{"keys", "get", "--store", st, strings.Repeat("k", 10<<10)}, "the limit is 255"},
		{[]string{"keys", "ls", "--store", st, "--state", "weird"}, "unknown state"},
		{[]string{"bench", "--store", "memory:", "--concurrency", "0"}, "must be positive"},
		{[]string{"bench", "--store", "memory:", "--duration", "10s", "--retention", "15s"}, "must outlast both phases"},
	}
	for _, tt := range tests {
		_, err := run(t, tt.args...)
		if err == nil || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("idem %s: err = %v, want it to mention %q (and no password)", strings.Join(tt.args, " ")[:min(60, len(strings.Join(tt.args, " ")))], err, tt.want)
		}
	}
}

// TestVersion: idem version names the module version, the revision it was
// built from and the Go version.
func TestVersion(t *testing.T) {
	out, err := run(t, "version")
	if err != nil || !strings.HasPrefix(out, "idem ") || !strings.Contains(out, "go1.") {
		t.Fatalf("idem version: %q %v", out, err)
	}
	line := versionLine(&debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v0.1.0"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "b8eb63d"}, {Key: "vcs.time", Value: "2026-12-06T21:00:00Z"}, {Key: "vcs.modified", Value: "true"}}})
	if line != "idem v0.1.0, revision b8eb63d of 2026-12-06T21:00:00Z, modified, go1.26.0" {
		t.Fatalf("the version line: %q", line)
	}
}

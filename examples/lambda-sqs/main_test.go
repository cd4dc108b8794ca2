package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	_ "modernc.org/sqlite"

	"github.com/idemgo/idem/internal/testenv"
)

// rie returns AWS's Runtime Interface Emulator: IDEM_LAMBDA_RIE, or where
// .ci/run installs it ($XDG_CACHE_HOME/idem-go/bin/aws-lambda-rie).
func rie(t *testing.T) string {
	bin := os.Getenv("IDEM_LAMBDA_RIE")
	if bin == "" {
		cache, _ := os.UserCacheDir()
		bin = filepath.Join(cache, "idem-go", "bin", "aws-lambda-rie")
	}
	_, err := os.Stat(bin)
	testenv.Need(t, "the Lambda Runtime Interface Emulator", bin, err)
	return bin
}

// TestUnderTheRuntimeInterfaceEmulator runs the function as Lambda does —
// its bootstrap binary under AWS's Runtime Interface Emulator, with a
// three-second timeout — and invokes it with SQS events: a batch holding a
// duplicate and a record without a key, the same batch again, and a record
// whose work outlives the invocation.
func TestUnderTheRuntimeInterfaceEmulator(t *testing.T) {
	testenv.SkipShort(t, "the Lambda Runtime Interface Emulator")
	emulator := rie(t)
	dir := t.TempDir()
	build := exec.Command("go", "build", "-tags", "lambda.norpc", "-o", filepath.Join(dir, "bootstrap"), ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the function: %v\n%s", err, out)
	}
	api, runtime := testenv.FreePort(t), testenv.FreePort(t)
	cmd := exec.Command(emulator, "--runtime-interface-emulator-address", "127.0.0.1:"+strconv.Itoa(api),
		"--runtime-api-address", "127.0.0.1:"+strconv.Itoa(runtime), filepath.Join(dir, "bootstrap"))
	cmd.Env = append(os.Environ(), "AWS_LAMBDA_FUNCTION_TIMEOUT=3", "IDEM_STORE=sqlite:"+filepath.Join(dir, "idem.db"),
		"LEDGER="+filepath.Join(dir, "ledger.txt"), "SLOW_ACCOUNT=ACC-SLOW")
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("the emulator's log:\n%s", log.String())
		}
	})
	url := fmt.Sprintf("http://127.0.0.1:%d/2015-03-31/functions/function/invocations", api)
	invoke := func(recs ...events.SQSMessage) []string {
		t.Helper()
		body, _ := json.Marshal(events.SQSEvent{Records: recs})
		var resp *http.Response
		testenv.Eventually(t, 20*time.Second, "the emulator answers", func() error {
			var err error
			resp, err = http.Post(url, "application/json", bytes.NewReader(body))
			return err
		})
		defer resp.Body.Close()
		var out events.SQSEventResponse
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("invocation: %d, %v", resp.StatusCode, err)
		}
		var ids []string
		for _, f := range out.BatchItemFailures {
			ids = append(ids, f.ItemIdentifier)
		}
		slices.Sort(ids)
		return ids
	}
	rec := func(id, key, account string) events.SQSMessage {
		m := events.SQSMessage{MessageId: id, Body: fmt.Sprintf(`{"account":%q,"amount_cents":2500}`, account), EventSource: "aws:sqs",
			EventSourceARN: "arn:aws:sqs:eu-west-1:123456789012:credits", MessageAttributes: map[string]events.SQSMessageAttribute{}}
		if key != "" {
			m.MessageAttributes["Idempotency-Key"] = events.SQSMessageAttribute{DataType: "String", StringValue: &key}
		}
		return m
	}
	batch := []events.SQSMessage{rec("m1", "K-1", "ACC-1"), rec("m2", "K-1", "ACC-1"), rec("m3", "K-2", "ACC-2"), rec("m4", "", "ACC-3")}
	for round := range 2 {
		if got := invoke(batch...); !slices.Equal(got, []string{"m4"}) {
			t.Fatalf("round %d: batch item failures %v, want m4 (no key)", round+1, got)
		}
	}
	ledger, _ := os.ReadFile(filepath.Join(dir, "ledger.txt"))
	if lines := strings.Split(strings.TrimSpace(string(ledger)), "\n"); len(lines) != 2 {
		t.Fatalf("the ledger holds %d credits, want 2 (K-1 and K-2 once each):\n%s", len(lines), ledger)
	}

	// A record whose work outlives the invocation: the handler still
	// answers in time, and the claim ends by the deadline plus the margin.
	start := time.Now()
	if got := invoke(rec("m5", "K-3", "ACC-SLOW")); !slices.Equal(got, []string{"m5"}) {
		t.Fatalf("the slow record: batch item failures %v, want m5", got)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("the invocation took %v: past its three-second timeout", took)
	}
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "idem.db")+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var leaseUntil int64
	if err := db.QueryRowContext(context.Background(), `SELECT lease_until FROM idem_records WHERE instr(k, CAST('K-3' AS BLOB)) > 0`).Scan(&leaseUntil); err != nil {
		t.Fatal(err)
	}
	if end, limit := time.UnixMilli(leaseUntil), start.Add(3*time.Second+time.Second+100*time.Millisecond); end.After(limit) {
		t.Fatalf("the claim lives until %v, %v past the deadline plus the margin", end, end.Sub(limit))
	}
}

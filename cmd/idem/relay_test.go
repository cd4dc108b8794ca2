package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/outbox"
)

// flakyReceiver is an idempotent HTTP receiver that misbehaves on the first
// attempt of most keys: it processes and then drops the connection, answers
// 503, or answers after the sender gave up.
type flakyReceiver struct {
	mu        sync.Mutex
	attempts  map[string][]string // key → bodies of every attempt
	processed map[string]int
	t         *testing.T
}

func (f *flakyReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.attempts[key] = append(f.attempts[key], string(body))
	n := len(f.attempts[key])
	_, done := f.processed[key]
	f.mu.Unlock()
	time.Sleep(20 * time.Millisecond)
	var i int
	fmt.Sscanf(key, `"INV-%d"`, &i)
	if n == 1 {
		switch i % 4 {
		case 0: // processes, then the connection drops before the answer
			f.process(key)
			if hj, ok := w.(http.Hijacker); ok {
				c, _, _ := hj.Hijack()
				c.Close()
				return
			}
		case 1:
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		case 2: // too late: the sender timed out (and the work happened)
			f.process(key)
			time.Sleep(700 * time.Millisecond)
			w.WriteHeader(http.StatusCreated)
			return
		}
	}
	if done {
		w.Header().Set("Idempotent-Replayed", "true")
	} else {
		f.process(key)
	}
	w.WriteHeader(http.StatusCreated)
}

func (f *flakyReceiver) process(key string) {
	f.mu.Lock()
	f.processed[key]++
	f.mu.Unlock()
}

// sqliteOutbox returns a migrated outbox on a new SQLite file, and its
// store URL.
func sqliteOutbox(t *testing.T) (string, *outbox.Store) { return outboxOn(t, "sqlite") }

// outboxOn migrates an outbox on a database of the kind (sqlite, mysql) of
// the test's own and returns its store URL and the outbox.
func outboxOn(t *testing.T, kind string) (string, *outbox.Store) {
	store := "sqlite:" + filepath.Join(t.TempDir(), "outbox.db")
	if kind == "mysql" {
		store = testenv.MySQLDatabase(t, "")
	}
	s, closeFn, err := openOutbox(context.Background(), store)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeFn() })
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return store, s
}

func startRelay(t *testing.T, store string, extra ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], append([]string{"relay", "--store", store, "--concurrency", "4", "--batch", "5", "--lease", "2s",
		"--http-timeout", "400ms", "--backoff-min", "50ms", "--backoff-max", "200ms", "--poll", "100ms"}, extra...)...)
	cmd.Env = append(os.Environ(), "IDEM_TEST_MAIN=1")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd
}

// TestRelayKill9TwiceWithFlakyReceiver: a relay killed with SIGKILL twice
// while a receiver fails most first attempts; the third delivers every
// intent once, each attempt with the same key and bytes — on SQLite and on
// MySQL.
func TestRelayKill9TwiceWithFlakyReceiver(t *testing.T) {
	for _, kind := range []string{"sqlite", "mysql"} {
		t.Run(kind, func(t *testing.T) { relayKill9TwiceWithFlakyReceiver(t, kind) })
	}
}

func relayKill9TwiceWithFlakyReceiver(t *testing.T, kind string) {
	recv := &flakyReceiver{attempts: map[string][]string{}, processed: map[string]int{}, t: t}
	srv := httptest.NewServer(recv)
	defer srv.Close()
	store, s := outboxOn(t, kind)
	ctx := context.Background()
	const n = 60
	for i := range n {
		if err := s.Enqueue(ctx, outbox.Message{Key: fmt.Sprintf("INV-%d", i), Destination: srv.URL + "/invoices",
			Payload: []byte(fmt.Sprintf(`{"invoice":%d}`, i))}); err != nil {
			t.Fatal(err)
		}
	}
	for kill := 1; kill <= 2; kill++ {
		r := startRelay(t, store)
		time.Sleep(400 * time.Millisecond)
		if err := r.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = r.Wait()
		t.Logf("relay killed with SIGKILL (%d of 2)", kill)
	}
	startRelay(t, store)
	deadline := time.Now().Add(60 * time.Second)
	for {
		pending, _ := s.List(ctx, outbox.Pending, 0, n)
		if len(pending) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d messages still pending", len(pending))
		}
		time.Sleep(100 * time.Millisecond)
	}
	rows, err := s.List(ctx, "", 0, n)
	if err != nil {
		t.Fatal(err)
	}
	recv.mu.Lock()
	defer recv.mu.Unlock()
	for _, r := range rows {
		key := `"` + r.Key + `"`
		if r.Status != outbox.Acked {
			t.Errorf("%s: %s (%s)", r.Key, r.Status, r.LastError)
		}
		if recv.processed[key] != 1 {
			t.Errorf("%s processed %d times by the receiver", r.Key, recv.processed[key])
		}
		for _, b := range recv.attempts[key] {
			if b != string(r.Payload) {
				t.Errorf("%s: an attempt carried %q, want %q", r.Key, b, r.Payload)
			}
		}
		if r.Tries < 1 || r.Tries > len(recv.attempts[key]) {
			t.Errorf("%s: tries %d for %d attempts seen", r.Key, r.Tries, len(recv.attempts[key]))
		}
	}
	total := 0
	for _, a := range recv.attempts {
		total += len(a)
	}
	t.Logf("%d intents delivered once each through %d attempts, every attempt with the same key and bytes", n, total)
}

// TestRelayNATSToken: the relay authenticates to NATS with its own token
// (--nats-token), the outbox row naming only the server and subject;
// without it the row stays pending with the server's reason.
func TestRelayNATSToken(t *testing.T) {
	srv := testenv.StartNATSServer(t, "--auth", "relay-s3cret")
	st := srv.Stream(t, "ORDERS", "orders", nats.Token("relay-s3cret"))
	store, s := oneMessageOutbox(t, "ORD-1", srv.URL+"/orders")
	pendingWith(t, store, s, "ORD-1", "Authorization Violation")
	startRelay(t, store, "--max-tries", "1000", "--nats-token", "relay-s3cret")
	sentToStream(t, s, "ORD-1", st)
}

// TestRelayAMQPCredentials: the relay logs in to RabbitMQ as its own user
// (--amqp-user, --amqp-password), whatever user the row's URL names; without
// them the row stays pending with the broker's refusal. And the password a
// row's URL does carry is not printed by `idem outbox ls`.
func TestRelayAMQPCredentials(t *testing.T) {
	ch, q := testenv.AMQPQueue(t, "idemrelay.")
	stranger, user, password := testenv.AMQPStranger(t)
	store, s := sqliteOutbox(t)
	ctx := context.Background()
	if err := s.Enqueue(ctx, outbox.Message{Key: "ORD-1", Destination: stranger + "?routing_key=" + q, Payload: []byte("order")}); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"outbox", "ls", "--store", store}, {"outbox", "ls", "--json", "--store", store}} {
		out, err := run(t, args...)
		if err != nil || strings.Contains(out, "row-s3cret") || !strings.Contains(out, "idem-nobody:xxxxx@") {
			t.Fatalf("%v: the password shown, or the destination not (%v):\n%s", args, err, out)
		}
	}
	pendingWith(t, store, s, "ORD-1", "not allowed") // the broker's refusal of the row's user
	t.Setenv("IDEM_AMQP_PASSWORD", password)         // --amqp-password's default
	startRelay(t, store, "--max-tries", "1000", "--amqp-user", user)
	rowReaches(t, s, "ORD-1", outbox.Sent)
	if d, ok, err := ch.Get(q, true); err != nil || !ok || d.MessageId != "ORD-1" {
		t.Fatalf("delivered %q %v %v", d.MessageId, ok, err)
	}
}

// TestRelayNATSTLS: a NATS server with TLS from a private CA that wants
// client certificates. The relay trusts the CA only when told
// (--nats-tls-ca) and shows its certificate only when given one
// (--nats-tls-cert, --nats-tls-key); until both, the row stays pending with
// the reason.
func TestRelayNATSTLS(t *testing.T) {
	files := testenv.NewTLSFiles(t)
	srv := testenv.StartNATSServer(t, "--tlsverify", "--tlscert", files.Cert, "--tlskey", files.Key, "--tlscacert", files.CA)
	st := srv.Stream(t, "ORDERS", "orders", nats.RootCAs(files.CA), nats.ClientCert(files.Cert, files.Key))
	store, s := oneMessageOutbox(t, "ORD-1", srv.URL+"/orders")
	pendingWith(t, store, s, "ORD-1", "certificate signed by unknown authority")
	pendingWith(t, store, s, "ORD-1", "remote error: tls", "--nats-tls-ca", files.CA) // the server refuses the handshake without a client certificate
	startRelay(t, store, "--max-tries", "1000", "--nats-tls-ca", files.CA, "--nats-tls-cert", files.Cert, "--nats-tls-key", files.Key)
	sentToStream(t, s, "ORD-1", st)
}

// sentToStream waits until the outbox row of key is sent, and checks the
// stream holds one message.
func sentToStream(t *testing.T, s *outbox.Store, key string, st jetstream.Stream) {
	t.Helper()
	ctx := context.Background()
	rowReaches(t, s, key, outbox.Sent)
	if info, err := st.Info(ctx); err != nil || info.State.Msgs != 1 {
		t.Fatalf("the stream holds %+v (%v), want the message", info, err)
	}
}

// TestRelayHTTPTLS: an HTTPS receiver with a certificate from a private CA
// that wants client certificates (mutual TLS, as B2B endpoints often do).
// The relay trusts the CA only when told (--http-tls-ca) and shows a
// certificate only when given one (--http-tls-cert, --http-tls-key);
// until both, the row stays pending with the reason.
func TestRelayHTTPTLS(t *testing.T) {
	files := testenv.NewTLSFiles(t)
	ca, err := os.ReadFile(files.CA)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	cert, err := tls.LoadX509KeyPair(files.Cert, files.Key)
	if err != nil {
		t.Fatal(err)
	}
	var got atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert}
	srv.StartTLS()
	defer srv.Close()
	store, s := oneMessageOutbox(t, "INV-1", srv.URL+"/invoices")
	pendingWith(t, store, s, "INV-1", "certificate signed by unknown authority")
	pendingWith(t, store, s, "INV-1", "remote error: tls", "--http-tls-ca", files.CA) // the receiver refuses the handshake without a client certificate
	startRelay(t, store, "--max-tries", "1000", "--http-tls-ca", files.CA, "--http-tls-cert", files.Cert, "--http-tls-key", files.Key)
	rowReaches(t, s, "INV-1", outbox.Acked)
	if got.Load() != 1 {
		t.Fatalf("the receiver handled %d requests, want 1", got.Load())
	}
}

// pendingWith runs a relay with args until the outbox row of key is pending
// with why in its last error, then kills it.
func pendingWith(t *testing.T, store string, s *outbox.Store, key, why string, args ...string) {
	t.Helper()
	relay := startRelay(t, store, append([]string{"--max-tries", "1000"}, args...)...) // never dead while the test looks
	testenv.Eventually(t, 30*time.Second, "the row pending: "+why, func() error {
		if row, err := s.Get(context.Background(), key); err != nil || row.Status != outbox.Pending || !strings.Contains(row.LastError, why) {
			return fmt.Errorf("row %+v, %v", row, err)
		}
		return nil
	})
	_ = relay.Process.Kill()
	_ = relay.Wait()
}

// oneMessageOutbox is an SQLite outbox holding one message, key to dest.
func oneMessageOutbox(t *testing.T, key, dest string) (string, *outbox.Store) {
	t.Helper()
	store, s := sqliteOutbox(t)
	if err := s.Enqueue(context.Background(), outbox.Message{Key: key, Destination: dest, Payload: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	return store, s
}

// TestRelayHTTPHeaders: a receiver that wants an API token. Without
// --http-headers the row is refused (401: dead, with the answer); with a
// headers file naming the receiver's host, the relay sends the token on
// its own and the row — which carries none — is acknowledged.
func TestRelayHTTPHeaders(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer relay-t0ken" {
			http.Error(w, "who are you?", http.StatusUnauthorized)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	store, s := oneMessageOutbox(t, "INV-1", srv.URL+"/invoices")
	ctx := context.Background()
	relay := startRelay(t, store)
	testenv.Eventually(t, 20*time.Second, "the row dead, refused", func() error {
		if row, err := s.Get(ctx, "INV-1"); err != nil || row.Status != outbox.Dead || !strings.Contains(row.LastError, "401") {
			return fmt.Errorf("row %+v, %v", row, err)
		}
		return nil
	})
	_ = relay.Process.Kill()
	_ = relay.Wait()
	headers := filepath.Join(t.TempDir(), "headers.yaml")
	if err := os.WriteFile(headers, []byte(strings.TrimPrefix(srv.URL, "http://")+":\n  Authorization: Bearer relay-t0ken\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.Enqueue(ctx, outbox.Message{Key: "INV-2", Destination: srv.URL + "/invoices", Payload: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	startRelay(t, store, "--http-headers", headers)
	rowReaches(t, s, "INV-2", outbox.Acked)
}

// rowReaches waits until the outbox row of key has status.
func rowReaches(t *testing.T, s *outbox.Store, key string, status outbox.Status) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, "the row "+string(status), func() error {
		if row, err := s.Get(context.Background(), key); err != nil || row.Status != status {
			return fmt.Errorf("row %+v, %v", row, err)
		}
		return nil
	})
}

// TestRelayKafka: a Kafka cluster (kfake, of the test's own) with TLS from
// a private CA and SASL/SCRAM-SHA-512. The relay trusts the CA only when
// told (--kafka-tls-ca; --kafka-tls trusts the system's) and logs in only
// when given a user (--kafka-user, the password from $IDEM_KAFKA_PASSWORD);
// until both, the row stays pending with the reason. Then the record reaches the topic
// with the key in its Idempotency-Key header.
func TestRelayKafka(t *testing.T) {
	files := testenv.NewTLSFiles(t)
	cert, err := tls.LoadX509KeyPair(files.Cert, files.Key)
	if err != nil {
		t.Fatal(err)
	}
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-512", "relay", "relay-s3cret"),
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}), kfake.SeedTopics(1, "orders"))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	store, s := oneMessageOutbox(t, "ORD-1", "kafka://"+strings.Join(cluster.ListenAddrs(), ",")+"/orders")
	pendingWith(t, store, s, "ORD-1", "TLS missing")
	pendingWith(t, store, s, "ORD-1", "certificate signed by unknown authority", "--kafka-tls")
	pendingWith(t, store, s, "ORD-1", "SASL", "--kafka-tls-ca", files.CA)
	t.Setenv("IDEM_KAFKA_PASSWORD", "relay-s3cret")
	startRelay(t, store, "--max-tries", "1000", "--kafka-tls-ca", files.CA, "--kafka-user", "relay")
	rowReaches(t, s, "ORD-1", outbox.Sent)

	pool := x509.NewCertPool()
	ca, _ := os.ReadFile(files.CA)
	pool.AppendCertsFromPEM(ca)
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.DialTLSConfig(&tls.Config{RootCAs: pool}),
		kgo.SASL(scram.Auth{User: "relay", Pass: "relay-s3cret"}.AsSha512Mechanism()),
		kgo.ConsumeTopics("orders"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	recs := cl.PollFetches(ctx).Records()
	if len(recs) != 1 || len(recs[0].Headers) != 1 || recs[0].Headers[0].Key != "Idempotency-Key" || string(recs[0].Headers[0].Value) != "ORD-1" {
		t.Fatalf("the topic holds %d records: %+v", len(recs), recs)
	}
}

// TestOutboxOrderingKeys: two messages of one ordering key, the first to a
// destination no sender takes (dead at once). The second waits — listed as
// blocked after the first — and the receiver gets nothing; once the first
// is skipped, the second is delivered.
func TestOutboxOrderingKeys(t *testing.T) {
	var got atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	store, s := sqliteOutbox(t)
	for _, args := range [][]string{
		{"outbox", "enqueue", "--store", store, "--key", "A-1", "--to", "nope://nowhere", "--data", "1", "--ordering-key", "acct-A"},
		{"outbox", "enqueue", "--store", store, "--key", "A-2", "--to", srv.URL, "--data", "2", "--ordering-key", "acct-A"},
	} {
		if out, err := run(t, args...); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	startRelay(t, store)
	rowReaches(t, s, "A-1", outbox.Dead)
	testenv.Eventually(t, 10*time.Second, "A-2 listed as blocked after A-1", func() error {
		out, err := run(t, "outbox", "ls", "--store", store, "--status", "pending")
		if err != nil || !strings.Contains(out, "blocked") || !strings.Contains(out, "after A-1") || !strings.Contains(out, "acct-A") {
			return fmt.Errorf("%v:\n%s", err, out)
		}
		return nil
	})
	if n := got.Load(); n != 0 {
		t.Fatalf("the receiver got %d requests behind a dead message", n)
	}
	if out, err := run(t, "outbox", "skip", "--store", store, "A-1", "A-2"); err == nil || !strings.Contains(out, "A-1: skipped") {
		t.Fatalf("skip of a dead and a pending message: %v\n%s", err, out)
	}
	rowReaches(t, s, "A-2", outbox.Acked)
	if row, _ := s.Get(context.Background(), "A-1"); row.Status != outbox.Skipped || got.Load() != 1 {
		t.Fatalf("A-1 %s, the receiver got %d requests", row.Status, got.Load())
	}
}

// TestRelayKill9KeepsOrder: messages of three ordering keys, sent by relay
// processes killed with SIGKILL mid-batch twice, to a slow receiver. A
// killed relay's claimed message may arrive again (after its lease, with
// its key), but no message of a key arrives before the one enqueued before
// it, nor after the one enqueued after it.
func TestRelayKill9KeepsOrder(t *testing.T) {
	for _, kind := range []string{"sqlite", "mysql"} {
		t.Run(kind, func(t *testing.T) { relayKill9KeepsOrder(t, kind) })
	}
}

func relayKill9KeepsOrder(t *testing.T, kind string) {
	var mu sync.Mutex
	arrivals := map[string][]int{} // ordering key → sequence numbers in arrival order
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var m struct {
			Account string `json:"account"`
			Seq     int    `json:"seq"`
		}
		_ = json.NewDecoder(r.Body).Decode(&m)
		mu.Lock()
		arrivals[m.Account] = append(arrivals[m.Account], m.Seq)
		mu.Unlock()
		time.Sleep(30 * time.Millisecond)
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	store, s := outboxOn(t, kind)
	ctx := context.Background()
	const perKey = 15
	accounts := []string{"acct-A", "acct-B", "acct-C"}
	for i := range perKey {
		for _, acc := range accounts {
			if err := s.Enqueue(ctx, outbox.Message{Key: fmt.Sprintf("%s-%d", acc, i), Destination: srv.URL, OrderingKey: acc,
				Payload: []byte(fmt.Sprintf(`{"account":%q,"seq":%d}`, acc, i))}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for kill := 1; kill <= 2; kill++ {
		r := startRelay(t, store)
		time.Sleep(300 * time.Millisecond)
		if err := r.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = r.Wait()
	}
	startRelay(t, store)
	testenv.Eventually(t, 60*time.Second, "every message acked", func() error {
		if pending, err := s.List(ctx, outbox.Pending, 0, 100); err != nil || len(pending) > 0 {
			return fmt.Errorf("%d pending (%v)", len(pending), err)
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	total := 0
	for _, seqs := range arrivals {
		total += len(seqs)
	}
	t.Logf("%d messages arrived in order, through %d requests", len(accounts)*perKey, total)
	for _, acc := range accounts {
		seqs := arrivals[acc]
		next := 0 // the next sequence number not yet seen
		for i, seq := range seqs {
			switch {
			case seq == next:
				next++
			case seq == next-1: // the last one again: a killed relay's send, resent after its lease
			default:
				t.Fatalf("%s: arrivals %v: %d at position %d", acc, seqs, seq, i)
			}
		}
		if next != perKey {
			t.Fatalf("%s: arrivals %v", acc, seqs)
		}
	}
}

// otlpReceiver is an OTLP endpoint — OTLP/HTTP (POST /v1/traces,
// protobuf) or OTLP/gRPC (the TraceService) — that keeps the spans it
// receives.
type otlpReceiver struct {
	coltracepb.UnimplementedTraceServiceServer
	mu       sync.Mutex
	spans    []*tracepb.Span
	endpoint string
}

func (o *otlpReceiver) keep(req *coltracepb.ExportTraceServiceRequest) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			o.spans = append(o.spans, ss.Spans...)
		}
	}
}

// Export implements the OTLP/gRPC TraceService.
func (o *otlpReceiver) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	o.keep(req)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func newOTLPReceiver(t *testing.T, protocol string) *otlpReceiver {
	o := &otlpReceiver{}
	if protocol == "grpc" {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := grpc.NewServer()
		coltracepb.RegisterTraceServiceServer(srv, o)
		go func() { _ = srv.Serve(ln) }()
		t.Cleanup(srv.Stop)
		o.endpoint = "http://" + ln.Addr().String()
		return o
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		var req coltracepb.ExportTraceServiceRequest
		if err != nil || r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" || proto.Unmarshal(body, &req) != nil {
			http.Error(w, "not an OTLP/HTTP protobuf export", http.StatusBadRequest)
			return
		}
		o.keep(&req)
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(srv.Close)
	o.endpoint = srv.URL
	return o
}

func (o *otlpReceiver) span(name string) *tracepb.Span {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, s := range o.spans {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// TestRelayExportsTraces: with OTEL_EXPORTER_OTLP_ENDPOINT set, idem relay
// exports each send as a span over OTLP (HTTP and gRPC) — the child of the
// span that enqueued the row, linked to it — and the receiver gets the send
// span's context in traceparent.
func TestRelayExportsTraces(t *testing.T) {
	for _, protocol := range []string{"http/protobuf", "grpc"} {
		t.Run(strings.ReplaceAll(protocol, "/", "-"), func(t *testing.T) { testRelayExportsTraces(t, protocol) })
	}
}

func testRelayExportsTraces(t *testing.T, protocol string) {
	otlp := newOTLPReceiver(t, protocol)
	got := make(chan string, 1)
	dest := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case got <- r.Header.Get("traceparent"):
		default:
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer dest.Close()
	store, s := sqliteOutbox(t)
	enqueued := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{0x4b, 0xf9, 1}, SpanID: trace.SpanID{0x00, 0xf0, 7}, TraceFlags: trace.FlagsSampled})
	ctx := trace.ContextWithSpanContext(context.Background(), enqueued)
	if err := s.Enqueue(ctx, outbox.Message{Key: "ORD-1", Destination: dest.URL + "/orders", Payload: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.endpoint)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
	t.Setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
	t.Setenv("OTEL_SERVICE_NAME", "relay-under-test")
	startRelay(t, store)
	rowReaches(t, s, "ORD-1", outbox.Acked)
	var header string
	select {
	case header = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the receiver got nothing")
	}
	var send *tracepb.Span
	testenv.Eventually(t, 20*time.Second, "the send span exported", func() error {
		if send = otlp.span("send " + strings.TrimPrefix(dest.URL, "http://")); send == nil {
			return errors.New("not yet")
		}
		return nil
	})
	traceID, spanID := enqueued.TraceID(), enqueued.SpanID()
	if !bytes.Equal(send.TraceId, traceID[:]) || !bytes.Equal(send.ParentSpanId, spanID[:]) {
		t.Fatalf("the send span's trace %x parent %x, want %s %s", send.TraceId, send.ParentSpanId, enqueued.TraceID(), enqueued.SpanID())
	}
	if len(send.Links) != 1 || !bytes.Equal(send.Links[0].SpanId, spanID[:]) {
		t.Fatalf("the send span's links %v", send.Links)
	}
	if want := fmt.Sprintf("00-%s-%x-01", enqueued.TraceID(), send.SpanId); header != want {
		t.Fatalf("the receiver got traceparent %q, want %q", header, want)
	}
}

// child returns a span named name whose parent is parent.
func (o *otlpReceiver) child(parent *tracepb.Span, name string) *tracepb.Span {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, s := range o.spans {
		if s.Name == name && bytes.Equal(s.ParentSpanId, parent.SpanId) {
			return s
		}
	}
	return nil
}

// TestRelaySQS: idem relay sends sqs://QUEUE-NAME rows with the region,
// credentials and endpoint of the standard AWS configuration — its
// environment here — the key in the Idempotency-Key attribute. A queue
// that does not exist yet keeps the row pending, saying so.
func TestRelaySQS(t *testing.T) {
	c := testenv.SQSClient(t) // sets AWS_ENDPOINT_URL_SQS and the rest for the relay's process
	name := testenv.RandomName("idem-relay-")
	store, s := oneMessageOutbox(t, "ORD-1", "sqs://"+name)
	pendingWith(t, store, s, "ORD-1", "does not exist")
	out, err := c.CreateQueue(context.Background(), &sqs.CreateQueueInput{QueueName: aws.String(name)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.DeleteQueue(context.Background(), &sqs.DeleteQueueInput{QueueUrl: out.QueueUrl}) })
	startRelay(t, store, "--max-tries", "1000")
	rowReaches(t, s, "ORD-1", outbox.Sent)
	got, err := c.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{QueueUrl: out.QueueUrl, MessageAttributeNames: []string{"All"}, WaitTimeSeconds: 5})
	if err != nil || len(got.Messages) != 1 || *got.Messages[0].MessageAttributes["Idempotency-Key"].StringValue != "ORD-1" {
		t.Fatalf("the queue holds %+v (%v)", got, err)
	}
}

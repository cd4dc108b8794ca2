package natssender_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/outbox"
	"github.com/idemgo/idem/outbox/natssender"
)

// TestJetStreamCluster sends 400 intents to an R3 stream on a 3-server
// JetStream cluster and kills, halfway, the server the sender is connected
// to. Every intent is retried with its key until acknowledged: the stream
// holds each exactly once (Nats-Msg-Id dedup across the failover).
func TestJetStreamCluster(t *testing.T) {
	cluster := testenv.StartNATSCluster(t, 3)
	admin, err := nats.Connect(strings.Join(cluster.URLs[1:], ","))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	js, _ := jetstream.New(admin)
	ctx := context.Background()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"ORDERS.>"}, Replicas: 3, Duplicates: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	s := natssender.New()
	defer s.Close()
	const n = 400
	retries, killedAt := 0, time.Time{}
	var recovered time.Duration
	for i := range n {
		if i == n/2 {
			cluster.Kill(t, 0)
			killedAt = time.Now()
		}
		m := &outbox.Message{Key: fmt.Sprintf("ORD-%04d", i), Destination: cluster.URLs[0] + "/ORDERS.new", Payload: []byte("order")}
		for attempt := 0; ; attempt++ {
			sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			res := s.Send(sctx, m)
			cancel()
			if res.Status == outbox.Sent {
				break
			}
			if res.Status != outbox.Pending {
				t.Fatalf("%s: %s (%v)", m.Key, res.Status, res.Err)
			}
			if time.Since(killedAt) > time.Minute {
				t.Fatalf("%s still failing a minute after the kill: %v", m.Key, res.Err)
			}
			retries++
			time.Sleep(100 * time.Millisecond) // the relay's backoff
		}
		if i == n/2 {
			recovered = time.Since(killedAt)
		}
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		id := m.Header.Get(nats.MsgIdHdr)
		if seen[id] {
			t.Fatalf("%s stored twice", id)
		}
		seen[id] = true
	}
	if len(seen) != n || info.State.Msgs != n {
		t.Fatalf("the stream holds %d messages (%d keys), want %d", info.State.Msgs, len(seen), n)
	}
	t.Logf("R3 stream, the sender's server killed at message %d: %d retries, the first send after the kill took %v; %d messages, each once",
		n/2, retries, recovered.Round(time.Millisecond), n)
}

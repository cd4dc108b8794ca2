package natsidem_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/broker"
	"github.com/idemgo/idem/broker/natsidem"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store/memstore"
)

// TestJetStreamCluster consumes an R3 stream on a 3-server JetStream
// cluster through natsidem while the server the consumer is connected to
// is killed: 300 intents, each published twice (new broker ids), each
// processed exactly once.
func TestJetStreamCluster(t *testing.T) {
	cluster := testenv.StartNATSCluster(t, 3)
	pubConn, err := nats.Connect(strings.Join(cluster.URLs[1:], ","))
	if err != nil {
		t.Fatal(err)
	}
	defer pubConn.Close()
	pub, _ := jetstream.New(pubConn)
	ctx := context.Background()
	if _, err := pub.CreateStream(ctx, jetstream.StreamConfig{Name: "PAY", Subjects: []string{"PAY.>"}, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := pub.CreateOrUpdateConsumer(ctx, "PAY", jetstream.ConsumerConfig{Durable: "worker", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 2 * time.Second, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	// The consumer connects to server 0 first (and learns the others).
	subConn, err := nats.Connect(cluster.URLs[0], nats.ReconnectWait(100*time.Millisecond), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	defer subConn.Close()
	sub, _ := jetstream.New(subConn)
	store := memstore.New(memstore.Config{})
	defer store.Close()
	g, err := idem.NewGuard(idem.Config{Store: store, Lease: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	const n = 300
	var mu sync.Mutex
	runs := map[string]int{}
	acked := make(chan string, 4*n)
	h, err := natsidem.GuardHandler(g, natsidem.Config{Scope: "pay", Key: broker.HeaderKey("correlation_id"),
		Policy: broker.Policy{InProgressDelay: 200 * time.Millisecond, BackoffMin: 50 * time.Millisecond, BackoffMax: 200 * time.Millisecond},
		OnDecision: func(msg jetstream.Msg, d broker.Decision) {
			if d.Verdict == broker.Ack {
				acked <- msg.Headers().Get(nats.MsgIdHdr)
			}
		}},
		func(ctx context.Context, msg jetstream.Msg, fence uint64) ([]byte, error) {
			mu.Lock()
			runs[msg.Headers().Get("correlation_id")]++
			mu.Unlock()
			return nil, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := sub.Consumer(ctx, "PAY", "worker")
	if err != nil {
		t.Fatal(err)
	}
	cc, err := cons.Consume(h)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	publish := func(i, copy int) {
		m := nats.NewMsg("PAY.in")
		m.Header.Set("correlation_id", fmt.Sprintf("PAY-%04d", i))
		m.Header.Set(nats.MsgIdHdr, fmt.Sprintf("broker-%d-%d", i, copy))
		for {
			pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			_, err := pub.PublishMsg(pctx, m)
			cancel()
			if err == nil {
				return
			}
			time.Sleep(100 * time.Millisecond) // the producer's retry during the election
		}
	}
	for i := range n {
		publish(i, 0)
	}
	distinct := map[string]bool{} // broker ids acked
	waitAcks := func(want int) {
		deadline := time.After(60 * time.Second)
		for len(distinct) < want {
			select {
			case k := <-acked:
				distinct[k] = true
			case <-deadline:
				t.Fatalf("%d of %d intents acked", len(distinct), want)
			}
		}
	}
	waitAcks(n / 3)
	cluster.Kill(t, 0) // the consumer's server, mid-consumption
	for i := range n {
		publish(i, 1) // every intent again, with a new broker id
	}
	waitAcks(2 * n) // every copy acked: the first processed, the second replayed
	mu.Lock()
	defer mu.Unlock()
	for k, r := range runs {
		if r != 1 {
			t.Fatalf("%s processed %d times", k, r)
		}
	}
	if len(runs) != n {
		t.Fatalf("%d intents processed, want %d", len(runs), n)
	}
}

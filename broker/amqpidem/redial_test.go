package amqpidem_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/broker"
	"github.com/idemgo/idem/broker/amqpidem"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/outbox"
	"github.com/idemgo/idem/outbox/amqpsender"
	"github.com/idemgo/idem/store/memstore"
)

// TestConsumerOutlivesABrokerCrash: RabbitMQ is killed with SIGKILL and
// started again while a ConsumeRedialing consumer runs; the consumer opens
// a new connection, declares its queue again and goes on — every message,
// published before and after the crash, is handled, each key's work run
// once. (Consume alone returns when its channel closes: a consumer built on
// it ends with the broker.)
func TestConsumerOutlivesABrokerCrash(t *testing.T) {
	r := testenv.StartRabbitMQ(t)
	const q, n = "orders", 60
	s := memstore.New(memstore.Config{})
	defer s.Close()
	g, _ := idem.NewGuard(idem.Config{Store: s})
	var mu sync.Mutex
	runs := map[string]int{}
	half, all := make(chan struct{}), make(chan struct{})
	h, err := amqpidem.GuardHandler(g, amqpidem.Config{Scope: "orders", Key: amqpidem.MessageIDKey,
		Policy: broker.Policy{BackoffMin: 20 * time.Millisecond, BackoffMax: 50 * time.Millisecond}, Concurrency: 4},
		func(ctx context.Context, d *amqp.Delivery, fence uint64) ([]byte, error) {
			mu.Lock()
			defer mu.Unlock()
			runs[d.MessageId]++
			switch len(runs) {
			case n / 2:
				if runs[d.MessageId] == 1 {
					close(half)
				}
			case n:
				if runs[d.MessageId] == 1 {
					close(all)
				}
			}
			return nil, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	var closes sync.Mutex
	var reasons []string
	ctx, stop := context.WithCancel(context.Background())
	consumed := make(chan error, 1)
	go func() {
		consumed <- amqpidem.ConsumeRedialing(ctx, amqpidem.Redialing{
			URL: r.URL,
			Setup: func(ch *amqp.Channel) error {
				if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
					return err
				}
				return ch.Qos(8, 0, false)
			},
			OnError: func(err error) {
				closes.Lock()
				defer closes.Unlock()
				reasons = append(reasons, err.Error())
			},
		}, q, "", h)
	}()

	sender := amqpsender.New(amqp.Config{})
	defer sender.Close()
	send := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			m := &outbox.Message{Key: fmt.Sprintf("ORD-%d", i), Destination: r.URL + "?routing_key=" + q, Payload: []byte("order")}
			testenv.Eventually(t, 30*time.Second, "the broker confirms "+m.Key, func() error {
				if res := sender.Send(context.Background(), m); res.Status != outbox.Sent {
					return fmt.Errorf("%s: %v", res.Status, res.Err)
				}
				return nil
			})
		}
	}
	send(0, n/2)
	<-half
	r.Crash(t)
	send(n/2, n)
	select {
	case <-all:
	case <-time.After(60 * time.Second):
		mu.Lock()
		t.Fatalf("after the crash: %d of %d keys handled", len(runs), n)
	}
	stop()
	if err := <-consumed; err != nil {
		t.Fatalf("ConsumeRedialing returned %v when its context ended, want nil", err)
	}
	mu.Lock()
	defer mu.Unlock()
	for k, c := range runs {
		if c != 1 {
			t.Errorf("%s ran %d times", k, c)
		}
	}
	closes.Lock()
	defer closes.Unlock()
	if len(reasons) == 0 {
		t.Error("OnError heard nothing of the crash")
	}
	t.Logf("the consumer heard: %q", reasons)
}

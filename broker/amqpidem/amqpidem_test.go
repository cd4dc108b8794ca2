package amqpidem_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/broker"
	"github.com/idemgo/idem/broker/amqpidem"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/store/memstore"
)

// queue declares a queue dead-lettering into queue+".dead" and returns a
// channel to publish on and one to consume from.
func queue(t *testing.T) (*amqp.Channel, *amqp.Channel, string) {
	t.Helper()
	conn, err := amqp.DialConfig(testenv.AMQPURL, amqp.Config{Dial: amqp.DefaultDial(3 * time.Second)})
	testenv.Need(t, "RabbitMQ", testenv.AMQPURL, err)
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	name := testenv.RandomName("idemtest.")
	if _, err := ch.QueueDeclare(name+".dead", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(name, false, true, false, false, amqp.Table{
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": name + ".dead",
	}); err != nil {
		t.Fatal(err)
	}
	consume, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := consume.Qos(10, 0, false); err != nil {
		t.Fatal(err)
	}
	return ch, consume, name
}

func publish(t *testing.T, ch *amqp.Channel, q, msgID, corr, body string) {
	t.Helper()
	if err := ch.PublishWithContext(context.Background(), "", q, false, false, amqp.Publishing{
		MessageId: msgID, CorrelationId: corr, Body: []byte(body),
	}); err != nil {
		t.Fatal(err)
	}
}

func TestAMQPAdapter(t *testing.T) {
	ch, consumeCh, q := queue(t)
	s := memstore.New(memstore.Config{})
	defer s.Close()
	g, _ := idem.NewGuard(idem.Config{Store: s, MaxAttempts: 3})
	var mu sync.Mutex
	runs := map[string]int{}
	decisions := make(chan string, 100)
	h, err := amqpidem.GuardHandler(g, amqpidem.Config{
		Scope: "credits", Key: amqpidem.CorrelationIDKey,
		Policy: broker.Policy{BackoffMin: 20 * time.Millisecond, BackoffMax: 50 * time.Millisecond},
		OnDecision: func(d *amqp.Delivery, dec broker.Decision) {
			decisions <- d.CorrelationId + " " + dec.Verdict.String()
		},
	}, func(ctx context.Context, d *amqp.Delivery, fence uint64) ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		runs[d.CorrelationId]++
		switch {
		case d.CorrelationId == "flaky" && runs["flaky"] == 1:
			return nil, errors.New("timeout")
		case d.CorrelationId == "broken":
			return nil, errors.New("always")
		}
		return nil, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	consumeErr := make(chan error, 1)
	go func() { consumeErr <- amqpidem.Consume(ctx, consumeCh, q, "", h) }()
	for i := range 5 {
		publish(t, ch, q, fmt.Sprint("m-", i), "PAY-1", "credit 100")
	}
	publish(t, ch, q, "m-f", "flaky", "x")
	publish(t, ch, q, "m-b", "broken", "y")
	// Wait for: 5 acks of PAY-1, flaky retried then acked, broken dead-lettered.
	want := map[string]bool{"PAY-1 ack": false, "flaky ack": false, "broken dead-letter": false}
	deadline := time.After(20 * time.Second)
	acks := 0
	for !(want["PAY-1 ack"] && want["flaky ack"] && want["broken dead-letter"] && acks == 5) {
		select {
		case d := <-decisions:
			if d == "PAY-1 ack" {
				acks++
			}
			want[d] = true
		case err := <-consumeErr:
			t.Fatalf("Consume ended: %v", err)
		case <-deadline:
			t.Fatalf("decisions so far: %v, PAY-1 acks %d", want, acks)
		}
	}
	mu.Lock()
	if runs["PAY-1"] != 1 || runs["flaky"] != 2 || runs["broken"] != 3 {
		t.Errorf("runs %v", runs)
	}
	mu.Unlock()
	// The broker routes the rejected message to the dead-letter queue
	// asynchronously.
	var dl amqp.Delivery
	var ok bool
	for end := time.Now().Add(5 * time.Second); !ok && err == nil && time.Now().Before(end); {
		if dl, ok, err = ch.Get(q+".dead", true); !ok {
			time.Sleep(20 * time.Millisecond)
		}
	}
	if err != nil || !ok || dl.CorrelationId != "broken" {
		t.Fatalf("dead-letter queue: %v %v %q", ok, err, dl.CorrelationId)
	}
}

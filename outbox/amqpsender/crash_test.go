package amqpsender_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemgo/idem/broker/amqpidem"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/outbox"
	"github.com/idemgo/idem/outbox/amqpsender"
)

// TestConfirmedSurvivesBrokerCrash measures what the relay's guarantee
// rests on: a message the broker confirmed is in the queue, or was handed
// to a consumer that acknowledged it, after the node is killed with
// SIGKILL and started again — for each queue type the guides name. Eight
// senders publish through the outbox's sender while a consumer takes the
// queue's messages (acknowledging each after it noted it) and the node is
// crashed three times; then every key a send reported Sent must have been
// consumed.
func TestConfirmedSurvivesBrokerCrash(t *testing.T) {
	for _, queueType := range []string{"classic", "quorum"} {
		t.Run(queueType, func(t *testing.T) { confirmedSurvivesCrash(t, queueType) })
	}
}

func confirmedSurvivesCrash(t *testing.T, queueType string) {
	srv := testenv.StartRabbitMQ(t)
	queue := testenv.RandomName("idemcrash.")
	declare := func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": queueType})
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var mu sync.Mutex
	consumed := map[string]bool{}
	var consuming sync.WaitGroup
	consuming.Go(func() {
		_ = amqpidem.ConsumeRedialing(ctx, amqpidem.Redialing{URL: srv.URL, PauseMax: 200 * time.Millisecond,
			Setup: func(ch *amqp.Channel) error {
				if err := declare(ch); err != nil {
					return err
				}
				return ch.Qos(64, 0, false)
			}}, queue, "", func(d amqp.Delivery) {
			mu.Lock()
			consumed[d.MessageId] = true
			mu.Unlock()
			_ = d.Ack(false)
		})
	})
	// The queue exists before the first send (the consumer declares it).
	for {
		conn, err := amqp.Dial(srv.URL)
		if err == nil {
			ch, _ := conn.Channel()
			_, err = ch.QueueDeclarePassive(queue, true, false, false, false, amqp.Table{"x-queue-type": queueType})
			conn.Close()
		}
		if err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}

	sender := amqpsender.New(amqp.Config{})
	defer sender.Close()
	dest := srv.URL + "?routing_key=" + queue
	var sentMu sync.Mutex
	var sent []string
	var attempts, refused atomic.Int64
	stop := make(chan struct{})
	var senders sync.WaitGroup
	for g := range 8 {
		senders.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("K-%d-%d", g, n)
				for { // as the relay does: the same key until it is sent
					sctx, scancel := context.WithTimeout(ctx, 2*time.Second)
					res := sender.Send(sctx, &outbox.Message{Key: key, Destination: dest, Payload: []byte(key)})
					scancel()
					attempts.Add(1)
					if res.Status == outbox.Sent {
						sentMu.Lock()
						sent = append(sent, key)
						sentMu.Unlock()
						break
					}
					refused.Add(1)
					select {
					case <-stop:
						return
					case <-time.After(20 * time.Millisecond):
					}
				}
			}
		})
	}
	countSent := func() int {
		sentMu.Lock()
		defer sentMu.Unlock()
		return len(sent)
	}
	for range 3 {
		for start := countSent(); countSent() < start+2000; {
			time.Sleep(10 * time.Millisecond)
		}
		srv.Crash(t)
	}
	for start := countSent(); countSent() < start+2000; {
		time.Sleep(10 * time.Millisecond)
	}
	close(stop)
	senders.Wait()

	// Every confirmed message comes to the consumer.
	deadline := time.Now().Add(time.Minute)
	var missing []string
	for {
		missing = missing[:0]
		mu.Lock()
		for _, key := range sent {
			if !consumed[key] {
				missing = append(missing, key)
			}
		}
		mu.Unlock()
		if len(missing) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("%s queue: %d messages confirmed in %d sends (%d not confirmed, sent again), 3 crashes; %d confirmed and never consumed",
		queueType, len(sent), attempts.Load(), refused.Load(), len(missing))
	if len(missing) > 0 {
		t.Errorf("%d confirmed messages lost in the crashes of the node, e.g. %v", len(missing), missing[:min(10, len(missing))])
	}
}

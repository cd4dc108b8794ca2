package main

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/broker"
	"github.com/idemgo/idem/broker/amqpidem"
	"github.com/idemgo/idem/store/memstore"
)

// benchAMQP runs the same comparison on RabbitMQ: a fresh queue of n
// messages per configuration, consumed with manual acks, prefetch 256.
func benchAMQP(url string, n int) {
	conn, err := amqp.Dial(url)
	check(err)
	defer conn.Close()
	run := func(name string, handler func(done func()) func(amqp.Delivery)) float64 {
		ch, err := conn.Channel()
		check(err)
		defer ch.Close()
		q := "consumebench." + name
		_, _ = ch.QueueDelete(q, false, false, false)
		_, err = ch.QueueDeclare(q, false, false, false, false, nil)
		check(err)
		defer ch.QueueDelete(q, false, false, false)
		check(ch.Confirm(false))
		for i := range n {
			id := "PAY-" + strconv.Itoa(i)
			_, err := ch.PublishWithDeferredConfirm("", q, false, false, amqp.Publishing{
				Headers: amqp.Table{"correlation_id": id}, Body: []byte(`{"correlation_id":"` + id + `"}`)})
			check(err)
		}
		// Wait until the queue holds them all.
		for {
			qi, err := ch.QueueDeclarePassive(q, false, false, false, false, nil)
			check(err)
			if qi.Messages >= n {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		cch, err := conn.Channel()
		check(err)
		defer cch.Close()
		check(cch.Qos(256, 0, false))
		var count atomic.Int64
		finished := make(chan struct{})
		done := func() {
			if count.Add(1) == int64(n) {
				close(finished)
			}
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		start := time.Now()
		go func() { _ = amqpidem.Consume(ctx, cch, q, "", handler(done)) }()
		<-finished
		return float64(n) / time.Since(start).Seconds()
	}
	bare := run("bare", func(done func()) func(amqp.Delivery) {
		return func(d amqp.Delivery) { _ = d.Ack(false); done() }
	})
	fmt.Printf("== %d messages, RabbitMQ at %s\n", n, url)
	fmt.Printf("%-62s %8.0f msg/s  1.00\n", "bare RabbitMQ, manual ack", bare)
	for _, conc := range []int{1, 8} {
		r := run(fmt.Sprintf("idem%d", conc), func(done func()) func(amqp.Delivery) {
			g, err := idem.NewGuard(idem.Config{Store: memstore.New(memstore.Config{})})
			check(err)
			h, err := amqpidem.GuardHandler(g, amqpidem.Config{Scope: "bench", Key: broker.HeaderKey("correlation_id"), Concurrency: conc,
				OnDecision: func(*amqp.Delivery, broker.Decision) { done() }},
				func(ctx context.Context, d *amqp.Delivery, fence uint64) ([]byte, error) { return nil, nil })
			check(err)
			return h
		})
		fmt.Printf("%-62s %8.0f msg/s  %.2f of bare\n", fmt.Sprintf("amqpidem+memstore, %d at once", conc), r, r/bare)
	}
}

// Command consumebench measures JetStream consumption through natsidem
// next to bare consumption, in one run: the same 20,000 messages on one
// durable pull consumer, each configuration from a fresh stream.
//
//	(cd scripts && go run ./consumebench -n 20000)
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/broker"
	"github.com/idemgo/idem/broker/natsidem"
	"github.com/idemgo/idem/store/memstore"
)

func main() {
	n := flag.Int("n", 20000, "messages per run")
	url := flag.String("nats", "nats://127.0.0.1:4222", "NATS URL")
	flag.Parse()
	nc, err := nats.Connect(*url)
	check(err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	check(err)
	ctx := context.Background()

	// run consumes n messages of a fresh stream with handler(acked) and
	// returns messages per second.
	run := func(name string, handler func(done func()) jetstream.MessageHandler) float64 {
		stream := "CONSUMEBENCH_" + name
		_ = js.DeleteStream(ctx, stream)
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{stream + ".>"}})
		check(err)
		defer js.DeleteStream(ctx, stream)
		for i := range *n {
			m := nats.NewMsg(stream + ".in")
			m.Data = []byte(`{"correlation_id":"PAY-` + strconv.Itoa(i) + `","amount":100}`)
			m.Header.Set("correlation_id", "PAY-"+strconv.Itoa(i))
			_, err := js.PublishMsgAsync(m)
			check(err)
		}
		<-js.PublishAsyncComplete()
		cons, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "bench", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 1000})
		check(err)
		var count atomic.Int64
		finished := make(chan struct{})
		done := func() {
			if count.Add(1) == int64(*n) {
				close(finished)
			}
		}
		start := time.Now()
		cc, err := cons.Consume(handler(done))
		check(err)
		select {
		case <-finished:
		case <-time.After(5 * time.Minute):
			log.Fatalf("%s: %d of %d consumed", name, count.Load(), *n)
		}
		elapsed := time.Since(start)
		cc.Stop()
		return float64(*n) / elapsed.Seconds()
	}

	guarded := func(concurrency int, confirm bool) func(done func()) jetstream.MessageHandler {
		return func(done func()) jetstream.MessageHandler {
			s := memstore.New(memstore.Config{})
			g, err := idem.NewGuard(idem.Config{Store: s})
			check(err)
			h, err := natsidem.GuardHandler(g, natsidem.Config{Scope: "bench", Key: broker.HeaderKey("correlation_id"),
				Concurrency: concurrency, ConfirmAcks: confirm,
				OnDecision: func(jetstream.Msg, broker.Decision) { done() }},
				func(ctx context.Context, msg jetstream.Msg, fence uint64) ([]byte, error) { return nil, nil })
			check(err)
			return h
		}
	}
	bare := run("bare", func(done func()) jetstream.MessageHandler {
		return func(msg jetstream.Msg) { _ = msg.Ack(); done() }
	})
	fmt.Printf("== %d messages, one durable pull consumer, NATS at %s\n", *n, *url)
	fmt.Printf("bare JetStream, plain ack                 %8.0f msg/s  1.00\n", bare)
	for _, c := range []struct {
		name        string
		concurrency int
		confirm     bool
	}{
		{"natsidem+memstore, confirmed acks, 1 at once (the old default)", 1, true},
		{"natsidem+memstore, plain acks, 1 at once", 1, false},
		{"natsidem+memstore, plain acks, 8 at once", 8, false},
	} {
		r := run(fmt.Sprintf("idem%d%v", c.concurrency, c.confirm), guarded(c.concurrency, c.confirm))
		fmt.Printf("%-62s %8.0f msg/s  %.2f of bare\n", c.name, r, r/bare)
	}
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}

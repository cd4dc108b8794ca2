// Command consumebench measures consumption through natsidem, amqpidem and
// kafkaidem next to bare consumption, in one run: the same 20,000 messages
// on one durable pull consumer (JetStream), one queue (RabbitMQ) or one
// consumer group of a topic of eight partitions (Kafka), each configuration
// from a fresh stream, queue or topic. With -sqs, the same on an Amazon SQS
// queue (an emulator's endpoint: fauxqs, started as internal/testenv
// starts it), sqsidem next to a bare receive-and-delete loop.
//
//	(cd scripts && go run ./consumebench -n 20000)
//	(cd scripts && go run ./consumebench -sections sqs -sqs http://127.0.0.1:4566 -n 5000)
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/broker"
	"github.com/idemgo/idem/broker/natsidem"
	"github.com/idemgo/idem/scripts/internal/proccpu"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/memstore"
	"github.com/idemgo/idem/store/storeurl"
)

func main() {
	n := flag.Int("n", 20000, "messages per run")
	url := flag.String("nats", "nats://127.0.0.1:4222", "NATS URL")
	redisURL := flag.String("redis", "redis://127.0.0.1:6379/0", "Redis URL (the Redis runs)")
	pgURL := flag.String("postgres", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL URL (the inbox runs; \"\" skips them)")
	amqpURL := flag.String("amqp", "amqp://guest:guest@127.0.0.1:5672/", "RabbitMQ URL (\"\" skips it)")
	redisWorkers := flag.Int("redis-workers", 8, "consumers at once in the Redis runs (natsidem and the bare lifecycles alike)")
	sections := flag.String("sections", "guard,inbox,amqp,kafka,sqs", "what to run: guard (natsidem over a Guard), inbox (PostgreSQL), amqp, kafka, sqs (with -sqs)")
	sqsEndpoint := flag.String("sqs", "", "SQS endpoint, http://HOST:PORT (\"\" skips the sqs section); region and credentials from the standard AWS configuration")
	sqsWorkers := flag.Int("sqs-workers", 8, "messages at once in the SQS runs (sqsidem's Concurrency, the bare loop's receivers)")
	kafkaBrokers := flag.String("kafka", "", "Kafka seed brokers, host:port[,…] (\"\": a kfake cluster in this process)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		check(err)
		check(pprof.StartCPUProfile(f))
		defer pprof.StopCPUProfile()
	}
	want := func(section string) bool { return slices.Contains(strings.Split(*sections, ","), section) }
	nc, err := nats.Connect(*url)
	check(err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	check(err)
	ctx := context.Background()

	run := func(name string, handler func(done func()) jetstream.MessageHandler) float64 {
		return runJS(ctx, js, *n, name, func(done func()) (jetstream.MessageHandler, func()) { return handler(done), func() {} })
	}

	openRedis := func() store.Store {
		s, err := storeurl.Open(ctx, *redisURL+"?pool_size=64&idem_prefix="+fmt.Sprintf("consumebench%d:", time.Now().UnixNano()), nil)
		check(err)
		return s
	}
	if want("guard") {
		benchGuard(ctx, js, *n, *url, openRedis, *redisWorkers, run)
	}
	if want("kafka") {
		benchKafka(ctx, *n, *kafkaBrokers, *redisWorkers, openRedis)
	}
	if *pgURL != "" && want("inbox") {
		benchInbox(ctx, js, *n, *pgURL)
	}
	if *amqpURL != "" && want("amqp") {
		benchAMQP(*amqpURL, *n)
	}
	if *sqsEndpoint != "" && want("sqs") {
		benchSQS(ctx, *sqsEndpoint, *n, *sqsWorkers)
	}
}

// benchRetention is how long the records the Redis runs write stay in the
// server: long enough for the run, short enough not to weigh on the next
// runs' figures (a shared Redis full of old records is a slower Redis).
const benchRetention = 5 * time.Minute

// benchGuard: bare JetStream consumption, natsidem over a Guard on the
// memory store (confirmed and plain acks, 1 and 8 at once) and on Redis
// (against the store's own lifecycles at 8 workers).
func benchGuard(ctx context.Context, js jetstream.JetStream, n int, url string, openRedis func() store.Store, redisWorkers int, run func(string, func(func()) jetstream.MessageHandler) float64) {
	guarded := func(concurrency int, confirm bool, open func() store.Store) func(done func()) jetstream.MessageHandler {
		return func(done func()) jetstream.MessageHandler {
			s := open()
			g, err := idem.NewGuard(idem.Config{Store: s, Retention: benchRetention})
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
	fmt.Printf("== %d messages, one durable pull consumer, NATS at %s\n", n, url)
	fmt.Printf("bare JetStream, plain ack                 %8.0f msg/s  1.00\n", bare)
	fmt.Printf("  %s\n", cpu["bare"])
	mem := func() store.Store { return memstore.New(memstore.Config{}) }
	for _, c := range []struct {
		name        string
		concurrency int
		confirm     bool
	}{
		{"natsidem+memstore, confirmed acks, 1 at once (the old default)", 1, true},
		{"natsidem+memstore, plain acks, 1 at once", 1, false},
		{"natsidem+memstore, plain acks, 8 at once", 8, false},
	} {
		r := run(fmt.Sprintf("idem%d%v", c.concurrency, c.confirm), guarded(c.concurrency, c.confirm, mem))
		fmt.Printf("%-62s %8.0f msg/s  %.2f of bare\n", c.name, r, r/bare)
		fmt.Printf("  %s\n", cpu[fmt.Sprintf("idem%d%v", c.concurrency, c.confirm)])
	}
	// Redis: natsidem at 8 against the store's own lifecycles at 8 workers.
	viaNATS := run("redis8", guarded(redisWorkers, false, openRedis))
	raw, rawCPU := redisLifecycles(ctx, openRedis(), redisWorkers)
	fmt.Printf("%-62s %8.0f msg/s  %.2f of bare\n", fmt.Sprintf("natsidem+redis, plain acks, %d at once", redisWorkers), viaNATS, viaNATS/bare)
	fmt.Printf("  %s\n", cpu["redis8"])
	fmt.Printf("%-62s %8.0f /s     natsidem+redis is %.2f of it\n", fmt.Sprintf("redis lifecycles (Acquire+Complete), %d workers, no broker", redisWorkers), raw, viaNATS/raw)
	fmt.Printf("  lifecycles: %s\n", rawCPU)
}

// redisLifecycles runs Acquire+Complete on s with workers goroutines for
// five seconds, as idem bench does, and returns lifecycles per second and
// the CPU per lifecycle.
func redisLifecycles(ctx context.Context, s store.Store, workers int) (float64, string) {
	cpu1 := proccpu.Seconds()
	var lifecycles atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Since(start) < 5*time.Second; i++ {
				k := fmt.Sprintf("w%d-%d", w, i)
				a, err := s.Acquire(ctx, store.AcquireRequest{Key: k, Lease: time.Minute, Retention: benchRetention})
				check(err)
				check(s.Complete(ctx, k, a.Fence, nil, benchRetention))
				lifecycles.Add(1)
			}
		}()
	}
	wg.Wait()
	raw := float64(lifecycles.Load()) / time.Since(start).Seconds()
	return raw, proccpu.PerMessage(cpu1, proccpu.Seconds(), float64(lifecycles.Load()))
}

// runJS consumes n messages of a fresh stream with the handler made by
// open (which also returns what to call once the subscription stopped) and
// returns messages per second.
// cpu holds each run's CPU per message, by run name.
var cpu = map[string]string{}

func runJS(ctx context.Context, js jetstream.JetStream, n int, name string, open func(done func()) (jetstream.MessageHandler, func())) float64 {
	stream := "CONSUMEBENCH_" + name
	_ = js.DeleteStream(ctx, stream)
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{stream + ".>"}})
	check(err)
	defer js.DeleteStream(ctx, stream)
	for i := range n {
		m := nats.NewMsg(stream + ".in")
		m.Data = []byte(`{"correlation_id":"PAY-` + strconv.Itoa(i) + `","account":"ACC-` + strconv.Itoa(i%10000) + `","amount_cents":100}`)
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
		if count.Add(1) == int64(n) {
			close(finished)
		}
	}
	handler, closeHandler := open(done)
	cpu0 := proccpu.Seconds()
	start := time.Now()
	// What the subscription reports (missed heartbeats, status messages)
	// is printed: a stall in a run is then explained, not only timed.
	cc, err := cons.Consume(handler, jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		fmt.Fprintf(os.Stderr, "  %s: consume at %v (%d consumed): %v\n", name, time.Since(start).Round(time.Millisecond), count.Load(), err)
	}))
	check(err)
	select {
	case <-finished:
	case <-time.After(5 * time.Minute):
		log.Fatalf("%s: %d of %d consumed", name, count.Load(), n)
	}
	elapsed := time.Since(start)
	cpu[name] = proccpu.PerMessage(cpu0, proccpu.Seconds(), float64(n))
	cc.Stop()
	closeHandler()
	return float64(n) / elapsed.Seconds()
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}

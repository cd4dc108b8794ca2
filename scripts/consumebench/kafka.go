package main

import (
	"context"
	"fmt"
	"log"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/broker"
	"github.com/idemgo/idem/broker/kafkaidem"
	"github.com/idemgo/idem/scripts/internal/proccpu"
	"github.com/idemgo/idem/store"
	"github.com/idemgo/idem/store/memstore"
)

// kafkaPartitions is how many partitions each run's topic has, and how many
// records kafkaidem runs at once.
const kafkaPartitions = 8

// benchKafka: a bare franz-go group consumer that commits after each poll,
// next to kafkaidem over a Guard on the memory store and on Redis, each
// from a fresh topic holding the same n records; with brokers "" on a kfake
// cluster in this process. The rate counts from the group's assignment of
// the partitions to the last record consumed, so the join is not in it.
func benchKafka(ctx context.Context, n int, brokers string, redisWorkers int, openRedis func() store.Store) {
	seeds := strings.Split(brokers, ",")
	where := brokers
	if brokers == "" {
		c, err := kfake.NewCluster(kfake.NumBrokers(1))
		check(err)
		defer c.Close()
		seeds, where = c.ListenAddrs(), "a kfake cluster in this process"
	}
	admin, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	check(err)
	defer admin.Close()
	adm := kadm.NewClient(admin)
	run := func(name string, consume func(topic string, assigned kgo.Opt, done func()) (stop func())) (float64, string) {
		topic := fmt.Sprintf("consumebench-%s-%d", name, time.Now().UnixNano())
		resp, err := adm.CreateTopic(ctx, kafkaPartitions, 1, nil, topic)
		if err == nil {
			err = resp.Err
		}
		check(err)
		defer adm.DeleteTopics(ctx, topic)
		var wg sync.WaitGroup
		for i := range n {
			id := "PAY-" + strconv.Itoa(i)
			wg.Add(1)
			admin.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte(id),
				Value:   []byte(`{"correlation_id":"` + id + `","account":"ACC-` + strconv.Itoa(i%10000) + `","amount_cents":100}`),
				Headers: []kgo.RecordHeader{{Key: kafkaidem.KeyHeader, Value: []byte(id)}}},
				func(_ *kgo.Record, err error) { check(err); wg.Done() })
		}
		wg.Wait()
		var count atomic.Int64
		var start time.Time
		var cpu0 map[string]float64
		var once sync.Once
		finished := make(chan struct{})
		assigned := kgo.OnPartitionsAssigned(func(context.Context, *kgo.Client, map[string][]int32) {
			once.Do(func() { start, cpu0 = time.Now(), proccpu.Seconds() })
		})
		stop := consume(topic, assigned, func() {
			if count.Add(1) == int64(n) {
				close(finished)
			}
		})
		defer stop()
		select {
		case <-finished:
		case <-time.After(5 * time.Minute):
			log.Fatalf("%s: %d of %d consumed", name, count.Load(), n)
		}
		elapsed := time.Since(start)
		return float64(n) / elapsed.Seconds(), proccpu.PerMessage(cpu0, proccpu.Seconds(), float64(n))
	}
	group := func(topic string) []kgo.Opt {
		return []kgo.Opt{kgo.SeedBrokers(seeds...), kgo.ConsumerGroup(topic), kgo.ConsumeTopics(topic),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}
	}
	bare, bareCPU := run("bare", func(topic string, assigned kgo.Opt, done func()) func() {
		cl, err := kgo.NewClient(append(group(topic), kgo.DisableAutoCommit(), assigned)...)
		check(err)
		ctx, cancel := context.WithCancel(ctx)
		go func() {
			for ctx.Err() == nil {
				fs := cl.PollFetches(ctx)
				fs.EachRecord(func(*kgo.Record) { done() })
				if err := cl.CommitUncommittedOffsets(ctx); err != nil && ctx.Err() == nil {
					log.Fatal(err)
				}
			}
		}()
		return func() { cancel(); cl.Close() }
	})
	guarded := func(s store.Store, concurrency int) func(string, kgo.Opt, func()) func() {
		return func(topic string, assigned kgo.Opt, done func()) func() {
			g, err := idem.NewGuard(idem.Config{Store: s, Retention: benchRetention})
			check(err)
			c, err := kafkaidem.GuardConsumer(g, kafkaidem.Config{Scope: "bench", Concurrency: concurrency, ClientOptions: append(group(topic), assigned),
				OnDecision: func(*kgo.Record, broker.Decision) { done() }},
				func(context.Context, *kgo.Record, uint64) ([]byte, error) { return nil, nil })
			check(err)
			ctx, cancel := context.WithCancel(ctx)
			ran := make(chan struct{})
			go func() { check(c.Run(ctx)); close(ran) }()
			return func() { cancel(); <-ran }
		}
	}
	fmt.Printf("== %d records, %d partitions, Kafka at %s\n", n, kafkaPartitions, where)
	fmt.Printf("%-62s %8.0f rec/s  1.00\n", "bare franz-go, commit after each poll", bare)
	fmt.Printf("  %s\n", bareCPU)
	mem, memCPU := run("memstore", guarded(memstore.New(memstore.Config{}), kafkaPartitions))
	fmt.Printf("%-62s %8.0f rec/s  %.2f of bare\n", fmt.Sprintf("kafkaidem+memstore, %d at once", kafkaPartitions), mem, mem/bare)
	fmt.Printf("  %s\n", memCPU)
	viaKafka, redisCPU := run("redis", guarded(openRedis(), redisWorkers))
	raw, rawCPU := redisLifecycles(ctx, openRedis(), redisWorkers)
	fmt.Printf("%-62s %8.0f rec/s  %.2f of bare\n", fmt.Sprintf("kafkaidem+redis, %d at once", redisWorkers), viaKafka, viaKafka/bare)
	fmt.Printf("  %s\n", redisCPU)
	fmt.Printf("%-62s %8.0f /s     kafkaidem+redis is %.2f of it\n", fmt.Sprintf("redis lifecycles (Acquire+Complete), %d workers, no broker", redisWorkers), raw, viaKafka/raw)
	fmt.Printf("  lifecycles: %s\n", rawCPU)
}

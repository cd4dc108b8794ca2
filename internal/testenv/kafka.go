package testenv

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Environment naming the Kafka cluster the tests use. With
// IDEM_KAFKA_BROKERS unset, the first test that asks starts a cluster of
// franz-go's kfake in its process and sets both variables, so the helper
// processes it starts (and kills) reach that same cluster.
const (
	envKafkaBrokers = "IDEM_KAFKA_BROKERS"      // host:port[,host:port…]
	envKafkaFake    = "IDEM_KAFKA_FAKE_CLUSTER" // "1": the brokers are a kfake cluster of the test
)

var (
	kafkaOnce sync.Once
	kafkaErr  error
)

// Kafka returns the seed brokers of the tests' Kafka cluster: those of
// IDEM_KAFKA_BROKERS, or those of a kfake cluster running in this process
// (started by the first caller, for the life of the test binary).
func Kafka(t testing.TB) []string {
	t.Helper()
	kafkaOnce.Do(func() {
		if os.Getenv(envKafkaBrokers) != "" {
			return
		}
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(100*time.Millisecond),
			kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(1))
		if err != nil {
			kafkaErr = err
			return
		}
		os.Setenv(envKafkaBrokers, strings.Join(c.ListenAddrs(), ","))
		os.Setenv(envKafkaFake, "1")
	})
	if kafkaErr != nil {
		t.Fatalf("starting a kfake cluster: %v", kafkaErr)
	}
	brokers := strings.Split(os.Getenv(envKafkaBrokers), ",")
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = cl.Ping(ctx)
		cancel()
		cl.Close()
	}
	Need(t, "Kafka", os.Getenv(envKafkaBrokers), err)
	return brokers
}

// KafkaFake reports whether the tests' cluster is a kfake cluster of the
// test (rather than IDEM_KAFKA_BROKERS').
func KafkaFake() bool { return os.Getenv(envKafkaFake) == "1" }

// KafkaGroupOptions are the consumer-group timings of the tests: a member
// that dies (SIGKILL) or freezes (SIGSTOP) loses its partitions after a
// second on the kfake cluster, after the six seconds a real broker's
// default group.min.session.timeout.ms allows on a real one.
func KafkaGroupOptions() []kgo.Opt {
	session := time.Second
	if !KafkaFake() {
		session = 6 * time.Second
	}
	return []kgo.Opt{kgo.SessionTimeout(session), kgo.HeartbeatInterval(session / 4),
		kgo.RebalanceTimeout(20 * time.Second), kgo.FetchMaxWait(200 * time.Millisecond)}
}

// KafkaTopic creates a topic of partitions partitions (and its dead-letter
// topic, name + ".DLT") and returns its name; both are deleted when t ends.
func KafkaTopic(t testing.TB, brokers []string, prefix string, partitions int32) string {
	t.Helper()
	adm := KafkaAdmin(t, brokers)
	name := RandomName(prefix)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	replication := int16(1)
	if !KafkaFake() {
		replication = -1 // the cluster's default
	}
	for _, topic := range []string{name, name + ".DLT"} {
		resp, err := adm.CreateTopic(ctx, partitions, replication, nil, topic)
		if err == nil {
			err = resp.Err
		}
		if err != nil {
			t.Fatalf("creating the topic %s: %v", topic, err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopics(ctx, name, name+".DLT")
	})
	return name
}

// KafkaAdmin returns an admin client of brokers, closed when t ends.
func KafkaAdmin(t testing.TB, brokers []string) *kadm.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return kadm.NewClient(cl)
}

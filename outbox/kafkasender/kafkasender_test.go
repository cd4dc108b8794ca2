package kafkasender_test

import (
	"bytes"
	"context"
	"github.com/twmb/franz-go/pkg/kfake"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemgo/idem/broker/kafkaidem"
	"github.com/idemgo/idem/internal/testenv"
	"github.com/idemgo/idem/outbox"
	"github.com/idemgo/idem/outbox/kafkasender"
	"github.com/idemgo/idem/outbox/sendertest"
)

func destination(brokers []string, topic string) string {
	return "kafka://" + strings.Join(brokers, ",") + "/" + topic
}

// records reads what topic holds, from its start.
func records(t testing.TB, brokers []string, topic string) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	adm := testenv.KafkaAdmin(t, brokers)
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	var want int64
	ends.Each(func(o kadm.ListedOffset) { want += o.Offset })
	if want == 0 {
		return nil
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var out []*kgo.Record
	for int64(len(out)) < want {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("read %d of %d records: %v", len(out), want, err)
		}
		out = append(out, fs.Records()...)
	}
	return out
}

func header(r *kgo.Record, name string) string {
	for _, h := range r.Headers {
		if h.Key == name {
			return string(h.Value)
		}
	}
	return ""
}

// TestConformance: the receiver is a Kafka topic, which keeps every
// attempt (the idempotent producer drops only its own retries of one
// send), each with the key in the Idempotency-Key header.
func TestConformance(t *testing.T) {
	brokers := testenv.Kafka(t)
	s := kafkasender.New(kafkasender.Config{DeliveryTimeout: 3 * time.Second})
	defer s.Close()
	sendertest.Run(t, sendertest.Target{
		Sender: s,
		Destination: func(t *testing.T) (string, func() []sendertest.Delivery) {
			topic := testenv.KafkaTopic(t, brokers, "idemsend-", 3)
			return destination(brokers, topic), func() []sendertest.Delivery {
				var out []sendertest.Delivery
				for _, r := range records(t, brokers, topic) {
					out = append(out, sendertest.Delivery{KeyField: header(r, kafkasender.KeyHeader), Payload: r.Value})
				}
				return out
			}
		},
		KeyField:    func(key string) string { return key },
		Unreachable: func(*testing.T) string { return "kafka://127.0.0.1:1/orders" },
		Refused: func(*testing.T) []string {
			b := strings.Join(brokers, ",")
			return []string{"kafka://" + b, "kafka://" + b + "/", "kafka:///orders", "kafka://" + b + "/with space",
				"kafka://" + b + "/" + strings.Repeat("x", 250), "kafka://" + b + ",/orders", "nats://" + b + "/orders"}
		},
	})
}

// TestRecordKeyAndHeaders: the record key is the outbox key by default,
// or what RecordKey returns (an aggregate's records in one partition); the
// message's headers travel, and the key header is the outbox key whatever
// a header of the message says.
func TestRecordKeyAndHeaders(t *testing.T) {
	if kafkasender.KeyHeader != kafkaidem.KeyHeader {
		t.Fatalf("the sender writes %s, the consumer reads %s", kafkasender.KeyHeader, kafkaidem.KeyHeader)
	}
	brokers := testenv.Kafka(t)
	topic := testenv.KafkaTopic(t, brokers, "idemsend-", 4)
	plain := kafkasender.New(kafkasender.Config{})
	defer plain.Close()
	byAccount := kafkasender.New(kafkasender.Config{RecordKey: func(m *outbox.Message) []byte { return []byte(m.Headers["Account"]) }})
	defer byAccount.Close()
	send := func(s *kafkasender.Sender, key string) {
		m := &outbox.Message{Key: key, Destination: destination(brokers, topic), Payload: []byte("p-" + key),
			Headers: map[string]string{"Account": "ACC-7", "Content-Type": "application/json", kafkasender.KeyHeader: "forged"}}
		if res := s.Send(context.Background(), m); res.Status != outbox.Sent {
			t.Fatalf("%s: %s (%v)", key, res.Status, res.Err)
		}
	}
	send(plain, "K-1")
	for _, k := range []string{"A-1", "A-2", "A-3", "A-4", "A-5"} {
		send(byAccount, k)
	}
	// Without RecordKey, a message's ordering key is its record key.
	for _, k := range []string{"O-1", "O-2", "O-3"} {
		m := &outbox.Message{Key: k, Destination: destination(brokers, topic), Payload: []byte("p-" + k), OrderingKey: "ACC-9"}
		if res := plain.Send(context.Background(), m); res.Status != outbox.Sent {
			t.Fatalf("%s: %s (%v)", k, res.Status, res.Err)
		}
	}
	got := records(t, brokers, topic)
	if len(got) != 9 {
		t.Fatalf("%d records, want 9", len(got))
	}
	ordered := map[int32]bool{}
	for _, r := range got {
		if strings.HasPrefix(string(r.Value), "p-O-") {
			ordered[r.Partition] = true
			if string(r.Key) != "ACC-9" || header(r, outbox.OrderingKeyHeader) != "ACC-9" {
				t.Errorf("record %s: key %q, headers %v", r.Value, r.Key, r.Headers)
			}
		}
	}
	if len(ordered) != 1 {
		t.Errorf("one ordering key's records went to partitions %v", ordered)
	}
	got = slices.DeleteFunc(got, func(r *kgo.Record) bool { return strings.HasPrefix(string(r.Value), "p-O-") })
	partitions := map[int32]bool{}
	for _, r := range got {
		key := strings.TrimPrefix(string(r.Value), "p-")
		if header(r, kafkasender.KeyHeader) != key || header(r, "Content-Type") != "application/json" || header(r, "Account") != "ACC-7" {
			t.Errorf("record %s: headers %v", key, r.Headers)
		}
		want := []byte("ACC-7")
		if key == "K-1" {
			want = []byte("K-1")
		} else {
			partitions[r.Partition] = true
		}
		if !bytes.Equal(r.Key, want) {
			t.Errorf("record %s: key %q, want %q", key, r.Key, want)
		}
	}
	if len(partitions) != 1 {
		t.Errorf("one account's records went to partitions %v, want one", partitions)
	}
}

// TestTooLargeIsDead: a record larger than the producer may send is dead
// at once, with the reason.
func TestTooLargeIsDead(t *testing.T) {
	brokers := testenv.Kafka(t)
	topic := testenv.KafkaTopic(t, brokers, "idemsend-", 1)
	s := kafkasender.New(kafkasender.Config{})
	defer s.Close()
	res := s.Send(context.Background(), &outbox.Message{Key: "BIG", Destination: destination(brokers, topic), Payload: make([]byte, 2<<20)})
	if res.Status != outbox.Dead || res.Err == nil {
		t.Fatalf("a 2 MiB record: %s (%v), want dead", res.Status, res.Err)
	}
}

func TestParseDestination(t *testing.T) {
	brokers, topic, err := kafkasender.ParseDestination("kafka://k1:9093,k2/orders.v1")
	if err != nil || topic != "orders.v1" || strings.Join(brokers, ",") != "k1:9093,k2:9092" {
		t.Fatalf("got %v %q %v", brokers, topic, err)
	}
}

// TestMissingTopic: a row sent to a topic that does not exist has the
// cluster create it, as Java's and librdkafka's producers do where the
// cluster allows it (auto.create.topics.enable, on by default in Apache
// Kafka); where the cluster does not, the row stays pending with an error
// that says the topic does not exist.
func TestMissingTopic(t *testing.T) {
	t.Run("created", func(t *testing.T) {
		if !testenv.KafkaFake() && testenv.KafkaBrokers() != nil {
			t.Skip("a real cluster may refuse to create topics")
		}
		brokers := testenv.Kafka(t)
		topic := testenv.RandomName("idemnew-")
		s := kafkasender.New(kafkasender.Config{})
		defer s.Close()
		if res := s.Send(context.Background(), &outbox.Message{Key: "K-1", Destination: destination(brokers, topic), Payload: []byte("x")}); res.Status != outbox.Sent {
			t.Fatalf("to a topic the cluster may create: %s %v", res.Status, res.Err)
		}
		if recs := records(t, brokers, topic); len(recs) != 1 {
			t.Fatalf("%d records in the new topic", len(recs))
		}
	})
	t.Run("refused", func(t *testing.T) {
		c, err := kfake.NewCluster(kfake.NumBrokers(1)) // creates no topic on use
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		s := kafkasender.New(kafkasender.Config{})
		defer s.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		res := s.Send(ctx, &outbox.Message{Key: "K-1", Destination: destination(c.ListenAddrs(), "nowhere"), Payload: []byte("x")})
		if res.Status != outbox.Pending || res.Err == nil || !strings.Contains(res.Err.Error(), `topic "nowhere" does not exist`) {
			t.Fatalf("to a topic the cluster does not create: %s %v", res.Status, res.Err)
		}
	})
}

// Package kafkasender delivers outbox messages to Kafka, on franz-go's
// idempotent producer with acks from every in-sync replica: a record to
// kafka://HOST[,HOST…]/TOPIC with the outbox key in the Idempotency-Key
// header on every attempt, so the consumer (broker/kafkaidem) can tell a
// resend from a new message.
//
// The idempotent producer only drops the duplicates its own retries make
// within one producer session; a relay that sends a row again (after a
// lost acknowledgement, a crash, a lease taken over) writes a new record
// at a new offset. End-to-end deduplication is the consumer's, by the key.
package kafkasender

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemgo/idem/outbox"
)

// KeyHeader is the record header that carries the outbox key.
const KeyHeader = "Idempotency-Key"

// Config configures the sender.
type Config struct {
	// ClientOptions are added to every client the sender opens: TLS
	// (kgo.DialTLSConfig), SASL (kgo.SASL), a client id — so that secrets
	// live in the relay's configuration, not in every outbox row's
	// destination. The sender's own options (acks from all in-sync
	// replicas, the idempotent producer, no linger) come first.
	ClientOptions []kgo.Opt
	// RecordKey returns the Kafka record key of a message, which picks its
	// partition: records of one key stay in one partition, in order.
	// Defaults to the message's ordering key, or its outbox key when it has
	// none (each message to a partition of its key's hash).
	RecordKey func(m *outbox.Message) []byte
	// DeliveryTimeout bounds one send, also when its context does not (the
	// relay's send timeout bounds it too). Defaults to 30s; at least 1s.
	DeliveryTimeout time.Duration
}

// Sender produces to Kafka. One client per set of seed brokers, shared by
// the sends to every topic there.
type Sender struct {
	cfg     Config
	mu      sync.Mutex
	clients map[string]*kgo.Client
}

// New returns the Kafka sender.
func New(cfg Config) *Sender {
	if cfg.RecordKey == nil {
		cfg.RecordKey = func(m *outbox.Message) []byte {
			if m.OrderingKey != "" {
				return []byte(m.OrderingKey)
			}
			return []byte(m.Key)
		}
	}
	if cfg.DeliveryTimeout <= 0 {
		cfg.DeliveryTimeout = 30 * time.Second
	}
	cfg.DeliveryTimeout = max(cfg.DeliveryTimeout, time.Second) // franz-go's floor
	return &Sender{cfg: cfg, clients: map[string]*kgo.Client{}}
}

// ParseDestination splits kafka://HOST[:PORT][,HOST[:PORT]…]/TOPIC into the
// seed brokers and the topic.
func ParseDestination(dest string) (brokers []string, topic string, err error) {
	rest, ok := strings.CutPrefix(dest, "kafka://")
	hosts, topic, _ := strings.Cut(rest, "/")
	if !ok || hosts == "" || !validTopic(topic) {
		return nil, "", fmt.Errorf("want kafka://HOST[:PORT][,HOST[:PORT]…]/TOPIC with a topic of letters, digits, '.', '_' and '-', got %q", dest)
	}
	for _, h := range strings.Split(hosts, ",") {
		if h == "" || strings.ContainsAny(h, "/?#@ ") {
			return nil, "", fmt.Errorf("want kafka://HOST[:PORT][,HOST[:PORT]…]/TOPIC, got %q", dest)
		}
		if !strings.Contains(h, ":") {
			h += ":9092"
		}
		brokers = append(brokers, h)
	}
	return brokers, topic, nil
}

// validTopic: Kafka's legal topic names.
func validTopic(t string) bool {
	if t == "" || len(t) > 249 || t == "." || t == ".." {
		return false
	}
	for _, c := range []byte(t) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func (s *Sender) client(brokers []string) (*kgo.Client, error) {
	id := strings.Join(brokers, ",")
	s.mu.Lock()
	defer s.mu.Unlock()
	if cl, ok := s.clients[id]; ok {
		return cl, nil
	}
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(brokers...),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(0),
		kgo.RecordDeliveryTimeout(s.cfg.DeliveryTimeout),
		kgo.ClientID("idem-relay"),
		// A topic not there yet is created by the cluster where it allows
		// it (auto.create.topics.enable), as Java's and librdkafka's
		// producers have it.
		kgo.AllowAutoTopicCreation(),
	}, s.cfg.ClientOptions...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, err
	}
	s.clients[id] = cl
	return cl, nil
}

// Send implements outbox.Sender: Sent once the partition's leader
// acknowledged the record (with every in-sync replica); Pending for what a
// retry may fix (no broker reachable, a topic not there yet, a timeout);
// Dead for a destination or a record Kafka refuses for good (malformed, too
// large, an invalid topic).
func (s *Sender) Send(ctx context.Context, m *outbox.Message) outbox.Result {
	brokers, topic, err := ParseDestination(m.Destination)
	if err != nil {
		return outbox.Result{Status: outbox.Dead, Err: err}
	}
	cl, err := s.client(brokers)
	if err != nil {
		return outbox.Result{Status: outbox.Dead, Err: err}
	}
	rec := &kgo.Record{Topic: topic, Key: s.cfg.RecordKey(m), Value: m.Payload,
		Headers: make([]kgo.RecordHeader, 0, len(m.Headers)+2)}
	for k, v := range m.Headers {
		if k != KeyHeader && k != outbox.OrderingKeyHeader {
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
		}
	}
	rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: KeyHeader, Value: []byte(m.Key)})
	if m.OrderingKey != "" {
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: outbox.OrderingKeyHeader, Value: []byte(m.OrderingKey)})
	}
	if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
		if permanent(err) {
			return outbox.Result{Status: outbox.Dead, Err: err}
		}
		if errors.Is(err, kerr.UnknownTopicOrPartition) {
			err = fmt.Errorf("the topic %q does not exist, and the cluster did not create it (create it, or allow auto.create.topics.enable): %w", topic, err)
		}
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, kgo.ErrRecordTimeout) {
			// franz-go retries a broker it cannot reach, trust or log in
			// to until the send times out, and reports the timeout only:
			// one request tells why.
			pctx, cancel := context.WithTimeout(context.Background(), time.Second)
			if perr := cl.Ping(pctx); perr != nil && !errors.Is(perr, context.DeadlineExceeded) {
				err = fmt.Errorf("%w (the brokers: %v)", err, perr)
			}
			cancel()
		}
		return outbox.Result{Status: outbox.Pending, Err: err}
	}
	return outbox.Result{Status: outbox.Sent}
}

// permanent: what no retry of the same record to the same topic fixes.
func permanent(err error) bool {
	for _, e := range []error{kerr.MessageTooLarge, kerr.RecordListTooLarge, kerr.InvalidTopicException,
		kerr.InvalidRecord, kerr.CorruptMessage, kerr.InvalidRequiredAcks} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// Close closes the clients.
func (s *Sender) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, cl := range s.clients {
		cl.Close()
		delete(s.clients, id)
	}
}

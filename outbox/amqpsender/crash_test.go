package amqpsender_test

import (
	"context"
	"flag"
	"fmt"
	"regexp"
	"strings"
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
// SIGKILL and started again, on a durable classic queue, as the end-to-end
// campaign and the examples declare it. Eight senders publish through the
// outbox's sender while a consumer takes the queue's messages
// (acknowledging each after it noted it) and the node is crashed three
// times; then every key a send reported Sent must have been consumed.
func TestConfirmedSurvivesBrokerCrash(t *testing.T) { confirmedSurvivesCrash(t, "classic") }

var backlogCrashes = flag.Bool("amqpsender.backlog-crashes", false, "run TestConfirmedBacklogSurvivesBrokerCrashes")

// TestSendReturnsWhenTheBrokerStopsAnswering: a broker that stops
// answering (its connection stalled, not closed) holds a send no longer
// than the send's context — the relay's SendTimeout — and the sender
// answers again, on a new connection, once the broker does.
func TestSendReturnsWhenTheBrokerStopsAnswering(t *testing.T) {
	conn, err := amqp.DialConfig(testenv.AMQPURL, amqp.Config{Dial: amqp.DefaultDial(3 * time.Second)})
	testenv.Need(t, "RabbitMQ", testenv.AMQPURL, err)
	conn.Close()
	ch, q := testenv.AMQPQueue(t, "idemstall.")
	proxy := testenv.StartProxy(t, strings.TrimSuffix(strings.TrimPrefix(testenv.AMQPURL, "amqp://guest:guest@"), "/"))
	dest := "amqp://guest:guest@" + proxy.Addr() + "/?routing_key=" + q
	s := amqpsender.New(amqp.Config{})
	defer s.Close()
	send := func(key string) outbox.Result {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		done := make(chan outbox.Result, 1)
		go func() { done <- s.Send(ctx, &outbox.Message{Key: key, Destination: dest, Payload: []byte(key)}) }()
		select {
		case res := <-done:
			return res
		case <-time.After(10 * time.Second):
			t.Fatalf("send %s: no answer 10 s after its context ended", key)
			return outbox.Result{}
		}
	}
	if res := send("K-1"); res.Status != outbox.Sent {
		t.Fatalf("before the stall: %s %v", res.Status, res.Err)
	}
	proxy.Stall()
	// First, on the open connection: a publish larger than what the socket buffers: its write blocks on a
	// broker that reads nothing, and the send still returns with its
	// context.
	big := make([]byte, 16<<20)
	bigSend := func() outbox.Result {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		done := make(chan outbox.Result, 1)
		go func() { done <- s.Send(ctx, &outbox.Message{Key: "K-big", Destination: dest, Payload: big}) }()
		select {
		case res := <-done:
			return res
		case <-time.After(10 * time.Second):
			t.Fatalf("a send whose write blocks: no answer 10 s after its context ended")
			return outbox.Result{}
		}
	}
	if res := bigSend(); res.Status != outbox.Pending {
		t.Fatalf("a broker that reads nothing: %s %v, want pending", res.Status, res.Err)
	}
	for _, key := range []string{"K-2", "K-3"} {
		if res := send(key); res.Status != outbox.Pending {
			t.Fatalf("a broker that does not answer: %s %s %v, want pending", key, res.Status, res.Err)
		}
	}
	proxy.Unstall()
	testenv.Eventually(t, 10*time.Second, "a send after the stall", func() error {
		if res := send("K-4"); res.Status != outbox.Sent {
			return fmt.Errorf("after the stall: %s %v", res.Status, res.Err)
		}
		return nil
	})
	if d, ok, err := ch.Get(q, true); err != nil || !ok || d.MessageId != "K-1" {
		t.Fatalf("the first message: %q %v %v", d.MessageId, ok, err)
	}
}

func confirmedSurvivesCrash(t *testing.T, queueType string) {
	t.Helper()
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
	var reasonsMu sync.Mutex
	reasons := map[string]int{} // why sends were not confirmed, by kind
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
					reasonsMu.Lock()
					reasons[reason(res.Err)]++
					reasonsMu.Unlock()
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
	t.Logf("%s queue: %d messages confirmed in %d sends (%d not confirmed, sent again: %v), 3 crashes; %d confirmed and never consumed",
		queueType, len(sent), attempts.Load(), refused.Load(), reasons, len(missing))
	if len(missing) > 0 {
		t.Errorf("%d confirmed messages lost in the crashes of the node, e.g. %v; the node said:\n%s", len(missing), missing[:min(10, len(missing))],
			strings.Join(srv.LogLines("dropped", "crashed"), "\n"))
	}
}

// reason is the kind of a send's refusal: its error without what varies
// (addresses, ids).
func reason(err error) string {
	if err == nil {
		return "no error"
	}
	return digits.ReplaceAllString(err.Error(), "#")
}

var digits = regexp.MustCompile(`[0-9]+`)

// TestConfirmedBacklogSurvivesBrokerCrashes: a queue that holds a backlog
// — every message confirmed and none consumed yet, as while the consumers
// are down or far behind — keeps all of it across SIGKILLs of the node in
// quick succession, each while sixteen senders publish: every confirmed
// message is in the queue once the node is back, none dropped in its
// recovery (the node rebuilds its message store's index from its files
// each time).
//
// It runs with -amqpsender.backlog-crashes (about two minutes: four kills
// of a node under sixteen senders). A minute without a confirm fails it
// with the last refusal and what the node logged of its recoveries and
// resource alarms.
func TestConfirmedBacklogSurvivesBrokerCrashes(t *testing.T) {
	if !*backlogCrashes {
		t.Skip("run with -amqpsender.backlog-crashes (about two minutes: four kills of a node under sixteen senders)")
	}
	srv := testenv.StartRabbitMQ(t)
	queue := durableQueue(t, srv.URL, "idembacklog.")
	sender := amqpsender.New(amqp.Config{})
	defer sender.Close()
	dest := srv.URL + "?routing_key=" + queue
	var mu sync.Mutex
	var sent []string
	var lastErr error // the last send's reason for not being sent
	stop := make(chan struct{})
	var senders sync.WaitGroup
	for g := range 16 {
		senders.Go(func() {
			for n := 0; ; n++ {
				key := fmt.Sprintf("K-%d-%d", g, n)
				for { // the same key until it is sent
					select {
					case <-stop:
						return
					default:
					}
					ctx, cancel := context.WithTimeout(context.Background(), time.Second)
					res := sender.Send(ctx, &outbox.Message{Key: key, Destination: dest, Payload: []byte(key)})
					cancel()
					mu.Lock()
					if res.Status == outbox.Sent {
						sent = append(sent, key)
						mu.Unlock()
						break
					}
					lastErr = res.Err
					mu.Unlock()
					time.Sleep(10 * time.Millisecond)
				}
			}
		})
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(sent)
	}
	const crashes = 4
	for i := range crashes {
		for start, moved, last := count(), time.Now(), count(); count() < start+2500; time.Sleep(5 * time.Millisecond) {
			if n := count(); n != last {
				moved, last = time.Now(), n
			} else if time.Since(moved) > time.Minute {
				mu.Lock()
				err := lastErr
				mu.Unlock()
				close(stop)
				senders.Wait()
				t.Fatalf("after crash %d no send confirmed for a minute (%d confirmed); the last refusal: %v; the node said:\n%s", i, n, err,
					strings.Join(srv.LogLines("dropped", "crashed", "Deleting", "deleted", "error", "alarm"), "\n"))
			}
		}
		srv.Crash(t)
	}
	close(stop)
	senders.Wait()

	conn, err := amqp.Dial(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	queued := map[string]bool{}
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		queued[d.MessageId] = true
	}
	var missing []string
	for _, key := range sent {
		if !queued[key] {
			missing = append(missing, key)
		}
	}
	t.Logf("%d messages confirmed across %d crashes; %d in the queue, %d missing", len(sent), crashes, len(queued), len(missing))
	if len(missing) > 0 {
		t.Errorf("%d confirmed messages not in the queue after the crashes, e.g. %v; the node said:\n%s", len(missing), missing[:min(10, len(missing))],
			strings.Join(srv.LogLines("dropped", "crashed"), "\n"))
	}
}

// TestSendSaysWhenTheBrokerBlocksPublishing: a node that raises a resource
// alarm (low on disk, here) blocks its publishers — it stops reading what
// they send, so no confirm comes. A send then returns pending within its
// context with the broker's reason, not a bare timeout, and sends go
// through again once the alarm clears.
func TestSendSaysWhenTheBrokerBlocksPublishing(t *testing.T) {
	srv := testenv.StartRabbitMQ(t)
	queue := durableQueue(t, srv.URL, "idemblocked.")
	sender := amqpsender.New(amqp.Config{})
	defer sender.Close()
	dest := srv.URL + "?routing_key=" + queue
	send := func(key string) outbox.Result {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return sender.Send(ctx, &outbox.Message{Key: key, Destination: dest, Payload: []byte(key)})
	}
	if res := send("K-1"); res.Status != outbox.Sent {
		t.Fatalf("before the alarm: %s %v", res.Status, res.Err)
	}
	if _, err := srv.Ctl("set_disk_free_limit", "1000000000000000"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "a send naming the alarm", func() error {
		res := send("K-2")
		if res.Status != outbox.Pending || res.Err == nil || !strings.Contains(res.Err.Error(), "blocks publishing") ||
			!strings.Contains(res.Err.Error(), "disk") {
			return fmt.Errorf("under a disk alarm: %s %v", res.Status, res.Err)
		}
		return nil
	})
	if _, err := srv.Ctl("set_disk_free_limit", "50000000"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "a send after the alarm", func() error {
		if res := send("K-2"); res.Status != outbox.Sent {
			return fmt.Errorf("after the alarm: %s %v", res.Status, res.Err)
		}
		return nil
	})
}

// durableQueue declares a durable classic queue named prefix and random
// digits on the broker at url, and returns its name.
func durableQueue(t *testing.T, url, prefix string) string {
	t.Helper()
	queue := testenv.RandomName(prefix)
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	return queue
}

package amqpidem

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Redialing configures ConsumeRedialing: how to open, and open again, the
// consumer's connection.
type Redialing struct {
	// URL is the broker's. Required.
	URL string
	// Config is how the connection is opened (credentials, TLS, heartbeat);
	// the zero Config dials as amqp.Dial does.
	Config amqp.Config
	// Setup runs on every new channel before it consumes: declare the queue
	// and its bindings (a restarted broker without them has lost them only if
	// they were not durable), set the prefetch (Qos). Optional.
	Setup func(ch *amqp.Channel) error
	// OnError, if set, hears why each connection ended and why each attempt
	// to open one failed. It is where a lasting refusal shows — a wrong URL
	// or credentials, a queue declared elsewhere with other arguments — which
	// is otherwise tried again, silently, until ctx ends; to fail at start
	// instead, dial once before (as examples/payments-consumer does).
	OnError func(error)
	// PauseMin and PauseMax bound the pause before opening a connection
	// again: PauseMin after a connection that had consumed, doubling on
	// each failure up to PauseMax. Default 100ms and 5s.
	PauseMin, PauseMax time.Duration
}

// ConsumeRedialing runs handler on every delivery of queue, as Consume does,
// and when the connection or channel ends — a broker restarted, a network
// cut, a connection the broker closed — opens a new one after a pause and
// goes on, until ctx ends; it then returns nil. A connection that cannot be
// opened, or whose Setup fails, is tried again the same way. Deliveries the
// closed channel had not acknowledged are the broker's to send again
// (Redelivered set), and the handler's store or inbox replays what had
// already run: nothing is lost, nothing runs twice. Acks of deliveries from
// a closed channel fail and are dropped for that reason — so do those of
// handlers still running (Config.Concurrency above 1, or a BatchHandler's
// batch) when ctx ends and the connection closes: those deliveries come
// again to the next consumer, which replays them.
func ConsumeRedialing(ctx context.Context, r Redialing, queue, consumer string, handler func(amqp.Delivery)) error {
	if r.URL == "" || handler == nil {
		return errors.New("idem/amqpidem: ConsumeRedialing needs Redialing.URL and a handler")
	}
	if r.PauseMin <= 0 {
		r.PauseMin = 100 * time.Millisecond
	}
	if r.PauseMax < r.PauseMin {
		r.PauseMax = max(5*time.Second, r.PauseMin)
	}
	pause := r.PauseMin
	for {
		consumed, err := consumeOnce(ctx, r, queue, consumer, handler)
		if ctx.Err() != nil {
			return nil
		}
		if r.OnError != nil {
			r.OnError(err)
		}
		if consumed {
			pause = r.PauseMin
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		pause = min(2*pause, r.PauseMax)
	}
}

// consumeOnce opens a connection and a channel, sets them up and consumes
// until either closes or ctx ends; consumed reports whether it got as far
// as consuming.
func consumeOnce(ctx context.Context, r Redialing, queue, consumer string, handler func(amqp.Delivery)) (consumed bool, err error) {
	conn, err := amqp.DialConfig(r.URL, r.Config)
	if err != nil {
		return false, fmt.Errorf("idem/amqpidem: dial: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return false, fmt.Errorf("idem/amqpidem: open a channel: %w", err)
	}
	if r.Setup != nil {
		if err := r.Setup(ch); err != nil {
			return false, fmt.Errorf("idem/amqpidem: set up the channel: %w", err)
		}
	}
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	err = Consume(ctx, ch, queue, consumer, handler)
	if err == nil { // ctx ended
		return true, nil
	}
	select {
	case cause := <-closed:
		if cause != nil {
			return true, fmt.Errorf("%w: %v", err, cause)
		}
	default:
	}
	return true, err
}

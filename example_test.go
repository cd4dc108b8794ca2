package idem_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/store/memstore"
)

func ExampleDo() {
	store := memstore.New(memstore.Config{})
	defer store.Close()
	guard, err := idem.NewGuard(idem.Config{Store: store})
	if err != nil {
		panic(err)
	}
	type Booking struct{ ID, Seat string }
	bookings := 0
	book := func(ctx context.Context) (Booking, error) {
		bookings++
		return Booking{ID: fmt.Sprintf("B-%d", bookings), Seat: "12A"}, nil
	}
	key := idem.Key{Scope: "POST /bookings", ID: "7f3a9c"}
	first, _ := idem.Do(context.Background(), guard, key, book)
	retry, _ := idem.Do(context.Background(), guard, key, book) // the client retries
	fmt.Println(first.ID, retry.ID, "bookings:", bookings)
	// Output: B-1 B-1 bookings: 1
}

func ExampleGuard_Run() {
	store := memstore.New(memstore.Config{})
	defer store.Close()
	guard, _ := idem.NewGuard(idem.Config{Store: store})
	key := idem.Key{Scope: "credit-transfers", ID: "PAY-42"}
	credit := func(ctx context.Context, fence uint64) ([]byte, error) {
		return []byte("credited"), nil
	}
	for _, delivery := range []string{"first delivery", "redelivery"} {
		res, err := guard.Run(context.Background(), key, nil, credit)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%s: %s %s\n", delivery, res.Outcome, res.Value)
	}
	// Output:
	// first delivery: acquired credited
	// redelivery: replayed credited
}

// Instruction and Booking are the consumer example's message and result.
type Instruction struct {
	CorrelationID string
	Account       string
	Cents         int64
}

type Booking struct{ ID string }

// A consumer: the key is the instruction's own id (never the broker's
// message id), the business write is conditioned on the fence, and each
// answer of Do says what to do with the message.
func ExampleDo_consumer() {
	store := memstore.New(memstore.Config{})
	defer store.Close()
	guard, err := idem.NewGuard(idem.Config{Store: store, Lease: 30 * time.Second, Retention: 72 * time.Hour})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	bookings := 0
	bookPayment := func(ctx context.Context, msg Instruction, fence uint64) (Booking, error) {
		bookings++ // a real one writes "WHERE fence < $fence" beside the booking
		return Booking{ID: fmt.Sprintf("B-%d", bookings)}, nil
	}
	msg := Instruction{CorrelationID: "PAY-42", Account: "ACC-1", Cents: 2500}
	for _, delivery := range []string{"delivery", "redelivery"} {
		key := idem.Key{Scope: "credit-transfers", ID: msg.CorrelationID}
		booking, err := idem.Do(ctx, guard, key, func(ctx context.Context) (Booking, error) {
			fence, _ := idem.FenceFrom(ctx) // condition business writes on it
			return bookPayment(ctx, msg, fence)
		})
		switch {
		case errors.Is(err, idem.ErrInProgress): // another worker has it: redeliver later
			fmt.Println(delivery, "in progress")
		case err != nil: // failed; a replayed failure is *idem.ReplayedFailure
			fmt.Println(delivery, "failed:", err)
		default: // the first run's result, every time
			fmt.Println(delivery, "booked", booking.ID)
		}
	}
	fmt.Println("bookings:", bookings)
	// Output:
	// delivery booked B-1
	// redelivery booked B-1
	// bookings: 1
}

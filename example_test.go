package idem_test

import (
	"context"
	"fmt"

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

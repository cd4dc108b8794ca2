package lambdaidem

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestInvocationContext: the context of a request made from an event ends
// ReturnBefore ahead of the invocation's deadline, or when the event has
// been served, whichever is first; Err agrees with Done at every moment,
// whether or not anything waited on it; contexts made from it end with it.
func TestInvocationContext(t *testing.T) {
	parent, cancel := context.WithDeadline(context.Background(), time.Now().Add(time.Hour))
	defer cancel()
	d, _ := parent.Deadline()

	// Served before its time: nothing waited, then something does.
	v := &invocation{parent: parent, deadline: d, returnBy: d.Add(-time.Minute)}
	if at, ok := v.Deadline(); !ok || !at.Equal(d.Add(-time.Minute)) {
		t.Fatalf("Deadline %v %v", at, ok)
	}
	if v.Err() != nil || v.Value(invocationKey{}) != v {
		t.Fatalf("a live invocation: Err %v, Value %v", v.Err(), v.Value(invocationKey{}))
	}
	v.end()
	select {
	case <-v.Done():
	default:
		t.Fatal("Done is open after the event was served")
	}
	if !errors.Is(v.Err(), context.Canceled) {
		t.Fatalf("Err after the event was served: %v", v.Err())
	}

	// Waited on while live: a context made from it ends with it.
	w := &invocation{parent: parent, deadline: d, returnBy: d.Add(-time.Minute)}
	child, stop := context.WithCancel(w)
	defer stop()
	if child.Err() != nil {
		t.Fatalf("the child of a live invocation: %v", child.Err())
	}
	w.end()
	<-child.Done()
	if !errors.Is(w.Err(), context.Canceled) {
		t.Fatalf("Err after the event was served: %v", w.Err())
	}

	// Past its return-by time, waited on or not.
	late := &invocation{parent: parent, deadline: d, returnBy: time.Now().Add(-time.Millisecond)}
	if !errors.Is(late.Err(), context.DeadlineExceeded) {
		t.Fatalf("Err past the return-by time: %v", late.Err())
	}
	<-late.Done()
	late.end()

	// Without a deadline: the invocation's context as it is.
	none := &invocation{parent: context.Background()}
	if _, ok := none.Deadline(); ok || none.Done() != nil || none.Err() != nil {
		t.Fatal("an invocation without a deadline has one")
	}
	none.end()
}

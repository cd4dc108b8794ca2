package grpcidem

import (
	"context"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TestRetryDelayCapped: an Aborted answer whose RetryInfo asks for an hour
// is retried after MaxRetryDelay (5 s by default), not an hour.
func TestRetryDelayCapped(t *testing.T) {
	st, err := status.New(codes.Aborted, "in progress").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		max, want time.Duration
	}{{0, 5 * time.Second}, {200 * time.Millisecond, 200 * time.Millisecond}} {
		var waited []time.Duration
		wait := func(ctx context.Context, d time.Duration) error { waited = append(waited, d); return nil }
		in := UnaryClient(ClientConfig{MaxRetryDelay: tc.max, MaxAttempts: 2, wait: wait})
		calls := 0
		err := in(context.Background(), "/s/M", nil, nil, nil, func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
			if calls++; calls == 1 {
				return st.Err()
			}
			return nil
		})
		if err != nil || calls != 2 || len(waited) != 1 || waited[0] != tc.want {
			t.Fatalf("MaxRetryDelay %v: err %v after %d calls, waited %v; want one wait of %v", tc.max, err, calls, waited, tc.want)
		}
	}
}

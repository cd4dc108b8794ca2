package grpcidem

import (
	"context"
	"time"

	"github.com/google/uuid"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemgo/idem/internal/ctxsleep"
)

// ClientConfig configures the client interceptor. The zero value works.
type ClientConfig struct {
	// Metadata is where the key is sent. Defaults to KeyMetadata.
	Metadata string
	// Methods limits the calls given a key to these full method names (and
	// MethodFunc's); by default every unary call gets one.
	Methods []string
	// MethodFunc selects the calls given a key by a function of the full
	// method name.
	MethodFunc func(fullMethod string) bool
	// NewKey makes a call's key. Defaults to a UUIDv7.
	NewKey func() (string, error)
	// MaxAttempts bounds the calls of one logical call that the interceptor
	// makes itself, retrying Aborted answers that carry a RetryInfo (a call
	// with its key in progress on the server) after the delay they ask
	// for. Defaults to 5; 1 retries nothing.
	MaxAttempts int
	// MaxRetryDelay caps the delay a RetryInfo asks for: a server (or
	// whatever answers for it) that asks for an hour gets a retry after
	// MaxRetryDelay. Defaults to 5s.
	MaxRetryDelay time.Duration

	wait func(ctx context.Context, d time.Duration) error // tests: instead of sleeping
}

// UnaryClient returns a unary client interceptor that gives each logical
// call one idempotency key — the one the caller put in the outgoing
// metadata, or a new one — and so keeps it across grpc-go's own retries
// (its retry policy and transparent retries resend the metadata as it
// is) and across the interceptor's retries of Aborted answers with a
// RetryInfo.
func UnaryClient(cfg ClientConfig) grpc.UnaryClientInterceptor {
	if cfg.Metadata == "" {
		cfg.Metadata = KeyMetadata
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 5
	}
	if cfg.MaxRetryDelay <= 0 {
		cfg.MaxRetryDelay = 5 * time.Second
	}
	if cfg.wait == nil {
		cfg.wait = ctxsleep.Sleep
	}
	if cfg.NewKey == nil {
		cfg.NewKey = func() (string, error) {
			u, err := uuid.NewV7()
			return u.String(), err
		}
	}
	methods := map[string]bool{}
	for _, m := range cfg.Methods {
		methods[m] = true
	}
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if (len(methods) > 0 || cfg.MethodFunc != nil) && !methods[method] && (cfg.MethodFunc == nil || !cfg.MethodFunc(method)) {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		if md, _ := metadata.FromOutgoingContext(ctx); len(md.Get(cfg.Metadata)) == 0 {
			key, err := cfg.NewKey()
			if err != nil {
				return status.Errorf(codes.Internal, "idem/grpcidem: a new key: %v", err)
			}
			ctx = metadata.AppendToOutgoingContext(ctx, cfg.Metadata, key)
		}
		for attempt := 1; ; attempt++ {
			err := invoker(ctx, method, req, reply, cc, opts...)
			delay, again := retryAfter(err)
			if !again || attempt >= cfg.MaxAttempts {
				return err
			}
			if cfg.wait(ctx, min(delay, cfg.MaxRetryDelay)) != nil {
				return err
			}
		}
	}
}

// retryAfter reports whether err is an Aborted answer with a RetryInfo,
// and the delay it asks for.
func retryAfter(err error) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Aborted {
		return 0, false
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration(), true
		}
	}
	return 0, false
}

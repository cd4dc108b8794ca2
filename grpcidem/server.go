package grpcidem

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/store"
)

// KeyMetadata is the metadata key the key travels in by default.
const KeyMetadata = "idempotency-key"

// Config configures the server interceptor.
type Config struct {
	// Guard runs the calls and stores their results. Required.
	Guard *idem.Guard
	// Methods opts methods in by full name ("/pkg.Service/Method"). One of
	// Methods and MethodFunc is required; calls of other methods pass
	// through untouched.
	Methods []string
	// MethodFunc opts methods in by a function of the full name.
	MethodFunc func(fullMethod string) bool
	// Metadata is where the key is read. Defaults to KeyMetadata.
	Metadata string
	// RequireKey refuses (InvalidArgument) a call of an opted-in method
	// without a key. By default it runs unprotected.
	RequireKey bool
	// Principal names the caller, so that a stored response is replayed only
	// to the caller that caused it; "" means none. Defaults to
	// DefaultPrincipal: the authorization metadata, else the client's TLS
	// certificate. A call with a key but no principal runs unprotected —
	// nothing stored, nothing replayed — unless AllowNoPrincipal.
	Principal func(ctx context.Context) string
	// AllowNoPrincipal shares one scope among every caller without a
	// principal (a service behind an authenticating proxy that strips the
	// credentials, a test).
	AllowNoPrincipal bool
	// Dispositions maps a status code the handler returned to what becomes
	// of the key. Codes absent fall back to DefaultDispositions.
	Dispositions map[codes.Code]idem.Disposition
	// RetryDelay is what the RetryInfo of a key in progress asks the client
	// to wait. Defaults to 1s.
	RetryDelay time.Duration
	// WaitInProgress, if positive, makes a duplicate of a call in progress
	// wait up to this long for the first to finish, and answers it with the
	// first's stored answer — for clients that do not retry ABORTED. Past
	// the bound, ABORTED as without it. A waiter stops when its call is
	// cancelled; the waiters of one key share one poll of the store; past
	// the Guard's caps on waiters (idem.Config.MaxWaitersPerKey,
	// MaxWaiters), ABORTED at once.
	WaitInProgress time.Duration
}

// DefaultDispositions: OK and the codes that say the request itself is
// wrong are stored and replayed (idem.Complete); Unavailable and
// DeadlineExceeded may leave the work done or not, so the key is held until
// its lease ends (idem.Hold); every other code releases the key for the
// retry to run again (idem.Release).
var DefaultDispositions = map[codes.Code]idem.Disposition{
	codes.OK:                 idem.Complete,
	codes.InvalidArgument:    idem.Complete,
	codes.NotFound:           idem.Complete,
	codes.AlreadyExists:      idem.Complete,
	codes.PermissionDenied:   idem.Complete,
	codes.FailedPrecondition: idem.Complete,
	codes.OutOfRange:         idem.Complete,
	codes.Unimplemented:      idem.Complete,
	codes.Unauthenticated:    idem.Complete,
	codes.Unavailable:        idem.Hold,
	codes.DeadlineExceeded:   idem.Hold,
}

// DefaultPrincipal is a hash of the authorization metadata, else of the
// client's verified TLS certificate, else "". The credential itself is
// never stored.
func DefaultPrincipal(ctx context.Context) string {
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get("authorization"); len(v) > 0 && v[0] != "" {
			return "auth:" + digest([]byte(strings.Join(v, "\n")))
		}
	}
	if p, ok := peer.FromContext(ctx); ok {
		if tlsInfo, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(tlsInfo.State.VerifiedChains) > 0 && len(tlsInfo.State.VerifiedChains[0]) > 0 {
			return "tls:" + digest(tlsInfo.State.VerifiedChains[0][0].Raw)
		}
	}
	return ""
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:12])
}

// Server is the server interceptor.
type Server struct {
	cfg     Config
	methods map[string]bool
}

// NewServer validates cfg and returns the interceptor.
func NewServer(cfg Config) (*Server, error) {
	if cfg.Guard == nil {
		return nil, errors.New("idem/grpcidem: Config.Guard is required")
	}
	if len(cfg.Methods) == 0 && cfg.MethodFunc == nil {
		return nil, errors.New("idem/grpcidem: name the idempotent methods (Config.Methods or Config.MethodFunc): gRPC does not say which methods are")
	}
	if cfg.Metadata == "" {
		cfg.Metadata = KeyMetadata
	}
	cfg.Metadata = strings.ToLower(cfg.Metadata)
	if cfg.Principal == nil {
		cfg.Principal = DefaultPrincipal
	}
	if cfg.RetryDelay <= 0 {
		cfg.RetryDelay = time.Second
	}
	s := &Server{cfg: cfg, methods: map[string]bool{}}
	for _, m := range cfg.Methods {
		if !strings.HasPrefix(m, "/") || strings.Count(m, "/") != 2 {
			return nil, fmt.Errorf("idem/grpcidem: method %q: want a full name, /package.Service/Method", m)
		}
		s.methods[m] = true
	}
	return s, nil
}

func (s *Server) optedIn(fullMethod string) bool {
	return s.methods[fullMethod] || (s.cfg.MethodFunc != nil && s.cfg.MethodFunc(fullMethod))
}

// Check verifies, once the services are registered on srv, that every
// method that opted in by name is a unary method of srv (a streaming method
// cannot be made idempotent by storing one response), and that its
// response type is in the protobuf registry (a replay decodes into it).
func (s *Server) Check(srv *grpc.Server) error {
	known := map[string]bool{}
	var errs []error
	for service, info := range srv.GetServiceInfo() {
		for _, m := range info.Methods {
			full := "/" + service + "/" + m.Name
			known[full] = true
			if !s.optedIn(full) {
				continue
			}
			if m.IsClientStream || m.IsServerStream {
				errs = append(errs, fmt.Errorf("idem/grpcidem: %s is a streaming method: only unary methods can be made idempotent (a stream is not one request and one response)", full))
				continue
			}
			if _, err := responseType(full); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for m := range s.methods {
		if !known[m] {
			errs = append(errs, fmt.Errorf("idem/grpcidem: %s is not a method of the server", m))
		}
	}
	return errors.Join(errs...)
}

// responseTypes caches responseType's answers by full method name.
var responseTypes sync.Map // string → protoreflect.MessageType

// responseType finds the response message type of a method in the global
// protobuf registry.
func responseType(fullMethod string) (protoreflect.MessageType, error) {
	if mt, ok := responseTypes.Load(fullMethod); ok {
		return mt.(protoreflect.MessageType), nil
	}
	mt, err := lookUpResponseType(fullMethod)
	if err == nil {
		responseTypes.Store(fullMethod, mt)
	}
	return mt, err
}

func lookUpResponseType(fullMethod string) (protoreflect.MessageType, error) {
	service, method, _ := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(service))
	if err != nil {
		return nil, fmt.Errorf("idem/grpcidem: %s: the service is not in the protobuf registry: %w", fullMethod, err)
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return nil, fmt.Errorf("idem/grpcidem: %s: %s is not a service", fullMethod, service)
	}
	md := sd.Methods().ByName(protoreflect.Name(method))
	if md == nil {
		return nil, fmt.Errorf("idem/grpcidem: %s: no such method", fullMethod)
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(md.Output().FullName())
	if err != nil {
		return nil, fmt.Errorf("idem/grpcidem: %s: its response type: %w", fullMethod, err)
	}
	return mt, nil
}

// Unary returns the unary server interceptor (grpc.ChainUnaryInterceptor).
func (s *Server) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if !s.optedIn(info.FullMethod) {
			return handler(ctx, req)
		}
		var key string
		if md, ok := metadata.FromIncomingContext(ctx); ok {
			if v := md.Get(s.cfg.Metadata); len(v) > 0 {
				key = v[0]
			}
		}
		if key == "" {
			if s.cfg.RequireKey {
				return nil, status.Errorf(codes.InvalidArgument, "%s requires an %s", info.FullMethod, s.cfg.Metadata)
			}
			return handler(ctx, req)
		}
		principal := s.cfg.Principal(ctx)
		if principal == "" && !s.cfg.AllowNoPrincipal {
			return handler(ctx, req) // whose response would it be? unprotected, as over HTTP
		}
		msg, ok := req.(proto.Message)
		if !ok {
			return nil, status.Errorf(codes.Internal, "idem/grpcidem: %s: the request is not a protobuf message", info.FullMethod)
		}
		body, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "idem/grpcidem: encoding the request: %v", err)
		}
		k := idem.Key{Scope: scope(info.FullMethod, principal), ID: key}
		if err := k.Validate(); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "%s: %v", s.cfg.Metadata, err)
		}
		var resp any
		res, err := s.cfg.Guard.Run(ctx, k, &idem.RunOptions{Fingerprint: idem.Fingerprint([]byte(info.FullMethod), body), WaitInProgress: s.cfg.WaitInProgress},
			func(ctx context.Context, fence uint64) ([]byte, error) {
				out, herr := handler(ctx, req)
				resp = out
				return s.settle(out, herr)
			})
		switch res.Outcome {
		case store.Acquired, store.TakenOver:
			// The handler ran: its own answer, whatever became of the key
			// (a settle the store refused is the store's concern, not the
			// caller's: the work is done).
			var de *decision
			if errors.As(err, &de) {
				return resp, de.handlerErr
			}
			if err != nil && resp == nil {
				return nil, err
			}
			return resp, nil
		case store.Replayed:
			return replay(info.FullMethod, res.Value)
		case store.InProgress:
			st, _ := status.New(codes.Aborted, "a call with this idempotency key is in progress").
				WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(s.cfg.RetryDelay)})
			return nil, st.Err()
		case store.Mismatch:
			return nil, status.Error(codes.FailedPrecondition, "the idempotency key was used with another request")
		case store.Poisoned:
			return nil, status.Error(codes.FailedPrecondition, "the idempotency key failed too many times")
		}
		if errors.Is(err, idem.ErrInvalidKey) {
			return nil, status.Errorf(codes.InvalidArgument, "%s: %v", s.cfg.Metadata, err)
		}
		// No claim: the store failed; nothing ran.
		return nil, status.Errorf(codes.Unavailable, "the idempotency store is unavailable: %v", err)
	}
}

// decision carries the handler's own error out of the guarded work, with
// the disposition its code maps to.
type decision struct{ handlerErr error }

func (d *decision) Error() string { return d.handlerErr.Error() }

// settle encodes the handler's answer for the store, or says what becomes of
// the key.
func (s *Server) settle(out any, herr error) ([]byte, error) {
	st := status.Convert(herr)
	d, ok := s.cfg.Dispositions[st.Code()]
	if !ok {
		if d, ok = DefaultDispositions[st.Code()]; !ok {
			d = idem.Release
		}
	}
	if d != idem.Complete {
		return nil, idem.WithDisposition(d, &decision{herr})
	}
	stored, err := encode(st.Proto(), out)
	if err != nil {
		return nil, idem.WithDisposition(idem.Release, &decision{status.Errorf(codes.Internal, "idem/grpcidem: %v", err)})
	}
	if herr != nil {
		return stored, idem.WithDisposition(idem.Complete, &decision{herr})
	}
	return stored, nil
}

// The stored form of an answer: the google.rpc.Status (code, message,
// details) length-prefixed, then the response message (OK only).
func encode(st *spb.Status, out any) ([]byte, error) {
	sb, err := proto.MarshalOptions{Deterministic: true}.Marshal(st)
	if err != nil {
		return nil, err
	}
	b := binary.AppendUvarint(nil, uint64(len(sb)))
	b = append(b, sb...)
	if st.GetCode() == int32(codes.OK) {
		m, ok := out.(proto.Message)
		if !ok {
			return nil, errors.New("the response is not a protobuf message")
		}
		mb, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		if err != nil {
			return nil, err
		}
		b = append(b, mb...)
	}
	return b, nil
}

// replay decodes a stored answer: the response, or the stored status.
func replay(fullMethod string, stored []byte) (any, error) {
	n, w := binary.Uvarint(stored)
	if w <= 0 || uint64(len(stored)-w) < n {
		return nil, status.Error(codes.Internal, "idem/grpcidem: a stored answer that cannot be read")
	}
	var st spb.Status
	if err := proto.Unmarshal(stored[w:w+int(n)], &st); err != nil {
		return nil, status.Errorf(codes.Internal, "idem/grpcidem: a stored status that cannot be read: %v", err)
	}
	if st.GetCode() != int32(codes.OK) {
		return nil, status.FromProto(&st).Err()
	}
	mt, err := responseType(fullMethod)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	m := mt.New().Interface()
	if err := proto.Unmarshal(stored[w+int(n):], m); err != nil {
		return nil, status.Errorf(codes.Internal, "idem/grpcidem: a stored response that cannot be read: %v", err)
	}
	return m, nil
}

// scope is the method and the principal, hashed when too long for a scope.
func scope(fullMethod, principal string) string {
	s := fullMethod + " " + principal
	if len(s) > idem.MaxScopeBytes {
		sum := sha256.Sum256([]byte(s))
		s = "sha256:" + hex.EncodeToString(sum[:])
	}
	return s
}

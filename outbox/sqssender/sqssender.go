// Package sqssender delivers outbox messages to Amazon SQS: destination
// sqs://QUEUE-NAME, in the region and account of the standard AWS
// configuration (config.LoadDefaultConfig: the environment, the shared
// files, the instance's role; AWS_ENDPOINT_URL_SQS or AWS_ENDPOINT_URL
// for an emulator). The message's key goes in the Idempotency-Key message
// attribute on every attempt; on a FIFO queue (a name ending in .fifo) it
// is also the MessageDeduplicationId, so SQS drops a resend within its
// five-minute deduplication interval, and the ordering key is the
// MessageGroupId.
package sqssender

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"

	"github.com/idemgo/idem/internal/coalesce"
	"github.com/idemgo/idem/outbox"
)

// Attributes the sender writes.
const (
	// KeyAttribute carries the message's key.
	KeyAttribute = "Idempotency-Key"
	// EncodingAttribute is "base64" on a message whose payload is not text
	// SQS accepts in a body (bytes that are not UTF-8, control characters):
	// the body is then the payload in standard base64. sqsidem decodes it.
	EncodingAttribute = "Idem-Body-Encoding"
)

// maxAttributes is how many message attributes SQS accepts on a message.
const maxAttributes = 10

// Config configures the sender. The zero value works.
type Config struct {
	// Client is the SQS client. Defaults to one made from
	// config.LoadDefaultConfig at the first send.
	Client *sqs.Client
	// MessageGroupID is the MessageGroupId of a FIFO queue's messages that
	// have no ordering key. Defaults to "idem": one group, in the order of
	// the sends.
	MessageGroupID string
}

// Sender sends to SQS. It looks a queue's URL up by name once. Sends to
// one queue that meet while others are in flight go together in one
// SendMessageBatch (up to ten), each with its own answer: a lone send
// goes at once, alone.
type Sender struct {
	cfg    Config
	mu     sync.Mutex
	client *sqs.Client
	urls   map[string]string
	groups map[string]*coalesce.Group[*sqs.SendMessageInput, struct{}] // by queue URL
	lookup sync.Mutex                                                  // one GetQueueUrl at a time: the first send's answers the others
}

// maxInFlight is how many calls a queue's sends keep in flight at once.
const maxInFlight = 8

// New returns the SQS sender.
func New(cfg Config) *Sender {
	if cfg.MessageGroupID == "" {
		cfg.MessageGroupID = "idem"
	}
	return &Sender{cfg: cfg, client: cfg.Client, urls: map[string]string{}, groups: map[string]*coalesce.Group[*sqs.SendMessageInput, struct{}]{}}
}

var queueName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,75}(\.fifo|[A-Za-z0-9_-]{0,5})$`)

// ParseDestination returns the queue name of sqs://QUEUE-NAME: 1 to 80
// letters, digits, hyphens and underscores, a FIFO queue's ending in .fifo.
func ParseDestination(dest string) (string, error) {
	u, err := url.Parse(dest)
	if err != nil || u.Scheme != "sqs" || u.Path != "" || u.RawQuery != "" || u.User != nil || !queueName.MatchString(u.Host) {
		return "", fmt.Errorf("want sqs://QUEUE-NAME (1 to 80 letters, digits, - and _; .fifo at the end of a FIFO queue's), got %q", dest)
	}
	return u.Host, nil
}

func (s *Sender) queue(ctx context.Context, name string) (*sqs.Client, string, error) {
	s.mu.Lock()
	c, url := s.client, s.urls[name]
	s.mu.Unlock()
	if c == nil {
		cfg, err := config.LoadDefaultConfig(ctx)
		if err != nil {
			return nil, "", fmt.Errorf("the AWS configuration: %w", err)
		}
		c = sqs.NewFromConfig(cfg)
		s.mu.Lock()
		if s.client == nil {
			s.client = c
		}
		c = s.client
		s.mu.Unlock()
	}
	if url != "" {
		return c, url, nil
	}
	s.lookup.Lock()
	defer s.lookup.Unlock()
	s.mu.Lock()
	url = s.urls[name]
	s.mu.Unlock()
	if url != "" {
		return c, url, nil // looked up while this send waited
	}
	out, err := c.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(name)})
	if err != nil {
		var missing *types.QueueDoesNotExist
		if errors.As(err, &missing) {
			return nil, "", fmt.Errorf("the queue %s does not exist (in the configured region and account): %w", name, err)
		}
		return nil, "", fmt.Errorf("looking up the queue %s: %w", name, err)
	}
	s.mu.Lock()
	s.urls[name] = *out.QueueUrl
	s.mu.Unlock()
	return c, *out.QueueUrl, nil
}

// Send implements outbox.Sender.
func (s *Sender) Send(ctx context.Context, m *outbox.Message) outbox.Result {
	name, err := ParseDestination(m.Destination)
	if err != nil {
		return outbox.Result{Status: outbox.Dead, Err: err}
	}
	in, err := s.input(name, m)
	if err != nil {
		return outbox.Result{Status: outbox.Dead, Err: err}
	}
	c, url, err := s.queue(ctx, name)
	if err != nil {
		return outbox.Result{Status: outbox.Pending, Err: err}
	}
	in.QueueUrl = aws.String(url)
	if _, err := s.group(c, url).Do(ctx, in); err != nil {
		if refused(err) {
			return outbox.Result{Status: outbox.Dead, Err: fmt.Errorf("SQS refused the message: %w", err)}
		}
		var missing *types.QueueDoesNotExist
		if errors.As(err, &missing) {
			s.mu.Lock()
			delete(s.urls, name) // deleted since: look it up again next time
			s.mu.Unlock()
		}
		return outbox.Result{Status: outbox.Pending, Err: err}
	}
	return outbox.Result{Status: outbox.Sent}
}

// group returns the coalescing group of url's sends.
func (s *Sender) group(c *sqs.Client, url string) *coalesce.Group[*sqs.SendMessageInput, struct{}] {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.groups[url]
	if g == nil {
		one := func(ctx context.Context, in *sqs.SendMessageInput) (struct{}, error) {
			_, err := c.SendMessage(ctx, in)
			return struct{}{}, err
		}
		g = coalesce.New(coalesce.Config[*sqs.SendMessageInput]{MaxBatch: 10, MaxInFlight: maxInFlight, LoneInFlight: 1,
			Key: func(in *sqs.SendMessageInput) string {
				return aws.ToString(in.MessageAttributes[KeyAttribute].StringValue)
			}},
			one, func(ctx context.Context, ins []*sqs.SendMessageInput, _ []struct{}, errs []error) {
				sendBatch(ctx, c, url, ins, errs, one)
			})
		s.groups[url] = g
	}
	return g
}

// sendBatch sends ins to url in one SendMessageBatch and sets each one's
// error; a batch SQS refuses as a whole for its size goes one by one.
func sendBatch(ctx context.Context, c *sqs.Client, url string, ins []*sqs.SendMessageInput, errs []error,
	one func(context.Context, *sqs.SendMessageInput) (struct{}, error)) {
	entries := make([]types.SendMessageBatchRequestEntry, len(ins))
	for i, in := range ins {
		entries[i] = types.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), MessageBody: in.MessageBody,
			MessageAttributes: in.MessageAttributes, MessageDeduplicationId: in.MessageDeduplicationId, MessageGroupId: in.MessageGroupId}
	}
	out, err := c.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(url), Entries: entries})
	if err != nil {
		var apiErr smithy.APIError
		if errors.As(err, &apiErr) && strings.HasSuffix(apiErr.ErrorCode(), "BatchRequestTooLong") {
			for i, in := range ins {
				_, errs[i] = one(ctx, in)
			}
			return
		}
		for i := range errs {
			errs[i] = err
		}
		return
	}
	for _, f := range out.Failed {
		if i, err := strconv.Atoi(aws.ToString(f.Id)); err == nil && i >= 0 && i < len(errs) {
			fault := smithy.FaultServer
			if f.SenderFault {
				fault = smithy.FaultClient
			}
			errs[i] = &smithy.GenericAPIError{Code: aws.ToString(f.Code), Message: aws.ToString(f.Message), Fault: fault}
		}
	}
}

// input is the SendMessage request of m to queue name, without its URL.
func (s *Sender) input(name string, m *outbox.Message) (*sqs.SendMessageInput, error) {
	attrs := map[string]types.MessageAttributeValue{}
	str := func(v string) types.MessageAttributeValue {
		return types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
	}
	for k, v := range m.Headers {
		if v != "" {
			attrs[k] = str(v)
		}
	}
	attrs[KeyAttribute] = str(m.Key)
	if m.OrderingKey != "" {
		attrs[outbox.OrderingKeyHeader] = str(m.OrderingKey)
	}
	if len(m.Payload) == 0 {
		return nil, errors.New("SQS takes no empty message body")
	}
	body := string(m.Payload)
	if !sqsText(m.Payload) {
		body = base64.StdEncoding.EncodeToString(m.Payload)
		attrs[EncodingAttribute] = str("base64")
	}
	if len(attrs) > maxAttributes {
		return nil, fmt.Errorf("%d headers and idem's attributes make %d message attributes; SQS takes at most %d", len(m.Headers), len(attrs), maxAttributes)
	}
	for k, v := range attrs {
		if !attributeName.MatchString(k) || strings.HasPrefix(strings.ToLower(k), "aws.") || strings.HasPrefix(strings.ToLower(k), "amazon.") {
			return nil, fmt.Errorf("the header %q cannot be an SQS message attribute (letters, digits, _, - and . only, not starting with AWS. or Amazon.)", k)
		}
		if !sqsText([]byte(*v.StringValue)) {
			return nil, fmt.Errorf("the value of the header %q has characters SQS does not take in an attribute (control characters, bytes that are not UTF-8)", k)
		}
	}
	in := &sqs.SendMessageInput{MessageBody: aws.String(body), MessageAttributes: attrs}
	if strings.HasSuffix(name, ".fifo") {
		group := m.OrderingKey
		if group == "" {
			group = s.cfg.MessageGroupID
		}
		in.MessageDeduplicationId = aws.String(fifoID(m.Key))
		in.MessageGroupId = aws.String(fifoID(group))
	}
	return in, nil
}

var (
	attributeName = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,256}$`)
	fifoIDChars   = regexp.MustCompile("^[A-Za-z0-9!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~]{1,128}$")
)

// fifoID is v as a MessageDeduplicationId or MessageGroupId: v itself
// where it fits (1 to 128 printable ASCII characters), else "sha256:" and
// the hex SHA-256 of v.
func fifoID(v string) string {
	if fifoIDChars.MatchString(v) {
		return v
	}
	sum := sha256.Sum256([]byte(v))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// sqsText reports whether b is text SQS takes as a body: UTF-8 of the
// characters #x9, #xA, #xD, #x20 to #xD7FF, #xE000 to #xFFFD and above
// #xFFFF.
func sqsText(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		switch {
		case r == 0x9 || r == 0xA || r == 0xD:
		case r >= 0x20 && r <= 0xD7FF, r >= 0xE000 && r <= 0xFFFD, r > 0xFFFF:
		default:
			return false
		}
	}
	return true
}

// refused reports whether SQS refused the message itself (too large, a
// body or attribute it does not take): sending it again cannot succeed.
func refused(err error) bool {
	var apiErr smithy.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	switch strings.TrimPrefix(apiErr.ErrorCode(), "AWS.SimpleQueueService.") { // the query protocol's codes have the prefix
	case "InvalidMessageContents", "InvalidParameterValue", "InvalidAttributeName", "InvalidAttributeValue",
		"MessageTooLong", "UnsupportedOperation", "InvalidParameterCombination":
		return true
	}
	var invalid *types.InvalidMessageContents
	return errors.As(err, &invalid)
}

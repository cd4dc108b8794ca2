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
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"

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

// Sender sends to SQS. It looks a queue's URL up by name once.
type Sender struct {
	cfg    Config
	mu     sync.Mutex
	client *sqs.Client
	urls   map[string]string
}

// New returns the SQS sender.
func New(cfg Config) *Sender {
	if cfg.MessageGroupID == "" {
		cfg.MessageGroupID = "idem"
	}
	return &Sender{cfg: cfg, client: cfg.Client, urls: map[string]string{}}
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
	if _, err := c.SendMessage(ctx, in); err != nil {
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
	for k := range attrs {
		if !attributeName.MatchString(k) || strings.HasPrefix(strings.ToLower(k), "aws.") || strings.HasPrefix(strings.ToLower(k), "amazon.") {
			return nil, fmt.Errorf("the header %q cannot be an SQS message attribute (letters, digits, _, - and . only, not starting with AWS. or Amazon.)", k)
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

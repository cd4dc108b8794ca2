package e2e_test

import (
	"fmt"
	"html"
	"slices"
	"strings"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// waterfall renders spans of one trace as an SVG waterfall: one bar per
// span on a common time axis, indented by depth, in start order, with its
// kind; a span's links are drawn as dashed lines to the linked span.
func waterfall(spans []sdktrace.ReadOnlySpan) []byte {
	slices.SortFunc(spans, func(a, b sdktrace.ReadOnlySpan) int { return a.StartTime().Compare(b.StartTime()) })
	start, end := spans[0].StartTime(), spans[0].EndTime()
	row := map[string]int{}
	depth := map[string]int{}
	for i, s := range spans {
		row[s.SpanContext().SpanID().String()] = i
		if s.EndTime().After(end) {
			end = s.EndTime()
		}
		if d, ok := depth[s.Parent().SpanID().String()]; ok && s.Parent().IsValid() {
			depth[s.SpanContext().SpanID().String()] = d + 1
		} else {
			depth[s.SpanContext().SpanID().String()] = 0
		}
	}
	const left, width, rowH, top = 330, 560, 34, 40
	total := end.Sub(start)
	x := func(t time.Time) float64 { return left + float64(t.Sub(start))/float64(total)*width }
	var b strings.Builder
	h := top + len(spans)*rowH + 30
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="13">`+"\n", left+width+30, h)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="#fff"/><text x="10" y="24" font-weight="bold">One trace: a request that enqueues, the relay's send, the consumer, the inbox (trace %s…, %v)</text>`+"\n",
		spans[0].SpanContext().TraceID().String()[:8], total.Round(time.Millisecond))
	for i, s := range spans {
		y := top + i*rowH
		d := depth[s.SpanContext().SpanID().String()]
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text><text x="%d" y="%d" fill="#667" font-size="11">%s · %s</text>`+"\n",
			10+d*14, y+14, html.EscapeString(s.Name()), 10+d*14, y+27, strings.ToLower(s.SpanKind().String()), s.EndTime().Sub(s.StartTime()).Round(100*time.Microsecond))
		w := max(x(s.EndTime())-x(s.StartTime()), 2)
		fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="%.1f" height="18" rx="3" fill="%s"/>`+"\n", x(s.StartTime()), y+4, w, []string{"#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2"}[d%5])
		for _, l := range s.Links() {
			if j, ok := row[l.SpanContext.SpanID().String()]; ok {
				fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#999" stroke-dasharray="4 3"/><text x="%.1f" y="%d" fill="#999" font-size="11">link</text>`+"\n",
					x(s.StartTime()), y+4, x(spans[j].StartTime()), top+j*rowH+22, x(s.StartTime())+4, y+2)
			}
		}
	}
	b.WriteString("</svg>\n")
	return []byte(b.String())
}

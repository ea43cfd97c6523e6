// promql reads a JSON array of PromQL expressions on stdin and writes, as JSON on stdout, for
// each one the metric names its selectors read, or the error Prometheus's own PromQL parser
// reports. Tests use it to check that dashboards and rules only use metrics workers export.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

type result struct {
	Expr    string   `json:"expr"`
	Metrics []string `json:"metrics"`
	Error   string   `json:"error,omitempty"`
}

func main() {
	var exprs []string
	if err := json.NewDecoder(os.Stdin).Decode(&exprs); err != nil {
		fmt.Fprintln(os.Stderr, "promql: stdin must be a JSON array of strings:", err)
		os.Exit(1)
	}
	// The default options: the functions and syntax a stock Prometheus server accepts.
	p := parser.NewParser(parser.Options{})
	out := make([]result, 0, len(exprs))
	for _, e := range exprs {
		out = append(out, inspect(p, e))
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, "promql:", err)
		os.Exit(1)
	}
}

func inspect(p parser.Parser, text string) result {
	r := result{Expr: text, Metrics: []string{}}
	expr, err := p.ParseExpr(text)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	names := map[string]bool{}
	parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
		vs, ok := node.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		for _, m := range vs.LabelMatchers {
			if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
				name = m.Value
			}
		}
		if name == "" {
			// A selector matching names by regex reads metrics no one can list: not allowed here.
			r.Error = fmt.Sprintf("selector %s does not name one metric", vs.String())
			return nil
		}
		names[name] = true
		return nil
	})
	for n := range names {
		r.Metrics = append(r.Metrics, n)
	}
	sort.Strings(r.Metrics)
	return r
}

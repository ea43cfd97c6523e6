// promparse reads a Prometheus text exposition on stdin and writes, as JSON on stdout, the
// metric families Prometheus's own parser (expfmt) reads from it and the problems its linter
// (promlint, what `promtool check metrics` runs) finds. Tests use it to check what workers serve.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/protobuf/encoding/protojson"
)

type problem struct {
	Metric string `json:"metric"`
	Text   string `json:"text"`
}

type output struct {
	Families []json.RawMessage `json:"families"`
	Problems []problem         `json:"problems"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "promparse:", err)
		os.Exit(1)
	}
}

func run() error {
	text, err := io.ReadAll(os.Stdin)
	if err != nil {
		return err
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(text))
	if err != nil {
		return err
	}
	names := make([]string, 0, len(families))
	for name := range families {
		names = append(names, name)
	}
	sort.Strings(names)
	out := output{Families: []json.RawMessage{}, Problems: []problem{}}
	for _, name := range names {
		b, err := protojson.Marshal(families[name])
		if err != nil {
			return err
		}
		out.Families = append(out.Families, b)
	}
	problems, err := promlint.New(bytes.NewReader(text)).Lint()
	if err != nil {
		return err
	}
	for _, p := range problems {
		out.Problems = append(out.Problems, problem{Metric: p.Metric, Text: p.Text})
	}
	return json.NewEncoder(os.Stdout).Encode(out)
}

package main

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"slices"

	"go.yaml.in/yaml/v3"
)

// Images are the values a release writes into the chart.
type Images struct {
	Registry, Tag, RunnerTag string
	// Digests pin images by digest, keyed as images.digests (dispatcher,
	// webhook, runner).
	Digests map[string]string
}

// SetImages sets images.registry, images.tag, images.runnerTag and
// images.digests in a values.yaml, keeping its comments and every other
// value as they are.
func SetImages(values []byte, im Images) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(values, &doc); err != nil {
		return nil, err
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, errors.New("not a YAML mapping")
	}
	images := lookup(doc.Content[0], "images")
	if images == nil || images.Kind != yaml.MappingNode {
		return nil, errors.New("no images mapping")
	}
	set := func(key, value string) error {
		n := lookup(images, key)
		if n == nil {
			return fmt.Errorf("no images.%s", key)
		}
		*n = yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: value, Style: yaml.DoubleQuotedStyle,
			HeadComment: n.HeadComment, LineComment: n.LineComment, FootComment: n.FootComment}
		return nil
	}
	if err := set("registry", im.Registry); err != nil {
		return nil, err
	}
	if err := set("tag", im.Tag); err != nil {
		return nil, err
	}
	if err := set("runnerTag", im.RunnerTag); err != nil {
		return nil, err
	}
	d := lookup(images, "digests")
	if d == nil {
		return nil, errors.New("no images.digests")
	}
	m := yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", HeadComment: d.HeadComment, LineComment: d.LineComment}
	if len(im.Digests) == 0 {
		m.Style = yaml.FlowStyle
	}
	for _, k := range slices.Sorted(maps.Keys(im.Digests)) {
		m.Content = append(m.Content,
			&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: k},
			&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: im.Digests[k], Style: yaml.DoubleQuotedStyle})
	}
	*d = m
	var out bytes.Buffer
	enc := yaml.NewEncoder(&out)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// lookup returns the value node of key in mapping m, or nil.
func lookup(m *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

package main

import (
	"bytes"
	"testing"
)

func TestParseLists(t *testing.T) {
	t.Parallel()
	c, err := parse([]string{"--dispatcher-id", "d", "--env-allow", "TF_*, GREETING ,", "--repo-allow", `^https://a/,^https://b/`}, func(string) string { return "" }, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.envAllow) != 2 || c.envAllow[1] != "GREETING" || len(c.repoAllow) != 2 {
		t.Errorf("env %q, repos %v", c.envAllow, c.repoAllow)
	}
	c, err = parse(nil, func(k string) string {
		if k == "POD_NAME" {
			return "dispatcher-7d9f"
		}
		return ""
	}, &bytes.Buffer{})
	if err != nil || c.id != "dispatcher-7d9f" {
		t.Errorf("id from POD_NAME: %q, %v", c.id, err)
	}
}

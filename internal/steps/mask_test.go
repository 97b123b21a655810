package steps

import (
	"context"
	"os"
	"strings"
	"testing"
)

// TestSecretsAreMaskedInTheLog: the job's secrets, the resolved values of
// its container.env secret references (MaskEnv) and what a step masks
// with ::add-mask:: are written as *** wherever a step prints them: whole,
// split across writes, a multi-line secret's lines, inside other text; a
// job output holding one is left out. A value shorter than minMask is not
// masked, nor is anything else.
func TestSecretsAreMaskedInTheLog(t *testing.T) {
	const (
		token    = "gitea-token-5f1e"
		password = "hunter2-db"
		resolved = "vault-resolved-77"
		added    = "added-at-runtime"
		key      = "-----BEGIN KEY-----\nMIIEabcdef\n-----END KEY-----"
	)
	plan := &Plan{
		Job:     "deploy",
		Secrets: map[string]string{"GITEA_TOKEN": token, "DB": password, "PEM": key, "SHORT": "abc"},
		MaskEnv: []string{"TF_VAR_pw"},
		Steps: []Step{
			{Name: "whole", Run: `echo "token=${{ secrets.GITEA_TOKEN }} db=$DB"`, Env: map[string]string{"DB": "${{ secrets.DB }}"}},
			{Name: "split", Run: `printf 'hunt'; printf 'er2-db and %s\n' "$TF_VAR_pw"`},
			{Name: "pem", Run: `printf '%s\n' "$PEM"`, Env: map[string]string{"PEM": "${{ secrets.PEM }}"}},
			{Name: "add-mask", Run: `echo "::add-mask::` + added + `"; echo "now ` + added + ` is masked"; echo "abc stays"`},
			{ID: "o", Name: "outputs", Run: `echo "leak=$DB" >> "$GITHUB_OUTPUT"; echo "fine=plain" >> "$GITHUB_OUTPUT"`, Env: map[string]string{"DB": "${{ secrets.DB }}"}},
		},
		Outputs: map[string]string{"leak": "${{ steps.o.outputs.leak }}", "fine": "${{ steps.o.outputs.fine }}"},
	}
	plan.Marker = testMarker
	plan.Workspace = t.TempDir()
	var out strings.Builder
	r := &Runner{Plan: plan, Out: &out, Temp: t.TempDir(),
		Environ: []string{"PATH=" + os.Getenv("PATH"), "HOME=/tmp", "TF_VAR_pw=" + resolved, "NOT_SECRET=" + "visible-value"}}
	result, err := r.Run(context.Background())
	if err != nil || result != Success {
		t.Fatalf("result %s, %v", result, err)
	}
	log := out.String()
	for _, v := range []string{token, password, resolved, added, "MIIEabcdef", "-----BEGIN KEY-----", "hunt"} {
		if strings.Contains(log, v) {
			t.Errorf("the log holds %q:\n%s", v, log)
		}
	}
	events, lines := parse(t, log)
	got := strings.Join(lines, "\n")
	for _, want := range []string{
		"token=*** db=***",
		"*** and ***",
		"***\n***\n***",
		"::add-mask::***",
		"now *** is masked",
		"abc stays",
		"runwarden: the job's output leak holds a secret; left out",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the log has no %q:\n%s", want, got)
		}
	}
	outputs := outputsOf(events)
	if _, ok := outputs["leak"]; ok || outputs["fine"] != "plain" {
		t.Errorf("outputs %v: want fine alone", outputs)
	}
}

// TestMaskerHoldsAnUnendedLine: a line is written once it ends, so a
// secret split across writes is masked; what is left unended is written,
// masked, by Flush, and a line past maxPending is written as it is so far.
func TestMaskerHoldsAnUnendedLine(t *testing.T) {
	var out strings.Builder
	m := newMasker(&out)
	m.add("s3cret-value")
	for _, p := range []string{"a s3c", "ret-va", "lue b\nand s3cret", "-value"} {
		if _, err := m.Write([]byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	if got := out.String(); got != "a *** b\n" {
		t.Errorf("written %q before the flush", got)
	}
	if err := m.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); got != "a *** b\nand ***" {
		t.Errorf("written %q", got)
	}
	out.Reset()
	long := strings.Repeat("x", maxPending+1)
	_, _ = m.Write([]byte(long))
	if out.Len() != len(long) {
		t.Errorf("a line past %d bytes was held: %d written", maxPending, out.Len())
	}
}

package gitea

import (
	"fmt"
	"testing"
	"time"

	runnerv1 "code.gitea.io/actions-proto-go/runner/v1"
)

func TestStepLog(t *testing.T) {
	const m = "::rw-x::"
	t0 := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	l := newStepLog(m, 4)
	for i, line := range []string{
		"runwarden: checking things",
		m + ` {"kind":"start","step":0}`,
		"one",
		"two",
		m + ` {"kind":"end","step":0,"result":"success","outcome":"success"}`,
		m + ` {"kind":"end","step":1,"result":"skipped","outcome":"skipped"}`,
		m + ` {"kind":"start","step":2}`,
		"three",
		m + ` {"kind":"start","step":9}`,
		m + ` not json`,
		m + ` {"kind":"outputs","outputs":{"a":"b"}}`,
		m + ` {"kind":"job","result":"failure"}`,
	} {
		l.add(line, t0.Add(time.Duration(i)*time.Second))
	}
	l.finish(runnerv1.Result_RESULT_FAILURE, t0.Add(time.Minute))
	var rows []string
	for _, r := range l.rows {
		rows = append(rows, r.GetContent())
	}
	want := []string{"runwarden: checking things", "one", "two", "three", m + ` {"kind":"start","step":9}`, m + " not json"}
	if fmt.Sprint(rows) != fmt.Sprint(want) {
		t.Errorf("rows %q, want %q", rows, want)
	}
	got := func(i int) string {
		s := l.steps[i]
		return fmt.Sprintf("%s %d+%d started=%v stopped=%v", s.GetResult(), s.GetLogIndex(), s.GetLogLength(), s.StartedAt != nil, s.StoppedAt != nil)
	}
	for i, w := range []string{
		"RESULT_SUCCESS 1+2 started=true stopped=true",
		"RESULT_SKIPPED 0+0 started=false stopped=false",
		"RESULT_FAILURE 3+3 started=true stopped=true",
		"RESULT_SKIPPED 0+0 started=false stopped=false",
	} {
		if g := got(i); g != w {
			t.Errorf("step %d: %s, want %s", i, g, w)
		}
	}
	if l.outputs["a"] != "b" {
		t.Errorf("outputs %q", l.outputs)
	}
}

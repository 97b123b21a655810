package policy

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseSecretRef(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		value string
		want  []SecretRef
		errs  []string // substrings of each ref's error, "" for none
	}{
		{name: "no reference", value: "plain ${HOME} text", want: nil},
		{name: "ssm", value: "${ssm:prod/db/password}", want: []SecretRef{{Store: "ssm", Name: "prod/db/password", Raw: "${ssm:prod/db/password}"}}},
		{name: "ssm arn", value: "${ssm:arn:aws:secretsmanager:us-east-1:1:secret:db-AbCd}", want: []SecretRef{{Store: "ssm", Name: "arn:aws:secretsmanager:us-east-1:1:secret:db-AbCd", Raw: "${ssm:arn:aws:secretsmanager:us-east-1:1:secret:db-AbCd}"}}},
		{name: "gcp", value: "${gcp:db-password}", want: []SecretRef{{Store: "gcp", Name: "db-password", Raw: "${gcp:db-password}"}}},
		{name: "azure", value: "${azure:db-password@team-vault}", want: []SecretRef{{Store: "azure", Name: "db-password", Vault: "team-vault", Raw: "${azure:db-password@team-vault}"}}},
		{name: "vault", value: "${vault:secret/data/db.password@team-a}", want: []SecretRef{{Store: "vault", Name: "secret/data/db", Key: "password", Vault: "team-a", Raw: "${vault:secret/data/db.password@team-a}"}}},
		{name: "two in one value", value: "u=${ssm:a}&p=${gcp:b}", want: []SecretRef{{Store: "ssm", Name: "a", Raw: "${ssm:a}"}, {Store: "gcp", Name: "b", Raw: "${gcp:b}"}}},
		{name: "azure without vault", value: "${azure:db}", errs: []string{"no @<vault-name>; expected ${azure:<secret-name>@<vault-name>}"}},
		{name: "vault without key", value: "${vault:secret/db@ns}", errs: []string{"no .<key>"}},
		{name: "vault without namespace", value: "${vault:secret/db.k}", errs: []string{"no @<namespace>"}},
		{name: "unterminated", value: "${ssm:abc", errs: []string{"no closing brace"}},
		{name: "bad ssm id", value: "${ssm:has space}", errs: []string{"invalid secret id"}},
		{name: "bad azure vault", value: "${azure:x@-bad}", errs: []string{"invalid vault name"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := ParseSecretRef("main", "X", tt.value)
			if tt.errs != nil {
				if len(got) != len(tt.errs) {
					t.Fatalf("got %d refs, want %d: %+v", len(got), len(tt.errs), got)
				}
				for i, e := range tt.errs {
					if !strings.Contains(got[i].Error, e) {
						t.Errorf("ref %d error %q, want it to contain %q", i, got[i].Error, e)
					}
				}
				return
			}
			for i := range tt.want {
				tt.want[i].Container, tt.want[i].Env = "main", "X"
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("refs (-want +got):\n%s", diff)
			}
		})
	}
}

func FuzzParseSecretRef(f *testing.F) {
	for _, s := range []string{"${ssm:a}", "${vault:a/b.c@d}", "${azure:a@bcd}", "x${gcp:", "${vault:.@}"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, value string) {
		for _, r := range ParseSecretRef("c", "E", value) {
			if !strings.Contains(value, r.Raw) {
				t.Fatalf("raw %q is not part of the value %q", r.Raw, value)
			}
			if r.Error == "" && r.Name == "" {
				t.Fatalf("well-formed reference %q has no name", r.Raw)
			}
			if r.Error != "" && !strings.Contains(r.Error, "expected ${"+r.Store+":") {
				t.Fatalf("error %q does not give the expected form", r.Error)
			}
		}
	})
}

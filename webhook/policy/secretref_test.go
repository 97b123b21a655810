package policy

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/runwarden/runwarden/internal/contract"
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
		{name: "ssm parameter path", value: "${ssm:/team-a/db}", want: []SecretRef{{Store: "ssm", Name: "/team-a/db", Raw: "${ssm:/team-a/db}"}}},
		{name: "ssm JSON key", value: "${ssm:arn:aws:secretsmanager:eu-west-1:1:secret:db-AbCd#password}", want: []SecretRef{{
			Store: "ssm", Name: "arn:aws:secretsmanager:eu-west-1:1:secret:db-AbCd", Key: "password", Raw: "${ssm:arn:aws:secretsmanager:eu-west-1:1:secret:db-AbCd#password}",
		}}},
		{name: "ssm bad JSON key", value: "${ssm:/db#pass word}", errs: []string{"invalid JSON key"}},
		{name: "vault dot-dot", value: "${vault:team-a/../team-b/db.password@ns}", errs: []string{`invalid secret id: path segment ".."; expected`}},
		{name: "vault dot", value: "${vault:team-a/./db.password@ns}", errs: []string{`invalid secret id: path segment "."`}},
		{name: "vault empty segment", value: "${vault:team-a//db.password@ns}", errs: []string{"invalid secret id: empty path segment"}},
		{name: "vault trailing slash", value: "${vault:team-a/.password@ns}", errs: []string{"invalid secret id: empty path segment"}},
		{name: "vault namespace dot-dot", value: "${vault:secret/db.password@team-a/..}", errs: []string{"invalid namespace"}},
		{name: "vault namespace empty segment", value: "${vault:secret/db.password@team-a//x}", errs: []string{"invalid namespace: empty path segment"}},
		{name: "ssm dot-dot", value: "${ssm:team-a/../team-b/db}", errs: []string{`invalid secret id: path segment ".."`}},
		{name: "ssm leading dot-dot", value: "${ssm:/../team-b/db}", errs: []string{`invalid secret id: path segment ".."`}},
		{name: "ssm doubled slash", value: "${ssm://team-b/db}", errs: []string{"invalid secret id: empty path segment"}},
		{name: "gcp dot-dot", value: "${gcp:team-a/../team-b}", errs: []string{`invalid secret id: path segment ".."`}},
		{name: "gcp leading slash", value: "${gcp:/team-b}", errs: []string{"invalid secret id: empty path segment"}},
		{name: "gcp with a project", value: "${gcp:projects/p1/secrets/db/versions/3}", want: []SecretRef{{Store: "gcp", Name: "projects/p1/secrets/db/versions/3", Raw: "${gcp:projects/p1/secrets/db/versions/3}"}}},
		{name: "gcp project form cut short", value: "${gcp:projects/p1/db}", errs: []string{"projects/<project>/secrets/<secret>[/versions/<version>]"}},
		{name: "gcp project form past the version", value: "${gcp:projects/p1/secrets/db/versions/3/x}", errs: []string{"projects/<project>/secrets/<secret>[/versions/<version>]"}},
		{name: "gcp path without a project", value: "${gcp:team-a/db}", errs: []string{"a secret of the configured project has no /"}},
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

// FuzzParseSecretRef: parsing never panics, every reference is part of the
// value, and no reference it accepts names a path with a "." or ".."
// segment or an empty one (beyond an SSM parameter's leading "/"), which a
// policy's pattern would place elsewhere than the store does.
func FuzzParseSecretRef(f *testing.F) {
	for _, s := range []string{
		"${ssm:a}", "${vault:a/b.c@d}", "${azure:a@bcd}", "x${gcp:", "${vault:.@}",
		"${ssm:/team-a/db}", "${vault:team-a/../team-b/db.password@ns}", "${vault:a//b.k@n}", "${gcp:./x}",
	} {
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
			if r.Error == "" && r.Store != "azure" {
				paths := []string{r.Name}
				if r.Store == "ssm" {
					paths[0] = strings.TrimPrefix(r.Name, "/")
				}
				if r.Store == "vault" {
					paths = append(paths, r.Vault)
				}
				for _, p := range paths {
					for _, seg := range strings.Split(p, "/") {
						if seg == "" || seg == "." || seg == ".." {
							t.Fatalf("accepted %q: segment %q in %q", r.Raw, seg, p)
						}
					}
				}
			}
		}
	})
}

// TestHasSecretRefAgreesWithTheWebhook: contract.HasSecretRef, which the
// dispatcher's Gitea source uses to find a job's secret references, finds
// one exactly where the webhook parses one, well formed or not.
func TestHasSecretRefAgreesWithTheWebhook(t *testing.T) {
	for _, v := range []string{
		"", "plain", "$vault:x", "{vault:x}", "${VAULT:x}", "${env:HOME}", "$${vault", "${vault}",
		"${vault:secret/db.password@team-a}", "pre ${ssm:/p/x} post", "${gcp:x", "${azure:n@v}", "a${vault:", "${{ secrets.X }}",
	} {
		if got, want := contract.HasSecretRef(v), len(ParseSecretRef("c", "E", v)) > 0; got != want {
			t.Errorf("%q: HasSecretRef %v, the webhook parses a reference: %v", v, got, want)
		}
	}
}

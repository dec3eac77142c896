// Package promtest runs a real Prometheus server for tests: it scrapes
// targets the test names, loads rule files, and answers the HTTP API
// (/api/v1/query, /api/v1/rules, /api/v1/targets).
//
// The binary is $TANDEM_PROMETHEUS, else prometheus on PATH (Debian's and
// Ubuntu's prometheus package installs /usr/bin/prometheus; CI installs it).
// Where there is none, Start skips the test, or fails it when
// TANDEM_REQUIRE_TESTDATA=1 (as CI sets).
//
//	srv := promtest.Start(t, promtest.Config{
//		Targets:   map[string][]string{"tandem-proxy": {"127.0.0.1:8000"}},
//		RuleFiles: []string{"rules.yml"},
//	})
//	v, err := srv.Query(ctx, "up")
package promtest

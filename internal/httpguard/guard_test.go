package httpguard

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tandem-serve/tandem/internal/apierror"
	"github.com/tandem-serve/tandem/internal/httpguard/httpguardtest"
)

func TestIsJSON(t *testing.T) {
	for ct, want := range map[string]bool{
		"application/json":                  true,
		"application/json; charset=utf-8":   true,
		"Application/JSON;charset=UTF-8":    true,
		" application/json ; charset=utf-8": true,
		"":                                  false,
		"text/plain":                        false,
		"text/plain; charset=utf-8":         false,
		"application/x-www-form-urlencoded": false,
		"multipart/form-data; boundary=x":   false,
		"application/jsonx":                 false,
		"application/vnd.api+json":          false,
		"application/json-seq":              false,
	} {
		if got := IsJSON(ct); got != want {
			t.Errorf("IsJSON(%q) = %v, want %v", ct, got, want)
		}
	}
}

// guarded serves Wrap over a handler that reads the body and answers 200
// with it, or 400 with the read error's text.
func guarded(t *testing.T) *httptest.Server {
	t.Helper()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			if _, ok := errors.AsType[*InvalidUTF8Error](err); !ok {
				t.Errorf("read error %T %v, want *InvalidUTF8Error", err, err)
			}
			apierror.WriteError(w, apierror.BadRequest("", "reading request body: %v", err))
			return
		}
		_, _ = w.Write(b)
	})
	srv := httptest.NewServer(Wrap(h, Options{JSONPaths: []string{"/json"}}))
	t.Cleanup(srv.Close)
	return srv
}

func send(t *testing.T, method, url string, header http.Header, body string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = header
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

func TestWrapContentType(t *testing.T) {
	srv := guarded(t)
	ct := func(vs ...string) http.Header { return http.Header{"Content-Type": vs} }
	cases := []struct {
		name   string
		method string
		path   string
		header http.Header
		status int
		msg    string // substring of a refusal's message
	}{
		{"application/json is served", "POST", "/json", ct("application/json"), 200, ""},
		{"a charset parameter and upper case are served", "POST", "/json", ct("Application/JSON; charset=utf-8"), 200, ""},
		{"text/plain is a 415", "POST", "/json", ct("text/plain"), 415, `(got "text/plain")`},
		{"a form is a 415", "POST", "/json", ct("application/x-www-form-urlencoded"), 415, "Only 'application/json' is allowed"},
		{"multipart is a 415", "POST", "/json", ct("multipart/form-data; boundary=b"), 415, "multipart/form-data"},
		{"no content type is a 415", "POST", "/json", http.Header{}, 415, "(got none)"},
		{"two content types are a 415", "POST", "/json", ct("application/json", "text/plain"), 415, "several"},
		{"a long content type is cut in the message", "POST", "/json", ct("text/" + strings.Repeat("x", 500)), 415, `xxx..."`},
		{"other paths are not checked", "POST", "/other", ct("text/plain"), 200, ""},
		{"other methods are not checked", "PUT", "/json", ct("text/plain"), 200, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, h, body := send(t, c.method, srv.URL+c.path, c.header, `{"a":"b"}`)
			if status != c.status {
				t.Fatalf("status %d, want %d: %s", status, c.status, body)
			}
			if c.status == 200 {
				if body != `{"a":"b"}` {
					t.Errorf("handler read %q", body)
				}
				return
			}
			var eb apierror.ErrorBody
			if err := json.Unmarshal([]byte(body), &eb); err != nil {
				t.Fatalf("error body %q: %v", body, err)
			}
			if eb.Error.Code != 415 || eb.Error.Type != apierror.TypeUnsupportedMediaType || !strings.Contains(eb.Error.Message, c.msg) {
				t.Errorf("error %+v, want code 415, type %s, message containing %q", eb.Error, apierror.TypeUnsupportedMediaType, c.msg)
			}
			if got := h.Get("Content-Type"); got != "application/json" {
				t.Errorf("error Content-Type %q", got)
			}
			if len(eb.Error.Message) > 400 {
				t.Errorf("message of %d bytes repeats too much of the header", len(eb.Error.Message))
			}
		})
	}
}

func TestWrapRefusesInvalidUTF8(t *testing.T) {
	srv := guarded(t)
	json := http.Header{"Content-Type": {"application/json"}}
	for _, c := range []struct {
		name, body string
		status     int
		msg        string
	}{
		{"valid UTF-8 passes untouched", `{"p":"héllo 日本 🙂 \ufffd"}`, 200, ""},
		{"an invalid byte is a 400 naming its offset", "{\"p\":\"a\xffb\"}", 400, "at byte 7"},
		{"a character cut at the end is a 400", "{\"p\":\"\xe2\x82", 400, "at byte 6"},
		{"an overlong encoding is a 400", "{\"p\":\"\xc0\xaf\"}", 400, "not valid UTF-8"},
		{"a surrogate is a 400", "{\"p\":\"\xed\xa0\x80\"}", 400, "not valid UTF-8"},
	} {
		t.Run(c.name, func(t *testing.T) {
			status, _, body := send(t, "POST", srv.URL+"/json", json.Clone(), c.body)
			if status != c.status {
				t.Fatalf("status %d, want %d: %s", status, c.status, body)
			}
			if c.status == 200 && body != c.body {
				t.Errorf("handler read %q, want %q", body, c.body)
			}
			if !strings.Contains(body, c.msg) {
				t.Errorf("answer %s lacks %q", body, c.msg)
			}
		})
	}
	t.Run("other paths are not checked", func(t *testing.T) {
		if status, _, body := send(t, "POST", srv.URL+"/other", json.Clone(), "\xff"); status != 200 || body != "\xff" {
			t.Errorf("status %d, body %q", status, body)
		}
	})
}

func TestWrapClosesAmbiguousFraming(t *testing.T) {
	srv := guarded(t)
	httpguardtest.CheckFraming(t, srv.Listener.Addr().String(), "/json")
}

func TestAmbiguousFraming(t *testing.T) {
	for _, c := range []struct {
		name   string
		major  int
		minor  int
		te     []string
		expect bool
	}{
		{"HTTP/1.1 with Content-Length", 1, 1, nil, false},
		{"HTTP/1.1 chunked", 1, 1, []string{"chunked"}, true},
		{"HTTP/1.0", 1, 0, nil, true},
		{"HTTP/2", 2, 0, nil, false},
	} {
		r := &http.Request{ProtoMajor: c.major, ProtoMinor: c.minor, TransferEncoding: c.te}
		if got := AmbiguousFraming(r); got != c.expect {
			t.Errorf("%s: %v, want %v", c.name, got, c.expect)
		}
	}
}

func TestWrapAuthorizesBeforeTheContentType(t *testing.T) {
	var served bool
	h := Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { served = true }), Options{
		JSONPaths: []string{"/json"},
		Authorize: func(r *http.Request) *apierror.Error {
			if r.Header.Get("Authorization") != "Bearer k" {
				return apierror.NewError(http.StatusUnauthorized, "", "send the key")
			}
			return nil
		},
	})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	status, hdr, body := send(t, "POST", srv.URL+"/json", http.Header{"Content-Type": {"text/plain"}}, "{}")
	if status != 401 || hdr.Get("WWW-Authenticate") == "" || !strings.Contains(body, "send the key") {
		t.Errorf("without the key: %d %v %s, want a 401 with a challenge", status, hdr, body)
	}
	status, _, _ = send(t, "POST", srv.URL+"/json", http.Header{"Content-Type": {"text/plain"}, "Authorization": {"Bearer k"}}, "{}")
	if status != 415 {
		t.Errorf("with the key and text/plain: %d, want 415", status)
	}
	if served {
		t.Error("a refused request reached the handler")
	}
}

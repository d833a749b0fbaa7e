// HTTP/1.1 conformance of the server's edge, over raw sockets: request framing (RFC 9112 §2-§7),
// the API key checked on the headers before the body (RFC 9110 §11), the caps on connections and
// buffered body bytes, the header timeout and the half-closed client. Each case states the status
// and whether the connection stays open; "open" is proved by a second request answered on it,
// "closed" by EOF right after the one answer (nothing smuggled in the body gets answered).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "server_harness.h"

using namespace ss;
using namespace ss::server;
using namespace std::chrono_literals;
using test_support::Harness;

namespace {

struct Response {
  int version = 0;  // 10 or 11
  int status = 0;  // 0: none (EOF, reset or timeout before a whole response)
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
};

// One client connection that reads responses one at a time (1xx interim responses skipped),
// keeping whatever follows for the next read.
class Conn {
 public:
  explicit Conn(int port) : fd_(test_support::connect_to(port)) {}
  ~Conn() {
    if (fd_ >= 0) ::close(fd_);
  }
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;
  bool ok() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  bool send(const std::string& s) { return test_support::send_all(fd_, s); }

  Response next(std::chrono::milliseconds limit = 5000ms) {
    const auto end = std::chrono::steady_clock::now() + limit;
    for (;;) {
      Response r;
      const size_t used = parse(r);
      if (used > 0) {
        in_.erase(0, used);
        if (r.status >= 100 && r.status < 200) continue;
        return r;
      }
      if (!fill(end)) return {};
    }
  }
  // The server closed its side with nothing more to say within `limit`.
  bool closed_after(std::chrono::milliseconds limit = 3000ms) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (in_.empty()) {
      if (!fill(end)) return eof_;
    }
    return false;  // more bytes came: an answer to something that should not have been read
  }
  const std::string& pending() const { return in_; }

 private:
  // Appends what arrives before `end`; false on EOF, reset or timeout.
  bool fill(std::chrono::steady_clock::time_point end) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
    char buf[65536];
    const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n <= 0) {
      eof_ = true;  // EOF or reset: either way the server is done with this connection
      return false;
    }
    in_.append(buf, static_cast<size_t>(n));
    return true;
  }
  // Bytes of one complete response at the front of in_, or 0.
  size_t parse(Response& r) const {
    const size_t he = in_.find("\r\n\r\n");
    if (he == std::string::npos || in_.compare(0, 5, "HTTP/") != 0) return 0;
    r.version = in_.compare(0, 8, "HTTP/1.1") == 0 ? 11 : 10;
    r.status = std::atoi(in_.c_str() + 9);
    size_t line = in_.find("\r\n") + 2;
    while (line < he) {
      const size_t e = in_.find("\r\n", line);
      const std::string l = in_.substr(line, e - line);
      const size_t c = l.find(':');
      if (c != std::string::npos) {
        std::string k = l.substr(0, c);
        for (char& ch : k) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
        size_t v = c + 1;
        while (v < l.size() && l[v] == ' ') ++v;
        r.headers[k] = l.substr(v);
      }
      line = e + 2;
    }
    size_t p = he + 4;
    if (r.status < 200) return p;
    if (r.headers.count("content-length")) {
      const size_t n = std::stoul(r.headers.at("content-length"));
      if (in_.size() < p + n) return 0;
      r.body = in_.substr(p, n);
      return p + n;
    }
    if (r.headers.count("transfer-encoding")) {
      for (;;) {
        const size_t e = in_.find("\r\n", p);
        if (e == std::string::npos) return 0;
        const size_t n = std::stoul(in_.substr(p, e - p), nullptr, 16);
        if (n == 0) return in_.size() >= e + 4 ? e + 4 : 0;
        if (in_.size() < e + 2 + n + 2) return 0;
        r.body += in_.substr(e + 2, n);
        p = e + 2 + n + 2;
      }
    }
    return 0;  // read-until-close bodies are not used by this server
  }
  int fd_;
  std::string in_;
  bool eof_ = false;
};

const std::string kKey = "K";
const std::string kAuth = "Authorization: Bearer K\r\n";
const std::string kTokenize = R"({"prompt":"hi"})";

std::string post(const std::string& target, const std::string& body, const std::string& extra = kAuth) {
  return "POST " + target + " HTTP/1.1\r\nHost: x\r\n" + extra + "Content-Length: " + std::to_string(body.size()) +
         "\r\n\r\n" + body;
}

std::string chunked(const std::string& chunks, const std::string& extra = kAuth) {
  return "POST /tokenize HTTP/1.1\r\nHost: x\r\n" + extra + "Transfer-Encoding: chunked\r\n\r\n" + chunks;
}

std::string hex(size_t n) {
  char b[32];
  std::snprintf(b, sizeof b, "%zx", n);
  return b;
}

struct Case {
  std::string name;
  std::string request;
  int status;
  bool stays_open;
};

// Each case on a fresh connection: the answer's status, then either a second request answered on
// the same connection or EOF with nothing more.
void run_cases(int port, const std::vector<Case>& cases) {
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Conn conn(port);
    ASSERT_TRUE(conn.ok());
    ASSERT_TRUE(conn.send(c.request));
    const Response r = conn.next();
    EXPECT_EQ(r.status, c.status) << r.body;
    if (c.stays_open) {
      conn.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
      EXPECT_EQ(conn.next().status, 200) << "the connection should stay open";
    } else {
      if (r.version == 11) {  // HTTP/1.0 closes unless told otherwise
        EXPECT_EQ(r.headers.count("connection") ? r.headers.at("connection") : "", "close");
      }
      EXPECT_TRUE(conn.closed_after()) << "the connection should be closed; got more: " << conn.pending();
    }
  }
}

ServerOptions keyed() {
  ServerOptions so;
  so.api_key = kKey;
  so.max_body_bytes = 64 * 1024;
  so.max_buffered_body_bytes = 1 << 20;
  return so;
}

// The issue's reproductions: a Transfer-Encoding the server does not decode must not leave the body
// on the connection to be read as the next request.
TEST(HttpConformance, RequestFramingTransferEncoding) {
  Harness h(keyed());
  const std::string smuggled = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  const std::string tok_chunks = hex(kTokenize.size()) + "\r\n" + kTokenize + "\r\n0\r\n\r\n";
  run_cases(h.port, {
      {"TE gzip, body is a request", "POST /tokenize HTTP/1.1\r\nHost: x\r\n" + kAuth + "Transfer-Encoding: gzip\r\n\r\n" + smuggled, 400, false},
      {"TE identity", "POST /tokenize HTTP/1.1\r\nHost: x\r\n" + kAuth + "Transfer-Encoding: identity\r\n\r\n" + smuggled, 400, false},
      {"TE chunked, chunked", "POST /tokenize HTTP/1.1\r\nHost: x\r\n" + kAuth + "Transfer-Encoding: chunked, chunked\r\n\r\n" + tok_chunks, 400, false},
      {"TE chunked on two lines", "POST /tokenize HTTP/1.1\r\nHost: x\r\n" + kAuth + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n" + tok_chunks, 400, false},
      {"TE chunked then gzip", "POST /tokenize HTTP/1.1\r\nHost: x\r\n" + kAuth + "Transfer-Encoding: chunked, gzip\r\n\r\n" + tok_chunks, 400, false},
      {"TE xchunked + CL", "POST /tokenize HTTP/1.1\r\nHost: x\r\n" + kAuth + "Transfer-Encoding: xchunked\r\nContent-Length: " + std::to_string(kTokenize.size()) + "\r\n\r\n" + kTokenize, 400, false},
      {"TE identity + CL", "POST /tokenize HTTP/1.1\r\nHost: x\r\n" + kAuth + "Transfer-Encoding: identity\r\nContent-Length: " + std::to_string(kTokenize.size()) + "\r\n\r\n" + kTokenize, 400, false},
      {"TE chunked + CL", "POST /tokenize HTTP/1.1\r\nHost: x\r\n" + kAuth + "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n" + tok_chunks, 400, false},
      {"CL + TE chunked", "POST /tokenize HTTP/1.1\r\nHost: x\r\n" + kAuth + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n" + tok_chunks, 400, false},
      {"TE empty", "POST /tokenize HTTP/1.1\r\nHost: x\r\n" + kAuth + "Transfer-Encoding: \r\n\r\n" + smuggled, 400, false},
      {"TE in HTTP/1.0", "POST /tokenize HTTP/1.0\r\nHost: x\r\n" + kAuth + "Transfer-Encoding: chunked\r\n\r\n" + tok_chunks, 400, false},
      {"TE gzip, chunked: coding not implemented", "POST /tokenize HTTP/1.1\r\nHost: x\r\n" + kAuth + "Transfer-Encoding: gzip, chunked\r\n\r\n" + tok_chunks, 501, false},
      {"TE chunked, any case", "POST /tokenize HTTP/1.1\r\nHost: x\r\n" + kAuth + "Transfer-Encoding: ChunKed\r\n\r\n" + tok_chunks, 200, true},
  });
}

TEST(HttpConformance, RequestLineAndHost) {
  Harness h(keyed());
  run_cases(h.port, {
      {"HTTP/1.1 without Host", "GET /health HTTP/1.1\r\n\r\n", 400, false},
      {"two Host lines", "GET /health HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", 400, false},
      {"Host with a space inside", "GET /health HTTP/1.1\r\nHost: a b\r\n\r\n", 400, false},
      {"empty Host is allowed", "GET /health HTTP/1.1\r\nHost:\r\n\r\n", 200, true},
      {"Host with port and IPv6 literal", "GET /health HTTP/1.1\r\nHost: [::1]:8000\r\n\r\n", 200, true},
      {"HTTP/2.0 request line", "GET /health HTTP/2.0\r\nHost: x\r\n\r\n", 400, false},
      {"HTTP/1.1 with junk after the version", "GET /health HTTP/1.1x\r\nHost: x\r\n\r\n", 400, false},
      {"two spaces in the request line", "GET  /health HTTP/1.1\r\nHost: x\r\n\r\n", 400, false},
      {"not HTTP", "HELLO\r\n\r\n", 400, false},
  });
  // HTTP/1.0 needs no Host, and closes after its answer (no keep-alive asked for).
  Conn c(h.port);
  c.send("GET /health HTTP/1.0\r\n\r\n");
  EXPECT_EQ(c.next().status, 200);
  EXPECT_TRUE(c.closed_after());
}

TEST(HttpConformance, HeaderSyntax) {
  Harness h(keyed());
  run_cases(h.port, {
      {"space before the colon", "GET /health HTTP/1.1\r\nHost : x\r\n\r\n", 400, false},
      {"whitespace-led line after the request line", "GET /health HTTP/1.1\r\n Host: x\r\n\r\n", 400, false},
      {"bare LF line endings", "GET /health HTTP/1.1\nHost: x\n\n", 400, false},
      {"bare CR inside a value", "GET /health HTTP/1.1\r\nHost: x\r\nX-A: a\rb\r\n\r\n", 400, false},
      {"NUL inside a value", std::string("GET /health HTTP/1.1\r\nHost: x\r\nX-A: a") + '\0' + "b\r\n\r\n", 400, false},
      {"field name with a bad char", "GET /health HTTP/1.1\r\nHost: x\r\nX(A): 1\r\n\r\n", 400, false},
      {"OWS around a value", "GET /health HTTP/1.1\r\nHost: \t x \t\r\n\r\n", 200, true},
      // RFC 9112 §5.2 lets a server replace obs-fold with SP (Beast does) instead of refusing it.
      {"obs-fold in a value", "GET /health HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n", 200, true},
      {"obs-fold in Transfer-Encoding", "POST /tokenize HTTP/1.1\r\nHost: x\r\n" + kAuth + "Transfer-Encoding: gzip\r\n chunked\r\n\r\n0\r\n\r\n", 400, false},
      {"headers past 64 KiB", "GET /health HTTP/1.1\r\nHost: x\r\nX-A: " + std::string(70000, 'a') + "\r\n\r\n", 431, false},
  });
}

TEST(HttpConformance, ContentLength) {
  Harness h(keyed());
  run_cases(h.port, {
      {"valid", post("/tokenize", kTokenize), 200, true},
      {"not a number", "POST /tokenize HTTP/1.1\r\nHost: x\r\n" + kAuth + "Content-Length: 5x\r\n\r\nhello", 400, false},
      {"negative", "POST /tokenize HTTP/1.1\r\nHost: x\r\n" + kAuth + "Content-Length: -1\r\n\r\n", 400, false},
      {"two different values", "POST /tokenize HTTP/1.1\r\nHost: x\r\n" + kAuth + "Content-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", 400, false},
      {"a list of different values", "POST /tokenize HTTP/1.1\r\nHost: x\r\n" + kAuth + "Content-Length: 3, 4\r\n\r\nabcd", 400, false},
      {"past the body limit: 413 before the body", "POST /tokenize HTTP/1.1\r\nHost: x\r\n" + kAuth + "Content-Length: 99999999\r\n\r\n", 413, false},
      {"overflowing 64 bits", "POST /tokenize HTTP/1.1\r\nHost: x\r\n" + kAuth + "Content-Length: 99999999999999999999999\r\n\r\n", 400, false},
  });
}

TEST(HttpConformance, ChunkedBodies) {
  Harness h(keyed());
  const std::string a = kTokenize.substr(0, 5), b = kTokenize.substr(5);
  const std::string two = hex(a.size()) + "\r\n" + a + "\r\n" + hex(b.size()) + "\r\n" + b + "\r\n";
  run_cases(h.port, {
      {"two chunks", chunked(two + "0\r\n\r\n"), 200, true},
      {"chunk extensions", chunked(hex(a.size()) + ";name=value;q=\"quoted \\\" ext\"\r\n" + a + "\r\n" + hex(b.size()) + " ; x\r\n" + b + "\r\n0;last\r\n\r\n"), 200, true},
      {"trailer fields", chunked(two + "0\r\nX-Checksum: 1\r\nX-Other: 2\r\n\r\n"), 200, true},
      {"upper-case and zero-padded sizes", chunked("000" + hex(kTokenize.size()) + "\r\n" + kTokenize + "\r\n0\r\n\r\n"), 200, true},
      {"size overflowing 64 bits", chunked("fffffffffffffffffffff\r\n" + a + "\r\n0\r\n\r\n"), 400, false},
      {"size past the body limit", chunked("100000\r\n" + a), 413, false},
      {"size not hex", chunked("zz\r\n" + a + "\r\n0\r\n\r\n"), 400, false},
      {"negative size", chunked("-5\r\n" + a + "\r\n0\r\n\r\n"), 400, false},
      {"data longer than the size", chunked("2\r\n" + a + "\r\n0\r\n\r\n"), 400, false},
      {"bare LF after the size", chunked(hex(a.size()) + "\n" + a + "\r\n0\r\n\r\n"), 400, false},
      {"chunk extension of 1 KiB", chunked(hex(kTokenize.size()) + ";x=" + std::string(1024, 'e') + "\r\n" + kTokenize + "\r\n0\r\n\r\n"), 200, true},
      // Beast does not bound extensions; the connection's read buffer (128 KiB) does.
      {"chunk extension of 1 MiB", chunked(hex(a.size()) + ";x=" + std::string(1 << 20, 'e') + "\r\n" + a + "\r\n0\r\n\r\n"), 400, false},
  });
}

TEST(HttpConformance, PipeliningAfterAnError) {
  Harness h(keyed());
  const std::string health = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  {  // an error that leaves the framing intact (404, 405, a bad body): the next request is answered
    Conn c(h.port);
    c.send("GET /nope HTTP/1.1\r\nHost: x\r\n" + kAuth + "\r\n" + "GET /v1/completions HTTP/1.1\r\nHost: x\r\n" +
           kAuth + "\r\n" + post("/tokenize", "{bad json") + health);
    EXPECT_EQ(c.next().status, 404);
    const Response m = c.next();
    EXPECT_EQ(m.status, 405);
    EXPECT_EQ(m.headers.count("allow") ? m.headers.at("allow") : "", "POST");
    EXPECT_EQ(c.next().status, 400);
    EXPECT_EQ(c.next().status, 200);
  }
  {  // a framing error: nothing after it on the connection is read
    Conn c(h.port);
    c.send("GET /health HTTP/1.1\r\n\r\n" + health + health);
    EXPECT_EQ(c.next().status, 400);
    EXPECT_TRUE(c.closed_after()) << c.pending();
  }
  {  // a 401: the rest is not read either
    Conn c(h.port);
    c.send("GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n" + health);
    EXPECT_EQ(c.next().status, 401);
    EXPECT_TRUE(c.closed_after()) << c.pending();
  }
}

TEST(HttpConformance, ApiKeyOnTheHeaders) {
  Harness h(keyed());
  run_cases(h.port, {
      {"scheme in lower case", post("/tokenize", kTokenize, "Authorization: bearer K\r\n"), 200, true},
      {"scheme in upper case, two spaces", post("/tokenize", kTokenize, "Authorization: BEARER  K\r\n"), 200, true},
      {"no key", post("/tokenize", kTokenize, ""), 401, false},
      {"wrong key", post("/tokenize", kTokenize, "Authorization: Bearer L\r\n"), 401, false},
      {"key as a prefix", post("/tokenize", kTokenize, "Authorization: Bearer KK\r\n"), 401, false},
      {"another scheme", post("/tokenize", kTokenize, "Authorization: Basic K\r\n"), 401, false},
      {"scheme only", post("/tokenize", kTokenize, "Authorization: Bearer\r\n"), 401, false},
      {"two Authorization lines", post("/tokenize", kTokenize, "Authorization: Bearer L\r\n" + kAuth), 401, false},
      // No route is discoverable without the key: 401 before 404 and 405.
      {"unknown route without key", "GET /nope HTTP/1.1\r\nHost: x\r\n\r\n", 401, false},
      {"wrong method without key", "GET /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n", 401, false},
      {"unknown route with key", "GET /nope HTTP/1.1\r\nHost: x\r\n" + kAuth + "\r\n", 404, true},
      {"wrong method with key", "GET /v1/completions HTTP/1.1\r\nHost: x\r\n" + kAuth + "\r\n", 405, true},
      {"health is open", "GET /health HTTP/1.1\r\nHost: x\r\n\r\n", 200, true},
      {"metrics are open by default", "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", 200, true},
      {"a query string does not open a route", "GET /v1/models?x=/health HTTP/1.1\r\nHost: x\r\n\r\n", 401, false},
  });
  // Expect: 100-continue without the key: the 401 comes instead of the 100.
  Conn c(h.port);
  c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 10\r\n\r\n");
  std::this_thread::sleep_for(100ms);
  const Response r = c.next();
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(r.headers.count("www-authenticate") ? r.headers.at("www-authenticate") : "", "Bearer");
}

TEST(HttpConformance, MetricsRequireKey) {
  ServerOptions so = keyed();
  so.metrics_require_key = true;
  Harness h(so);
  run_cases(h.port, {
      {"metrics without key", "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", 401, false},
      {"metrics with key", "GET /metrics HTTP/1.1\r\nHost: x\r\n" + kAuth + "\r\n", 200, true},
      {"health still open", "GET /health HTTP/1.1\r\nHost: x\r\n\r\n", 200, true},
  });
}

// The 401 comes on the headers: the server neither waits for nor holds the declared 4 MB body.
TEST(HttpConformance, UnauthorizedBodyIsNotRead) {
  ServerOptions so = keyed();
  so.max_body_bytes = 4u << 20;
  so.max_buffered_body_bytes = 8u << 20;
  Harness h(so);
  std::vector<std::unique_ptr<Conn>> conns;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 8; ++i) {
    auto c = std::make_unique<Conn>(h.port);
    c->send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4194304\r\n\r\n" + std::string(1000, 'x'));
    conns.push_back(std::move(c));
  }
  for (auto& c : conns) {
    const Response r = c->next(2000ms);
    EXPECT_EQ(r.status, 401);
    EXPECT_EQ(r.headers.count("connection") ? r.headers.at("connection") : "", "close");
    EXPECT_TRUE(c->closed_after(3000ms));
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 4s) << "answered without waiting for the bodies";
  // 8 x 4 MB would be past the 8 MB cap had they been charged: a keyed request still gets through.
  Conn ok(h.port);
  ok.send(post("/tokenize", kTokenize));
  EXPECT_EQ(ok.next().status, 200);
  EXPECT_NE(h.metrics().find("selfserve_requests_rejected_total{reason=\"unauthorized\"} 8"), std::string::npos);
}

TEST(HttpConformance, ConnectionCapGives503) {
  ServerOptions so = keyed();
  so.max_connections = 3;
  Harness h(so);
  std::vector<std::unique_ptr<Conn>> idle;
  for (int i = 0; i < 3; ++i) idle.push_back(std::make_unique<Conn>(h.port));
  {
    Conn c(h.port);
    c.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    const Response r = c.next();
    EXPECT_EQ(r.status, 503) << r.body;
    EXPECT_EQ(r.headers.count("retry-after") ? r.headers.at("retry-after") : "", "1");
    EXPECT_NE(r.body.find("too_many_connections"), std::string::npos);
    EXPECT_TRUE(c.closed_after());
  }
  idle.pop_back();  // one slot frees up
  int status = 0;
  for (int i = 0; i < 100 && status != 200; ++i) {
    Conn c(h.port);
    c.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    status = c.next().status;
    if (status != 200) std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(status, 200);
}

TEST(HttpConformance, BufferedBodyCapGives503) {
  ServerOptions so = keyed();
  so.max_body_bytes = 64 * 1024;
  so.max_buffered_body_bytes = 100 * 1024;
  Harness h(so);
  // A holds 60 KB of declared body (charged once its 100 Continue came), so B's 60 KB do not fit.
  Conn a(h.port);
  const std::string body_a = R"({"prompt":")" + std::string(60000 - 13, 'a') + R"("})";
  ASSERT_EQ(body_a.size(), 60000u);
  a.send("POST /tokenize HTTP/1.1\r\nHost: x\r\n" + kAuth + "Expect: 100-continue\r\nContent-Length: 60000\r\n\r\n");
  char buf[64];
  ASSERT_GT(::recv(a.fd(), buf, sizeof buf, 0), 0) << "100 Continue";
  {
    Conn b(h.port);
    b.send(post("/tokenize", body_a));
    const Response r = b.next();
    EXPECT_EQ(r.status, 503) << r.body;
    EXPECT_EQ(r.headers.count("retry-after") ? r.headers.at("retry-after") : "", "1");
    EXPECT_TRUE(b.closed_after());
  }
  {  // a chunked body is charged as it arrives: refused once it passes what is left
    Conn b(h.port);
    b.send(chunked(hex(30000) + "\r\n" + std::string(30000, 'b') + "\r\n"));
    std::this_thread::sleep_for(50ms);
    b.send(hex(30000) + "\r\n" + std::string(30000, 'b') + "\r\n0\r\n\r\n");
    const Response r = b.next();
    EXPECT_EQ(r.status, 503) << r.body;
    EXPECT_TRUE(b.closed_after());
  }
  a.send(body_a);
  EXPECT_EQ(a.next().status, 200) << "the held body is served";
  // A is answered: its charge is given back.
  Conn b(h.port);
  b.send(post("/tokenize", body_a));
  EXPECT_EQ(b.next().status, 200);
  EXPECT_NE(h.metrics().find("selfserve_http_buffered_body_bytes 0\n"), std::string::npos);
}

TEST(HttpConformance, HeaderTimeout) {
  ServerOptions so = keyed();
  so.header_timeout_s = 0.3;
  so.idle_timeout_s = 3;
  Harness h(so);
  const auto t0 = std::chrono::steady_clock::now();
  Conn slow(h.port), silent(h.port);
  slow.send("GET /health HTTP/1.1\r\nHo");
  EXPECT_TRUE(slow.closed_after(2000ms)) << "a header that never ends";
  EXPECT_TRUE(silent.closed_after(2000ms)) << "a new connection that sends nothing";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2000ms) << "cut by the header timeout, not the idle one";
  // Between keep-alive requests the idle timeout applies, not the header timeout.
  Conn k(h.port);
  k.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(k.next().status, 200);
  std::this_thread::sleep_for(600ms);
  k.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(k.next().status, 200) << "still open after twice the header timeout";
  // A header sent slowly, byte by byte, is cut at the header timeout from its first byte.
  const std::string req = "GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + std::string(40, 's') + "\r\n\r\n";
  std::this_thread::sleep_for(100ms);
  bool cut = false;
  for (char ch : req) {
    if (!k.send(std::string(1, ch))) {
      cut = true;
      break;
    }
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_TRUE(cut || k.closed_after(500ms));
}

// HTTP/1.1 lets a client close its sending side after a complete request; it still gets the answer.
TEST(HttpConformance, HalfClosedClientIsAnswered) {
  Harness h(keyed());
  h.step_delay_ms = 5;
  const std::string gen = R"({"prompt":"Once upon","max_tokens":8,"temperature":0,"ignore_eos":true)";
  for (const std::string& body : {gen + "}", gen + R"(,"stream":true})", kTokenize}) {
    SCOPED_TRACE(body);
    Conn c(h.port);
    c.send(post(body == kTokenize ? "/tokenize" : "/v1/completions", body));
    ASSERT_EQ(::shutdown(c.fd(), SHUT_WR), 0);
    const Response r = c.next();
    EXPECT_EQ(r.status, 200) << r.body;
    if (body.find("\"stream\"") != std::string::npos) {
      EXPECT_NE(r.body.find("data: [DONE]"), std::string::npos);
    } else if (body != kTokenize) {
      EXPECT_NE(r.body.find("\"completion_tokens\":8"), std::string::npos) << r.body;
    }
    EXPECT_TRUE(c.closed_after());
  }
  EXPECT_TRUE(h.wait_idle());
  EXPECT_EQ(h.metrics().find("finish_reason=\"abort\"} 1"), std::string::npos) << "nothing was aborted";
}

}  // namespace

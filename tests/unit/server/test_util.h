// Test support for the server folder: the small Qwen2-style tokenizer from tests/data, and a
// blocking HTTP/1.1 client on plain sockets (one request per connection, chunked bodies decoded).
#pragma once
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace ss::server::test_support {

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline std::unique_ptr<tok::Tokenizer> test_tokenizer() {
  const std::string dir = std::string(SS_SOURCE_DIR) + "/tests/data/tokenizer/";
  auto t = tok::Tokenizer::from_json_text(read_file(dir + "qwen2.tokenizer.json"),
                                          read_file(dir + "qwen2.tokenizer_config.json"), "qwen2.tokenizer.json");
  if (!t.ok()) return nullptr;
  return std::move(t).value();
}

struct HttpResult {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;                            // de-chunked
};

inline int connect_to(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

inline bool send_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

inline std::string request_text(const std::string& method, const std::string& target, const std::string& body,
                                const std::vector<std::string>& headers = {}) {
  std::string r = method + " " + target + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n";
  for (const auto& h : headers) r += h + "\r\n";
  if (!body.empty() || method == "POST") r += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  return r + "\r\n" + body;
}

inline HttpResult parse_response(const std::string& raw) {
  HttpResult r;
  const size_t he = raw.find("\r\n\r\n");
  if (he == std::string::npos || raw.size() < 12) return r;
  r.status = std::atoi(raw.c_str() + 9);
  std::istringstream hs(raw.substr(0, he));
  std::string line;
  std::getline(hs, line);
  while (std::getline(hs, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const size_t c = line.find(':');
    if (c == std::string::npos) continue;
    std::string k = line.substr(0, c);
    for (auto& ch : k) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    size_t v = c + 1;
    while (v < line.size() && line[v] == ' ') ++v;
    r.headers[k] = line.substr(v);
  }
  std::string body = raw.substr(he + 4);
  if (r.headers["transfer-encoding"] == "chunked") {
    std::string out;
    size_t p = 0;
    while (p < body.size()) {
      const size_t e = body.find("\r\n", p);
      if (e == std::string::npos) break;
      const size_t n = std::stoul(body.substr(p, e - p), nullptr, 16);
      if (n == 0) break;
      out += body.substr(e + 2, n);
      p = e + 2 + n + 2;
    }
    body = out;
  }
  r.body = body;
  return r;
}

inline std::string read_all(int fd) {
  std::string raw;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    raw.append(buf, static_cast<size_t>(n));
  }
  return raw;
}

inline HttpResult http(int port, const std::string& method, const std::string& target, const std::string& body = {},
                       const std::vector<std::string>& headers = {}) {
  const int fd = connect_to(port);
  if (fd < 0) return {};
  send_all(fd, request_text(method, target, body, headers));
  HttpResult r = parse_response(read_all(fd));
  ::close(fd);
  return r;
}

// The JSON payloads of an SSE body ("data: ..." lines), [DONE] included as the raw string.
inline std::vector<std::string> sse_payloads(const std::string& body) {
  std::vector<std::string> out;
  size_t p = 0;
  while ((p = body.find("data: ", p)) != std::string::npos) {
    const size_t e = body.find("\n\n", p);
    out.push_back(body.substr(p + 6, e - p - 6));
    if (e == std::string::npos) break;
    p = e + 2;
  }
  return out;
}

}  // namespace ss::server::test_support

// cluster/service/http_api — the fleet service's HTTP/JSON API and status page
// (docs/fleet.md lists the routes). Listens on the loopback address unless told otherwise;
// on any other address a bearer token is required for every request.
#pragma once

#include <memory>
#include <string>

namespace loom::service {

class Service;

struct ApiOptions {
  std::string host = "127.0.0.1";
  int port = 8470;
  std::string token;  // required (Authorization: Bearer TOKEN) when not empty
};

class HttpApi {
 public:
  HttpApi(Service& service, ApiOptions options);
  ~HttpApi();
  // Binds (throws naming the address when it cannot) and serves until stop().
  void bind();
  void serve();
  void stop();
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The status page: pools, the queue, running jobs with their loss curves, every
// placement's reason; plain HTML and script served by the daemon.
const char* status_page_html();

}  // namespace loom::service
